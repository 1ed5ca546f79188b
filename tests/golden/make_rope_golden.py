"""Writes tests/golden/rope/: transformers' rotary embeddings at positions up to 1,048,575, for
tests/unit/models/test_rope_long.py (and tests/reference/test_rope_live.py, which recomputes them).

    python tests/golden/make_rope_golden.py     # needs the `reference` extra (PyTorch, transformers)

For each scaling (`CASES`: Llama 3.1's llama3, YaRN with and without DeepSeek's mscale, LongRoPE
with its short and long factors, linear, the default with theta 1e6 and GPT-NeoX's partial
rotary), transformers' `LlamaRotaryEmbedding` (or `GPTNeoXRotaryEmbedding`) gives its float32
`inv_freq`, the powers `theta ** (2i / dim)` it starts from (PyTorch's `powf`, whose last bit
may differ from a correctly rounded power), its attention scaling, and `cos`/`sin` (`[len(POSITIONS), rotary_dim // 2]`, the
first half: the second repeats it) at `POSITIONS`, far past every original length (LongRoPE:
once with positions within its original length, for the short factors). `rope.json` holds the
cases and their scalars, `rope.npz` the arrays (float32).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "rope")
POSITIONS = [0, 1, 2, 4095, 4096, 8191, 8192, 32768, 131071, 500000, 524287, 524288, 777777,
             999999, 1048575]  # fmt: skip
SHORT_POSITIONS = [0, 1, 2, 100, 1000, 2047, 4095]  # within LongRoPE's original length
_RNG = np.random.default_rng(0)
CASES = {
    "llama3": dict(
        head_dim=128, theta=500000.0, max_positions=131072,
        rope={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    ),
    "yarn": dict(
        head_dim=128, theta=10000.0, max_positions=131072,
        rope={"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 8192},
    ),
    "yarn_mscale": dict(
        head_dim=64, theta=10000.0, max_positions=163840,
        rope={"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
              "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    ),
    "longrope": dict(
        head_dim=96, theta=10000.0, max_positions=131072,
        rope={"rope_type": "longrope", "original_max_position_embeddings": 4096,
              "short_factor": [round(float(f), 6) for f in 1 + 0.1 * _RNG.random(48)],
              "long_factor": [round(float(f), 6) for f in np.geomspace(1.0, 60.0, 48)]},
    ),
    "linear": dict(
        head_dim=128, theta=10000.0, max_positions=16384,
        rope={"rope_type": "linear", "factor": 4.0},
    ),
    "default_1e6": dict(head_dim=128, theta=1000000.0, max_positions=32768, rope={}),
    "gpt_neox_partial": dict(
        head_dim=64, theta=10000.0, max_positions=2048, rope={}, partial_rotary_factor=0.25
    ),
}  # fmt: skip


def rotary(name: str, case: dict, positions: list[int]) -> dict[str, np.ndarray]:
    """transformers' `inv_freq`, attention scaling, cos and sin for one case."""
    import torch
    import transformers

    rope = {"rope_theta": case["theta"], "rope_type": "default", **case["rope"]}
    heads = 4
    if name.startswith("gpt_neox"):
        from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding

        rope["partial_rotary_factor"] = case["partial_rotary_factor"]
        cfg = transformers.GPTNeoXConfig(
            hidden_size=case["head_dim"] * heads, num_attention_heads=heads,
            max_position_embeddings=case["max_positions"], rope_parameters=rope,
        )  # fmt: skip
        emb = GPTNeoXRotaryEmbedding(cfg)
    else:
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        cfg = transformers.LlamaConfig(
            hidden_size=case["head_dim"] * heads, num_attention_heads=heads,
            head_dim=case["head_dim"], max_position_embeddings=case["max_positions"],
            rope_parameters=rope,
        )  # fmt: skip
        emb = LlamaRotaryEmbedding(cfg)
    x = torch.zeros(1, len(positions), case["head_dim"])
    with torch.no_grad():
        cos, sin = emb(x, torch.tensor(positions)[None])
    half = emb.inv_freq.shape[0]
    theta = torch.tensor(case["theta"], dtype=torch.float32).item()  # as PyTorch reads it
    return {
        "inv_freq": emb.inv_freq.numpy().copy(),
        "powers": (theta ** (torch.arange(0, 2 * half, 2, dtype=torch.float) / (2 * half))).numpy(),
        "cos": cos[0, :, :half].numpy(),
        "sin": sin[0, :, :half].numpy(),
        "scaling": np.float64(emb.attention_scaling),
    }


def compute() -> tuple[dict, dict[str, np.ndarray]]:
    """The golden's JSON and arrays, from the installed transformers."""
    import torch
    import transformers

    meta = {
        "generated_with": {"transformers": transformers.__version__, "torch": torch.__version__},
        "positions": POSITIONS,
        "short_positions": SHORT_POSITIONS,
        "cases": {},
    }
    arrays = {}
    for name, case in CASES.items():
        runs = {"": POSITIONS}
        if case["rope"].get("rope_type") == "longrope":
            runs["short_"] = SHORT_POSITIONS
        scalings = {}
        for prefix, positions in runs.items():
            found = rotary(name, case, positions)
            for key in ("inv_freq", "powers", "cos", "sin"):
                arrays[f"{name}/{prefix}{key}"] = found[key]
            scalings[f"{prefix}attention_scaling"] = float(found["scaling"])
        meta["cases"][name] = {**case, **scalings}
    return meta, arrays


def main() -> None:
    meta, arrays = compute()
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "rope.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1)
    np.savez_compressed(os.path.join(OUT, "rope.npz"), **arrays)
    print(f"wrote {OUT} ({len(arrays)} arrays) with transformers {meta['generated_with']}")


if __name__ == "__main__":
    sys.exit(main())
