"""`attend`: every implementation against a NumPy float64 reference of the mask of ATTENTION.md
(segments, windows, chunks, sinks, soft-cap, grouped-query heads, value heads of another width,
padding, any order of the row); block skipping; memory linear in the window; `auto`'s picks."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppl_jax.errors import ConfigError
from ppl_jax.models import registry
from ppl_jax.models.layers import flash, fused
from ppl_jax.models.layers.attention import attend, resolve, resolve_for
from ppl_jax.scoring.nll import token_nll

import helpers


def reference(q, k, v, seg, pos, window=None, chunk=None, sinks=None, scale=None, softcap=None):
    """The mask of ATTENTION.md section 1 and the softmax with sinks, in float64, one query at a
    time; padding queries (segment 0) give zeros."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    seg, pos = np.asarray(seg), np.asarray(pos)
    b, t, h, d = q.shape
    group = h // k.shape[2]
    scale = d**-0.5 if scale is None else scale
    out = np.zeros((b, t, h, v.shape[3]))
    for r in range(b):
        for i in np.flatnonzero(seg[r]):
            vis = (seg[r] == seg[r, i]) & (pos[r] <= pos[r, i])
            if window is not None:
                vis &= pos[r, i] - pos[r] < window
            if chunk is not None:
                vis &= pos[r, i] // chunk == pos[r] // chunk
            for head in range(h):
                s = k[r, vis, head // group] @ q[r, i, head] * scale
                if softcap is not None:
                    s = softcap * np.tanh(s / softcap)
                m = max(s.max(), -np.inf if sinks is None else float(sinks[head]))
                e = np.exp(s - m)
                den = e.sum() + (0.0 if sinks is None else np.exp(float(sinks[head]) - m))
                out[r, i, head] = e @ v[r, vis, head // group] / den
    return out


def packed_rows(lengths, t):
    """`(segment_ids, positions)` `[len(lengths), t] int32`: each row's segments of the given
    lengths one after another (ids 1, 2, ...), positions 0, 1, ... in each, padding after."""
    seg = np.zeros((len(lengths), t), np.int32)
    pos = np.zeros((len(lengths), t), np.int32)
    for r, row in enumerate(lengths):
        start = 0
        for s, n in enumerate(row):
            seg[r, start : start + n] = s + 1
            pos[r, start : start + n] = np.arange(n)
            start += n
    return seg, pos


def packed_inputs(b=2, t=128, seed=0):
    rng = np.random.default_rng(seed)
    seg, pos = packed_rows([[50, 40, 38], [100]], t)
    return rng, jnp.asarray(seg[:b]), jnp.asarray(pos[:b])


def random_case(rng, b, t, h, kv, dk, dv):
    lengths = []
    for _ in range(b):
        row, left = [], int(rng.integers(t // 2, t + 1))  # the rest padding
        while left > 0:
            n = int(rng.integers(1, left + 1))
            row.append(n)
            left -= n
        lengths.append(row)
    seg, pos = packed_rows(lengths, t)
    q = rng.standard_normal((b, t, h, dk)).astype(np.float32)
    k = rng.standard_normal((b, t, kv, dk)).astype(np.float32)
    v = rng.standard_normal((b, t, kv, dv)).astype(np.float32)
    return q, k, v, seg, pos


MASKS = [
    {},
    {"window": 9},
    {"chunk": 16},
    {"window": 5, "chunk": 12},
    {"softcap": 2.0, "scale": 0.7},
    {"sinks": True},
    {"sinks": True, "window": 20, "softcap": 3.0},
]


REFERENCE_CASES = [
    (MASKS[0], (16, 16)),
    (MASKS[3], (8, 24)),
    (MASKS[-1], (128, 256)),
]  # every other mask and block size: tests/slow/test_context_grid.py


@pytest.mark.parametrize("mask,blocks", REFERENCE_CASES, ids=str)
def test_xla_equals_float64_reference(mask, blocks):
    """Random packed rows with padding, 4 query heads over 2 key/value heads, Dv != Dk, a row
    length (77) that no block divides; every block size gives the reference."""
    rng = np.random.default_rng(len(mask) * 7 + blocks[0])
    q, k, v, seg, pos = random_case(rng, 3, 77, 4, 2, 8, 5)
    mask = dict(mask)
    if mask.get("sinks"):
        mask["sinks"] = rng.standard_normal(4).astype(np.float32) * 2
    out = flash.flash_attention(
        q,
        k,
        v,
        seg,
        pos,
        seg,
        pos,
        blocks=blocks,
        **{**_DEFAULTS, **mask, "scale": mask.get("scale", 8**-0.5)},
    )
    ref = reference(q, k, v, seg, pos, **mask)
    real = seg > 0
    np.testing.assert_allclose(np.asarray(out)[real], ref[real], atol=2e-6, rtol=0)
    assert (np.asarray(out)[~real] == 0).all()


_DEFAULTS = {"window": None, "chunk": None, "sinks": None, "softcap": None}


@pytest.mark.parametrize(
    "mask",
    [
        m if m in (MASKS[2], MASKS[5]) else pytest.param(m, marks=pytest.mark.slow)
        for m in MASKS[1:]
    ],
    ids=lambda m: "-".join(m),
)
def test_each_option_changes_the_result(mask):
    """Turning each option off changes the output: the tests above could fail."""
    rng = np.random.default_rng(5)
    q, k, v, seg, pos = random_case(rng, 2, 64, 4, 2, 8, 8)
    seg[:] = 1
    pos[:] = np.arange(64)
    mask = dict(mask)
    if mask.get("sinks"):
        mask["sinks"] = jnp.asarray(rng.standard_normal(4), jnp.float32)
    on = attend(q, k, v, segment_ids=seg, positions=pos, **mask)
    off = attend(q, k, v, segment_ids=seg, positions=pos)
    assert np.abs(np.asarray(on) - np.asarray(off)).max() > 1e-2


def test_any_order_of_the_row():
    """The mask is by positions: a row's tokens shuffled give the same outputs, shuffled."""
    rng = np.random.default_rng(1)
    q, k, v, seg, pos = random_case(rng, 2, 96, 2, 2, 8, 8)
    perm = rng.permutation(96)
    sinks = jnp.asarray([0.5, -1.0])
    kw = {"window": 30, "chunk": 40, "sinks": sinks}
    out = attend(q, k, v, segment_ids=seg, positions=pos, **kw)
    shuffled = attend(
        q[:, perm], k[:, perm], v[:, perm], segment_ids=seg[:, perm], positions=pos[:, perm], **kw
    )
    real = seg[:, perm] > 0
    np.testing.assert_allclose(
        np.asarray(shuffled)[real], np.asarray(out)[:, perm][real], atol=1e-6
    )


def test_key_blocks_skipped():
    """The scorer's layout: a query block visits the key blocks from its window's (chunk's,
    segment's) start to its diagonal, never those after it; padding blocks none."""
    t, bq, bk = 1024, 128, 128
    pos = np.arange(t, dtype=np.int32)[None]
    seg = np.ones((1, t), np.int32)
    first, end, full = flash.key_ranges(seg, pos, seg, pos, bq, bk, None, None)
    np.testing.assert_array_equal(first, 0)
    np.testing.assert_array_equal(full, np.tril(np.ones((8, 8), bool), -1))  # below the diagonal
    np.testing.assert_array_equal(end, np.arange(1, 9))
    first, end, _ = flash.key_ranges(seg, pos, seg, pos, bq, bk, 200, None)
    np.testing.assert_array_equal(first, [0, 0, 0, 1, 2, 3, 4, 5])
    first, end, _ = flash.key_ranges(seg, pos, seg, pos, bq, bk, None, 256)
    np.testing.assert_array_equal(first, [0, 0, 2, 2, 4, 4, 6, 6])
    seg2, pos2 = packed_rows([[300, 400]], t)  # two documents, then 324 padding
    first, end, full = flash.key_ranges(seg2, pos2, seg2, pos2, bq, bk, None, None)
    np.testing.assert_array_equal(first, [0, 0, 0, 2, 2, 2, 0, 0])
    np.testing.assert_array_equal(end, [1, 2, 3, 4, 5, 6, 0, 0])
    assert full.sum() == 2  # (1, 0) and (4, 3): one document, keys all before, no padding


def test_memory_linear_in_the_window_and_no_square():
    """The compiled program's temporaries grow as T (not T^2) and it holds no [T, T] array; a
    65,536-token window compiles."""

    def temp_bytes(t):
        q = jax.ShapeDtypeStruct((1, t, 2, 16), jnp.float32)
        ids = jax.ShapeDtypeStruct((1, t), jnp.int32)
        fn = jax.jit(lambda q, k, v, s, p: attend(q, k, v, segment_ids=s, positions=p))
        compiled = fn.lower(q, q, q, ids, ids).compile()
        assert f"{t},{t}]" not in compiled.as_text()
        return compiled.memory_analysis().temp_size_in_bytes

    small, large = temp_bytes(16_384), temp_bytes(65_536)
    assert large < 4.5 * small  # 4x the tokens: linear, with a constant part
    assert large < 65_536 * 65_536 * 4 / 100  # far below one [T, T] float32 score matrix


@pytest.mark.parametrize(
    "heads,kv_heads,window",
    [
        (4, 1, 16),
        pytest.param(4, 2, None, marks=pytest.mark.slow),
        pytest.param(4, 4, None, marks=pytest.mark.slow),
    ],
)
def test_splash_equals_xla_on_packed_rows(heads, kv_heads, window):
    rng, seg, pos = packed_inputs()
    q = jnp.asarray(rng.standard_normal((2, 128, heads, 16)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((2, 128, kv_heads, 16)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((2, 128, kv_heads, 16)), jnp.float32)
    sinks = jnp.asarray(rng.standard_normal(heads), jnp.float32)
    for kw in ({}, {"sinks": sinks}):
        xla = attend(q, k, v, segment_ids=seg, positions=pos, window=window, **kw)
        splash = attend(
            q, k, v, segment_ids=seg, positions=pos, window=window, implementation="splash", **kw
        )
        real = np.asarray(seg) != 0
        np.testing.assert_allclose(np.asarray(splash)[real], np.asarray(xla)[real], atol=1e-5)


@pytest.mark.slow
def test_splash_with_an_offset_is_the_rows_later_queries():
    """`fused.splash` with `offset`: queries `offset ..` of the row against all its keys (the
    context axis's chunks), a traced offset choosing among the kernels."""
    rng, seg, pos = packed_inputs(b=1, t=256)
    seg, pos = packed_rows([[256]], 256)
    q, k, v = (jnp.asarray(rng.standard_normal((1, 256, 2, 16)), jnp.float32) for _ in range(3))
    whole = attend(q, k, v, segment_ids=seg, positions=pos, window=40)
    for start in (0, 128):
        part = jax.jit(
            lambda q, q_seg, off: fused.splash(
                q, k, v, q_seg, seg, window=40, sinks=None, scale=0.25, softcap=None, offset=off
            )
        )(q[:, start : start + 128], seg[:, start : start + 128], jnp.int32(start))
        np.testing.assert_allclose(
            np.asarray(part), np.asarray(whole)[:, start : start + 128], atol=1e-5
        )


def test_xla_attention_sees_only_its_segment():
    rng, seg, pos = packed_inputs()
    q, k, v = (jnp.asarray(rng.standard_normal((2, 128, 2, 8)), jnp.float32) for _ in range(3))
    out = attend(q, k, v, segment_ids=seg, positions=pos, implementation="xla")
    # Changing segment 1 of row 0 leaves segments 2 and 3 unchanged.
    k2 = k.at[0, :50].set(0.0)
    v2 = v.at[0, :50].set(9.0)
    out2 = attend(q, k2, v2, segment_ids=seg, positions=pos, implementation="xla")
    np.testing.assert_array_equal(np.asarray(out)[0, 50:], np.asarray(out2)[0, 50:])
    assert not np.allclose(np.asarray(out)[0, :50], np.asarray(out2)[0, :50])


def test_model_with_splash_attention_scores_like_xla():
    cfg = dataclasses.replace(helpers.TINY, max_positions=256)
    params = helpers.random_params(cfg, seed=2)
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, 256, (1, 129)), jnp.int32)
    pos = jnp.arange(128, dtype=jnp.int32)[None]
    seg = jnp.ones((1, 128), jnp.int32)
    nll = {}
    for impl in ("xla", "splash"):
        model = registry.build(cfg.to_dict(), jnp.float32, impl)
        nll[impl] = np.asarray(
            token_nll(model.apply(params, tokens[:, :-1], pos, seg), tokens[:, 1:])
        )
    np.testing.assert_allclose(nll["splash"], nll["xla"], rtol=1e-5, atol=1e-5)


def test_cudnn_segment_layout():
    """The packed cuDNN path's offsets and lengths from segment ids (-1 where a row has fewer
    segments), and the NaN guard on rows with more segments than laid out."""
    seg, _ = packed_rows([[3, 2, 4], [5], []], 12)
    lengths, offsets = fused._segment_layout(jnp.asarray(seg), 4)
    np.testing.assert_array_equal(lengths, [[3, 2, 4, -1], [5, -1, -1, -1], [-1] * 4])
    np.testing.assert_array_equal(offsets, [[0, 3, 5, -1, -1], [0, -1, -1, -1, -1], [-1] * 5])
    out = jnp.ones((3, 12, 1, 8), jnp.bfloat16)
    guarded = np.asarray(fused._poison_unsupported_rows(out, jnp.asarray(seg), 2), np.float32)
    assert np.isnan(guarded[0]).all() and np.isfinite(guarded[1:]).all()


def test_auto_resolution():
    assert resolve("auto", jnp.float32, 64, platform="cpu") == "xla"
    assert resolve("auto", jnp.bfloat16, 64, platform="cpu") == "xla"
    assert resolve("auto", jnp.bfloat16, 128, platform="gpu") == "cudnn"
    assert resolve("auto", jnp.float16, 64, platform="gpu") == "cudnn"
    assert resolve("auto", jnp.float32, 64, platform="gpu") == "xla"  # cuDNN flash is 16-bit
    assert resolve("auto", jnp.bfloat16, 256, platform="gpu") == "xla"
    assert resolve("auto", jnp.float32, 64, platform="tpu") == "splash"
    assert resolve("xla", jnp.bfloat16, 64, platform="gpu") == "xla"
    # cuDNN carries chunks, sinks and narrower values around its partial (split_merge).
    for needs in ({"chunk": True}, {"sinks": True}, {"value_dim": 32}):
        assert resolve("auto", jnp.bfloat16, 64, platform="gpu", **needs) == "cudnn"
    assert resolve("auto", jnp.bfloat16, 64, platform="tpu", chunk=True) == "splash"
    assert resolve("auto", jnp.bfloat16, 64, platform="tpu", sinks=True) == "splash"
    assert resolve("auto", jnp.bfloat16, 64, platform="tpu", context=2) == "splash"
    # cuDNN across the context axis (gathered keys, or a ring: split and merged).
    assert resolve("auto", jnp.bfloat16, 64, platform="gpu", context=4) == "cudnn"
    ring4 = {"context": 4, "context_attention": "ring"}  # cuDNN's partials round the ring
    assert resolve("auto", jnp.bfloat16, 64, platform="gpu", **ring4) == "cudnn"
    ring = {"context": 2, "context_attention": "ring"}  # splash's partials round the ring
    assert resolve("auto", jnp.bfloat16, 64, platform="tpu", **ring) == "splash"
    assert jax.default_backend() == "cpu"


@pytest.mark.parametrize(
    "setting,needs,message",
    [
        ("cudnn", {"softcap": True}, "cannot soft-cap attention scores"),
        ("cudnn", {"softcap": True, "context": 2, "context_attention": "ring"}, "cannot soft-cap"),
    ],
)
def test_explicit_implementation_refused_in_one_sentence(setting, needs, message):
    with pytest.raises(ConfigError, match=f"model.attention={setting} {message}"):
        resolve(setting, jnp.bfloat16, 64, platform="gpu", **needs)


def test_explicit_cudnn_where_it_cannot_run_is_refused_in_one_sentence(tiny_checkpoint):
    """On devices without cuDNN (this CPU), while the run's attention is resolved for its mesh
    (before any weight is read); a model built abstractly for cuDNN (no devices) still builds."""
    from ppl_jax.checkpoints import architecture, open_checkpoint
    from ppl_jax.runtime import mesh as mesh_lib

    message = r"model.attention=cudnn needs an NVIDIA GPU with cuDNN, .* devices \(cpu\) have none"
    with pytest.raises(ConfigError, match=message):
        resolve("cudnn", jnp.bfloat16, 64, platform="cpu")
    arch = architecture.resolve(open_checkpoint(tiny_checkpoint), 5)
    for context in (1, 2):
        mesh = mesh_lib.make_mesh(-1, 1, context=context)
        with pytest.raises(ConfigError, match=message + ".*model.attention=auto"):
            arch.attention("cudnn", "bfloat16", mesh)
    assert not arch.model("bfloat16", "cudnn").honours_segments
    assert resolve("cudnn", jnp.bfloat16, 64) == "cudnn"  # no platform: not checked


def test_resolve_for_reads_the_family_keys():
    desc = {"embed_dim": 64, "num_heads": 4, "head_dim": 16}
    assert resolve_for("auto", jnp.bfloat16, desc) == "xla"  # on CPU
    assert resolve_for("splash", jnp.bfloat16, {**desc, "attn_chunk": 8192}) == "splash"
    with pytest.raises(ConfigError, match="soft-cap"):
        resolve_for("cudnn", jnp.bfloat16, {**desc, "attn_softcap": 50.0})
    # cuDNN carries chunks, sinks and narrower values around its partial (split_merge).
    for key, value in (("attn_chunk", 8192), ("attn_sinks", True), ("v_head_dim", 32)):
        assert resolve_for("cudnn", jnp.bfloat16, {**desc, key: value}) == "cudnn"


def test_bad_arguments():
    q = jnp.zeros((1, 8, 2, 4))
    ids = jnp.ones((1, 8), jnp.int32)
    with pytest.raises(ValueError, match="window"):
        attend(q, q, q, segment_ids=ids, positions=ids, window=0)
    with pytest.raises(ValueError, match="sinks"):
        attend(q, q, q, segment_ids=ids, positions=ids, sinks=jnp.zeros(3))
    with pytest.raises(ValueError, match="do not fit"):
        attend(q, q[:, :4], q, segment_ids=ids, positions=ids)


def test_splash_kernel_reused_across_traces():
    """The cached splash kernel serves a second trace of the same width (another batch size):
    its mask tables are concrete, not the first trace's tracers."""
    rng = np.random.default_rng(4)
    for b in (1, 2):
        seg = jnp.ones((b, 128), jnp.int32)
        pos = jnp.broadcast_to(jnp.arange(128, dtype=jnp.int32), (b, 128))
        q, k, v = (jnp.asarray(rng.standard_normal((b, 128, 2, 8)), jnp.float32) for _ in range(3))
        fn = jax.jit(
            lambda q, k, v, seg=seg, pos=pos: attend(
                q, k, v, segment_ids=seg, positions=pos, implementation="splash"
            )
        )
        ref = attend(q, k, v, segment_ids=seg, positions=pos, implementation="xla")
        np.testing.assert_allclose(np.asarray(fn(q, k, v)), np.asarray(ref), atol=1e-5)


@pytest.mark.parametrize("width", [1, 7, 256, 300])
def test_pairwise_trees_are_the_reductions(width):
    """The pairwise trees that replace reductions on CPU: the max exactly, the sum to float32
    rounding."""
    x = np.random.default_rng(width).standard_normal((3, 5, width)).astype(np.float32)
    x[0, 0, -1] = -np.inf
    np.testing.assert_array_equal(np.asarray(flash.row_max(jnp.asarray(x))), x.max(axis=-1))
    x[0, 0, -1] = 0.0
    np.testing.assert_allclose(
        np.asarray(flash.row_sum(jnp.asarray(x))), x.astype(np.float64).sum(-1), atol=1e-5
    )
