"""A decoder's layers run as scans over runs of identical layers, the weights stored per layer.

Every decoder of `ppl_jax.models` keeps its layers as a list of modules (`layers/{i}/...` in the
params: the names every checkpoint reader, mapping and description use) and runs them with
`run_layers`. Unrolled, each layer would be its own piece of the compiled program: compile time
grows with depth, and XLA keeps buffers of several layers alive at once (jax-ml/jax#14056: about
one `[T, d]` float32 buffer per layer at long windows). `run_layers` instead finds the layers that
compute the same function (equal `nnx.GraphDef` and weight shapes: the same kind of attention,
window, rotary variant and MLP) and splits the stack into **segments**, each a cycle of `p`
consecutive layers repeated `r` times (`p = 1` for a plain decoder; Gemma 2's sliding and global
layers make `p = 2`, Gemma 3's five sliding and one global `p = 6`; layers that fit no cycle run
alone). A segment runs as one `jax.lax.scan` over its `r` repeats whose body is the cycle's `p`
layers, so the compiled program holds each kind of layer once and the residual stream is the
only thing carried from one layer to the next (MaxText scans a repeating block of
`inhomogeneous_layer_cycle_interval` layers the same way).

Inside the body, repeat `j` takes its layers' weights with a `jax.lax.switch` over the stored
per-layer weights, which XLA runs as a conditional whose branch `j` returns layer `j`'s weights
(a quantized weight kept packed, `ppl_jax.models.layers.packed`, dequantized in its branch):
one layer's weights are copied per step of the scan (as the dynamic slice of a stacked array
would be), never the whole stack, so no stacked copy of the model exists anywhere and the stored
params keep their per-layer names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from ppl_jax.models.layers import packed


@dataclasses.dataclass(frozen=True)
class Segment:
    """Layers `start .. start + period * repeats - 1`: a cycle of `period` layers repeated
    `repeats` times (layer `start + j * period + m` is position `m` of repeat `j`)."""

    start: int
    period: int
    repeats: int

    @property
    def stop(self) -> int:
        return self.start + self.period * self.repeats


def segments(kinds: Sequence[Any], max_period: int = 8) -> list[Segment]:
    """The stack `kinds` (one hashable kind per layer; equal kinds compute the same function) cut
    into segments, greedily from the first layer: at each start, the cycle of at most
    `max_period` layers whose repeats cover the most layers (the shortest among equals); a
    layer no cycle repeats from is a segment of one.

    Returns:
      Segments in order, covering every layer once.
    """
    out, start, n = [], 0, len(kinds)
    while start < n:
        best = Segment(start, 1, 1)
        for period in range(1, min(max_period, n - start) + 1):
            cycle = list(kinds[start : start + period])
            repeats = 1
            while kinds[start + repeats * period : start + (repeats + 1) * period] == cycle:
                repeats += 1
            if repeats > 1 and period * repeats > best.period * best.repeats:
                best = Segment(start, period, repeats)
        out.append(best)
        start = best.stop
    return out


def _floats(state: Any, make: Any = None) -> Any:
    """`state` with each packed quantized weight (`packed.Packed`) as `make(weight)`: its float
    weight (dequantized) by default."""
    make = make or (lambda w: w.value())
    return jax.tree.map(
        lambda x: make(x) if packed.is_packed(x) else x, state, is_leaf=packed.is_packed
    )


def _kind(graphdef: nnx.GraphDef, state: nnx.State) -> tuple[Any, ...]:
    """What decides the function a layer computes: its graph and its weights' float shapes and
    dtypes (a packed weight counts as its float weight: layers of other block types compute the
    same function once dequantized)."""
    state = _floats(state, lambda w: jax.ShapeDtypeStruct(w.shape, w.dtype))
    shapes = tuple((x.shape, jnp.dtype(x.dtype).name) for x in jax.tree.leaves(state))
    return graphdef, jax.tree.structure(state), shapes


def _kind_ids(kinds: list[Any]) -> list[int]:
    """A small integer per kind, equal for equal kinds (by `==`: a graph definition holding a
    dict attribute is not hashable)."""
    unique: list[Any] = []
    ids = []
    for kind in kinds:
        found = next((i for i, u in enumerate(unique) if u == kind), None)
        if found is None:
            unique.append(kind)
            found = len(unique) - 1
        ids.append(found)
    return ids


def run_layers(layers: Sequence[nnx.Module], x: jax.Array, *args: Any) -> jax.Array:
    """`x` through every layer in order, `x = layer(x, *args)`, as scans over the runs of
    identical layers (module docstring).

    Args:
      layers: the decoder's layers; each `layer(x, *args)` returns an array of `x`'s shape and
        dtype (the residual stream) and depends on nothing but its weights and arguments.
      x: the residual stream, `[batch, seq, embed]` in the model's dtype.
      args: what every layer takes beside it (positions, segment ids).

    Returns:
      The residual stream after the last layer, `x`'s shape and dtype.
    """
    split = [nnx.split(layer) for layer in layers]
    for seg in segments(_kind_ids([_kind(g, s) for g, s in split])):
        if seg.repeats == 1:
            for i in range(seg.start, seg.stop):
                x = layers[i](x, *args)
            continue
        graphdefs = [split[seg.start + m][0] for m in range(seg.period)]
        # weights[m][j]: the state of layer `start + j * period + m`.
        weights = tuple(
            tuple(split[seg.start + j * seg.period + m][1] for j in range(seg.repeats))
            for m in range(seg.period)
        )
        # Branch j returns layer j's float weights: a packed weight is dequantized inside its
        # own branch, so the layers of a segment may store other block types (llama.cpp's
        # Q4_K_M mixes Q4_K and Q6_K) and one layer's float weights exist at a time.
        branches = [lambda w, j=j: _floats(w[j]) for j in range(seg.repeats)]

        def body(x, j, graphdefs=graphdefs, weights=weights, branches=branches):
            for graphdef, stored in zip(graphdefs, weights, strict=True):
                layer = nnx.merge(graphdef, jax.lax.switch(j, branches, stored))
                x = layer(x, *args)
            return x, None

        x, _ = jax.lax.scan(body, x, jnp.arange(seg.repeats))
    return x
