"""Writes tests/golden/trainers/easydel/: tiny training checkpoints written by EasyDeL itself, with
EasyDeL's own logits on a fixed token batch, for tests/unit/checkpoints/test_trainer_layouts.py.

Runs inside a side environment that has EasyDeL (never ppl_jax's own). EasyDeL 0.3.0 imports
transformers' torch-only classes at import time, so the environment needs a CPU torch (this
machine's wheel is for Python 3.11):

    ~/.pyenv/versions/3.11.7/bin/python -m venv /work/sidevenv/easydel
    /work/sidevenv/easydel/bin/pip install easydel==0.3.0 pillow torch==2.13.0+cpu
    /work/sidevenv/easydel/bin/python tests/golden/make_easydel_golden.py

Each run is a tiny model initialised by EasyDeL (`LlamaForCausalLM`, `Qwen3ForCausalLM`, float32,
`attn_mechanism="vanilla"`), turned into its `EasyDeLState` with an optax SGD with momentum
(`state.init_tx`), trained a step at a time (`state.apply_gradients` on the next-token loss of
EasyDeL's forward) and saved after each step as EasyDeL's trainer saves a milestone:
`state.save_state(<run>/run-<step>)` (its `config.json`, `tensorstore_index.json`, the params
under `model/` and the optimizer under `tx/`, a zarr folder per leaf) and the checkpointer's
`metadata.json`. The logits of each step are EasyDeL's forward pass
(`model(input_ids=...).logits`) of the state saved at that step, read back by EasyDeL's own
`EasyDeLState.load_state`. EasyDeL attends in bfloat16 by default (`attn_dtype`); these
models attend in float32 (`attn_dtype=float32`, passed again on loading since `config.json`
drops it), which removes that rounding from the writer's logits; so is its RoPE table, which
EasyDeL keeps in bfloat16 whatever the dtype (`rope_tables_in_float32`). Writes `logits.npz`
(`tokens`, `step_<N>`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "trainers", "easydel")
VOCAB, BATCH, SEQ, STEPS = 300, 2, 16, 2
SIZES = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=8,
             max_position_embeddings=64, attn_mechanism="vanilla",
             attn_dtype="float32")  # fmt: skip


def tokens() -> np.ndarray:
    """The fixed token batch, `[2, 16] int32`."""
    return ((np.arange(BATCH * SEQ).reshape(BATCH, SEQ) * 37 + 5) % VOCAB).astype(np.int32)


@contextlib.contextmanager
def rope_tables_in_float32():
    """EasyDeL casts its precomputed RoPE table (cos and sin of position x frequency) to bfloat16
    whatever the model's dtype (`EasyDeLBaseConfig.get_basic_frequencies`, `.astype(bfloat16)`):
    cos(1) is 0.539 instead of 0.5403. The logits are computed with the same table in float32,
    which removes that rounding from the writer's forward (as `attn_dtype` does for attention).
    Measured: with the bfloat16 table, a Qwen3 with QK-norm (attention scores of order one)
    differs from float32 RoPE by ~3e-4 of the largest logit; without RoPE in both, by 2e-7."""
    import jax
    import jax.numpy as jnp
    from easydel.infra.base_config import EasyDeLBaseConfig
    from easydel.infra.utils import ModuleCaches
    from easydel.layers import get_frequencies
    from jax.sharding import NamedSharding, PartitionSpec

    def get_basic_frequencies(self, head_size=None, rotary_dim=None, base=None):
        head_size = head_size or self.head_dim
        frequencies = get_frequencies(
            head_size=head_size, rotary_dim=rotary_dim or head_size,
            max_position=self.granted_freq_max_position_embedding,
            base=base or self.rope_theta, rope_scaling=self._get_rope_config().to_dict(),
            partial_rotary_factor=getattr(self, "partial_rotary_factor", 1.0),
        ).astype(jnp.float32)  # fmt: skip
        return ModuleCaches(jax.device_put(frequencies, NamedSharding(self.mesh, PartitionSpec())))

    original = EasyDeLBaseConfig.get_basic_frequencies
    EasyDeLBaseConfig.get_basic_frequencies = get_basic_frequencies
    try:
        yield
    finally:
        EasyDeLBaseConfig.get_basic_frequencies = original


def write_run(name: str) -> None:
    import easydel as ed
    import jax
    import jax.numpy as jnp
    import optax
    from eformer.serialization.checkpointer import _write_checkpoint_metadata
    from flax import nnx

    if name == "llama":
        config = ed.LlamaConfig(**SIZES, rms_norm_eps=1e-5, tie_word_embeddings=False)
        cls = ed.LlamaForCausalLM
    else:
        config = ed.Qwen3Config(**SIZES, rms_norm_eps=1e-6, tie_word_embeddings=True)
        cls = ed.Qwen3ForCausalLM
    model = cls(config=config, dtype=jnp.float32, param_dtype=jnp.float32,
                precision=jax.lax.Precision.HIGHEST, rngs=nnx.Rngs(0))  # fmt: skip
    # RMS-norm weights start at ones: give them values so that they matter to the logits.
    for i, (path, var) in enumerate(nnx.iter_graph(model)):
        if isinstance(var, nnx.Param) and "norm" in "/".join(map(str, path)):
            var[...] = var[...] + 0.1 * jax.random.normal(jax.random.PRNGKey(i), var.shape)
    ids = jnp.asarray(tokens())
    state = model.to_state().init_tx(optax.sgd(1e-1, momentum=0.9))

    def loss(graphstate):
        m = state.merge(graphstate)
        with m.mesh:
            logits = m(input_ids=ids).logits.astype(jnp.float32)
        logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
        return -jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1).mean()

    target = os.path.join(OUT, name)
    shutil.rmtree(target, ignore_errors=True)
    run = os.path.join(target, "run")
    for step in range(1, STEPS + 1):
        state = state.apply_gradients(grads=jax.grad(loss)(state.graphstate))
        folder = os.path.join(run, f"run-{step}")
        state.save_state(folder, step=step)
        _write_checkpoint_metadata(folder, step=step, is_temporary=False)
    out = {"tokens": tokens()}
    with rope_tables_in_float32():  # only here: the weights are trained as before
        for step in range(1, STEPS + 1):
            restored = ed.EasyDeLState.load_state(
                os.path.join(run, f"run-{step}"), dtype=jnp.float32, param_dtype=jnp.float32,
                precision=jax.lax.Precision.HIGHEST, auto_shard_model=False,
                config_kwargs={"attn_dtype": jnp.float32},
            )  # fmt: skip
            m = restored.model
            with m.mesh:
                out[f"step_{step}"] = np.asarray(m(input_ids=ids).logits, np.float32)
    assert not np.allclose(out["step_1"], out[f"step_{STEPS}"])
    np.savez(os.path.join(target, "logits.npz"), **out)


def main() -> None:
    import importlib.metadata as md

    os.makedirs(OUT, exist_ok=True)
    for name in sys.argv[1:] or ["llama", "qwen3"]:
        write_run(name)
    versions = {p: md.version(p) for p in ("easydel", "eformer", "jax", "flax", "tensorstore")}
    with open(os.path.join(OUT, "VERSIONS.json"), "w") as f:
        json.dump(versions, f, indent=1)


if __name__ == "__main__":
    main()
