"""Writes tests/golden/trainers/: tiny checkpoints written by other trainers' own code, with their
own logits on a fixed token batch, for tests/unit/checkpoints/test_trainer_golden.py.

    python tests/golden/make_trainer_golden.py            # everything
    python tests/golden/make_trainer_golden.py --only flax

Parts:

- `maxtext`: MaxText 0.2.5's own trainer (`python -m maxtext.trainers.pre_train.train`, CPU,
  synthetic data, 2 steps, a checkpoint per step) on tiny `llama2`, `mistral` and `qwen3`
  decoders, scanned and not; then MaxText's own Linen model (`models.transformer_as_linen`)
  gives the logits of each step's params.
- `gemma`: the gemma library 4.0.1 (`gm.nn.Transformer` with a tiny Gemma 3 config, params
  initialised by the library, saved by `gm.ckpts.save_params`), logits by `model.apply`.
- `flax`: a Linen `TrainState` (`CheckpointManager.save(step, args=StandardSave(state))`, item
  `default`) and an NNX `Composite(model=..., opt=...)` written by a small model of the test
  suite's own (`tests/golden/trainer_models.py`), 2 training steps each.

maxtext[tpu]==0.2.5 and gemma==4.0.1 install only on Python >= 3.12 and cannot share one
environment (maxtext needs sentencepiece >= 0.2.2, gemma imports only with 0.2.1): the script
makes two virtual environments from pyenv's 3.12 (`--venvs`, default ~/.cache/ppl_jax/trainers,
2.8 and 3.5 GB, made once) and runs those parts inside them; the `flax` part runs in the current
environment (flax and orbax only). Nothing here is a dependency of the default tests, which read
only the committed files. To refresh after a library upgrade, change the pins below and run the
script; commit tests/golden/trainers/ (a few MB) with the libraries' versions in MANIFEST.json.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "trainers")
PINS = {
    "maxtext": ["maxtext[tpu]==0.2.5"],
    "gemma": ["gemma==4.0.1", "sentencepiece==0.2.1"],
}
BATCH, SEQ = 2, 16
# Tiny decoders: MaxText override names; `vocab_size` larger than the scored vocabulary in one case.
MAXTEXT_SIZES = dict(base_emb_dim=32, base_num_query_heads=4, base_num_kv_heads=2, base_mlp_dim=64,
                     base_num_decoder_layers=2, head_dim=8, vocab_size=128, max_target_length=SEQ)  # fmt: skip
MAXTEXT_RUNS = {
    "maxtext_llama2_scanned": dict(decoder_block="llama2", scan_layers="true", steps=2),
    "maxtext_llama2_unscanned": dict(decoder_block="llama2", scan_layers="false", steps=1),
    "maxtext_mistral_scanned": dict(
        decoder_block="mistral", scan_layers="true", steps=1, rope_max_timescale=1000000
    ),  # fmt: skip
    "maxtext_qwen3_scanned": dict(
        decoder_block="qwen3",
        scan_layers="true",
        steps=1,
        use_qk_norm="true",
        normalization_layer_epsilon=1e-6,
    ),  # fmt: skip
}


def tokens(vocab: int) -> np.ndarray:
    """The fixed token batch, `[2, 16] int32`."""
    return ((np.arange(BATCH * SEQ).reshape(BATCH, SEQ) * 37 + 5) % vocab).astype(np.int32)


def venv(root: str, part: str) -> str:
    """The python of `part`'s environment under `root`, made (pyenv 3.12, the pins) if absent."""
    folder = os.path.join(root, part)
    python = os.path.join(folder, "bin", "python")
    if not os.path.exists(python):
        found = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python")))
        base = found[-1] if found else shutil.which("python3.12")
        if not base:
            sys.exit("make_trainer_golden: no Python 3.12 (pyenv install 3.12, or put it on PATH).")
        subprocess.run([base, "-m", "venv", folder], check=True)
        # gemma's dependencies (kauldron, xmanager) send pip's resolver backtracking for hours;
        # the versions the maxtext environment resolved constrain them to an answer at once.
        constraints = []
        other = os.path.join(root, "maxtext", "bin", "python")
        if part == "gemma" and os.path.exists(other):
            frozen = subprocess.run([other, "-m", "pip", "freeze"], capture_output=True, text=True)
            keep = [x for x in frozen.stdout.splitlines()
                    if x and not x.lower().startswith(("sentencepiece", "maxtext", "-e")) and "@" not in x]  # fmt: skip
            path = os.path.join(root, "constraints.txt")
            with open(path, "w") as f:
                f.write("\n".join(keep) + "\n")
            constraints = ["-c", path]
        subprocess.run(
            [python, "-m", "pip", "install", "-q", *PINS[part], *constraints], check=True
        )
    return python


# ---------------------------------------------------------------------------------- MaxText


def maxtext_part() -> None:
    """Inside the maxtext environment: train, save and write logits for each run."""
    from maxtext.configs import pyconfig

    base = os.path.join(os.path.dirname(pyconfig.__file__), "base.yml")
    for name, run in MAXTEXT_RUNS.items():
        run = dict(run)
        steps = run.pop("steps")
        overrides = {**MAXTEXT_SIZES, **run, "dtype": "float32", "weight_dtype": "float32",
                     "hardware": "cpu", "per_device_batch_size": 1,
                     "skip_jax_distributed_system": "true", "enable_goodput_recording": "false"}  # fmt: skip
        args = [f"{k}={v}" for k, v in overrides.items()]
        work = tempfile.mkdtemp()
        subprocess.run(
            [sys.executable, "-m", "maxtext.trainers.pre_train.train", base, "run_name=golden",
             f"base_output_directory={work}", "dataset_type=synthetic", f"steps={steps}",
             "enable_checkpointing=true", "checkpoint_period=1", "async_checkpointing=false",
             *args],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        target = os.path.join(OUT, name)
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(
            os.path.join(work, "golden", "checkpoints"), os.path.join(target, "checkpoints")
        )
        logits = maxtext_logits(base, args, os.path.join(target, "checkpoints"))
        np.savez(
            os.path.join(target, "logits.npz"), tokens=tokens(MAXTEXT_SIZES["vocab_size"]), **logits
        )
        with open(os.path.join(target, "architecture.txt"), "w") as f:
            f.write("maxtext:default " + " ".join(args[: len(MAXTEXT_SIZES) + len(run)]) + "\n")
        shutil.rmtree(work, ignore_errors=True)


def maxtext_logits(base: str, args: list[str], checkpoints: str) -> dict[str, np.ndarray]:
    import jax.numpy as jnp
    import orbax.checkpoint as ocp
    from maxtext.configs import pyconfig
    from maxtext.models import models
    from maxtext.utils import maxtext_utils

    config = pyconfig.initialize(
        [None, base, *args, "run_name=logits", "enable_checkpointing=false"]
    )
    mesh = maxtext_utils.get_mesh_from_config(config)
    model = models.transformer_as_linen(config, mesh, quant=None, model_mode="train")
    ids = jnp.asarray(tokens(config.vocab_size))
    positions = jnp.broadcast_to(jnp.arange(SEQ, dtype=jnp.int32), ids.shape)
    out = {}
    for step in sorted(int(s) for s in os.listdir(checkpoints) if s.isdigit()):
        restored = ocp.PyTreeCheckpointer().restore(os.path.join(checkpoints, str(step), "items"))
        with mesh:
            logits = model.apply(restored["params"], ids, positions,
                                 decoder_segment_ids=jnp.ones_like(ids), enable_dropout=False)  # fmt: skip
        out[f"step_{step}"] = np.asarray(logits, np.float32)
    return out


# ------------------------------------------------------------------------------------ gemma


def gemma_part() -> None:
    """Inside the gemma environment: a tiny Gemma 3 initialised, saved and scored by the library."""
    import jax
    import jax.numpy as jnp
    from gemma import gm

    cfg = gm.nn.config
    config = cfg.TransformerConfig(
        num_embed=128, embed_dim=32, hidden_dim=64, num_heads=4, head_dim=8, num_kv_heads=2,
        final_logit_softcap=None, use_post_attn_norm=True, use_post_ffw_norm=True,
        use_qk_norm=True, attention_types=(cfg.AttentionType.LOCAL_SLIDING, cfg.AttentionType.GLOBAL),
        query_pre_attn_norm=cfg.QueryPreAttentionNormalisation.BY_ONE_OVER_SQRT_HEAD_DIM,
        attn_logits_soft_cap=None, sliding_window_size=4, transpose_gating_einsum=True,
        local_base_frequency=10_000, global_base_frequency=1_000_000,
    )  # fmt: skip
    model = gm.nn.Transformer(config=config, dtype=jnp.float32)  # float32 params and logits
    ids = jnp.asarray(tokens(127) + 1)  # id 0 is the gemma library's padding: not in the batch
    params = model.init(jax.random.key(0), ids)["params"]
    # Norm scales are zero-initialised; give them values so that the `1+w` form is exercised.
    params = jax.tree_util.tree_map_with_path(
        lambda p, x: x + 0.1 * jax.random.normal(jax.random.key(len(str(p))), x.shape, x.dtype)
        if "scale" in str(p[-1]) else x, params)  # fmt: skip
    target = os.path.join(OUT, "gemma3_tiny")
    shutil.rmtree(target, ignore_errors=True)
    gm.ckpts.save_params(params, os.path.join(target, "params"))
    logits = model.apply({"params": params}, ids).logits
    np.savez(
        os.path.join(target, "logits.npz"),
        tokens=np.asarray(ids),
        bare=np.asarray(logits, np.float32),
    )
    hf = {"model_type": "gemma3_text", "vocab_size": 128, "hidden_size": 32,
          "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 8, "num_hidden_layers": 2, "max_position_embeddings": 64,
          "rms_norm_eps": 1e-6, "sliding_window": 4, "query_pre_attn_scalar": 8,
          "layer_types": ["sliding_attention", "full_attention"],
          "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                              "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}},
          "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True}  # fmt: skip
    with open(os.path.join(target, "config.json"), "w") as f:
        json.dump(hf, f, indent=1)


# ------------------------------------------------------------------------------------- flax


def flax_part() -> None:
    """In this environment: a Linen TrainState and an NNX state of the suite's own tiny model."""
    sys.path.insert(0, HERE)
    import trainer_models

    for name, write in (("linen_trainstate", trainer_models.write_linen),
                        ("nnx_state", trainer_models.write_nnx)):  # fmt: skip
        target = os.path.join(OUT, name)
        shutil.rmtree(target, ignore_errors=True)
        logits = write(os.path.join(target, "checkpoints"), tokens(trainer_models.VOCAB))
        np.savez(os.path.join(target, "logits.npz"), tokens=tokens(trainer_models.VOCAB), **logits)


def manifest() -> None:
    files = {}
    for path in sorted(glob.glob(os.path.join(OUT, "*"))):
        if os.path.isdir(path):
            size = sum(os.path.getsize(f) for f in glob.glob(os.path.join(path, "**"), recursive=True)
                       if os.path.isfile(f))  # fmt: skip
            files[os.path.basename(path)] = size
    with open(os.path.join(OUT, "MANIFEST.json"), "w") as f:
        json.dump({"pins": PINS, "batch": [BATCH, SEQ], "bytes": files}, f, indent=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=["maxtext", "gemma", "flax"], action="append")
    # Make the maxtext environment first: gemma's is constrained by what maxtext's resolved.
    parser.add_argument("--inside", choices=["maxtext", "gemma"], help=argparse.SUPPRESS)
    parser.add_argument("--venvs", default=os.path.expanduser("~/.cache/ppl_jax/trainers"))
    args = parser.parse_args()
    if args.inside:
        {"maxtext": maxtext_part, "gemma": gemma_part}[args.inside]()
        return
    os.makedirs(OUT, exist_ok=True)
    for part in args.only or ["maxtext", "gemma", "flax"]:
        if part == "flax":
            flax_part()
        else:
            python = venv(args.venvs, part)
            subprocess.run([python, os.path.abspath(__file__), "--inside", part], check=True)
    manifest()


if __name__ == "__main__":
    main()
