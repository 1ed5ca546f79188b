"""Evaluate every saved step of a training run from a loop, with the public API only.

    python examples/training_loop.py [WORKDIR]

A tiny random Llama is saved at three steps (`ppl_jax.testing`, standing in for your trainer's
Orbax checkpoints); the Evaluator is built once (datasets read, tokenized and planned, the step
compiled) and called with each step's params, as a training loop calls it every N steps. The
numbers equal the command line's (`ppl-jax --config.checkpoint.step=all`).
"""

import sys
import tempfile

import ppl_jax
from ppl_jax import testing

workdir = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
testing.save_random_checkpoint(f"{workdir}/run", steps=(100, 200, 300))
prose = testing.write_corpus(f"{workdir}/prose", [testing.stdlib_text(20_000)])

ckpt = ppl_jax.open_checkpoint(f"{workdir}/run")
mesh = ppl_jax.make_mesh(data=-1, model=1)
evaluator = ppl_jax.Evaluator(
    ppl_jax.resolve_architecture(ckpt).model(),
    mesh,
    [ppl_jax.DatasetSpec(name="prose", path=prose, tags="domain=prose")],
    ckpt.tokenizer(),
    protocol=ppl_jax.ProtocolSpec(seq_len=64),
    batch=ppl_jax.BatchSpec(batch_size=8),
)
for step in ckpt.steps():
    params = ckpt.restore(step, evaluator.param_targets)
    scalars = evaluator(params, step=step)
    print(f"step {step}: bits per byte {scalars['prose/bits_per_byte']:.4f}")
