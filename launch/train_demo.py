"""Trains the demo model shipped in `ppl_jax/demo/checkpoint`, and saves it as a training state.

A small Llama-family byte-level decoder is trained with optax (AdamW, warm-up then cosine decay)
on the source code of the CPython standard library found on this machine (CPython 3.11.7 for the
shipped checkpoint), holding out the modules in `ppl_jax.config.defaults.HELD_OUT_MODULES` (whose
3.11.7 text, shipped in `ppl_jax/demo/held_out/`, is the default evaluation) and the `test`
packages. The result
is saved with Orbax as `{step, params, opt_state}` plus the architecture and tokenizer, exactly
as a training loop would, so `ppl-jax` evaluates it with no other input.

    python launch/train_demo.py --steps=1500 --out=ppl_jax/demo/checkpoint
"""

from __future__ import annotations

import glob
import os
import shutil
import sysconfig
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags
from flax import nnx

import ppl_jax
from ppl_jax.checkpoints.formats import orbax as checkpoint
from ppl_jax.config import HELD_OUT_MODULES, demo_checkpoint_dir, held_out_paths
from ppl_jax.models import Llama, LlamaConfig, params_of_nnx, registry
from ppl_jax.runtime import DEFAULT_RULES, make_mesh, param_targets
from ppl_jax.scoring import token_nll
from ppl_jax.tokenizer import ByteTokenizer

FLAGS = flags.DEFINE
_STEPS = flags.DEFINE_integer("steps", 1500, "Training steps.")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Sequences per step.")
_SEQ = flags.DEFINE_integer("seq_len", 256, "Tokens (bytes) per training sequence.")
_LR = flags.DEFINE_float("learning_rate", 3e-3, "Peak learning rate.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed for the weights and the data order.")
_OUT = flags.DEFINE_string("out", demo_checkpoint_dir(), "Checkpoint directory (replaced).")
_EVAL_EVERY = flags.DEFINE_integer(
    "eval_every", 500, "Steps between two held-out evaluations (ppl_jax.Evaluator); 0: none."
)

CONFIG = LlamaConfig(
    vocab_size=256,
    embed_dim=128,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    mlp_dim=320,
    max_positions=1024,
    tie_embeddings=True,
)


def training_files() -> list[str]:
    """Standard-library `.py` files, minus the held-out modules, tests and vendored packages."""
    stdlib = sysconfig.get_paths()["stdlib"]
    held_out = {os.path.join(stdlib, m) for m in HELD_OUT_MODULES}
    files = []
    for path in sorted(glob.glob(os.path.join(stdlib, "**", "*.py"), recursive=True)):
        rel = os.path.relpath(path, stdlib)
        parts = rel.split(os.sep)
        if path in held_out or parts[0] in ("site-packages", "dist-packages", "idlelib"):
            continue
        if any(p in ("test", "tests") or p.startswith("test_") for p in parts):
            continue
        files.append(path)
    return files


def main(argv: list[str]) -> None:
    del argv
    files = training_files()
    text = "\n\n".join(open(f, encoding="utf-8", errors="replace").read() for f in files)
    corpus = ByteTokenizer().encode([text])[0]
    print(f"training on {len(files)} files, {corpus.size:,} bytes")

    lm = registry.build(CONFIG.to_dict(), jnp.float32)
    params = params_of_nnx(Llama(CONFIG, nnx.Rngs(_SEED.value)))
    schedule = optax.warmup_cosine_decay_schedule(
        0.0,
        _LR.value,
        warmup_steps=min(100, _STEPS.value // 10),
        decay_steps=_STEPS.value,
        end_value=_LR.value * 0.05,
    )
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.1))
    opt_state = optimizer.init(params)
    seq = _SEQ.value
    positions = jnp.broadcast_to(jnp.arange(seq, dtype=jnp.int32), (_BATCH.value, seq))
    segments = jnp.ones((_BATCH.value, seq), jnp.int32)

    @jax.jit
    def train_step(params, opt_state, tokens):
        def loss_fn(p):
            out = lm.apply(p, tokens[:, :-1], positions, segments)
            return jnp.mean(token_nll(out, tokens[:, 1:]))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    # Held-out bits per byte while training: built once, called with the params of each interval.
    mesh = make_mesh(-1, 1)
    _, shardings = param_targets(lm.abstract_params, lm.logical_axes, mesh, DEFAULT_RULES)
    evaluator = None
    if _EVAL_EVERY.value:
        held_out = [
            {"name": "held-out", "path": ",".join(held_out_paths().split(",")[:2])},
        ]
        evaluator = ppl_jax.Evaluator(
            lm, mesh, shardings, held_out, ByteTokenizer(), batch_size=8, seq_len=seq
        )

    rng = np.random.default_rng(_SEED.value)
    start = time.perf_counter()
    for step in range(1, _STEPS.value + 1):
        offsets = rng.integers(0, corpus.size - seq - 1, size=_BATCH.value)
        batch = np.stack([corpus[o : o + seq + 1] for o in offsets])
        params, opt_state, loss = train_step(params, opt_state, jnp.asarray(batch))
        if step % 100 == 0 or step == 1:
            bpb = float(loss) / np.log(2)
            print(
                f"step {step:5d}  loss {float(loss):.4f} nats  {bpb:.3f} bits/byte  "
                f"{time.perf_counter() - start:.0f} s",
                flush=True,
            )
        if evaluator is not None and (step % _EVAL_EVERY.value == 0 or step == _STEPS.value):
            scalars = evaluator(jax.device_put(params, shardings), step=step)
            print(
                f"step {step:5d}  held-out {scalars['held-out/bits_per_byte']:.4f} bits/byte "
                f"(ppl_jax.Evaluator)",
                flush=True,
            )

    shutil.rmtree(_OUT.value, ignore_errors=True)
    checkpoint.save_train_state(
        _OUT.value,
        _STEPS.value,
        {"step": _STEPS.value, "params": params, "opt_state": opt_state},
        {"model": CONFIG.to_dict(), "tokenizer": ByteTokenizer().describe()},
    )
    print(f"saved step {_STEPS.value} to {_OUT.value}")


if __name__ == "__main__":
    app.run(main)
