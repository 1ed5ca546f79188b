"""EasyDeL's checkpoints: `EasyDeLCheckpoint`, read in place with TensorStore.

Layout (EasyDeL 0.3.0 with eformer 0.0.99, measured on its own checkpoints in
tests/golden/trainers/easydel):

- a checkpoint folder holds EasyDeL's `config.json` (a Hugging Face config with EasyDeL's own
  keys besides: the architecture), `tensorstore_index.json` (`{"format": "tensorstore",
  "version", "prefixes": {"model": [{"path", "shape", "dtype"}, ...], "tx": [...]}}`, written
  after the arrays) and a zarr folder per leaf at each `path` (`model/model/layers/0/self_attn/
  q_proj/kernel`); `tx/` holds the optimizer state;
- a training run (`TrainingArguments.save_directory/<model_name>`) is a folder of milestones
  `run-<step>/`, each such a checkpoint (with the checkpointer's `metadata.json`);
- the params are the `model` prefix; names follow Hugging Face's (`model.layers.{i}.self_attn
  .q_proj`), NNX `Linear` kernels are `[in, out]` with the heads flattened, tables are
  `embedding`, norms `kernel`.

The architecture is the checkpoint's `config.json`
(`ppl_jax.checkpoints.formats.safetensors.read_description`), the tokenizer its tokenizer files when
the trainer saved them; the names map onto ppl_jax's llama family (Llama, Mistral, Qwen2, Qwen3) by
`RULES`; `checkpoint.mapping` replaces them.
"""

from __future__ import annotations

import json
import re
from typing import Any

import jax
import numpy as np

from ppl_jax import tokenizer as tokenizer_lib
from ppl_jax.checkpoints.checkpoint import Checkpoint, Options, Stored
from ppl_jax.checkpoints.formats import safetensors, tensorstore_tree
from ppl_jax.checkpoints.mapping import presets, storage
from ppl_jax.checkpoints.readers.step_folders import StepFolders
from ppl_jax.errors import CheckpointError
from ppl_jax.runtime import paths

INDEX = "tensorstore_index.json"
STEP = re.compile(r"run-(\d+)")
PREFIX = "model"

_L = r"model/layers/(?P<l>\d+)"
RULES: list[dict[str, Any]] = [
    {"from": "model/embed_tokens/embedding", "to": "embedding", "cut": 0},
    {"from": f"{_L}/self_attn/q_proj/kernel", "to": "layers/{l}/attn/q",
     "reshape": ["embed_dim", "num_heads", "head_dim"]},
    {"from": f"{_L}/self_attn/k_proj/kernel", "to": "layers/{l}/attn/k",
     "reshape": ["embed_dim", "num_kv_heads", "head_dim"]},
    {"from": f"{_L}/self_attn/v_proj/kernel", "to": "layers/{l}/attn/v",
     "reshape": ["embed_dim", "num_kv_heads", "head_dim"]},
    {"from": f"{_L}/self_attn/o_proj/kernel", "to": "layers/{l}/attn/o",
     "reshape": ["num_heads", "head_dim", "embed_dim"]},
    {"from": f"{_L}/self_attn/q_proj/bias", "to": "layers/{l}/attn/q_bias",
     "reshape": ["num_heads", "head_dim"]},
    {"from": f"{_L}/self_attn/k_proj/bias", "to": "layers/{l}/attn/k_bias",
     "reshape": ["num_kv_heads", "head_dim"]},
    {"from": f"{_L}/self_attn/v_proj/bias", "to": "layers/{l}/attn/v_bias",
     "reshape": ["num_kv_heads", "head_dim"]},
    {"from": f"{_L}/self_attn/q_norm/kernel", "to": "layers/{l}/attn/q_norm"},
    {"from": f"{_L}/self_attn/k_norm/kernel", "to": "layers/{l}/attn/k_norm"},
    {"from": f"{_L}/mlp/gate_proj/kernel", "to": "layers/{l}/mlp/gate"},
    {"from": f"{_L}/mlp/up_proj/kernel", "to": "layers/{l}/mlp/up"},
    {"from": f"{_L}/mlp/down_proj/kernel", "to": "layers/{l}/mlp/down"},
    {"from": f"{_L}/input_layernorm/kernel", "to": "layers/{l}/attn_norm"},
    {"from": f"{_L}/post_attention_layernorm/kernel", "to": "layers/{l}/mlp_norm"},
    {"from": "model/norm/kernel", "to": "final_norm"},
    {"from": "lm_head/kernel", "to": "lm_head", "cut": 1},
]  # fmt: skip


def _number(path: str) -> int | None:
    found = STEP.fullmatch(path.rstrip("/").rsplit("/", 1)[-1])
    return int(found.group(1)) if found else None


class EasyDeLCheckpoint(StepFolders, Checkpoint):
    """An EasyDeL checkpoint folder, or a run of `run-<step>/` milestones (module docstring)."""

    format = "easydel"
    STEP, FOLDER = STEP, "run-{step}"
    NONE_YET, A_STEP = "saved EasyDeL milestone yet", "a saved milestone"
    formats = ("easydel",)
    layout_name = "an EasyDeL checkpoint (tensorstore_index.json)"
    tokenizer_files = "no tokenizer.json or tokenizer.model beside its config.json"

    def __init__(self, path: str, options: Options | None = None, why: str = ""):
        super().__init__(path, options, why)
        self.single = paths.isfile(paths.join(path, INDEX))
        self._trees: dict[int | None, tuple[Stored, dict[str, Any]]] = {}

    @classmethod
    def claims(cls, path: str, options: Options) -> str | None:
        if paths.isfile(paths.join(path, INDEX)):
            return f"EasyDeL's '{INDEX}'"
        if paths.isdir(path) and any(
            _number(n) is not None and paths.isfile(paths.join(path, n, INDEX))
            for n in paths.listdir(path)
        ):
            return f"run-<step> folders with EasyDeL's '{INDEX}'"
        return None

    def complete(self, folder: str) -> bool:
        return paths.isfile(paths.join(folder, INDEX))

    def _tree(self, step: int | None) -> tuple[Stored, dict[str, Any]]:
        if step in self._trees:
            return self._trees[step]
        folder, where = self._folder(step), self._where(step)
        prefix = (self.mapping_file().get("params", "") or self.options.params or PREFIX).strip("/")
        try:
            index = json.loads(paths.read_bytes(paths.join(folder, INDEX)))
            entries = index["prefixes"][prefix]
            listed = {e["path"]: (tuple(int(d) for d in e["shape"]), np.dtype(e["dtype"]))
                      for e in entries}  # fmt: skip
        except KeyError:
            raise CheckpointError(
                f"{where}: its {INDEX} has no '{prefix}' prefix (it holds "
                f"{', '.join(sorted(index.get('prefixes', {})))}); set checkpoint.params."
            ) from None
        except (OSError, ValueError, TypeError) as e:
            raise CheckpointError(f"{where}: its {INDEX} cannot be read ({e}).") from None
        stored: Stored = {}
        specs: dict[str, Any] = {}
        for full, shape_dtype in listed.items():
            full = tensorstore_tree.check_inside(full, where)
            name = full[len(prefix) + 1 :] if full.startswith(prefix + "/") else full
            stored[name] = shape_dtype
            specs[name] = tensorstore_tree.folder_spec(folder, full)
        self._trees[step] = (stored, specs)
        return self._trees[step]

    def stored(self, step: int | None) -> Stored:
        return self._tree(self.resolve_step(step))[0]

    def read(self, step: int | None, abstract: dict[str, jax.ShapeDtypeStruct]) -> dict[str, Any]:
        step = self.resolve_step(step)
        read = tensorstore_tree.reader(self._tree(step)[1])
        return storage.place(abstract, tensorstore_tree.wrap_read_errors(read, self._where(step)))

    def carried_description(self, step: int | None) -> dict[str, Any] | None:
        return safetensors.read_description(self._folder(self.resolve_step(step)))

    def stored_tokenizer(self, step: int | None) -> tokenizer_lib.Tokenizer | None:
        folder = self._folder(self.resolve_step(step))
        return safetensors.read_tokenizer(folder) if safetensors.has_tokenizer(folder) else None

    def rules(self, step: int | None = None) -> list[dict[str, Any]]:
        file = self.mapping_file()
        if file:
            return file["rules"]
        if self.mapping:
            return presets.rules_for(self.mapping, self.known(step))
        if self.known(step).get("tie_embeddings"):  # EasyDeL keeps an unused lm_head then
            return [r for r in RULES if r["to"] != "lm_head"] + [
                {"from": "lm_head/kernel", "to": None}
            ]
        return RULES

    def layout_lines(self, step: int | None) -> list[str]:
        step = self.resolve_step(step)
        return [
            f"{'checkpoint' if step is None else f'milestone run-{step}'}: {self._folder(step)}",
            f"params: the '{PREFIX}' prefix of {INDEX}   {len(self.stored(step))} arrays",
        ]
