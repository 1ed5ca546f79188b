"""The device checks' `families` part: each golden family's shape (`tests/golden/families/`:
its few layers and layer pattern) at its released model's widths (`benchmarks.shapes.RELEASED`),
random weights, one row of `--seq_len` tokens (8,192) in bfloat16 under `model.attention=auto`:
tokens/s, model FLOPs utilisation and the kernel each kind of attention layer ran. One JSON.

    python -m benchmarks.families_check                        # every family, on the device
    python -m benchmarks.families_check --tiny --out=/tmp/f.json   # golden widths, 64 tokens (CPU)

FLOPs per token (the PaLM convention, as `benchmarks.bench_long_gpu`): 2 x the matrix-product
parameters a token passes through (every weight of two or more dimensions; an expert's weights
(the stacked [experts, in, out] MLP weights) by its share of the routing, top-k / experts; the input embedding table counted once, as the
head, when tied, else not: a lookup) + 2 x 2 x layers-with-attention x keys x heads x head
width for the scores and the weighted values, with the mean causal keys (T + 1) / 2 per query;
windows and chunks not discounted. MFU: that times tokens/s over the device's dense bfloat16
peak (`PEAK_BF16`, by `device_kind`; null where unknown, as on CPU).

`--families=llama_8b` scores the Llama 3.1 8B shape (all 32 layers) the same way (`tpu_check`).
Each family within what is left of `--seconds` (compile and two steps); the families not reached
are listed in `skipped`, a family that fails records its error and the rest go on.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

from absl import app, flags

from benchmarks.shapes import LLAMA_8B, RELEASED

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAMILY_DIR = os.path.join(ROOT, "tests", "golden", "families")
# Dense bfloat16 peak FLOP/s by `device_kind` substring, first match: NVIDIA's SXM parts, and the
# TPU generations (`TPU v5 lite` is v5e, `TPU v5` v5p, `TPU v6 lite` v6e).
PEAK_BF16 = (
    ("H100", 989e12),
    ("H200", 989e12),
    ("v6 lite", 918e12),
    ("v6e", 918e12),
    ("v5 lite", 197e12),
    ("v5e", 197e12),
    ("v5p", 459e12),
    ("TPU v5", 459e12),
)
TINY_SEQ = 64
# `--families=llama_8b`: the Llama 3.1 8B shape (`benchmarks.shapes.LLAMA_8B`), and its tiny mode
# at the golden models' widths.
LLAMA_8B_TINY = dict(LLAMA_8B, vocab_size=320, embed_dim=32, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=8, mlp_dim=64)  # fmt: skip


def peak_flops(kind: str) -> float | None:
    """The dense bfloat16 peak FLOP/s of a device of `device_kind` `kind`, or None."""
    return next((v for k, v in PEAK_BF16 if k in kind), None)


def families() -> list[str]:
    """The golden families, sorted."""
    return sorted(f for f in os.listdir(FAMILY_DIR) if os.path.isdir(os.path.join(FAMILY_DIR, f)))


def description(family: str, tiny: bool, seq_len: int) -> tuple[dict[str, Any], str]:
    """The family's architecture description at its released widths (golden ones when `tiny` or
    when `RELEASED` has none), with positions for `seq_len` tokens; and which widths. `llama_8b`:
    `LLAMA_8B` (`LLAMA_8B_TINY` when `tiny`)."""
    from ppl_jax.checkpoints.formats import safetensors

    if family == "llama_8b":  # not a golden family: the 8B shape of `benchmarks.shapes`
        from ppl_jax.models import LlamaConfig

        return LlamaConfig(**(LLAMA_8B_TINY if tiny else LLAMA_8B)).to_dict(), (
            "golden" if tiny else "released"
        )
    path = os.path.join(FAMILY_DIR, family)
    config = safetensors.read_config(path)
    widths = "golden" if tiny or family not in RELEASED else "released"
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    if widths == "released":
        text.update(RELEASED[family])
    text["max_position_embeddings"] = max(int(text.get("max_position_embeddings", 0)), seq_len + 1)
    return safetensors.read_description(path, config), widths


def flops_per_token(model: Any, d: dict[str, Any], seq_len: int) -> float:
    """The module docstring's convention, of the abstract params and the description `d`."""
    import jax

    share = d.get("moe_top_k", 0) / d["moe_experts"] if d.get("moe_experts") else 1.0
    matmul = 0.0
    for path, leaf in jax.tree_util.tree_leaves_with_path(model.abstract_params):
        name = jax.tree_util.keystr(path).lower()
        if len(leaf.shape) < 2 or ("embed" in name and not d.get("tie_embeddings")):
            continue
        routed = (  # the experts' stacked [experts, in, out] MLP weights, not the shared one's
            len(leaf.shape) == 3
            and leaf.shape[0] == d.get("moe_experts")
            and "mlp" in name
            and "shared" not in name
        )
        matmul += math.prod(leaf.shape) * (share if routed else 1.0)
    from ppl_jax.models.layers import kernels

    kinds = d.get("layer_kinds")
    attn_layers = (
        kinds.count("attention")
        if kinds
        else d["num_layers"] - len(d.get("linear_layers") or ())
        if kernels.head_dim(d)
        else 0
    )
    width = (d.get("num_heads") or 0) * (kernels.head_dim(d) or 0)
    return 2 * matmul + 2 * 2 * attn_layers * width * (seq_len + 1) / 2


def attention_of(d: dict[str, Any], platform: str, dtype: Any) -> dict[str, Any]:
    """What `model.attention=auto` runs for description `d` on `platform`: `attention` (the
    resolved name), `attention_layers` (the kernel per kind of layer) and `attention_note`, as
    results.json names them."""
    from ppl_jax.models.layers import attention

    return {
        "attention": attention.resolve_for("auto", dtype, d, platform=platform),
        "attention_layers": attention.layer_kernels("auto", dtype, d, platform=platform),
        "attention_note": attention.flash_note("auto", dtype, d, platform=platform),
    }


def score(d: dict[str, Any], seq_len: int, dtype: str = "bfloat16") -> dict[str, Any]:
    """One row of `seq_len` tokens through a random model of description `d` under `auto`:
    tokens/s of the second step, MFU, the kernel per kind of layer."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from ppl_jax.config.defaults import DEFAULT_RULES
    from ppl_jax.models import registry
    from ppl_jax.runtime import mesh as mesh_lib
    from ppl_jax.scoring import Scorer, StepOptions

    dt = jnp.dtype(dtype)
    kernels = attention_of(d, jax.devices()[0].platform, dt)
    model = registry.build(d, dt, kernels["attention"])
    mesh = mesh_lib.make_mesh(1, 1, devices=jax.devices()[:1])
    shardings = mesh_lib.param_shardings(
        model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES
    )
    params = jax.jit(
        lambda k: jax.tree.map(
            lambda a: (0.02 * jax.random.normal(k, a.shape, jnp.float32)).astype(a.dtype),
            model.abstract_params,
        ),
        out_shardings=shardings,
    )(jax.random.key(0))
    scorer = Scorer(model, mesh, shardings, StepOptions())
    t = seq_len
    tokens = np.random.default_rng(0).integers(0, d["vocab_size"], (1, t + 1)).astype(np.int32)
    batch = {
        "tokens": tokens,
        "target_mask": np.arange(t + 1)[None] > 0,
        "segment_ids": np.ones((1, t + 1), np.int32),
        "positions": np.arange(t + 1, dtype=np.int32)[None],
    }
    batch = {k: jax.device_put(v, scorer.batch_sharding) for k, v in batch.items()}
    t0 = time.perf_counter()
    compiled = scorer.compiled(1, t + 1)
    jax.block_until_ready(compiled(params, batch))
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    sums = jax.block_until_ready(compiled(params, batch))
    seconds = time.perf_counter() - t0
    rate = t / seconds
    per_token = flops_per_token(model, d, t)
    peak = peak_flops(jax.devices()[0].device_kind)
    return {
        **kernels,
        "params": int(sum(math.prod(x.shape) for x in jax.tree.leaves(model.abstract_params))),
        "flops_per_token": per_token,
        "compile_and_first_step_seconds": round(warm, 3),
        "step_seconds": seconds,
        "tokens_per_second": rate,
        "mfu": rate * per_token / peak if peak else None,
        "nll_per_token": float(np.asarray(sums.nll_sum).sum()) / t,
    }


def run(
    names: list[str], tiny: bool, seq_len: int, seconds: float, out: str | None = None
) -> dict[str, Any]:
    """Each family of `names` in turn within `seconds` (the module docstring); the report so far
    written to `out` after each (a process stopped on its time limit keeps what it scored)."""
    import jax

    seq_len = TINY_SEQ if tiny else seq_len
    deadline = time.perf_counter() + seconds
    report: dict[str, Any] = {
        "device": jax.devices()[0].device_kind,
        "peak_bf16_flops": peak_flops(jax.devices()[0].device_kind),
        "seq_len": seq_len,
        "dtype": "bfloat16",
        "tiny": tiny,
        "families": {},
        "skipped": [],
    }
    for name in names:
        if time.perf_counter() >= deadline:
            report["skipped"].append(name)
            continue
        t0 = time.perf_counter()
        try:
            d, widths = description(name, tiny, seq_len)
            row = {"widths": widths, **score(d, seq_len)}
        except Exception as e:  # one family's failure is its own row: the others still run
            row = {"error": f"{type(e).__name__}: {e}"[:500]}
        report["families"][name] = {**row, "seconds": round(time.perf_counter() - t0, 1)}
        if out:
            _dump(report, out)
    return report


def _dump(report: dict[str, Any], out: str) -> None:
    with open(out + ".tmp", "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    os.replace(out + ".tmp", out)


def write(report: dict[str, Any], out: str) -> None:
    """`run`'s report as JSON into `out`, and each family's tokens/s on one printed line."""
    _dump(report, out)
    print(json.dumps({k: v.get("tokens_per_second") for k, v in report["families"].items()}))


def _main() -> None:
    """The command line. Its flags are defined here, not on import: the tests import this module
    beside other benchmarks whose flags share these names (`--out`)."""
    names = flags.DEFINE_list("families", None, "The families (default: every golden family).")
    tiny = flags.DEFINE_bool("tiny", False, f"Golden widths and {TINY_SEQ} tokens: on a CPU.")
    seq = flags.DEFINE_integer("seq_len", 8192, "Tokens of the one row each family scores.")
    seconds = flags.DEFINE_float("seconds", 80.0, "Seconds for every family together.")
    out = flags.DEFINE_string("out", "families_check.json", "The JSON written.")
    app.run(
        lambda argv: write(
            run(names.value or families(), tiny.value, seq.value, seconds.value, out.value),
            out.value,
        )
    )


if __name__ == "__main__":
    _main()
