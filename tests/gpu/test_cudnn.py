"""On an NVIDIA GPU: the cuDNN flash-attention path (`model.attention=cudnn`) against the XLA path,
from the kernel to the command line. Collected only when PPL_JAX_GPU_TESTS=1 (tests/conftest.py):

    PPL_JAX_GPU_TESTS=1 python -m pytest -n 0 tests/gpu

Both paths run in bfloat16 against a float32 reference of the XLA path (at `highest`, as a float32
run computes: JAX's default on the GPU is TF32); cuDNN must be as close to it as XLA's own
bfloat16 result is, with the same token counts everywhere. And a float32 run is float32: its
compiled step asks for `highest` on every product, and its NLL equals NumPy float64's."""

import dataclasses
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.models import registry
from ppl_jax.models.layers.attention import attend, resolve
from ppl_jax.plans.layout import plan_layout
from ppl_jax.plans.windows import sliding
from ppl_jax.runtime import mesh as mesh_lib
from ppl_jax.scoring import precision
from ppl_jax.scoring.scorer import Scorer

import helpers


@pytest.fixture(autouse=True, scope="module")
def _on_gpu():
    assert jax.default_backend() == "gpu", f"PPL_JAX_GPU_TESTS=1 on {jax.default_backend()}"


def _padded_rows(lengths, t):
    seg = (np.arange(t)[None, :] < np.asarray(lengths)[:, None]).astype(np.int32)
    pos = np.broadcast_to(np.arange(t, dtype=np.int32), seg.shape)
    return jnp.asarray(seg), jnp.asarray(pos)


@pytest.mark.parametrize(
    "heads,kv_heads,head_dim,window",
    [(8, 2, 64, None), (8, 8, 128, None), (4, 1, 64, 64), (32, 8, 64, None)],
)
def test_cudnn_attention_matches_xla(heads, kv_heads, head_dim, window):
    t, lengths = 256, [256, 200, 77, 1, 0]  # the last row is all padding (a batch's filler row)
    seg, pos = _padded_rows(lengths, t)
    rng = np.random.default_rng(0)
    q, k, v = (
        rng.standard_normal((len(lengths), t, h, head_dim)).astype(np.float32)
        for h in (heads, kv_heads, kv_heads)
    )
    with precision.applied("highest"):
        ref = np.asarray(
            attend(*map(jnp.asarray, (q, k, v)), segment_ids=seg, positions=pos, window=window)
        )
    out = {}
    for impl in ("xla", "cudnn"):
        fn = jax.jit(
            lambda q, k, v, impl=impl: attend(
                q, k, v, segment_ids=seg, positions=pos, window=window, implementation=impl
            )
        )
        qb, kb, vb = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))
        out[impl] = np.asarray(fn(qb, kb, vb).astype(jnp.float32))
    real = np.asarray(seg) != 0
    err = {impl: np.abs(o[real] - ref[real]).max() for impl, o in out.items()}
    assert np.isfinite(out["cudnn"][real]).all()
    assert err["cudnn"] <= max(2 * err["xla"], 2e-2), err


def _scorer_totals(cfg, attention, params32, tokens, seq_len, batch_size):
    model = registry.build(cfg.to_dict(), jnp.bfloat16, attention)
    mesh = mesh_lib.make_mesh(-1, 1)
    shardings = mesh_lib.param_shardings(
        model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES
    )
    params = jax.device_put(
        jax.tree.map(lambda x: jnp.asarray(x, jnp.bfloat16), params32), shardings
    )
    windows = sliding(tokens, seq_len, seq_len // 2)
    return Scorer(model, mesh, shardings).score(params, windows, plan_layout(windows, batch_size))


def test_cudnn_scores_like_xla_with_filler_rows():
    """One window more than a batch of 4 rows per device: the second batch holds one window and
    filler rows of padding alone."""
    cfg = dataclasses.replace(
        helpers.TINY,
        vocab_size=512,
        embed_dim=256,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        mlp_dim=512,
        max_positions=512,
    )
    params = helpers.random_params(cfg, seed=1)
    batch = 4 * jax.device_count()
    tokens = np.random.default_rng(2).integers(0, 512, (batch + 1) * 64 + 64 + 1).astype(np.int32)
    totals = {a: _scorer_totals(cfg, a, params, tokens, 128, batch) for a in ("xla", "cudnn")}
    assert totals["cudnn"].num_tokens == totals["xla"].num_tokens == tokens.size - 1
    assert np.isfinite(totals["cudnn"].nll_sum)
    rel = abs(totals["cudnn"].nll_sum / totals["xla"].nll_sum - 1)
    assert rel < 2e-3, rel


def _run_demo(tmp_path, name, *flags):
    out = tmp_path / name
    cmd = [
        sys.executable,
        "-m",
        "ppl_jax",
        f"--config.output.dir={out}",
        "--config.output.progress=false",
        *flags,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=helpers.REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / "results.json", encoding="utf-8") as f:
        return json.load(f)


def test_demo_under_cudnn_matches_xla(tmp_path):
    """The built-in default on the GPU: `auto` in bfloat16 picks cuDNN (one window per row), and
    its numbers agree with XLA's packed rows in bfloat16 and with float32."""
    auto = _run_demo(tmp_path, "auto", "--config.model.dtype=bfloat16")
    xla = _run_demo(
        tmp_path, "xla", "--config.model.dtype=bfloat16", "--config.model.attention=xla"
    )
    f32 = _run_demo(tmp_path, "f32")
    assert auto["config"]["model"]["attention"] == "auto"
    assert (auto["matmul_precision"], f32["matmul_precision"]) == ("default", "highest")
    assert (auto["attention"], xla["attention"], f32["attention"]) == ("cudnn", "xla", "xla")
    assert resolve("auto", jnp.bfloat16, auto["model"]["head_dim"]) == "cudnn"
    for r in (auto, xla):
        assert r["num_tokens"] == f32["num_tokens"]
        assert r["num_bytes"] == f32["num_bytes"]
    assert abs(auto["perplexity"] / xla["perplexity"] - 1) < 1e-3
    assert abs(auto["perplexity"] / f32["perplexity"] - 1) < 2e-3
    assert abs(xla["perplexity"] / f32["perplexity"] - 1) < 2e-3


@pytest.mark.parametrize("start", [0, 256, 640])
def test_split_merge_with_cudnn_matches_xla(start):
    """A chunk of 128 queries at `start` of 1,024-token rows of one document (one full, one
    short, one empty): cuDNN's diagonal block and prefix merged by their float32 log-sum-exp
    (`ppl_jax.models.layers.split_merge`, what the context axis and a long window's query chunks
    run) against the flash kernel doing the same, and against the whole row in float32."""
    from ppl_jax.models.layers import split_merge

    t, lengths = 1024, [1024, 700, 0]
    seg, pos = _padded_rows(lengths, t)
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((len(lengths), t, h, 64)).astype(np.float32) for h in (8, 2, 2))
    ref = np.asarray(attend(*map(jnp.asarray, (q, k, v)), segment_ids=seg, positions=pos))
    real = jnp.asarray(lengths, jnp.int32)
    out = {}
    for name in ("xla", "cudnn"):
        fn = jax.jit(
            lambda q, k, v, name=name: split_merge.chunk_of_row(
                q, k, v, start, real, scale=64**-0.5, partial=split_merge.PARTIALS[name]
            )
        )
        qb, kb, vb = (jnp.asarray(x, jnp.bfloat16) for x in (q[:, start : start + 128], k, v))
        out[name] = np.asarray(fn(qb, kb, vb).astype(jnp.float32))
    scored = np.asarray(seg)[:, start : start + 128] != 0
    err = {n: np.abs(o[scored] - ref[:, start : start + 128][scored]).max() for n, o in out.items()}
    assert np.isfinite(out["cudnn"][scored]).all()
    assert err["cudnn"] <= max(2 * err["xla"], 2e-2), err


def test_a_float32_run_is_float32():
    """The scorer's float32 step on the GPU asks for `highest` on every product and scores every
    window of 16 tokens within 1e-4 nats of the NumPy float64 model (float32 on a CPU: 1.1e-5;
    TF32's 10-bit mantissa moves a logit of this model by about 1e-3)."""
    cfg = dataclasses.replace(helpers.TINY, vocab_size=512, embed_dim=256, mlp_dim=512)
    model = registry.build(cfg.to_dict(), jnp.float32, "xla")
    mesh = mesh_lib.make_mesh(1, 1, devices=jax.devices()[:1])
    shardings = mesh_lib.param_shardings(
        model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES
    )
    host = helpers.random_params(cfg, seed=2)
    params = jax.device_put(host, shardings)
    scorer = Scorer(model, mesh, shardings)
    assert scorer.matmul_precision == "highest"
    assert "precision = [DEFAULT" not in scorer.lowered(4, 17).as_text()
    tokens = np.random.default_rng(3).integers(0, 512, 16 * 16 + 1).astype(np.int32)
    windows = sliding(tokens, 16, 16)
    totals = scorer.score(params, windows, plan_layout(windows, 4))
    rows = windows.rows(np.arange(windows.num_windows))
    for k in range(windows.num_windows):
        n = int(rows["segment_ids"][k].sum())
        ref = helpers.reference_token_nll(host, cfg, rows["tokens"][k, :n])
        scored = rows["target_mask"][k, 1:n]
        assert abs(totals.window_nll[k] - ref[scored].sum()) < 1e-4


def test_cudnn_passes_a_nan_on():
    """A NaN key reaches the queries that see it through cuDNN, alone and split and merged (REVIEW
    item 19: a query whose scores are NaN is not one that sees no key); another row stays
    finite."""
    from ppl_jax.models.layers import split_merge

    t, lengths = 256, [256, 200]
    seg, pos = _padded_rows(lengths, t)
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((2, t, h, 64)).astype(np.float32) for h in (8, 2, 2))
    k[0, 30] = np.nan  # row 0, token 30, every key head
    qb, kb, vb = (jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))
    out = jax.jit(
        lambda q, k, v: attend(q, k, v, segment_ids=seg, positions=pos, implementation="cudnn")
    )(qb, kb, vb)
    out = np.asarray(out.astype(jnp.float32))
    assert np.isnan(out[0, 30:]).all()  # the queries that see it (earlier ones: unspecified)
    assert np.isfinite(out[1, :200]).all()
    real = jnp.asarray(lengths, jnp.int32)
    merged = jax.jit(
        lambda q, k, v: split_merge.chunk_of_row(
            q, k, v, 128, real, scale=64**-0.5, partial=split_merge.PARTIALS["cudnn"]
        )
    )(qb[:, 128:], kb, vb)  # token 30 is in the prefix of the queries 128..255
    merged = np.asarray(merged.astype(jnp.float32))
    assert np.isnan(merged[0]).all() and np.isfinite(merged[1, :72]).all()
