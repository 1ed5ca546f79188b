"""Tiny models, random checkpoints and real text for tests, examples and benchmarks.

Not for scoring real models: everything here is random or small, made to exercise the library on
one CPU in seconds.

```python
from ppl_jax import testing

testing.save_random_checkpoint("/tmp/ckpt", steps=(100, 200))  # an Orbax run of a tiny Llama
corpus = testing.write_corpus("/tmp/corpus", [testing.stdlib_text(20_000)])
```
"""

from __future__ import annotations

import os
import sysconfig
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx

from ppl_jax.checkpoints import orbax
from ppl_jax.models.adapters import params_of_nnx
from ppl_jax.models.llama import Llama, LlamaConfig

# A 2-layer Llama with grouped-query attention and an untied head over byte ids (21k params).
TINY = LlamaConfig(
    vocab_size=256,
    embed_dim=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    mlp_dim=64,
    max_positions=128,
    tie_embeddings=False,
)
# Standard-library modules whose source serves as real text (prose in docstrings and comments,
# and code); not the demo's held-out modules (`ppl_jax.config.defaults.HELD_OUT_MODULES`).
TEXT_MODULES = ("argparse.py", "difflib.py", "pprint.py", "calendar.py", "string.py")


def random_params(cfg: LlamaConfig = TINY, seed: int = 0) -> dict[str, Any]:
    """Random params of `cfg` (float32), with norm weights perturbed away from 1 so they matter."""
    params = params_of_nnx(Llama(cfg, nnx.Rngs(seed)))
    rng = np.random.default_rng(seed)

    def perturb(path, x):
        if str(path[-1].key).endswith("norm"):
            return x + 0.1 * rng.standard_normal(x.shape).astype(np.float32)
        return x

    return jax.tree_util.tree_map_with_path(perturb, params)


def save_random_checkpoint(
    path: str,
    cfg: LlamaConfig = TINY,
    steps: tuple[int, ...] = (5,),
    seed: int = 0,
    tokenizer: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Saves a training state (params and AdamW state) of random params at each step, with the
    architecture and tokenizer (`{"type": "byte"}` by default) ppl_jax reads; returns the params."""
    params = random_params(cfg, seed)
    opt_state = optax.adamw(1e-3).init(params)
    for step in steps:
        orbax.save_train_state(
            path,
            step,
            {"step": step, "params": params, "opt_state": opt_state},
            {"model": cfg.to_dict(), "tokenizer": tokenizer or {"type": "byte"}},
        )
    return params


def stdlib_text(num_chars: int, modules: tuple[str, ...] = TEXT_MODULES) -> str:
    """The first `num_chars` characters of the named standard-library sources, joined by blank
    lines: real, varied text present on every Python installation.

    Raises:
      ValueError: the modules hold fewer characters.
    """
    stdlib = sysconfig.get_paths()["stdlib"]
    parts, total = [], 0
    for name in modules:
        with open(os.path.join(stdlib, name), encoding="utf-8") as f:
            parts.append(f.read())
        total += len(parts[-1])
        if total >= num_chars:
            break
    text = "\n\n".join(parts)[:num_chars]
    if len(text) != num_chars:
        raise ValueError(f"the modules {modules} hold fewer than {num_chars} characters")
    return text


def write_corpus(folder: str, texts: list[str], name: str = "doc") -> str:
    """Writes each text to its own file in `folder`; returns the comma-separated paths (a
    `DatasetSpec.path`)."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    for i, text in enumerate(texts):
        path = os.path.join(folder, f"{name}{i}.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        paths.append(path)
    return ",".join(paths)
