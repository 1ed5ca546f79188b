"""The long-context measures at longer windows and on other meshes (slow): a 2,048-token document
scored whole against NumPy float64, and the measures unchanged by batch size, packing, length
buckets and the mesh."""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
import pytest
from test_long_context import run, settings

from ppl_jax.checkpoints import architecture, open_checkpoint
from ppl_jax.runtime.mesh import DEFAULT_RULES, make_mesh, param_targets

import helpers

pytestmark = pytest.mark.slow  # the tier of its folder

LONG = dataclasses.replace(helpers.TINY, max_positions=2048)
LENGTHS = (2048, 1500, 700, 90)
C, S = 512, 256


@pytest.fixture(scope="module")
def long_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("longer")
    ckpt = str(folder / "tiny2k")
    helpers.save_random_checkpoint(ckpt, LONG, steps=(1,), seed=3)
    text = helpers.stdlib_text(sum(LENGTHS) + 100).encode("ascii", "replace").decode()
    texts, at = [], 0
    for n in LENGTHS:
        texts.append(text[at : at + n])
        at += n
    path = helpers.corpus_files(folder, texts)
    return ckpt, path, texts, folder


def test_a_2048_token_document_whole_against_numpy(long_run):
    ckpt, path, texts, folder = long_run
    s = settings(
        ckpt, path, folder / "out", eval__seq_len=2047, eval__short_context=C,
        eval__short_targets=S, longppl__alpha=0.05, longppl__beta=-100.0,
    )  # fmt: skip
    ev = run(s)
    c = open_checkpoint(ckpt)
    model = architecture.resolve(c).model()
    target, _ = param_targets(
        model.abstract_params, model.logical_axes, make_mesh(-1, 1), DEFAULT_RULES
    )
    params = jax.device_get(c.restore(None, target))
    ids = np.frombuffer(texts[0].encode(), np.uint8).astype(np.int32)
    full = helpers.reference_token_nll(params, LONG, ids)
    rows = helpers.token_rows(ev.diagnostics["tokens_file"], 0)
    np.testing.assert_allclose(rows.nll, full, rtol=1e-5, atol=1e-5)
    short = full.copy()
    for a in range(C, ids.size, S):
        window = ids[a - C : a + S]
        short[a - 1 : a - 1 + window.size - C] = helpers.reference_token_nll(params, LONG, window)[
            C - 1 :
        ]
    np.testing.assert_allclose(rows.nll_short, short, rtol=1e-5, atol=1e-5)
    curve = ev.diagnostics["position_curve"]
    assert curve["buckets"][-1]["last"] == 2047 and curve["buckets"][-1]["documents"] == 1
    assert math.fsum(b["nll_sum"] for b in curve["buckets"]) == pytest.approx(
        ev.sums.nll_sum, rel=1e-13
    )


def summary(ev) -> tuple:
    lc = ev.diagnostics["long_context"]
    curve = ev.diagnostics["position_curve"]
    return (
        ev.sums.nll_sum,
        lc["context_gain"]["gain_sum"],
        lc["longppl"]["num_key_tokens"],
        lc["longppl"]["longppl"],
        [b["nll_sum"] for b in curve["buckets"]],
    )


@pytest.mark.parametrize(
    "overrides",
    [
        dict(eval__batch_size=16, eval__packing=False),
        dict(eval__length_buckets=4),
        dict(mesh__data=4, mesh__model=2, eval__batch_size=4),
    ],
)
def test_the_measures_do_not_depend_on_batches_packing_or_the_mesh(long_run, overrides):
    ckpt, path, _, folder = long_run
    base = dict(
        eval__seq_len=2047, eval__short_context=C, eval__short_targets=S, longppl__alpha=0.05,
        longppl__beta=-100.0, output__tokens=False,
    )  # fmt: skip
    want = summary(run(settings(ckpt, path, folder / "base", **base)))
    got = summary(run(settings(ckpt, path, folder / "other", **base, **overrides)))
    assert got[2] == want[2]  # the same key tokens
    for a, b in zip(got[:2] + got[3:4], want[:2] + want[3:4], strict=True):
        assert a == pytest.approx(b, rel=1e-6)
    np.testing.assert_allclose(got[4], want[4], rtol=1e-6)
