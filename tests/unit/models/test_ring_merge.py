"""The ring over the context axis with a kernel's partial attention
(`ppl_jax.models.layers.ring_merge`), on the CPU with the flash kernel's partial in cuDNN's
place: `attend(implementation="cudnn")` under `model.context_attention=ring`, with sinks and
values narrower than the keys, equals the flash kernel on one device within 1e-6 at
`mesh.context` 2 and 4; rows of one document take the partials, packed rows the flash ring."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_attention import packed_rows
from test_context import _on_mesh
from test_cudnn_cases import ROWS, SINKS, _narrow, _whole
from test_split_merge import SCALE, _case

from ppl_jax.models.layers import context as context_lib
from ppl_jax.models.layers import ring_merge, split_merge
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
