"""Writes tests/golden/trainers/levanter/: tiny checkpoints written by marin's levanter itself (the
`marin-levanter` package), with levanter's own logits on a fixed token batch, for
tests/unit/checkpoints/test_trainer_layouts.py.

Runs inside a side environment that has levanter (never ppl_jax's own):

    ~/.pyenv/versions/3.12.1/bin/python -m venv /work/sidevenv/levanter
    /work/sidevenv/levanter/bin/pip install marin-levanter==0.2.227.dev40316220070
    /work/sidevenv/levanter/bin/python tests/golden/make_levanter_golden.py

Each run is a tiny model initialised by levanter (`LlamaLMHeadModel`, `QwenLMHeadModel`,
`Qwen3LMHeadModel`), put in levanter's `TrainerState` with an optax optimizer (Adam in `llama_scanned`, SGD
elsewhere), trained a step at a time
(`TrainerState.take_step` on the next-token loss) and saved after each step by levanter's own
`Checkpointer` (`CheckpointerConfig.create(run_id).on_step(tree=state.saveable_state, step,
force=True)`, what `Trainer` calls): `<run>/step-<N>/` with `metadata.json`, `manifest.json` and
the OCDBT database of zarr3 arrays, one per leaf of the train state. Then the saved step is
loaded back with levanter's own `load_checkpoint` and its forward pass (`model(input_ids,
AttentionMask.causal())`) gives the logits, float32, of `tokens()`.

Runs: `llama_scanned` (`scan_layers=True`: `Stacked`, layers on axis 0; 2 steps), `llama_unscanned`
(`BlockSeq`: `blocks/{i}/...`), `qwen2_unscanned` (QwenConfig: q/k/v biases), `qwen3_scanned`
(QK-norm, tied embeddings). Each writes `description.json` (the ppl_jax description of its
architecture, what `checkpoint.architecture` takes) and `logits.npz` (`tokens`, `step_<N>`).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "trainers", "levanter")
VOCAB, BATCH, SEQ = 300, 2, 16
SIZES = dict(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=4, num_kv_heads=2,
             max_seq_len=64)  # fmt: skip


def tokens() -> np.ndarray:
    """The fixed token batch, `[2, 16] int32`."""
    return ((np.arange(BATCH * SEQ).reshape(BATCH, SEQ) * 37 + 5) % VOCAB).astype(np.int32)


def description(kind: str, config) -> dict:
    """The ppl_jax description of a levanter config (the family `llama` reads all four)."""
    out = {
        "family": "llama",
        "vocab_size": VOCAB,
        "embed_dim": config.hidden_dim,
        "num_layers": config.num_layers,
        "num_heads": config.num_heads,
        "num_kv_heads": config.num_kv_heads,
        "head_dim": config.hidden_dim // config.num_heads,
        "mlp_dim": config.intermediate_dim,
        "max_positions": config.max_seq_len,
        "rope_theta": float(config.rope.theta),
        "norm_eps": float(config.layer_norm_epsilon),
        "tie_embeddings": bool(config.tie_word_embeddings),
    }
    if kind == "qwen2":
        out["qkv_bias"] = True
    if kind == "qwen3":
        out["qk_norm"] = "head"
    return out


def runs():
    from levanter.layers.rotary import DefaultRotaryEmbeddingsConfig
    from levanter.models.llama import LlamaConfig
    from levanter.models.qwen import Qwen3Config, QwenConfig

    rope = DefaultRotaryEmbeddingsConfig(theta=10000.0)
    return {
        "llama_scanned": ("llama", LlamaConfig(**SIZES, scan_layers=True, rope=rope), 2),
        "llama_unscanned": ("llama", LlamaConfig(**SIZES, scan_layers=False, rope=rope), 1),
        "qwen2_unscanned": (
            "qwen2",
            QwenConfig(**SIZES, scan_layers=False, rope=rope, layer_norm_epsilon=1e-6),
            1,
        ),  # fmt: skip
        "qwen3_scanned": (
            "qwen3",
            Qwen3Config(
                **SIZES,
                scan_layers=True,
                tie_word_embeddings=True,
                layer_norm_epsilon=1e-6,
                rope=rope,
            ),
            1,
        ),  # fmt: skip
    }


def write_run(name: str, kind: str, config, steps: int) -> None:
    import equinox as eqx
    import haliax as hax
    import jax
    import jax.numpy as jnp
    import optax
    from levanter.checkpoint import CheckpointerConfig, load_checkpoint
    from levanter.layers.attention import AttentionMask
    from levanter.trainer_state import TrainerState

    Batch, Pos = hax.Axis("batch", BATCH), config.max_Pos.resize(SEQ)
    Vocab = hax.Axis("vocab", VOCAB)
    model = config.model_type.init(Vocab, config, key=jax.random.PRNGKey(0))
    # Norm weights start at ones and biases at zeros: give them values so that every weight
    # matters to the logits (as after training).
    leaves, treedef = jax.tree.flatten(model)
    leaves = [x + 0.1 * jax.random.normal(jax.random.PRNGKey(i), x.shape, x.dtype)
              if isinstance(x, jax.Array) and x.dtype == jnp.float32 else x
              for i, x in enumerate(leaves)]  # fmt: skip
    model = jax.tree.unflatten(treedef, leaves)
    # Adam's moments in one run (a train state as large runs save it); plain SGD (no optimizer
    # state) in the others keeps the files small.
    optimizer = optax.adam(1e-2) if name == "llama_scanned" else optax.sgd(1e-1)
    state = TrainerState.init(optimizer, model, key=jax.random.PRNGKey(1))
    ids = hax.named(jnp.asarray(tokens()), (Batch, Pos))
    mask = AttentionMask.causal()

    def loss(m):
        logits = m(ids, mask).array.astype(jnp.float32)
        logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
        return -jnp.take_along_axis(logp, ids.array[:, 1:, None], axis=-1).mean()

    work = tempfile.mkdtemp()
    checkpointer = CheckpointerConfig(base_path=work, keep=None, save_interval=None).create("run")
    for step in range(1, steps + 1):
        grads = eqx.filter_grad(loss)(state.model)
        state, _ = state.take_step(grads, key=jax.random.PRNGKey(step))
        checkpointer.on_step(tree=state.saveable_state, step=step, force=True)
        checkpointer.wait_until_finished()
    target = os.path.join(OUT, name)
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(os.path.join(work, "run"), os.path.join(target, "run"))
    shutil.rmtree(work, ignore_errors=True)
    out = {"tokens": tokens()}
    for step in range(1, steps + 1):
        # levanter's own reading of its own checkpoint, then its forward pass.
        restored = load_checkpoint(state, os.path.join(target, "run", f"step-{step}"))
        out[f"step_{step}"] = np.asarray(restored.model(ids, mask).array, np.float32)
    if steps > 1:  # the steps differ (a sweep has something to tell apart)
        assert not np.allclose(out["step_1"], out[f"step_{steps}"])
    np.savez(os.path.join(target, "logits.npz"), **out)
    with open(os.path.join(target, "description.json"), "w") as f:
        json.dump(description(kind, config), f, indent=1)


def main() -> None:
    import importlib.metadata as md

    os.makedirs(OUT, exist_ok=True)
    import haliax as hax
    import jax

    only = sys.argv[1:]
    with hax.partitioning.set_mesh(jax.make_mesh((1,), ("data",))):
        for name, (kind, config, steps) in runs().items():
            if not only or name in only:
                write_run(name, kind, config, steps)
    versions = {p: md.version(p) for p in ("marin-levanter", "marin-haliax", "jax", "tensorstore",
                                            "equinox")}  # fmt: skip
    with open(os.path.join(OUT, "VERSIONS.json"), "w") as f:
        json.dump(versions, f, indent=1)


if __name__ == "__main__":
    main()
