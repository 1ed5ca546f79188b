"""Writes tests/golden/readers/: checkpoints in the layouts of readers added by issue 25, each
written by its own library, with that library's own logits on a fixed token batch, for
tests/unit/checkpoints/test_readers_golden.py.

    python tests/golden/make_readers_golden.py              # everything
    python tests/golden/make_readers_golden.py --only v1

Parts:

- `v1`: the Orbax v1 API (`orbax.checkpoint.experimental.v1`, orbax-checkpoint as installed).
  The test suite's Linen model (`tests/golden/trainer_models.py`, `LinenLM`) trained 2 steps
  with optax; its `TrainState` saved at each step by `ocp.training.Checkpointer(dir).save`
  (`orbax_v1_run/`, numbered step folders), and its last params alone by `ocp.save`
  (`orbax_v1_bare/`, the marker file `orbax.checkpoint`). Logits: `LinenLM.apply`.
- `sharded`: transformers (`Qwen3ForCausalLM`, QK-norm, untied head; random weights, 1-D ones
  perturbed) saved by `save_pretrained(max_shard_size=...)` in bfloat16: several shards listed
  in `model.safetensors.index.json`, as large models are kept on a bucket. Logits: the model's
  own PyTorch forward in float32 over the stored bfloat16 weights (the rounding of the stored
  weights is the checkpoint's; nothing else rounds).

Both run in this environment (orbax, flax and optax are ppl_jax's dependencies; torch and
transformers are the live references' extra). Nothing here imports ppl_jax.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "readers")
BATCH, SEQ = 2, 16


def tokens(vocab: int) -> np.ndarray:
    """The fixed token batch, `[2, 16] int32`."""
    return ((np.arange(BATCH * SEQ).reshape(BATCH, SEQ) * 37 + 5) % vocab).astype(np.int32)


def v1_part() -> dict[str, str]:
    import jax
    import jax.numpy as jnp
    import optax
    import orbax.checkpoint as ocp_v0
    import orbax.checkpoint.experimental.v1 as ocp
    from flax.training import train_state

    sys.path.insert(0, HERE)
    import trainer_models as tm

    ids = tokens(tm.VOCAB)
    run, bare = os.path.join(OUT, "orbax_v1_run"), os.path.join(OUT, "orbax_v1_bare")
    for folder in (run, bare):
        shutil.rmtree(folder, ignore_errors=True)
    model = tm.LinenLM()
    params = model.init(jax.random.key(0), tm._batch(0))["params"]
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=optax.adam(1e-2))
    logits = {"tokens": ids}
    with ocp.training.Checkpointer(os.path.join(run, "checkpoints")) as checkpointer:
        for step in (1, 2):
            state = tm._linen_step(state, tm._batch(step))
            checkpointer.save(step, state)
            logits[f"step_{step}"] = np.asarray(
                model.apply({"params": state.params}, jnp.asarray(ids))
            )
    np.savez(os.path.join(run, "logits.npz"), **logits)
    ocp.save(bare, {"params": state.params})
    np.savez(os.path.join(OUT, "orbax_v1_bare_logits.npz"), tokens=ids, bare=logits["step_2"])
    return {"orbax-checkpoint": getattr(ocp_v0, "__version__", "?"), "api": "ocp.v1"}


def sharded_part() -> dict[str, str]:
    import torch
    import transformers as tf

    folder = os.path.join(OUT, "sharded_qwen3")
    shutil.rmtree(folder, ignore_errors=True)
    torch.manual_seed(0)
    config = tf.Qwen3Config(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
        rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False, initializer_range=0.2,
    )  # fmt: skip
    model = tf.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:  # norms: not all ones, so that a norm read wrongly shows
                p.add_(0.3 * torch.randn_like(p))
    model = model.to(torch.bfloat16)
    model.save_pretrained(folder, max_shard_size="60KB", safe_serialization=True)
    stored = tf.Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = tokens(config.vocab_size)
    with torch.no_grad():
        out = stored(torch.as_tensor(ids, dtype=torch.long)).logits.numpy()
    np.savez(os.path.join(folder, "logits.npz"), tokens=ids, bare=out.astype(np.float32))
    with open(os.path.join(folder, "model.safetensors.index.json")) as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
    assert len(shards) >= 4, shards
    return {"transformers": tf.__version__, "torch": torch.__version__}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=["v1", "sharded"])
    args = parser.parse_args()
    os.makedirs(OUT, exist_ok=True)
    manifest_path = os.path.join(OUT, "MANIFEST.json")
    manifest = json.load(open(manifest_path)) if os.path.exists(manifest_path) else {}
    for name, part in (("v1", v1_part), ("sharded", sharded_part)):
        if args.only in (None, name):
            manifest[name] = part()
    manifest["batch"] = [BATCH, SEQ]
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
