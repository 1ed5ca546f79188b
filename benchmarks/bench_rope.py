"""Benchmark: RoPE angles in float32 (transformers' arithmetic, `model.rope_angles=float32`)
against exact ones (`exact`) at long positions (issue 23 item 4).

    python -m benchmarks.bench_rope [--figure docs/images/rope_angles.png]

1. The angles: the largest error of `cos` over the frequencies against the float64 cosine of
   the float64 frequencies, at positions 2^0 .. 2^20, for Llama 3.1 8B's rotary (llama3
   scaling, theta 500,000, head_dim 128, `config.json`'s `rope_parameters`).
2. Their effect on the NLL: the demo model (`ppl_jax/demo`, trained on 256-token windows, head
   dim 32, theta 10,000) scores the first 1,000 tokens of a held-out document with its
   positions moved by an offset of 0 or 2^10 .. 2^20. RoPE sees only position differences, so
   in exact arithmetic every offset scores the same; the mean |NLL(offset) - NLL(0)| per token
   and the change of the mean NLL show what float32 angles cost far into a long document (the
   offset stands in for a long window's far end, which a CPU does not reach).
"""

from __future__ import annotations

import argparse
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from ppl_jax.checkpoints import open_checkpoint
from ppl_jax.config import demo_checkpoint_dir, held_out_paths
from ppl_jax.models import LlamaConfig, registry
from ppl_jax.models.layers import rope
from ppl_jax.runtime import DEFAULT_RULES, make_mesh, param_targets
from ppl_jax.scoring import token_stats

POSITIONS = [1 << k for k in range(21)]
OFFSETS = [0] + [1 << k for k in range(10, 21)]
LLAMA31 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}  # fmt: skip


def angle_errors() -> dict[str, list[float]]:
    """Per position, the largest |cos - float64 cos| of Llama 3.1's frequencies, per mode."""
    fields = rope.from_hf(LLAMA31, {"model_type": "llama"}, 128, 131072)
    cfg = LlamaConfig(
        vocab_size=8, embed_dim=512, num_layers=1, num_heads=4, num_kv_heads=4, head_dim=128,
        mlp_dim=8, max_positions=1 << 21, **fields,
    )  # fmt: skip
    pos = jnp.asarray([POSITIONS], jnp.int32)
    p = np.asarray(POSITIONS, np.float64)[:, None]
    truth = np.cos(p * rope.frequencies(cfg, False, np.float64))
    out = {}
    for mode in rope.ANGLES:
        c = dataclasses.replace(cfg, rope_angles=mode)
        cos, _ = jax.jit(lambda x, c=c: rope.cos_sin(x, jnp.ones_like(x), c))(pos)
        out[mode] = np.abs(np.asarray(cos[0], np.float64) - truth).max(axis=1).tolist()
    return out


def nll_drift(num_tokens: int = 1000) -> dict[str, dict[str, list[float]]]:
    """Per mode and offset, the mean |NLL(offset) - NLL(0)| and the change of the mean NLL."""
    ckpt = open_checkpoint(demo_checkpoint_dir())
    step = ckpt.resolve_step(None)
    description = {**ckpt.description(step), "max_positions": 1 << 21}
    with open(held_out_paths().split(",")[0], "rb") as f:
        ids = np.frombuffer(f.read(num_tokens + 1), np.uint8).astype(np.int32)
    inputs, targets = jnp.asarray(ids[None, :-1]), jnp.asarray(ids[None, 1:])
    segments = jnp.ones_like(inputs)
    out = {}
    for mode in rope.ANGLES:
        model = registry.build({**description, "rope_angles": mode}, jnp.float32, "xla")
        target, _ = param_targets(
            model.abstract_params, model.logical_axes, make_mesh(-1, 1),
            DEFAULT_RULES,
        )  # fmt: skip
        params = ckpt.restore(step, target)

        @jax.jit
        def nll(params, offset, model=model):
            positions = offset + jnp.arange(inputs.shape[1], dtype=jnp.int32)[None]
            return token_stats(model.apply(params, inputs, positions, segments), targets).nll

        base = np.asarray(nll(params, 0), np.float64)
        rows = {"mean_abs": [], "mean_change": [], "nll_per_token": float(base.mean())}
        for offset in OFFSETS:
            moved = np.asarray(nll(params, offset), np.float64)
            rows["mean_abs"].append(float(np.abs(moved - base).mean()))
            rows["mean_change"].append(float(moved.mean() - base.mean()))
        out[mode] = rows
    return out


def figure(angles: dict, drift: dict, path: str) -> None:
    """The two panels, written to `path` in the format of its extension (PNG, PDF, SVG)."""
    from ppl_jax.outputs import figures

    fig = figures.new_figure(10.0, 4.0, "the RoPE angle figure")
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for i, mode in enumerate(rope.ANGLES):
        style = dict(marker="o", markersize=3, color=figures.COLORS[i], label=mode)
        left.loglog(POSITIONS, np.maximum(angles[mode], 1e-9), **style)
        right.loglog(OFFSETS[1:], np.maximum(drift[mode]["mean_abs"][1:], 1e-9), **style)
    left.set(xlabel="position", ylabel="max |cos - float64 cos|",
             title="Llama 3.1 8B rotary (llama3 scaling)")  # fmt: skip
    right.set(xlabel="position offset", ylabel="mean |NLL(offset) - NLL(0)|, nats",
              title="demo model, 1,000 tokens moved by an offset")  # fmt: skip
    for ax in (left, right):
        ax.grid(True, **figures.GRID)
        ax.legend(title="model.rope_angles")
    figures.save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--figure", default="", help="write the figure (PNG) here")
    args = parser.parse_args()
    angles, drift = angle_errors(), nll_drift()
    print("position  " + "  ".join(f"{m:>10}" for m in rope.ANGLES))
    for k, p in enumerate(POSITIONS):
        print(f"{p:>8,}  " + "  ".join(f"{angles[m][k]:10.2e}" for m in rope.ANGLES))
    print("\noffset     mean |dNLL| (float32, exact)   mean NLL change (float32, exact)")
    for k, o in enumerate(OFFSETS):
        a = [drift[m]["mean_abs"][k] for m in rope.ANGLES]
        c = [drift[m]["mean_change"][k] for m in rope.ANGLES]
        print(f"{o:>9,}  {a[0]:10.2e} {a[1]:10.2e}        {c[0]:+10.2e} {c[1]:+10.2e}")
    print(f"NLL per token at offset 0: {drift['float32']['nll_per_token']:.5f}")
    if args.figure:
        figure(angles, drift, args.figure)
        print(f"figure: {args.figure}")


if __name__ == "__main__":
    main()
