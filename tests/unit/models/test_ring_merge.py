"""The ring over the context axis with a kernel's partial attention
(`ppl_jax.models.layers.ring_merge`), on the CPU with a stand-in for cuDNN's partial:
`attend(implementation="cudnn")` under `model.context_attention=ring`, with sinks and values
narrower than the keys, sliding windows and chunked attention, equals the flash kernel on one
device within 1e-6 at `mesh.context` 2 and 4; rows of one document take the partials, packed rows
the flash ring. The blocks' kinds under a window (`ring_merge.kinds`, `ring_merge.band`) against
the mask by positions, block by block."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_attention import packed_rows
from test_context import _on_mesh
from test_cudnn_cases import ROWS, SINKS, _narrow, _whole
from test_split_merge import SCALE, _case

from ppl_jax.models.layers import attention as attention_lib
from ppl_jax.models.layers import context as context_lib
from ppl_jax.models.layers import flash, ring_merge, split_merge
from ppl_jax.models.layers.attention import attend

PACKED = [[50, 46], [96], [30, 30], [9]]


@pytest.mark.parametrize("context", [2, 4])
def test_one_document_is_the_gathered_rows(context):
    """The devices' check equals `split_merge.one_document` of the whole row."""
    cases = [packed_rows(ROWS, 96), packed_rows(PACKED, 96), packed_rows([[96]] * 4, 96)]
    shifted = packed_rows([[96]] * 4, 96)
    shifted[1][2] += 1  # a window that does not start at position 0
    order = context_lib.load_balanced_order(96, context)

    for seg, pos in [*cases, shifted]:
        expected_ok, expected_real = split_merge.one_document(jnp.asarray(seg), jnp.asarray(pos))
        got = _on_mesh(8 // context, context, _checked(context), seg[:, order], pos[:, order])
        assert bool(got[0, 0]) == bool(expected_ok)
        np.testing.assert_array_equal(got[:, 1], expected_real)


def _checked(context):
    """A function of `(seg, pos)` on the mesh giving `[B, 2]`-per-token `(ok, real)` rows."""

    def fn(seg, pos):
        def body(seg, pos):
            ok, real = ring_merge.one_document(context, seg, pos)
            both = jnp.stack([jnp.broadcast_to(ok.astype(jnp.int32), real.shape), real], axis=1)
            return jnp.broadcast_to(both[:, None, :], seg.shape + (2,))

        return context_lib.shard_over_context(body, seg, pos)

    def first(seg, pos):
        return fn(seg, pos)[:, 0]

    return first


@pytest.mark.parametrize("context", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_attend_cudnn_round_a_ring(monkeypatch, context):
    calls = []

    def partial(*args, **options):
        calls.append(options)
        return split_merge.xla_partial(*args, **options)

    monkeypatch.setitem(split_merge.PARTIALS, "cudnn", partial)
    s = jnp.asarray(SINKS)
    settings = context_lib.Settings("ring")
    order = context_lib.load_balanced_order(96, context)
    for lengths in (ROWS, PACKED):
        q, k, v, seg, pos = _case(lengths)
        v = _narrow(v)

        def fn(q, k, v, seg, pos):
            with context_lib.settings(settings):
                return attend(
                    q, k, v, segment_ids=seg, positions=pos, scale=SCALE, sinks=s,
                    implementation="cudnn",
                )  # fmt: skip

        out = _on_mesh(8 // context, context, fn, *(x[:, order] for x in (q, k, v, seg, pos)))
        real = seg[:, order] > 0
        expected = np.asarray(_whole(q, k, v, seg, pos, s))[:, order]
        np.testing.assert_allclose(out[real], expected[real], atol=1e-6)
    assert calls  # cuDNN's partials ran round the ring
    assert jax.default_backend() == "cpu"


def by_index(q, k, v, q_len, kv_len, *, causal: bool, scale: float, window=None):
    """cuDNN's partial (`split_merge.Partial`) as its masks are written, by index: query `i` of
    the first `q_len` sees key `j` of the first `kv_len` where `j <= i` (causal top-left, whatever
    the lengths) and `i - j < window`; dense, in float32 at `highest`. A real query that sees
    no key (where `kv_len > 0`) gets NaN: what cuDNN gives such a row is not documented, so
    the ring must never ask for one. It stands in for cuDNN in the ring's grids: the flash
    kernel's partial computes the same (0 and `-inf` for such rows), but compiles about four
    times slower in the ring's switch branches."""
    b, length, h, _ = q.shape
    s, kv = k.shape[1], k.shape[2]
    grouped = q.reshape(b, length, kv, h // kv, -1).astype(jnp.float32)
    scores = scale * jnp.einsum(
        "blkgd,bskd->bkgls", grouped, k.astype(jnp.float32), precision="highest"
    )
    i, j = jnp.arange(length)[:, None], jnp.arange(s)[None]
    seen = (i < q_len[:, None, None]) & (j < kv_len[:, None, None])
    seen &= (j <= i) if causal else True
    seen &= (i - j < window) if window is not None else True
    seen = seen[:, None, None]
    lse = jax.nn.logsumexp(jnp.where(seen, scores, -jnp.inf), axis=-1)
    weights = jnp.where(seen, jnp.exp(scores - jnp.where(seen.any(-1), lse, 0.0)[..., None]), 0)
    out = jnp.einsum("bkgls,bskd->blkgd", weights, v.astype(jnp.float32), precision="highest")
    asked = (jnp.arange(length)[None] < q_len[:, None]) & (kv_len > 0)[:, None]
    blind = asked[:, None, None] & ~seen.any(-1)  # [B, 1, 1, L]
    out = jnp.where(blind.transpose(0, 3, 1, 2)[..., None], jnp.nan, out)
    lse = jnp.where(blind, jnp.nan, lse)
    return out.reshape(b, length, h, -1), lse.transpose(0, 3, 1, 2).reshape(b, length, h)


@functools.partial(jax.jit, static_argnames=("window", "chunk"))
def _one_device(q, k, v, seg, pos, sinks=None, window=None, chunk=None):
    """The flash kernel over the whole row (the reference), compiled once per mask."""
    return flash.flash_attention(
        q, k, v, seg, pos, seg, pos, window=window, chunk=chunk, sinks=sinks, scale=SCALE,
        softcap=None,
    )  # fmt: skip


T = 32  # chunks of L = 8 tokens at context 2, 4 at context 4
RAGGED = [[T], [T - 5], [9], [1]]  # one document each, padding at the end


def _ring_case(context, lengths=RAGGED, **mask):
    """`ring_merge.ring` (the `by_index` partial, sinks and narrow values) over `mesh.context =
    context` against the flash kernel over the whole row, on the real tokens."""
    q, k, v, seg, pos = _case(lengths, t=T)
    v = _narrow(v)
    s = jnp.asarray(SINKS)
    order = context_lib.load_balanced_order(T, context)

    def fn(q, k, v, seg, pos):
        def body(q, k, v, seg, pos):
            one, real = ring_merge.one_document(context, seg, pos)
            out = ring_merge.ring(
                context, q, k, v, real, scale=SCALE, partial=by_index, sinks=s, **mask
            )
            return jnp.where(one, out, jnp.nan)

        return context_lib.shard_over_context(body, q, k, v, seg, pos)

    out = _on_mesh(8 // context, context, fn, *(x[:, order] for x in (q, k, v, seg, pos)))
    real = seg[:, order] > 0
    expected = np.asarray(_one_device(q, k, v, seg, pos, s, **mask))[:, order]
    np.testing.assert_allclose(out[real], expected[real], atol=1e-6, rtol=0)


def _slow(*cases):
    return [pytest.param(*c, marks=pytest.mark.slow) for c in cases]


@pytest.mark.parametrize(
    "context,window",
    # The default tier: 12 at context 2 (two bands), by `attend` (the test of windows and chunks)
    _slow(*((2, w) for w in (1, 5, 8, 9, 12, 19, 37)), *((4, w) for w in (3, 4, 5, 6, 11, 37))),
)
def test_ring_with_a_window_equals_the_whole_row(context, window):
    """Sliding windows against chunks of `L` (8 at context 2, 4 at 4): smaller than `L`, `L`,
    `L + 1`, spanning several chunks, longer than the row."""
    _ring_case(context, window=window)


@pytest.mark.parametrize(
    "context,chunk",
    [(2, 16), (2, 4)] + _slow((2, 8), (2, 32), (2, 1), (4, 8), (4, 16), (4, 2), (4, 4)),
)
def test_ring_with_chunks_equals_the_whole_row(context, chunk):
    """Chunked attention (Llama 4) of a multiple of the ring's chunks of `L` (a key chunk in the
    queries' attention chunk all visible, the others unseen) or a divisor of it (the diagonal
    block reshaped into its attention chunks)."""
    _ring_case(context, chunk=chunk)


def test_ring_refuses_chunks_it_cannot_split():
    """Chunks that neither hold nor divide the ring's chunks, or come with a window: the flash
    kernel's ring (`kernels._cudnn_ring`); `ring` itself refuses them."""
    q = jnp.zeros((1, 16, 4, 8))
    for mask in (dict(chunk=6), dict(chunk=16, window=4)):
        with pytest.raises(ValueError, match="ring: chunked attention of"):
            ring_merge.ring(2, q, q, q, jnp.zeros(1), scale=1.0, partial=by_index, **mask)


@pytest.mark.parametrize("n,length", [(2, 8), (4, 4), (3, 5)])
def test_the_blocks_kinds_are_the_mask_by_positions(n, length):
    """For every window up to past the row and every pair of chunks, the block's kind (none, the
    diagonal, all, or a band: `band`'s placed causal call with its window, by index) equals the
    mask by positions `p - window < k <= p`, in NumPy."""
    t = 2 * n * length
    local = np.arange(length)
    for window in range(1, t + 3):
        bands, branch = ring_merge.kinds(n, length, window)
        assert len(bands) <= 2
        for i_a in range(2 * n):
            for i_b in range(2 * n):
                p, k = i_a * length + local[:, None], i_b * length + local[None]
                mask = (k <= p) & (p - k < window)
                kind = branch[i_a - i_b + 2 * n - 1]
                if kind == ring_merge.NONE:
                    assert not mask.any()
                elif kind == ring_merge.DIAGONAL:
                    assert i_a == i_b
                elif kind == ring_merge.WHOLE:
                    assert mask.all()
                else:  # queries at rows L - 1 + i, keys at j: causal, with the band's window
                    row = length - 1 + local[:, None]
                    width = bands[kind - 3]
                    placed = (local[None] <= row) & (row - local[None] < width)
                    np.testing.assert_array_equal(placed, mask)
                    assert mask.any() and not mask.all()


def _nan_ring(n, q, k, v, seg, pos, mask):
    """The flash kernel's ring replaced: NaN, which rows of one document must never reach."""
    return jnp.full(q.shape[:3] + v.shape[3:], jnp.nan, q.dtype)


PACKED_T = [[20, 12], [T], [5, 5], [1]]


@pytest.mark.parametrize(
    "mask,lengths",
    [(dict(window=12), RAGGED)]
    + _slow((dict(chunk=16), RAGGED), (dict(window=12), PACKED_T), (dict(chunk=4), PACKED_T)),
    ids=str,
)
def test_attend_cudnn_round_a_ring_with_windows_and_chunks(monkeypatch, mask, lengths):
    """`attend(implementation="cudnn")` round the ring at context 2 with a sliding window or
    chunks, sinks and narrow values: rows of one document take cuDNN's partials (a band's call
    among them; the flash kernel's ring replaced by NaN), a batch with packed rows the flash
    kernel's ring; both equal one device."""
    calls = []

    def partial(*args, **options):
        calls.append(options)
        return by_index(*args, **options)

    monkeypatch.setitem(split_merge.PARTIALS, "cudnn", partial)
    if all(len(row) <= 1 for row in lengths):
        monkeypatch.setattr(attention_lib, "_ring", _nan_ring)
    settings = context_lib.Settings("ring")
    order = context_lib.load_balanced_order(T, 2)
    s = jnp.asarray(SINKS)
    q, k, v, seg, pos = _case(lengths, t=T)
    v = _narrow(v)

    def fn(q, k, v, seg, pos):
        with context_lib.settings(settings):
            return attend(
                q, k, v, segment_ids=seg, positions=pos, scale=SCALE, sinks=s,
                implementation="cudnn", **mask,
            )  # fmt: skip

    out = _on_mesh(4, 2, fn, *(x[:, order] for x in (q, k, v, seg, pos)))
    real = seg[:, order] > 0
    expected = np.asarray(_one_device(q, k, v, seg, pos, s, **mask))[:, order]
    np.testing.assert_allclose(out[real], expected[real], atol=1e-6, rtol=0)
    assert calls  # cuDNN's partials ran round the ring
    if "window" in mask:  # a band: a causal call with queries after their keys
        assert any(o["causal"] and o.get("window") for o in calls)
