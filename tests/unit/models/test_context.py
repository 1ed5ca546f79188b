"""The context axis at the layer level (`ppl_jax.models.layers.context`, `attend` under a `context`
mesh): the load-balanced order, attention by all-gather and by ring equal to one device, the
per-token chunks, and the state passes of sequence-carrying layers against a NumPy float64 loop,
on 8 CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec
from test_attention import packed_rows

from ppl_jax.models.layers import context as context_lib
from ppl_jax.models.layers.attention import attend
from ppl_jax.runtime.mesh import make_mesh

MESHES = [(1, 8), (2, 4), (4, 2)]  # (data, context)


def test_load_balanced_order():
    np.testing.assert_array_equal(context_lib.load_balanced_order(8, 2), [0, 1, 6, 7, 2, 3, 4, 5])
    np.testing.assert_array_equal(context_lib.load_balanced_order(6, 1), np.arange(6))
    order = context_lib.load_balanced_order(48, 4)
    np.testing.assert_array_equal(np.sort(order), np.arange(48))
    # Device r holds chunks r and 2N-1-r: every device the same causal work.
    work = [order[r * 12 : (r + 1) * 12].sum() for r in range(4)]
    assert len(set(work)) == 1
    with pytest.raises(ValueError, match="do not split into 8 equal chunks"):
        context_lib.load_balanced_order(20, 4)


def _on_mesh(data, context, fn, *args):
    """`fn(*args)` jitted under a (data, context) mesh, `[B, T, ...]` inputs split over both."""
    mesh = make_mesh(data, 1, context=context)
    spec = NamedSharding(mesh, PartitionSpec("data", "context"))
    with jax.set_mesh(mesh):
        placed = [jax.device_put(a, spec) if a.ndim >= 2 else a for a in map(jnp.asarray, args)]
        return np.asarray(jax.jit(fn)(*placed))


def _case(t=192, seed=0):
    rng = np.random.default_rng(seed)
    seg, pos = packed_rows([[70, 60, 40], [150], [192], [12, 100]], t)
    q = rng.standard_normal((4, t, 4, 8)).astype(np.float32)
    k = rng.standard_normal((4, t, 2, 8)).astype(np.float32)
    v = rng.standard_normal((4, t, 2, 6)).astype(np.float32)
    sinks = rng.standard_normal(4).astype(np.float32)
    return q, k, v, seg, pos, sinks


CONTEXT_MASKS = [{}, {"window": 30, "sinks": True}, {"chunk": 48, "softcap": 2.0}]
CONTEXT_CASES = [
    (2, 4, False, CONTEXT_MASKS[1]),
    (1, 8, True, CONTEXT_MASKS[2]),
]  # the whole grid (every mesh, both ways, every mask): tests/slow/test_context_grid.py


@pytest.mark.parametrize("data,context,ring,mask", CONTEXT_CASES, ids=str)
def test_attend_over_context_equals_one_device(data, context, ring, mask):
    """Packed rows with padding, grouped-query heads, Dv != Dk, in the load-balanced order on
    the mesh: the outputs of one device (row order) to float32 rounding."""
    q, k, v, seg, pos, sinks = _case()
    mask = dict(mask)
    if mask.get("sinks"):
        mask["sinks"] = jnp.asarray(sinks)
    whole = np.asarray(attend(q, k, v, segment_ids=seg, positions=pos, **mask))
    order = context_lib.load_balanced_order(q.shape[1], context)
    settings = context_lib.Settings("ring" if ring else "all_gather")

    def fn(q, k, v, seg, pos):
        with context_lib.settings(settings):
            return attend(q, k, v, segment_ids=seg, positions=pos, **mask)

    out = _on_mesh(data, context, fn, *(x[:, order] for x in (q, k, v, seg, pos)))
    real = seg[:, order] > 0
    np.testing.assert_allclose(out[real], whole[:, order][real], atol=2e-6, rtol=0)


@pytest.mark.slow
def test_splash_over_context_equals_xla():
    """Splash (interpreted) with each chunk's offset in the causal mask, under context=2."""
    q, k, _, seg, pos, sinks = _case(t=512, seed=3)
    seg, pos = packed_rows([[300, 212], [512], [100], [512]], 512)
    kw = {"window": 200, "sinks": jnp.asarray(sinks)}
    whole = np.asarray(attend(q, k, k, segment_ids=seg, positions=pos, **kw))
    order = context_lib.load_balanced_order(512, 2)

    def fn(q, k, seg, pos):
        return attend(q, k, k, segment_ids=seg, positions=pos, implementation="splash", **kw)

    out = _on_mesh(4, 2, fn, *(x[:, order] for x in (q, k, seg, pos)))
    real = seg[:, order] > 0
    np.testing.assert_allclose(out[real], whole[:, order][real], atol=1e-5)


def test_row_not_split_evenly_is_refused():
    q = np.zeros((4, 100, 2, 8), np.float32)
    seg, pos = packed_rows([[100]] * 4, 100)
    fn = jax.jit(lambda q, s, p: attend(q, q, q, segment_ids=s, positions=p))
    with jax.set_mesh(make_mesh(1, 1, context=8)):
        with pytest.raises(ValueError, match="does not split into 2 x 8 chunks"):
            fn(q, seg, pos)


@pytest.mark.parametrize("data,context,chunk", [(8, 1, 0), (8, 1, 7), (2, 4, 7), (2, 4, 1000)])
def test_per_token_in_chunks(data, context, chunk):
    """Per-token work in chunks of each device's tokens (padded where they do not divide) gives
    the whole computation, on the mesh and off it."""
    rng = np.random.default_rng(chunk)
    x = rng.standard_normal((8, 96, 5)).astype(np.float32)
    w = jnp.asarray(rng.standard_normal((5, 3)).astype(np.float32))

    def layer(tree):
        return {"y": jnp.tanh(tree["x"] @ w), "n": jnp.sum(tree["x"], axis=-1)}

    whole = layer({"x": x})

    def fn(x):
        out = context_lib.per_token(layer, {"x": x}, chunk)
        return jnp.concatenate([out["y"], out["n"][..., None]], axis=-1)

    got = _on_mesh(data, context, fn, x)
    expected = np.concatenate([whole["y"], whole["n"][..., None]], axis=-1)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------ sequence-carrying layers


def _toy_scan(inputs, state):
    """`h_t = a_t h_{t-1} + x_t`, reset to `x_t` at a segment start (the state carries the
    last token's segment id); outputs `h_t`."""

    def step(carry, xs):
        h, last = carry
        a, x, seg = xs
        h = jnp.where(seg == last, a * h, 0.0) + x
        return (h, seg), h

    def row(a, x, seg, h, last):
        (h, last), out = jax.lax.scan(step, (h, last), (a, x, seg))
        return out, (h, last)

    out, (h, last) = jax.vmap(row)(inputs["a"], inputs["x"], inputs["seg"], *state)
    return {"h": out}, (h, last)


def _toy_summary(inputs):
    """The chunk's affine map of `h` (with the reset rule): `(A, b, first, last)` per row."""
    a, seg = inputs["a"], inputs["seg"]
    _, (b, last) = _toy_scan(inputs, (jnp.zeros(a.shape[0]), seg[:, 0]))

    def factor(a_row, seg_row):
        # The product of a_t over the chunk, 0 if a segment starts inside it after token 0.
        same = seg_row[1:] == seg_row[:-1]
        return jnp.prod(a_row) * jnp.all(same)

    return jax.vmap(factor)(a, seg), b, seg[:, 0], last


def _toy_combine(s1, s2):
    a1, b1, f1, l1 = s1
    a2, b2, f2, l2 = s2
    keep = (f2 == l1).astype(a1.dtype)
    return a2 * a1 * keep, a2 * b1 * keep + b2, f1, l2


def _toy_apply(summary, state):
    a, b, first, last = summary
    h, prev = state
    return a * jnp.where(first == prev, h, 0.0) + b, last


def _toy_reference(a, x, seg, h0, last0):
    a, x = np.asarray(a, np.float64), np.asarray(x, np.float64)
    out = np.zeros_like(x)
    finals = []
    for r in range(a.shape[0]):
        h, last = float(h0[r]), int(last0[r])
        for t in range(a.shape[1]):
            h = (a[r, t] * h if seg[r, t] == last else 0.0) + x[r, t]
            last = int(seg[r, t])
            out[r, t] = h
        finals.append(h)
    return out, np.asarray(finals)


STATE_CASES = [("pass_state", 2, 4), ("prefix_state", 2, 4), ("pass_state", 1, 8)]


@pytest.mark.parametrize("how,data,context", STATE_CASES)
def test_state_passes_through_the_chunks_in_row_order(how, data, context):
    """A linear recurrence with segment resets over rows in the load-balanced order on the mesh
    equals the NumPy float64 loop over the row (outputs, and the final state)."""
    rng = np.random.default_rng(11)
    t = 64
    seg, _ = packed_rows([[20, 30, 14], [64], [5, 59], [64], [33, 31], [64], [64], [64]], t)
    a = rng.uniform(0.5, 1.0, (8, t)).astype(np.float32)
    x = rng.standard_normal((8, t)).astype(np.float32)
    h0 = rng.standard_normal(8).astype(np.float32)
    last0 = np.where(np.arange(8) % 2, 1, 0).astype(np.int32)  # rows 1, 3, ... continue segment 1
    ref, final_ref = _toy_reference(a, x, seg, h0, last0)
    order = context_lib.load_balanced_order(t, context)

    def fn(a, x, seg, h0, last0):
        inputs = {"a": a, "x": x, "seg": seg}
        if how == "pass_state":
            out, (h, _) = context_lib.pass_state(_toy_scan, inputs, (h0, last0))
        else:
            out, (h, _) = context_lib.prefix_state(
                _toy_scan, _toy_summary, _toy_combine, _toy_apply, inputs, (h0, last0)
            )
        return jnp.concatenate([out["h"], h[:, None]], axis=1)

    mesh = make_mesh(data, 1, context=context)
    rows = NamedSharding(mesh, PartitionSpec("data", "context"))
    with jax.set_mesh(mesh):
        args = [jax.device_put(jnp.asarray(z[:, order]), rows) for z in (a, x, seg)]
        got = np.asarray(jax.jit(fn)(*args, jnp.asarray(h0), jnp.asarray(last0)))
    np.testing.assert_allclose(got[:, :t], ref[:, order], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[:, t], final_ref, rtol=1e-5, atol=1e-5)
    # The resets matter: without them the numbers differ.
    no_reset, _ = _toy_reference(a, x, np.ones_like(seg), h0, np.ones(8, np.int32))
    assert np.abs(no_reset - ref).max() > 0.1
