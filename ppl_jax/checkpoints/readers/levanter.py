"""levanter's (and marin's) training checkpoints: `LevanterRun`, read in place with TensorStore.

Layout (marin-levanter 0.2.227's `levanter.checkpoint` and `tensorstore_serialization`, measured
on its own checkpoints in tests/golden/trainers/levanter):

- a run folder (`<base_path>/<run_id>`) of step folders `step-<N>/`; a step is complete when its
  `metadata.json` (`{"step", "timestamp", "is_temporary"}`) is there: levanter writes it last,
  after every array is committed;
- in a step, one array per leaf of the saved train state, named by its path with `.` -> `/`
  (`model/transformer/layers/stacked/self_attn/q_proj/weight`, `opt_state/...`,
  `training_key`, `step`): since levanter's `manifest.json` (format 1), `zarr3` arrays in one
  OCDBT database per step (`manifest.ocdbt`, `d/`), listed by the manifest with shapes and
  dtypes; before, a zarr folder per leaf;
- the model's params are the `model/` subtree (`checkpoint.params` names another); haliax
  `Linear`s store `[*out, *in]` (`out_first=True`), scanned layers (`Stacked`) on axis 0 under
  `layers/stacked/`, unscanned ones (`BlockSeq`) under `layers/blocks/<i>/`;
- no architecture and no tokenizer: the run's YAML holds them; give the model as a Hugging
  Face `config.json` or a ppl_jax description (`checkpoint.architecture`).

The stored names map onto ppl_jax's llama family (Llama, Mistral, Qwen2 with q/k/v biases, Qwen3
with QK-norm, tied or not) by `RULES` (`ppl_jax.checkpoints.mapping.language`); `checkpoint.mapping`
(a preset or a file) replaces them.
"""

from __future__ import annotations

import json
import re
from typing import Any

import jax
import numpy as np

from ppl_jax.checkpoints.checkpoint import Checkpoint, Options, Stored
from ppl_jax.checkpoints.formats import tensorstore_tree
from ppl_jax.checkpoints.mapping import presets, storage
from ppl_jax.checkpoints.readers.step_folders import StepFolders
from ppl_jax.errors import CheckpointError
from ppl_jax.runtime import paths

STEP = re.compile(r"step-(\d+)")
COMMIT = "metadata.json"
MANIFEST = "manifest.json"
PARAMS = "model"

_LAYER = {"stacked": ("transformer/layers/stacked", {"axis": 0}, "{layer}"),
          "blocks": (r"transformer/layers/blocks/(?P<l>\d+)", None, "{l}")}  # fmt: skip
# stored (after the layer prefix) -> (model weight, operations): haliax keeps [*out, *in].
_BLOCK = [
    ("self_attn/q_proj/weight", "attn/q",
     {"transpose": [3, 0, 1, 2], "reshape": ["embed_dim", "num_heads", "head_dim"]}),
    ("self_attn/k_proj/weight", "attn/k", {"transpose": [2, 0, 1]}),
    ("self_attn/v_proj/weight", "attn/v", {"transpose": [2, 0, 1]}),
    ("self_attn/o_proj/weight", "attn/o", {"transpose": [1, 2, 0]}),
    ("self_attn/q_proj/bias", "attn/q_bias", {"reshape": ["num_heads", "head_dim"]}),
    ("self_attn/k_proj/bias", "attn/k_bias", {}),
    ("self_attn/v_proj/bias", "attn/v_bias", {}),
    ("self_attn/o_proj/bias", "attn/o_bias", {}),
    ("self_attn/q_norm/weight", "attn/q_norm", {}),
    ("self_attn/k_norm/weight", "attn/k_norm", {}),
    ("mlp/gate_proj/weight", "mlp/gate", {"transpose": [1, 0]}),
    ("mlp/up_proj/weight", "mlp/up", {"transpose": [1, 0]}),
    ("mlp/down_proj/weight", "mlp/down", {"transpose": [1, 0]}),
    ("mlp/gate_proj/bias", "mlp/gate_bias", {}),
    ("mlp/up_proj/bias", "mlp/up_bias", {}),
    ("mlp/down_proj/bias", "mlp/down_bias", {}),
    ("input_layernorm/weight", "attn_norm", {}),
    ("post_attention_layernorm/weight", "mlp_norm", {}),
]  # fmt: skip


def rules() -> list[dict[str, Any]]:
    """The mapping rules from levanter's Llama/Mistral/Qwen trees (the `model/` subtree) to
    ppl_jax's llama family."""
    out = []
    for prefix, layers, at in _LAYER.values():
        for stored, weight, ops in _BLOCK:
            rule = {"from": f"{prefix}/{stored}", "to": f"layers/{at}/{weight}", **ops}
            if layers:  # the layer axis is taken out first: the operations see one layer
                rule["layers"] = layers
            out.append(rule)
    return out + [
        {"from": "embeddings/token_embeddings/weight", "to": "embedding", "cut": 0},
        {"from": "transformer/norm/weight", "to": "final_norm"},
        {"from": "lm_head/weight", "to": "lm_head", "transpose": [1, 0], "cut": 1},
    ]


def _base(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def _number(name: str) -> int | None:
    found = STEP.fullmatch(name)
    return int(found.group(1)) if found else None


def complete(folder: str) -> bool:
    """A step folder whose `metadata.json` levanter committed (a JSON object with `step`)."""
    try:
        meta = json.loads(paths.read_bytes(paths.join(folder, COMMIT)).decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(meta, dict) and "step" in meta


class LevanterRun(StepFolders, Checkpoint):
    """A levanter run folder of `step-<N>/` steps, or one step folder (module docstring)."""

    format = "levanter"
    STEP, FOLDER = STEP, "step-{step}"
    NONE_YET = f"complete levanter step yet (step-<N> with '{COMMIT}')"
    formats = ("levanter",)
    layout_name = "a levanter run (TensorStore arrays per leaf, no architecture)"
    tokenizer_files = "levanter keeps the tokenizer in the run's YAML, not in the checkpoint"

    def __init__(self, path: str, options: Options | None = None, why: str = ""):
        super().__init__(path, options, why)
        number = _number(_base(path))
        self.single = number is not None and paths.isfile(paths.join(path, COMMIT))
        self._trees: dict[int | None, tuple[Stored, dict[str, dict[str, Any]]]] = {}

    @classmethod
    def claims(cls, path: str, options: Options) -> str | None:
        if _number(_base(path)) is not None and paths.isfile(paths.join(path, COMMIT)):
            return f"a levanter step folder ('{COMMIT}' in step-<N>)"
        if not paths.isdir(path):
            return None
        for name in paths.listdir(path):
            if _number(name) is not None and paths.isfile(paths.join(path, name, COMMIT)):
                return f"step-<N> folders with levanter's '{COMMIT}'"
        return None

    def complete(self, folder: str) -> bool:
        return complete(folder)

    def _params(self) -> str:
        return (self.mapping_file().get("params", "") or self.options.params or PARAMS).strip("/")

    def _tree(self, step: int | None) -> tuple[Stored, dict[str, dict[str, Any]]]:
        """The params (name -> shape, dtype) and each one's TensorStore spec."""
        if step in self._trees:
            return self._trees[step]
        folder, where = self._folder(step), self._where(step)
        listed: dict[str, Any] = {}
        if paths.isfile(paths.join(folder, MANIFEST)):
            try:
                manifest = json.loads(paths.read_bytes(paths.join(folder, MANIFEST)))
                listed = {a["path"]: a for a in manifest["arrays"]}
                driver, kv = manifest["array_driver"], manifest["kvstore_driver"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise CheckpointError(f"{where}: its {MANIFEST} cannot be read ({e}).") from None
            if kv != "ocdbt" or driver not in ("zarr", "zarr3"):
                raise CheckpointError(
                    f"{where}: its {MANIFEST} names arrays of driver {driver!r} in a {kv!r} "
                    f"store; ppl_jax reads levanter's zarr/zarr3 arrays in OCDBT."
                )
            specs = {n: tensorstore_tree.ocdbt_spec(folder, n, driver) for n in listed}
        elif paths.isfile(paths.join(folder, "manifest.ocdbt")):
            names = tensorstore_tree.ocdbt_arrays(folder)
            specs = {n: tensorstore_tree.ocdbt_spec(folder, n) for n in names}
        else:
            found = tensorstore_tree.folder_arrays(folder)
            specs = {n: tensorstore_tree.folder_spec(folder, n, d) for n, d in found.items()}
        prefix = self._params() + "/"
        specs = {n[len(prefix) :]: s for n, s in specs.items() if n.startswith(prefix)}
        for name in specs:
            tensorstore_tree.check_inside(prefix + name, where)
        if not specs:
            raise CheckpointError(
                f"{where} holds no arrays under '{prefix}' (set checkpoint.params to the "
                f"subtree with the model's params)."
            )
        if listed:
            stored = {n: (tuple(listed[prefix + n]["shape"]), np.dtype(listed[prefix + n]["dtype"]))
                      for n in specs}  # fmt: skip
        else:
            stored = tensorstore_tree.shapes(specs, where)
        self._trees[step] = (stored, specs)
        return self._trees[step]

    def stored(self, step: int | None) -> Stored:
        return self._tree(self.resolve_step(step))[0]

    def read(self, step: int | None, abstract: dict[str, jax.ShapeDtypeStruct]) -> dict[str, Any]:
        step = self.resolve_step(step)
        specs = self._tree(step)[1]
        read = tensorstore_tree.wrap_read_errors(tensorstore_tree.reader(specs), self._where(step))
        return storage.place(abstract, read)

    def rules(self, step: int | None = None) -> list[dict[str, Any]]:
        file = self.mapping_file()
        if file:
            return file["rules"]
        if self.mapping:
            return presets.rules_for(self.mapping, self.known(step))
        return rules()

    def layout_lines(self, step: int | None) -> list[str]:
        step = self.resolve_step(step)
        folder = self._folder(step)
        kind = "OCDBT + manifest.json" if paths.isfile(paths.join(folder, MANIFEST)) else "zarr"
        return [
            f"{'step folder' if step is None else f'step {step}'}: {folder} ({kind})",
            f"params: {self._params()}/   {len(self.stored(step))} arrays",
        ]
