"""The cases cuDNN carries as a transformation around its partial attention
(`ppl_jax.models.layers.split_merge`: `with_sinks`, `equal_widths`), tested on the CPU with the
flash kernel's partial in cuDNN's place against the flash kernel over the whole row, within 1e-6
in float32: learned sinks (GPT-OSS) added once after the merge, values narrower than the keys
(DeepSeek's MLA) padded, chunked attention (Llama 4) as the row reshaped into its chunks; on one
device, for a long window's chunk of queries, and over
`mesh.context` 2 and 4. The real cuDNN comparisons: tests/gpu/test_cudnn.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_context import _on_mesh
from test_split_merge import SCALE, _case, cudnn_on_cpu  # noqa: F401 (a fixture)

from ppl_jax.models.layers import context as context_lib
from ppl_jax.models.layers import flash, split_merge
from ppl_jax.models.layers.attention import attend

ROWS = [[96], [70], [96], [5]]
SINKS = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
SLOW_STARTS = [pytest.param(start, marks=pytest.mark.slow) for start in (16, 80)]


def _narrow(v):
    return v[..., :4]  # values 4 wide, keys 8


def _whole(q, k, v, seg, pos, sinks, chunk=None, window=None):
    """The flash kernel over the whole row (the reference), by the mask of positions."""
    return jax.jit(
        lambda *a: flash.flash_attention(
            *a, seg, pos, window=window, chunk=chunk, sinks=sinks, scale=SCALE, softcap=None
        )
    )(q, k, v, seg, pos)


def test_the_sink_epilogue_is_the_sink_in_the_denominator():
    """`out * sigmoid(lse - s)`, `logaddexp(lse, s)` against the softmax with the sink's logit
    as one more key of value 0 (NumPy float64); a query without keys gets 0 and `s`."""
    rng = np.random.default_rng(1)
    scores = rng.standard_normal((3, 5))
    values = rng.standard_normal((5, 2))
    s = np.array([0.3, -2.0, 1.5])
    lse = np.log(np.exp(scores).sum(-1))
    out = (np.exp(scores - lse[:, None]) @ values)[None, :, None]  # [1, 3, 1, 2]
    got, got_lse = split_merge.with_sinks(
        jnp.asarray(out.transpose(0, 2, 1, 3).reshape(1, 1, 3, 2), jnp.float32),
        jnp.asarray(lse[None, None], jnp.float32),
        jnp.asarray(s, jnp.float32),
    )
    denom = np.exp(scores).sum(-1) + np.exp(s)
    expected = (np.exp(scores) @ values) / denom[:, None]
    np.testing.assert_allclose(np.asarray(got)[0, 0], expected, atol=1e-6)
    np.testing.assert_allclose(np.asarray(got_lse)[0, 0], np.log(denom), atol=1e-6)
    empty = split_merge.with_sinks(jnp.zeros((1, 1, 3, 2)), jnp.full((1, 1, 3), -jnp.inf), s)
    assert np.all(np.asarray(empty[0]) == 0) and np.allclose(np.asarray(empty[1]), s)


@pytest.mark.parametrize("sinks,narrow", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("start", [0, 40])
def test_a_chunk_of_queries_with_sinks_or_narrow_values(sinks, narrow, start):
    q, k, v, seg, pos = _case(ROWS)
    v = _narrow(v) if narrow else v
    s = jnp.asarray(SINKS) if sinks else None
    _, real = split_merge.one_document(jnp.asarray(seg), jnp.asarray(pos))
    out = jax.jit(
        lambda q, k, v, real, s: split_merge.chunk_of_row(
            q, k, v, start, real, scale=SCALE, partial=split_merge.xla_partial, sinks=s
        )
    )(q[:, start : start + 16], k, v, real, s)
    assert out.shape[-1] == v.shape[-1]
    expected = np.asarray(_whole(q, k, v, seg, pos, s))[:, start : start + 16]
    scored = seg[:, start : start + 16] > 0
    np.testing.assert_allclose(np.asarray(out)[scored], expected[scored], atol=1e-6)


@pytest.mark.parametrize("context", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_over_context_adds_the_sinks_once_after_the_merge(context):
    """Sinks and narrow values over the context axis: each chunk's diagonal and prefixes merged,
    then the epilogue once; the flash kernel on one device the reference. Applied per partial
    the sink would count twice in every chunk with a prefix."""
    q, k, v, seg, pos = _case(ROWS)
    v = _narrow(v)
    order = context_lib.load_balanced_order(96, context)
    s = jnp.asarray(SINKS)

    def fn(q, k, v, seg, pos):
        def body(q, k, v, seg, pos):
            rows = [context_lib.gather_rows(x, context) for x in (k, v, seg, pos)]
            _, real = split_merge.one_document(rows[2], rows[3])
            return split_merge.over_context(
                q, rows[0], rows[1], real, context, scale=SCALE, partial=split_merge.xla_partial,
                sinks=s,
            )  # fmt: skip

        return context_lib.shard_over_context(body, q, k, v, seg, pos)

    out = _on_mesh(8 // context, context, fn, *(x[:, order] for x in (q, k, v, seg, pos)))
    real = seg[:, order] > 0
    expected = np.asarray(_whole(q, k, v, seg, pos, s))[:, order]
    np.testing.assert_allclose(out[real], expected[real], atol=1e-6)


@pytest.mark.parametrize("context", [1, 2, pytest.param(4, marks=pytest.mark.slow)])
def test_attend_cudnn_with_sinks_and_narrow_values(cudnn_on_cpu, context):  # noqa: F811
    """`attend(implementation="cudnn")` with sinks and values narrower than the keys: rows of one
    document through the partials and the epilogue, packed rows (the second case) through the
    flash kernel; both equal `xla` on one device."""
    for lengths in (ROWS, [[50, 46], [96], [30, 30], [9]]):
        q, k, v, seg, pos = _case(lengths)
        v = _narrow(v)
        s = jnp.asarray(SINKS)
        order = context_lib.load_balanced_order(96, context) if context > 1 else np.arange(96)

        def fn(q, k, v, seg, pos, s=s):
            return attend(
                q, k, v, segment_ids=seg, positions=pos, scale=SCALE, sinks=s,
                implementation="cudnn",
            )  # fmt: skip

        args = [x[:, order] for x in (q, k, v, seg, pos)]
        out = (
            np.asarray(jax.jit(fn)(*args))
            if context == 1
            else _on_mesh(8 // context, context, fn, *args)
        )
        real = seg[:, order] > 0
        expected = np.asarray(_whole(q, k, v, seg, pos, s))[:, order]
        np.testing.assert_allclose(out[real], expected[real], atol=1e-6)


@pytest.mark.parametrize("chunk", [32, 40, 128])
def test_chunks_reshaped_into_rows_are_the_chunk_mask(chunk):
    """`[B, T]` -> `[B * T/C, C]`, one causal call (the row padded to a multiple of the chunk;
    a chunk longer than the row: the row), with sinks and narrow values, against the flash
    kernel's chunk mask over the whole row."""
    q, k, v, seg, pos = _case(ROWS)
    v = _narrow(v)
    s = jnp.asarray(SINKS)
    _, real = split_merge.one_document(jnp.asarray(seg), jnp.asarray(pos))
    out = jax.jit(
        lambda q, k, v, real: split_merge.chunked_rows(
            q, k, v, real, chunk, scale=SCALE, partial=split_merge.xla_partial, sinks=s
        )
    )(q, k, v, real)
    expected = np.asarray(_whole(q, k, v, seg, pos, s, chunk))
    real = seg > 0
    np.testing.assert_allclose(np.asarray(out)[real], expected[real], atol=1e-6)
    unchunked = np.asarray(_whole(q, k, v, seg, pos, s))
    assert chunk > 96 or np.abs(unchunked[real] - expected[real]).max() > 1e-2  # the mask matters


@pytest.mark.parametrize("context", [1, 2])
def test_attend_cudnn_with_chunks(cudnn_on_cpu, context):  # noqa: F811
    """`attend(implementation="cudnn", chunk=...)`: one device reshapes rows of one document
    into their chunks (packed rows: the flash kernel); over the context axis the flash kernel.
    Both equal the flash kernel on one device."""
    for lengths in (ROWS, [[50, 46], [96], [30, 30], [9]]):
        q, k, v, seg, pos = _case(lengths)
        order = context_lib.load_balanced_order(96, context) if context > 1 else np.arange(96)

        def fn(q, k, v, seg, pos):
            return attend(
                q, k, v, segment_ids=seg, positions=pos, scale=SCALE, chunk=40,
                implementation="cudnn",
            )  # fmt: skip

        args = [x[:, order] for x in (q, k, v, seg, pos)]
        out = (
            np.asarray(jax.jit(fn)(*args))
            if context == 1
            else _on_mesh(8 // context, context, fn, *args)
        )
        real = seg[:, order] > 0
        expected = np.asarray(_whole(q, k, v, seg, pos, None, 40))[:, order]
        np.testing.assert_allclose(out[real], expected[real], atol=1e-6)


@pytest.mark.parametrize("window", [None, 1, 17])
def test_the_whole_row_with_a_window_sinks_and_narrow_values(monkeypatch, window):
    """One device: one causal call of the partial over the row with the window (GPT-OSS's
    sliding layers with their sinks), then the epilogue; and `attend(implementation="cudnn")`
    taking it (the partial called with the window) for rows of one document, the flash kernel
    for packed rows."""
    windows = []

    def partial(*args, **options):
        windows.append(options.get("window"))
        return split_merge.xla_partial(*args, **options)

    monkeypatch.setitem(split_merge.PARTIALS, "cudnn", partial)
    s = jnp.asarray(SINKS)
    for lengths in (ROWS, [[50, 46], [96], [30, 30], [9]]):
        q, k, v, seg, pos = _case(lengths)
        v = _narrow(v)
        expected = np.asarray(_whole(q, k, v, seg, pos, s, window=window))
        real = seg > 0
        got = jax.jit(
            lambda q, k, v, seg, pos: attend(
                q, k, v, segment_ids=seg, positions=pos, scale=SCALE, sinks=s, window=window,
                implementation="cudnn",
            )
        )(q, k, v, seg, pos)  # fmt: skip
        np.testing.assert_allclose(np.asarray(got)[real], expected[real], atol=1e-6)
    assert windows and set(windows) == {window}  # cuDNN's partial ran, with the window
    q, k, v, seg, pos = _case(ROWS)
    _, lengths = split_merge.one_document(jnp.asarray(seg), jnp.asarray(pos))
    out = jax.jit(
        lambda q, k, v: split_merge.whole_row(
            q, k, v, lengths, scale=SCALE, partial=split_merge.xla_partial, sinks=s, window=window
        )
    )(q, k, v)
    expected = np.asarray(_whole(q, k, v, seg, pos, s, window=window))
    np.testing.assert_allclose(np.asarray(out)[seg > 0], expected[seg > 0], atol=1e-6)


@pytest.mark.parametrize("window", [1, 17, 200])
@pytest.mark.parametrize("start", [0, 40, *SLOW_STARTS])
def test_a_chunk_of_queries_with_a_window_is_one_causal_call(window, start):
    """The chunk's queries at their offset in a block with the `window - 1` keys before them:
    one causal call with the window, the prefix's band included; against the whole row."""
    q, k, v, seg, pos = _case(ROWS)
    v = _narrow(v)
    s = jnp.asarray(SINKS)
    _, real = split_merge.one_document(jnp.asarray(seg), jnp.asarray(pos))
    out = jax.jit(
        lambda q, k, v, real, start: split_merge.chunk_of_row(
            q, k, v, start, real, scale=SCALE, partial=split_merge.xla_partial, sinks=s,
            window=window,
        )
    )(q[:, start : start + 16], k, v, real, jnp.int32(start))  # fmt: skip
    expected = np.asarray(_whole(q, k, v, seg, pos, s, window=window))[:, start : start + 16]
    scored = seg[:, start : start + 16] > 0
    np.testing.assert_allclose(np.asarray(out)[scored], expected[scored], atol=1e-6)


@pytest.mark.parametrize("context", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_attend_cudnn_with_a_window_over_context_and_queries_apart(monkeypatch, context):
    """A window with sinks on the split paths: over the context axis (each chunk one windowed
    call) and a long window's chunk of queries apart from its keys; cuDNN's partial (the flash
    one in its place) runs with the window, and both equal the flash kernel on one device."""
    windows = []

    def partial(*args, **options):
        windows.append(options.get("window"))
        return split_merge.xla_partial(*args, **options)

    monkeypatch.setitem(split_merge.PARTIALS, "cudnn", partial)
    q, k, v, seg, pos = _case(ROWS)
    s = jnp.asarray(SINKS)
    expected = np.asarray(_whole(q, k, v, seg, pos, s, window=30))
    order = context_lib.load_balanced_order(96, context)

    def fn(q, k, v, seg, pos):
        return attend(
            q, k, v, segment_ids=seg, positions=pos, scale=SCALE, sinks=s, window=30,
            implementation="cudnn",
        )  # fmt: skip

    out = _on_mesh(8 // context, context, fn, *(x[:, order] for x in (q, k, v, seg, pos)))
    real = seg[:, order] > 0
    np.testing.assert_allclose(out[real], expected[:, order][real], atol=1e-6)
    got = jax.jit(
        lambda q, k, v, seg, pos: attend(
            q[:, 32:64], k, v, segment_ids=seg[:, 32:64], positions=pos[:, 32:64],
            kv_segment_ids=seg, kv_positions=pos, scale=SCALE, sinks=s, window=30,
            implementation="cudnn",
        )
    )(q, k, v, seg, pos)  # fmt: skip
    scored = seg[:, 32:64] > 0
    np.testing.assert_allclose(np.asarray(got)[scored], expected[:, 32:64][scored], atol=1e-6)
    assert windows and set(windows) == {30}


@pytest.mark.parametrize("chunk", [16, 32, 48, 8, 24])
@pytest.mark.parametrize("start", [0, 48, *SLOW_STARTS])
def test_a_chunk_of_queries_with_chunked_attention(chunk, start):
    """16 queries at a multiple of 16: inside one attention chunk (16, 32, 48: the diagonal
    and the prefix from the chunk's first key) or holding whole ones (8: reshaped); 24 fits
    neither (`chunks_fit`); against the whole row's chunk mask."""
    assert split_merge.chunks_fit(16, chunk) == (chunk != 24)
    if chunk == 24:
        return
    q, k, v, seg, pos = _case(ROWS)
    v = _narrow(v)
    s = jnp.asarray(SINKS)
    _, real = split_merge.one_document(jnp.asarray(seg), jnp.asarray(pos))
    out = jax.jit(
        lambda q, k, v, real, start: split_merge.chunk_of_row(
            q, k, v, start, real, scale=SCALE, partial=split_merge.xla_partial, sinks=s,
            chunk=chunk,
        )
    )(q[:, start : start + 16], k, v, real, jnp.int32(start))  # fmt: skip
    expected = np.asarray(_whole(q, k, v, seg, pos, s, chunk=chunk))[:, start : start + 16]
    scored = seg[:, start : start + 16] > 0
    np.testing.assert_allclose(np.asarray(out)[scored], expected[scored], atol=1e-6)


@pytest.mark.parametrize(
    "context,chunk", [(2, 48), (4, 12), pytest.param(4, 36, marks=pytest.mark.slow)]
)
def test_attend_cudnn_with_chunks_over_context_and_queries_apart(monkeypatch, context, chunk):
    """Chunked attention on the split paths: over the context axis (chunks of 24 or 12 queries
    per device; 36 fits neither and takes the flash kernel) and a chunk of 24 queries apart
    from its keys (36 again the flash kernel); all equal the flash kernel on one device."""
    calls = []

    def partial(*args, **options):
        calls.append(options)
        return split_merge.xla_partial(*args, **options)

    monkeypatch.setitem(split_merge.PARTIALS, "cudnn", partial)
    q, k, v, seg, pos = _case(ROWS)
    s = jnp.asarray(SINKS)
    expected = np.asarray(_whole(q, k, v, seg, pos, s, chunk=chunk))
    order = context_lib.load_balanced_order(96, context)

    def fn(q, k, v, seg, pos):
        return attend(
            q, k, v, segment_ids=seg, positions=pos, scale=SCALE, sinks=s, chunk=chunk,
            implementation="cudnn",
        )  # fmt: skip

    out = _on_mesh(8 // context, context, fn, *(x[:, order] for x in (q, k, v, seg, pos)))
    real = seg[:, order] > 0
    np.testing.assert_allclose(out[real], expected[:, order][real], atol=1e-6)
    assert bool(calls) == split_merge.chunks_fit(96 // (2 * context), chunk)
    calls.clear()
    got = jax.jit(
        lambda q, k, v, seg, pos: attend(
            q[:, 24:48], k, v, segment_ids=seg[:, 24:48], positions=pos[:, 24:48],
            kv_segment_ids=seg, kv_positions=pos, scale=SCALE, sinks=s, chunk=chunk,
            implementation="cudnn",
        )
    )(q, k, v, seg, pos)  # fmt: skip
    scored = seg[:, 24:48] > 0
    np.testing.assert_allclose(np.asarray(got)[scored], expected[:, 24:48][scored], atol=1e-6)
    assert bool(calls) == split_merge.chunks_fit(24, chunk)
