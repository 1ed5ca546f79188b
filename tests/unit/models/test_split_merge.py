"""cuDNN's way across the context axis and a long window's chunks of queries
(`ppl_jax.models.layers.split_merge`), tested on the CPU with the flash kernel in cuDNN's place:
each chunk's diagonal block and prefix, merged by log-sum-exp, equal the attention over the whole
row; `attend(implementation="cudnn")` takes that path for rows of one document and the flash kernel
for packed rows."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_attention import packed_rows
from test_context import _on_mesh

from ppl_jax.errors import ConfigError
from ppl_jax.models.layers import context as context_lib
from ppl_jax.models.layers import flash, split_merge
from ppl_jax.models.layers.attention import attend

SCALE = 8**-0.5


def _case(lengths, t=96, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    seg, pos = packed_rows(lengths, t)
    b = len(lengths)
    q = rng.standard_normal((b, t, 4, 8)).astype(dtype)
    k = rng.standard_normal((b, t, 2, 8)).astype(dtype)
    v = rng.standard_normal((b, t, 2, 8)).astype(dtype)
    return q, k, v, seg, pos


@jax.jit
def _whole(q, k, v, seg, pos):
    return attend(q, k, v, segment_ids=seg, positions=pos, scale=SCALE)


@jax.jit
def _lse(q, k, v, seg, pos, k_seg, k_pos):
    return flash.attention_lse(
        q, k, v, seg, pos, k_seg, k_pos, window=None, chunk=None, scale=SCALE, softcap=None
    )


def test_merge_of_partials_is_attention_over_all_keys():
    q, k, v, seg, pos = _case([[96], [60], [96], [1]])
    whole, lse = _lse(q, k, v, seg, pos, seg, pos)
    np.testing.assert_allclose(np.asarray(whole), _whole(q, k, v, seg, pos), atol=1e-6)
    # Keys split at 40: the first part all before queries 40.. (and causal for 0..39).
    lo = _lse(q, k[:, :40], v[:, :40], seg, pos, seg[:, :40], pos[:, :40])
    hi = _lse(q, k[:, 40:], v[:, 40:], seg, pos, seg[:, 40:], pos[:, 40:])
    out, got_lse = split_merge.merge(lo, hi)
    real = seg > 0
    np.testing.assert_allclose(np.asarray(out)[real], np.asarray(whole)[real], atol=1e-6)
    np.testing.assert_allclose(np.asarray(got_lse)[real], np.asarray(lse)[real], atol=1e-5)
    assert np.all(np.isneginf(np.asarray(got_lse)[~real]))
    assert np.all(np.asarray(out)[~real] == 0)


@pytest.mark.parametrize("start", [0, 40, pytest.param(16, marks=pytest.mark.slow), 80])
def test_a_chunk_of_queries_equals_the_whole_row(start):
    """Rows of one document each (one full, one short, one empty), a chunk of 16 queries at
    `start`: diagonal and prefix (one call over the row, the first `start` keys real)."""
    q, k, v, seg, pos = _case([[96], [50], [], [3]])
    one, real = split_merge.one_document(jnp.asarray(seg), jnp.asarray(pos))
    assert bool(one) and real.tolist() == [96, 50, 0, 3]
    out = jax.jit(
        lambda q, k, v, real: split_merge.chunk_of_row(
            q, k, v, start, real, scale=SCALE, partial=split_merge.xla_partial
        )
    )(q[:, start : start + 16], k, v, real)
    expected = np.asarray(_whole(q, k, v, seg, pos))[:, start : start + 16]
    scored = seg[:, start : start + 16] > 0
    np.testing.assert_allclose(np.asarray(out)[scored], expected[scored], atol=1e-6)


def test_one_document_tells_packed_rows():
    seg, pos = packed_rows([[50, 46], [96]], 96)
    assert not bool(split_merge.one_document(jnp.asarray(seg), jnp.asarray(pos))[0])
    seg, pos = packed_rows([[96], [96]], 96)
    pos[1] += 1  # a window that does not start at position 0
    assert not bool(split_merge.one_document(jnp.asarray(seg), jnp.asarray(pos))[0])


@pytest.mark.parametrize("data,context", [(2, 4), pytest.param(1, 8, marks=pytest.mark.slow)])
def test_over_context_equals_one_device(data, context):
    """The split and the merge inside `shard_map` over the context axis (each device's two
    chunks, their prefixes by static slices chosen with `lax.switch`) against one device."""
    q, k, v, seg, pos = _case([[96], [70], [96], [5]])
    order = context_lib.load_balanced_order(96, context)

    def fn(q, k, v, seg, pos):
        def body(q, k, v, seg, pos):
            rows = [context_lib.gather_rows(x, context) for x in (k, v, seg, pos)]
            _, real = split_merge.one_document(rows[2], rows[3])
            return split_merge.over_context(
                q, rows[0], rows[1], real, context, scale=SCALE, partial=split_merge.xla_partial
            )

        return context_lib.shard_over_context(body, q, k, v, seg, pos)

    out = _on_mesh(data, context, fn, *(x[:, order] for x in (q, k, v, seg, pos)))
    real = seg[:, order] > 0
    expected = np.asarray(_whole(q, k, v, seg, pos))[:, order]
    np.testing.assert_allclose(out[real], expected[real], atol=1e-6)


@pytest.fixture
def cudnn_on_cpu(monkeypatch):
    """`attend(implementation="cudnn")`'s split-merge paths with the flash kernel in cuDNN's
    place (the rest of the cuDNN path needs a GPU: tests/gpu)."""
    monkeypatch.setitem(split_merge.PARTIALS, "cudnn", split_merge.xla_partial)


@pytest.mark.parametrize(
    "lengths",
    [
        [[96], [70], [96], [5]],
        pytest.param([[50, 46], [96], [30, 30], [9]], marks=pytest.mark.slow),
    ],
)
def test_attend_cudnn_over_context(cudnn_on_cpu, lengths):
    """Rows of one document take the split-merge; packed rows the flash kernel; both equal one
    device."""
    q, k, v, seg, pos = _case(lengths, dtype=np.float32)
    order = context_lib.load_balanced_order(96, 4)

    def fn(q, k, v, seg, pos):
        return attend(q, k, v, segment_ids=seg, positions=pos, scale=SCALE, implementation="cudnn")

    out = _on_mesh(2, 4, fn, *(x[:, order] for x in (q, k, v, seg, pos)))
    real = seg[:, order] > 0
    expected = np.asarray(_whole(q, k, v, seg, pos))[:, order]
    np.testing.assert_allclose(out[real], expected[real], atol=1e-6)


def test_attend_cudnn_queries_apart(cudnn_on_cpu):
    """A chunk of queries against the row's keys (`attend(kv_segment_ids=...)`), as a long
    window's layer runs it."""
    q, k, v, seg, pos = _case([[96], [70], [96], [5]])
    got = jax.jit(
        lambda q, k, v, seg, pos: attend(
            q[:, 32:64], k, v, segment_ids=seg[:, 32:64], positions=pos[:, 32:64],
            kv_segment_ids=seg, kv_positions=pos, scale=SCALE, implementation="cudnn",
        )
    )(q, k, v, seg, pos)  # fmt: skip
    scored = seg[:, 32:64] > 0
    expected = np.asarray(_whole(q, k, v, seg, pos))[:, 32:64]
    np.testing.assert_allclose(np.asarray(got)[scored], expected[scored], atol=1e-6)


def test_attend_queries_apart_refuses_what_cudnn_cannot_do(cudnn_on_cpu):
    """A chunk of queries apart from its keys takes `attend`'s checks too: cuDNN with a soft-cap
    is refused by name (the split-merge path would have dropped it)."""
    q, k, v, seg, pos = _case([[96], [70], [96], [5]])
    with pytest.raises(ConfigError, match="model.attention=cudnn cannot"):
        attend(
            q[:, 32:64], k, v, segment_ids=seg[:, 32:64], positions=pos[:, 32:64],
            kv_segment_ids=seg, kv_positions=pos, softcap=30.0, implementation="cudnn",
        )  # fmt: skip
