"""The test suite's own tiny language models, as a researcher writes them: a Linen module and an
NNX module whose `__call__(tokens)` returns logits, trained a few steps with optax and saved with
Orbax the usual way. `make_trainer_golden.py` writes their checkpoints; the tests (and the docs'
worked example) read them back through `ppl_jax.from_linen` / `from_nnx`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import linen as nn
from flax import nnx
from flax.training import train_state

VOCAB, EMBED, SEQ = 64, 16, 16


class LinenLM(nn.Module):
    """Embedding, one causal self-attention block, an MLP, tied unembedding."""

    @nn.compact
    def __call__(self, tokens):
        embed = nn.Embed(VOCAB, EMBED, name="embed")
        x = embed(tokens)
        mask = nn.make_causal_mask(tokens)
        # (SelfAttention, which wrote the golden checkpoint, is this module called on one input.)
        x = x + nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=EMBED, name="attn")(
            nn.LayerNorm()(x), mask=mask
        )
        x = x + nn.Dense(EMBED, name="down")(
            nn.gelu(nn.Dense(4 * EMBED, name="up")(nn.LayerNorm()(x)))
        )
        return embed.attend(nn.LayerNorm(name="final")(x))


class NnxLM(nnx.Module):
    """The same shape of model in NNX (layers in an `nnx.List`: integer keys in the state)."""

    def __init__(self, rngs: nnx.Rngs):
        self.embed = nnx.Embed(VOCAB, EMBED, rngs=rngs)
        self.blocks = nnx.List([nnx.Linear(EMBED, EMBED, rngs=rngs) for _ in range(2)])
        self.attn = nnx.MultiHeadAttention(num_heads=2, in_features=EMBED, decode=False, rngs=rngs)
        self.norm = nnx.LayerNorm(EMBED, rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens)
        x = x + self.attn(x, mask=nnx.make_causal_mask(tokens))
        for block in self.blocks:
            x = x + jax.nn.gelu(block(x))
        return self.embed.attend(self.norm(x))


def _batch(step: int) -> jnp.ndarray:
    return jnp.asarray(np.random.default_rng(step).integers(0, VOCAB, (4, SEQ)), jnp.int32)


def _loss(logits, tokens):
    return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:]).mean()


@jax.jit
def _linen_step(state, batch):
    grads = jax.grad(lambda p: _loss(state.apply_fn({"params": p}, batch), batch))(state.params)
    return state.apply_gradients(grads=grads)


@nnx.jit
def _nnx_step(model, optimizer, batch):
    grads = nnx.grad(lambda m: _loss(m(batch), batch))(model)
    optimizer.update(model, grads)


def write_linen(directory: str, ids: np.ndarray, steps: int = 2) -> dict[str, np.ndarray]:
    """Trains `LinenLM`, saving the `TrainState` at every step (item `default`); returns the
    logits of `ids` per saved step (`step_<n>`)."""
    model = LinenLM()
    params = model.init(jax.random.key(0), _batch(0))["params"]
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-2))
    out = {}
    with ocp.CheckpointManager(directory) as manager:
        for step in range(1, steps + 1):
            batch = _batch(step)
            state = _linen_step(state, batch)
            manager.save(step, args=ocp.args.StandardSave(state))
            out[f"step_{step}"] = np.asarray(
                model.apply({"params": state.params}, jnp.asarray(ids))
            )
        manager.wait_until_finished()
    return out


def write_nnx(directory: str, ids: np.ndarray, steps: int = 2) -> dict[str, np.ndarray]:
    """Trains `NnxLM` with `nnx.Optimizer`, saving `Composite(model=..., opt=...)` at every step;
    returns the logits of `ids` per saved step (`step_<n>`)."""
    model = NnxLM(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    out = {}
    with ocp.CheckpointManager(directory) as manager:
        for step in range(1, steps + 1):
            batch = _batch(step)
            _nnx_step(model, optimizer, batch)
            manager.save(
                step,
                args=ocp.args.Composite(
                    model=ocp.args.StandardSave(nnx.state(model)),
                    opt=ocp.args.StandardSave(nnx.state(optimizer)),
                ),
            )
            out[f"step_{step}"] = np.asarray(model(jnp.asarray(ids)))
        manager.wait_until_finished()
    return out


def linen_model():
    """`ppl_jax.from_linen` of `LinenLM` (an entry point: `trainer_models:linen_model`)."""
    import ppl_jax

    return ppl_jax.from_linen(LinenLM(), VOCAB, SEQ)


def nnx_model():
    """`ppl_jax.from_nnx` of `NnxLM` (an entry point: `trainer_models:nnx_model`)."""
    import ppl_jax

    return ppl_jax.from_nnx(lambda: NnxLM(nnx.Rngs(0)), VOCAB, SEQ)
