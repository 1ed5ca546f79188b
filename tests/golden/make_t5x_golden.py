"""Writes tests/golden/trainers/t5x/: a tiny decoder-only model's training checkpoints written by
T5X's own `t5x.checkpoints.Checkpointer`, with the model's logits on a fixed token batch, for
tests/unit/checkpoints/test_trainer_layouts.py.

T5X is not on PyPI and pins its dependencies to git URLs; it runs here from a snapshot of
google-research/t5x (commit cc342d419ec3, 2026-04-21) installed without dependencies into a side
environment beside PyPI's jax, flax, optax, orbax-checkpoint, tensorstore, tensorflow-cpu, clu,
seqio, grain and tensorflow-datasets, with google/airio (69897df7d9a4) and
google-research/jestimator (its main: the PyPI release predates `jax.sharding`) the same way:

    ~/.pyenv/versions/3.12.1/bin/python -m venv /work/sidevenv/t5x
    /work/sidevenv/t5x/bin/pip install jax flax optax orbax-checkpoint tensorstore clu seqio \\
        tensorflow-cpu gin-config fiddle chex jaxtyping cached_property absl-py etils \\
        tensorboard typing_extensions grain tensorflow-datasets
    /work/sidevenv/t5x/bin/pip install --no-deps -e <t5x> -e <airio> -e <jestimator>
    /work/sidevenv/t5x/bin/python tests/golden/make_t5x_golden.py

T5X has no architecture of its own in a checkpoint (nor one model: its models are gin-configured
Flax modules). The model here is a Llama-shaped decoder built from T5X's own layers
(`t5x.examples.decoder_only.layers`: `Embed`, `DenseGeneral`, `LayerNorm` (T5's RMS norm),
`MlpBlock` with `('silu', 'linear')`), with the attention (rotate-half RoPE, grouped-query heads)
written here because T5X's decoder-only example uses T5 relative position biases, which no
ppl_jax family has. Submodules carry T5X's names (`decoder/layers_{i}/self_attention/query/
kernel`, `pre_self_attention_layer_norm/scale`, `mlp/wi_0/kernel`, `decoder_norm/scale`,
`token_embedder/embedding`, `logits_dense/kernel`).

Its `FlaxOptimTrainState` (T5X's `optimizers.sgd` with momentum: its trace under
`state.param_states`; params with T5X's logical axes) is trained a
step at a time and saved after each by `Checkpointer.save` (a `PjitPartitioner` over the one CPU
device): `checkpoint_<step>/checkpoint` (msgpack; large leaves are TensorStore spec dicts, the
arrays in sibling `target.*` / `state.param_states.*` zarr folders). The logits are the module's
forward pass on params read back by T5X's own `checkpoints.load_t5x_checkpoint`.
Writes `description.json`, `mapping.yaml` (the rules that map the names to ppl_jax's llama
family) and `logits.npz` (`tokens`, `step_<N>`).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "trainers", "t5x")
VOCAB, BATCH, SEQ = 300, 2, 16
EMBED, HEADS, KV_HEADS, HEAD_DIM, MLP, LAYERS = 32, 4, 2, 8, 64, 2
THETA, EPS = 10000.0, 1e-6
STEPS = 2

DESCRIPTION = {
    "family": "llama", "vocab_size": VOCAB, "embed_dim": EMBED, "num_layers": LAYERS,
    "num_heads": HEADS, "num_kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "mlp_dim": MLP,
    "max_positions": 64, "rope_theta": THETA, "norm_eps": EPS, "tie_embeddings": False,
}  # fmt: skip

MAPPING = """\
# T5X names (this model's own submodule names) -> ppl_jax's llama weights. T5X's DenseGeneral
# stores 2-D kernels ([in, out] with the head axes flattened): reshaped to the model's.
rules:
  - {from: 'decoder/layers_(?P<l>\\d+)/pre_self_attention_layer_norm/scale', to: 'layers/{l}/attn_norm'}
  - {from: 'decoder/layers_(?P<l>\\d+)/self_attention/query/kernel', to: 'layers/{l}/attn/q',
     reshape: [embed_dim, num_heads, head_dim]}
  - {from: 'decoder/layers_(?P<l>\\d+)/self_attention/key/kernel', to: 'layers/{l}/attn/k',
     reshape: [embed_dim, num_kv_heads, head_dim]}
  - {from: 'decoder/layers_(?P<l>\\d+)/self_attention/value/kernel', to: 'layers/{l}/attn/v',
     reshape: [embed_dim, num_kv_heads, head_dim]}
  - {from: 'decoder/layers_(?P<l>\\d+)/self_attention/out/kernel', to: 'layers/{l}/attn/o',
     reshape: [num_heads, head_dim, embed_dim]}
  - {from: 'decoder/layers_(?P<l>\\d+)/pre_mlp_layer_norm/scale', to: 'layers/{l}/mlp_norm'}
  - {from: 'decoder/layers_(?P<l>\\d+)/mlp/wi_0/kernel', to: 'layers/{l}/mlp/gate'}
  - {from: 'decoder/layers_(?P<l>\\d+)/mlp/wi_1/kernel', to: 'layers/{l}/mlp/up'}
  - {from: 'decoder/layers_(?P<l>\\d+)/mlp/wo/kernel', to: 'layers/{l}/mlp/down'}
  - {from: 'decoder/decoder_norm/scale', to: final_norm}
  - {from: 'decoder/logits_dense/kernel', to: lm_head}
  - {from: 'token_embedder/embedding', to: embedding}
"""


def tokens() -> np.ndarray:
    """The fixed token batch, `[2, 16] int32`."""
    return ((np.arange(BATCH * SEQ).reshape(BATCH, SEQ) * 37 + 5) % VOCAB).astype(np.int32)


def model_class():
    import jax
    import jax.numpy as jnp
    from flax import linen as nn
    from t5x.examples.decoder_only import layers

    def rope(x, positions):  # x [batch, seq, heads, head_dim]; rotate-half (Llama, GPT-NeoX)
        half = HEAD_DIM // 2
        inv = 1.0 / THETA ** (jnp.arange(half, dtype=jnp.float32) / half)
        angles = positions[:, :, None].astype(jnp.float32) * inv  # [batch, seq, half]
        cos, sin = jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    class Attention(nn.Module):
        @nn.compact
        def __call__(self, x):
            dense = lambda feats, axes, name, axis=-1: layers.DenseGeneral(  # noqa: E731
                feats, axis=axis, kernel_axes=axes, dtype=jnp.float32, name=name)  # fmt: skip
            q = dense((HEADS, HEAD_DIM), ("embed", "heads", "kv"), "query")(x)
            k = dense((KV_HEADS, HEAD_DIM), ("embed", "kv_heads", "kv"), "key")(x)
            v = dense((KV_HEADS, HEAD_DIM), ("embed", "kv_heads", "kv"), "value")(x)
            positions = jnp.broadcast_to(jnp.arange(x.shape[1]), x.shape[:2])
            q, k = rope(q, positions), rope(k, positions)
            k = jnp.repeat(k, HEADS // KV_HEADS, axis=2)
            v = jnp.repeat(v, HEADS // KV_HEADS, axis=2)
            scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(HEAD_DIM)
            causal = jnp.tril(jnp.ones((x.shape[1], x.shape[1]), bool))
            weights = jax.nn.softmax(jnp.where(causal, scores, -1e30), axis=-1)
            out = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
            return layers.DenseGeneral(EMBED, axis=(-2, -1), kernel_axes=("heads", "kv", "embed"),
                                       dtype=jnp.float32, name="out")(out)  # fmt: skip

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = layers.LayerNorm(epsilon=EPS, name="pre_self_attention_layer_norm")(x)
            x = x + Attention(name="self_attention")(h)
            h = layers.LayerNorm(epsilon=EPS, name="pre_mlp_layer_norm")(x)
            return x + layers.MlpBlock(intermediate_dim=MLP, activations=("silu", "linear"),
                                       intermediate_dropout_rate=0.0, dtype=jnp.float32,
                                       name="mlp")(h, deterministic=True)  # fmt: skip

    class Decoder(nn.Module):
        @nn.compact
        def __call__(self, x):
            for i in range(LAYERS):
                x = Block(name=f"layers_{i}")(x)
            x = layers.LayerNorm(epsilon=EPS, name="decoder_norm")(x)
            return layers.DenseGeneral(VOCAB, kernel_axes=("embed", "vocab"), dtype=jnp.float32,
                                       name="logits_dense")(x)  # fmt: skip

    class LM(nn.Module):
        @nn.compact
        def __call__(self, ids):
            embed = layers.Embed(VOCAB, EMBED, dtype=jnp.float32, attend_dtype=jnp.float32,
                                 one_hot=False, name="token_embedder")  # fmt: skip
            return Decoder(name="decoder")(embed(ids))

    return LM


def main() -> None:
    import importlib.metadata as md

    import flax
    import jax
    import jax.numpy as jnp
    from t5x import checkpoints, optimizers, partitioning
    from t5x import train_state as train_state_lib

    lm = model_class()()
    ids = jnp.asarray(tokens())
    variables = lm.init(jax.random.PRNGKey(0), ids)
    # RMS-norm scales start at ones: give them values so that they matter to the logits.
    params = jax.tree_util.tree_map_with_path(
        lambda p, x: x + 0.1 * jax.random.normal(jax.random.PRNGKey(len(str(p))), x.shape)
        if "scale" in str(p[-1]) else x, variables["params"])  # fmt: skip
    variables = flax.core.freeze({**flax.core.unfreeze(variables), "params": params})
    state = train_state_lib.FlaxOptimTrainState.create(
        optimizers.sgd(1e-1, momentum=0.9), variables
    )
    state = jax.tree.map(jnp.asarray, state)  # as `utils.TrainStateInitializer`'s jit makes it
    partitioner = partitioning.PjitPartitioner(num_partitions=1)

    def loss(p):
        logits = lm.apply({"params": p}, ids)
        logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
        return -jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1).mean()

    work = tempfile.mkdtemp()
    checkpointer = checkpoints.Checkpointer(state, partitioner, os.path.join(work, "model_dir"))
    for _ in range(STEPS):
        state = state.apply_gradient(jax.grad(loss)(state.params), learning_rate=1e-1)
        checkpointer.save(state)
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    shutil.copytree(os.path.join(work, "model_dir"), os.path.join(OUT, "model_dir"))
    shutil.rmtree(work, ignore_errors=True)
    out = {"tokens": tokens()}
    for step in range(1, STEPS + 1):
        # T5X's own reader of its own checkpoint, then the module's forward pass.
        restored = checkpoints.load_t5x_checkpoint(
            os.path.join(OUT, "model_dir", f"checkpoint_{step}")
        )
        logits = lm.apply({"params": restored["target"]}, ids)
        out[f"step_{step}"] = np.asarray(logits, np.float32)
    assert not np.allclose(out["step_1"], out[f"step_{STEPS}"])
    np.savez(os.path.join(OUT, "logits.npz"), **out)
    with open(os.path.join(OUT, "description.json"), "w") as f:
        json.dump(DESCRIPTION, f, indent=1)
    with open(os.path.join(OUT, "mapping.yaml"), "w") as f:
        f.write(MAPPING)
    versions = {p: md.version(p) for p in ("t5x", "jax", "flax", "tensorstore", "optax")}
    versions["t5x_commit"] = "cc342d419ec3e3e9c4bf1df33c82330cafdc1e16"
    with open(os.path.join(OUT, "VERSIONS.json"), "w") as f:
        json.dump(versions, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
