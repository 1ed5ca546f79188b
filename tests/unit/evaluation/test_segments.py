"""Packing only for a model that keeps segments apart, and a one-row check of that claim
(`LanguageModel.honours_segments`, `ppl_jax.evaluation.segments`; issue 19 item 8)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

import ppl_jax
from ppl_jax.checkpoints import architecture, open_checkpoint
from ppl_jax.errors import ConfigError
from ppl_jax.evaluation import segments
from ppl_jax.plans.layout import plan_layout
from ppl_jax.runtime.mesh import make_mesh

import helpers


def ignoring_segments(model):
    """The model with an `apply` that ignores which segment a token is in (padding aside)."""

    def apply(params, tokens, positions, segment_ids):
        return model.apply(params, tokens, positions, (segment_ids > 0).astype(jnp.int32))

    return dataclasses.replace(model, apply=apply)


@pytest.fixture(scope="module")
def short_documents(tmp_path_factory):
    text = helpers.stdlib_text(1200)
    docs = [text[i : i + 20] for i in range(0, 600, 20)]  # 30 documents of 20 bytes
    return helpers.corpus_files(tmp_path_factory.mktemp("short"), docs)


def evaluator(model, tok, corpus, mesh):
    tok.eos_id = 0  # the rolling windows' prefix token (byte 0 never occurs in the text)
    return ppl_jax.Evaluator(
        model=model,
        mesh=mesh,
        param_shardings=None,
        suite=[ppl_jax.DatasetSpec(path=corpus)],
        tokenizer=tok,
        protocol=ppl_jax.ProtocolSpec(name="lm_eval_rolling", seq_len=64),
        batch=ppl_jax.BatchSpec(batch_size=8),
    )


def test_the_check_passes_an_honest_model_and_catches_one_that_ignores_segments(tiny_checkpoint):
    ckpt = open_checkpoint(tiny_checkpoint)
    mesh = make_mesh(-1, 1)
    for dtype, tolerance in (
        ("float32", 1e-6),
        ("bfloat16", segments.TOLERANCE[jnp.dtype(jnp.bfloat16)]),
    ):
        model = architecture.resolve(ckpt).model(dtype)
        target, _ = ppl_jax.runtime.mesh.param_targets(
            model.abstract_params, model.logical_axes, mesh, ppl_jax.runtime.mesh.DEFAULT_RULES,
            jnp.dtype(dtype),
        )  # fmt: skip
        params = ckpt.restore(5, target)
        assert segments.difference(model, params, mesh) <= tolerance, dtype
        liar = ignoring_segments(model)
        assert segments.difference(liar, params, mesh) > 10 * tolerance, dtype


def test_a_model_that_claims_segments_but_ignores_them_is_refused(tiny_checkpoint, short_documents):
    ckpt = open_checkpoint(tiny_checkpoint)
    mesh = make_mesh(-1, 1)
    liar = ignoring_segments(architecture.resolve(ckpt).model())
    ev = evaluator(liar, ckpt.tokenizer(5), short_documents, mesh)
    assert ev.datasets[0].layout.max_segments > 1  # packed: the claim is believed until checked
    params = ckpt.restore(5, ev.param_targets)
    with pytest.raises(ConfigError, match="honours_segments=False"):
        ev(params, step=5)


@pytest.mark.slow
def test_a_model_that_says_it_ignores_segments_is_scored_unpacked(tiny_checkpoint, short_documents):
    ckpt = open_checkpoint(tiny_checkpoint)
    mesh = make_mesh(-1, 1)
    honest = architecture.resolve(ckpt).model()
    said = dataclasses.replace(ignoring_segments(honest), honours_segments=False)
    ev = evaluator(said, ckpt.tokenizer(5), short_documents, mesh)
    assert ev.datasets[0].layout.max_segments == 1
    packed = evaluator(honest, ckpt.tokenizer(5), short_documents, mesh)
    assert packed.datasets[0].layout.max_segments > 1
    params = ckpt.restore(5, ev.param_targets)
    got, want = ev(params, step=5), packed(params, step=5)
    name = ev.datasets[0].name
    for metric in ("nll_per_token", "bits_per_byte", "top1_accuracy"):
        np.testing.assert_allclose(got[f"{name}/{metric}"], want[f"{name}/{metric}"], rtol=1e-6)


def test_a_model_on_cudnn_attention_is_scored_unpacked(tiny_checkpoint, short_documents):
    """cuDNN's attention takes per-row sequence lengths, not segments: a family model built for
    it says so (`honours_segments`, `ppl_jax.models.layers.attention.keeps_segments`), and its
    windows are laid out one per row, with no attention setting passed to the planner."""
    ckpt = open_checkpoint(tiny_checkpoint)
    tok = ckpt.tokenizer(5)
    tok.eos_id = 0
    for attention, packs in (("xla", True), ("cudnn", False)):
        model = architecture.resolve(ckpt).model(
            "bfloat16", attention
        )  # built abstractly: no GPU needed
        assert model.honours_segments is packs
        d = ppl_jax.prepare(
            ppl_jax.DatasetSpec(path=short_documents),
            ppl_jax.ProtocolSpec(name="lm_eval_rolling", seq_len=64),
            tok, model.vocab_size, ppl_jax.BatchSpec(batch_size=8), model.honours_segments,
        )  # fmt: skip
        assert (d.layout.max_segments > 1) is packs, attention


def test_a_prepared_packed_dataset_is_laid_out_again_with_the_runs_length_buckets(
    tiny_checkpoint, short_documents
):
    """A dataset prepared packed (`ppl_jax.prepare`) for a model that does not keep segments
    apart is laid out unpacked again, in the widths of the run's `length_buckets`, as its
    fingerprint says (it was laid out at the full width, whatever the buckets)."""
    ckpt = open_checkpoint(tiny_checkpoint)
    tok = ckpt.tokenizer(5)
    tok.eos_id = 0
    model = architecture.resolve(ckpt).model()
    said = dataclasses.replace(ignoring_segments(model), honours_segments=False)
    batch = ppl_jax.BatchSpec(batch_size=8, length_buckets=4)
    protocol = ppl_jax.ProtocolSpec(name="lm_eval_rolling", seq_len=64)
    prepared = ppl_jax.prepare(
        ppl_jax.DatasetSpec(path=short_documents), protocol, tok, model.vocab_size, batch
    )
    assert prepared.layout.max_segments > 1
    ev = ppl_jax.Evaluator(
        model=said, mesh=make_mesh(-1, 1), param_shardings=None, suite=[prepared],
        tokenizer=tok, protocol=protocol, batch=batch,
    )  # fmt: skip
    layout = ev.datasets[0].layout
    want = plan_layout(prepared.plan.windows, prepared.layout.batch_size, pack=False, num_buckets=4)
    assert layout.max_segments == 1
    assert layout.widths == want.widths and max(layout.widths) < 65  # 21-token windows
