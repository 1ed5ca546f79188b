"""Built-in mappings (`ppl_jax.checkpoints.mapping.language` rules) for the trees other trainers
write, and the reading of a user's mapping file.

Presets (the layouts measured with the libraries themselves; docs/other-trainers.md):

- `maxtext`: MaxText's Linen decoder (`llama2`, `mistral`, `qwen3` blocks), scanned
  (`decoder/layers/...`, layers on axis 1) or not (`decoder/layers_{i}/...`); the query kernel
  carries `1/sqrt(head_dim)` (MaxText attends with scale 1) unless the block has QK-norm; the
  embedding (and `logits_dense`) may be padded past the vocabulary. Params at `params/params`.
- `gemma`: the gemma library's Gemma 2/3 trees (`gm.ckpts.save_params`: `layer_{i}/attn/...`),
  nested or flat (`transformer/layer_0/...`); `q_einsum [heads, embed, head_dim]`, `kv_einsum
  [2, kv_heads, embed, head_dim]` (or `qkv_einsum [3, ...]`), `gating_einsum [2, mlp, embed]`
  (Gemma 2: `[2, embed, mlp]`); norms in the `1+w` form.
- `identity`: stored names are the model's (ppl_jax's own tree, saved by a user's loop).

A mapping file is YAML (JSON is YAML too): YAML because regular expressions are written as they
are read (no doubled backslashes in single quotes), comments explain a rule, and `yaml.safe_load`
runs no code (a Python file would; configuration read from data is never executed):

```yaml
item: default            # optional: the Orbax item (default: found)
params: params           # optional: the params subtree inside it (default: found)
rules:
  - {from: 'Embed_0/embedding', to: embedding}
  - {from: 'block_(?P<l>\\d+)/attn/q/kernel', to: 'layers/{l}/attn/q', reshape: [embed_dim, num_heads, head_dim]}
```
"""

from __future__ import annotations

from typing import Any

import yaml

from ppl_jax.checkpoints.mapping.rules import check_rules
from ppl_jax.errors import CheckpointError
from ppl_jax.runtime import paths

PRESETS = ("maxtext", "gemma", "identity")
FILE_KEYS = {"item", "params", "rules"}
MAX_FILE_BYTES = 1 << 20  # a mapping of every weight of the largest models is a few kB


class _Alias(Exception):
    def __init__(self, event: Any):
        super().__init__(event.anchor)
        self.event = event


class _Loader(yaml.SafeLoader):
    """`yaml.SafeLoader` without aliases (`*name`): an alias repeats a node, and nested ones
    repeat it exponentially (a "billion laughs" of a few hundred bytes); a mapping writes each
    rule out."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise _Alias(self.peek_event())
        return super().compose_node(parent, index)


def _maxtext(architecture: dict[str, Any]) -> list[dict[str, Any]]:
    qk_norm = architecture.get("qk_norm", "none") != "none"
    scale = 1.0 if qk_norm else "sqrt(head_dim)"
    rules = []
    for prefix, layers, at in (
        (r"decoder/layers", {"axis": 1}, "{layer}"),
        (r"decoder/layers_(?P<l>\d+)", None, "{l}"),
    ):
        blocks = [
            ("pre_self_attention_layer_norm/scale", "attn_norm", {}),
            ("self_attention/query/kernel", "attn/q", {"scale": scale}),
            ("self_attention/key/kernel", "attn/k", {}),
            ("self_attention/value/kernel", "attn/v", {}),
            ("self_attention/out/kernel", "attn/o", {}),
            ("self_attention/query_norm/scale", "attn/q_norm", {}),
            ("self_attention/key_norm/scale", "attn/k_norm", {}),
            ("post_self_attention_layer_norm/scale", "mlp_norm", {}),
            ("mlp/wi_0/kernel", "mlp/gate", {}),
            ("mlp/wi_1/kernel", "mlp/up", {}),
            ("mlp/wo/kernel", "mlp/down", {}),
        ]
        for stored, target, ops in blocks:
            rule = {"from": f"{prefix}/{stored}", "to": f"layers/{at}/{target}", **ops}
            if layers:
                rule["layers"] = layers
            rules.append(rule)
    rules += [
        {"from": "token_embedder/embedding", "to": "embedding", "cut": 0},
        {"from": "decoder/decoder_norm/scale", "to": "final_norm"},
        {"from": "decoder/logits_dense/kernel", "to": "lm_head", "cut": 1},
    ]
    return rules


def _gemma(architecture: dict[str, Any]) -> list[dict[str, Any]]:
    # The model's norms are `x̂·w` unless its family applies the `1+w` form itself.
    plus_one = {} if float(architecture.get("norm_offset", 0.0)) == 1.0 else {"plus_one": True}
    # Gemma 2 (no QK-norm) stores `gating_einsum` as [2, embed, mlp], Gemma 3 as [2, mlp, embed].
    gemma2 = architecture.get("qk_norm", "head") == "none"
    layer = r"(?:transformer/)?layer_(?P<l>\d+)"
    pair = {"axis": 0, "squeeze": True}
    return [
        {"from": r"(?:transformer/)?embedder/input_embedding", "to": "embedding", "cut": 0},
        {"from": rf"{layer}/pre_attention_norm/scale", "to": "layers/{l}/attn_norm", **plus_one},
        {
            "from": rf"{layer}/post_attention_norm/scale",
            "to": "layers/{l}/post_attn_norm",
            **plus_one,
        },  # fmt: skip
        {"from": rf"{layer}/pre_ffw_norm/scale", "to": "layers/{l}/mlp_norm", **plus_one},
        {"from": rf"{layer}/post_ffw_norm/scale", "to": "layers/{l}/post_mlp_norm", **plus_one},
        {"from": rf"{layer}/attn/q_einsum/w", "to": "layers/{l}/attn/q", "transpose": [1, 0, 2]},
        {
            "from": rf"{layer}/attn/kv_einsum/w",
            "to": ["layers/{l}/attn/k", "layers/{l}/attn/v"],
            "split": pair,
            "transpose": [1, 0, 2],
        },  # fmt: skip
        {
            "from": rf"{layer}/attn/qkv_einsum/w",
            "to": ["layers/{l}/attn/q", "layers/{l}/attn/k", "layers/{l}/attn/v"],
            "split": pair,
            "transpose": [1, 0, 2],
        },  # fmt: skip
        {"from": rf"{layer}/attn/_query_norm/scale", "to": "layers/{l}/attn/q_norm", **plus_one},
        {"from": rf"{layer}/attn/_key_norm/scale", "to": "layers/{l}/attn/k_norm", **plus_one},
        {"from": rf"{layer}/attn/attn_vec_einsum/w", "to": "layers/{l}/attn/o"},
        {
            "from": rf"{layer}/mlp/gating_einsum(?:/w)?",
            "to": ["layers/{l}/mlp/gate", "layers/{l}/mlp/up"],
            "split": pair,
            **({} if gemma2 else {"transpose": [1, 0]}),
        },  # fmt: skip
        {"from": rf"{layer}/mlp/linear(?:/w)?", "to": "layers/{l}/mlp/down"},
        {"from": r"(?:transformer/)?final_norm/scale", "to": "final_norm", **plus_one},
    ]


def _identity(architecture: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"from": "(?P<name>.*)", "to": "{name}"}]


_BUILDERS = {"maxtext": _maxtext, "gemma": _gemma, "identity": _identity}
# Where each preset's params sit inside the item, when the item holds more than the params.
PARAMS = {"maxtext": "params/params", "gemma": "", "identity": ""}


def rules_for(preset: str, architecture: dict[str, Any]) -> list[dict[str, Any]]:
    """The rules of a built-in preset for an architecture (`PRESETS`).

    Raises:
      CheckpointError: an unknown preset name.
    """
    if preset not in _BUILDERS:
        raise CheckpointError(
            f"checkpoint.mapping={preset!r} is neither a preset ({', '.join(PRESETS)}) nor a "
            f"mapping file (.yaml, .yml or .json)."
        )
    return _BUILDERS[preset](architecture)


def detect(stored: list[str]) -> str | None:
    """The preset whose tree `stored` names look like (MaxText, gemma), or None."""
    if any(n.startswith("decoder/") for n in stored) and "token_embedder/embedding" in stored:
        return "maxtext"
    if any(n.endswith("embedder/input_embedding") for n in stored):
        return "gemma"
    return None


def read_file(path: str) -> dict[str, Any]:
    """A mapping file: `{"item": str?, "params": str?, "rules": [rule, ...]}` (see the module).

    Read as data, never trusted: a regular file of at most `MAX_FILE_BYTES` (a FIFO, a device
    such as `/dev/zero`, or a larger file is refused before it is read), YAML without aliases
    (`_Loader`).

    Raises:
      CheckpointError: an unreadable file (not a regular file, too large, not UTF-8), not YAML,
        an alias, unknown keys, or faulty rules, naming it.
    """
    try:
        text = paths.read_small(path, MAX_FILE_BYTES).decode("utf-8")
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(
            f"checkpoint.mapping: cannot read {path!r} ({e}); give a YAML or JSON file of at "
            f"most {MAX_FILE_BYTES:,} bytes."
        ) from None
    try:
        data = yaml.load(text, Loader=_Loader)  # a SafeLoader without aliases
    except _Alias as e:
        raise CheckpointError(
            f"checkpoint.mapping {path!r} uses the YAML alias *{e.event.anchor} at line "
            f"{e.event.start_mark.line + 1}; ppl_jax reads no aliases (nested ones grow without "
            f"bound): write the rule out."
        ) from None
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise CheckpointError(
            f"checkpoint.mapping {path!r} is not valid YAML{line}; write rules as the docs' "
            f"'Checkpoints from other trainers' page shows."
        ) from None
    if isinstance(data, list):
        data = {"rules": data}
    if not isinstance(data, dict) or set(data) - FILE_KEYS or "rules" not in data:
        raise CheckpointError(
            f"checkpoint.mapping {path!r} must hold 'rules' (a list), and optionally 'item' and "
            f"'params'; it holds {sorted(data) if isinstance(data, dict) else type(data).__name__}."
        )
    data["rules"] = check_rules(data["rules"], f"checkpoint.mapping {path!r}")
    return data
