"""What llama.cpp's GGUF names mean to a family of `ppl_jax.models.families`: the record a family
declares for each GGUF architecture it reads (`GGUFArchitecture`, in its `Family.gguf`), the view
of a file's header that the record's reader reads (`GGUFHeader`), and the mapping rules of the
tensor names llama.cpp gives every Llama-like architecture (`llama_rules`), which a family
completes with its own.

Keys (`{arch}.block_count`, `{arch}.attention.head_count`, ...) and tensor names (`token_embd`,
`blk.{i}.attn_q`, ...) are those llama.cpp's `convert_hf_to_gguf.py` writes and llama.cpp reads
(`src/llama-arch.cpp`). The rules undo the converter's layouts as transformers' GGUF loader undoes
them (`modeling_gguf_pytorch_utils`): an `[out, in]` projection is GGML's `[in, out]` `ne`, i.e.
the Hugging Face `nn.Linear` weight; experts are stacked `[experts, out, in]`. The reading of the
keys every architecture shares, and the choice of the record by `general.architecture`, are
`ppl_jax.checkpoints.readers.gguf_arch`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from typing import Any

from ppl_jax.errors import CheckpointError
from ppl_jax.models.decoders.llama_hf import HEADS_IN

LAYER = r"blk\.(?P<l>\d+)\."
# The norm tensors of each `norm_layout` (ppl_jax.models.decoders.llama), llama.cpp's name -> ours.
NORMS = {
    "pre": {"attn_norm": "attn_norm", "ffn_norm": "mlp_norm"},
    "sandwich": {"attn_norm": "attn_norm", "post_attention_norm": "post_attn_norm",
                 "ffn_norm": "mlp_norm", "post_ffw_norm": "post_mlp_norm"},
    "post": {"post_attention_norm": "post_attn_norm", "post_ffw_norm": "post_mlp_norm"},
}  # fmt: skip
_REQUIRED = object()


@dataclasses.dataclass(frozen=True)
class GGUFHeader:
    """A GGUF file's header as an architecture's reader sees it.

    Attributes:
      path: the file, for the sentences.
      arch: its `general.architecture`.
      metadata: key -> value, as the `gguf` package reads them.
      tensors: the names of its tensors.
      rows: tensor name -> its values, `[n] float32` (the small F32 tensors some architectures
        keep their rotary factors in: `rope_freqs`, `rope_factors_long`); None where none can
        be read.
    """

    path: str
    arch: str
    metadata: Mapping[str, Any]
    tensors: Collection[str]
    rows: Callable[[str], Any] | None = None

    def key(self, key: str, default: Any = _REQUIRED) -> Any:
        """The value of `{arch}.{key}`, or `default` when the file has none.

        Raises:
          CheckpointError: a key without a default that the file lacks, naming it.
        """
        value = self.metadata.get(f"{self.arch}.{key}", default)
        if value is _REQUIRED:
            raise CheckpointError(
                f"{self.path!r} lacks the metadata key {self.arch}.{key}, which its {self.arch} "
                f"architecture needs; re-convert the model."
            )
        return value


@dataclasses.dataclass(frozen=True)
class GGUFArchitecture:
    """How a family reads one GGUF architecture (a `general.architecture` name).

    Attributes:
      model_type: the Hugging Face `model_type` the file is read as (by the family's reader in
        `hf_readers`), unless `config` says another.
      rules: description dict -> the mapping rules of the file's tensor names.
      config: (header, c) -> the file's `config.json` dict, as transformers names its fields:
        `c` holds what the keys every architecture shares give (`model_type`, the sizes; with
        `llama_like` the Llama-like fields too), completed here with what this architecture's
        keys and tensors mean (default: `c` as it is). Raises `CheckpointError` in one sentence.
      llama_like: whether `c` holds the Llama-like fields (`intermediate_size`, `rms_norm_eps`,
        `head_dim`, `partial_rotary_factor`, `rope_parameters`, the experts'); False for a
        `config.json` of names of its own (GPT-2's).
    """

    model_type: str
    rules: Callable[[dict[str, Any]], list[dict[str, Any]]]
    config: Callable[[GGUFHeader, dict[str, Any]], dict[str, Any]] = lambda header, c: c
    llama_like: bool = True


def layer_types(pattern: list[Any]) -> list[str]:
    """The `layer_types` of an `attention.sliding_window_pattern` list (true: sliding)."""
    return ["sliding_attention" if bool(p) else "full_attention" for p in pattern]


def llama_rules(
    d: dict[str, Any],
    *,
    norms: Mapping[str, str] | None = None,
    offset: float = 0.0,
    rope_pairs: bool = False,
) -> list[dict[str, Any]]:
    """The mapping rules of the tensor names llama.cpp gives the Llama-like architectures, for
    the description `d`: embeddings, norms, attention (q, k, v, output, their biases, sinks,
    QK-norm), the dense MLP, the router, the stacked experts and the shared expert.

    Args:
      d: the description (its `norm_layout`, `qk_norm`, `num_heads`, `num_kv_heads`,
        `head_dim`).
      norms: the per-layer norm tensors, llama.cpp's name -> ours (default: those of
        `d["norm_layout"]`, `NORMS`).
      offset: added to every norm's weight (Gemma's norms are stored as `1 + w`: -1).
      rope_pairs: the q and k rows are permuted per head into interleaved pairs (the converter's
        `LlamaModel.permute`), which the rules turn back into halves; otherwise a fused
        `attn_qkv` (rows q, then k, then v, as Phi-3's) is read too.
    """
    norm = {"offset": offset} if offset else {}
    permute = {"rope": {"axis": 2}} if rope_pairs else {}
    out: list[dict[str, Any]] = [
        {"from": r"token_embd\.weight", "to": "embedding"},
        {"from": r"output_norm\.weight", "to": "final_norm", **norm},
        {"from": r"output\.weight", "to": "lm_head", "transpose": [1, 0]},
        {"from": r"rope_freqs\.weight|rope_factors_(?:long|short)\.weight", "to": None},
    ]
    for theirs, ours in (norms or NORMS[d.get("norm_layout", "pre")]).items():
        out.append({"from": LAYER + theirs + r"\.weight", "to": "layers/{l}/" + ours, **norm})
    attn = "layers/{l}/attn/"
    out += [
        {"from": LAYER + r"attn_(?P<p>[qk])\.weight", "to": attn + "{p}", **HEADS_IN, **permute},
        {"from": LAYER + r"attn_v\.weight", "to": attn + "v", **HEADS_IN},
        {"from": LAYER + r"attn_(?P<p>[qk])\.bias", "to": attn + "{p}_bias",
         "reshape": [-1, "head_dim"], **({"rope": {"axis": 1}} if permute else {})},
        {"from": LAYER + r"attn_v\.bias", "to": attn + "v_bias", "reshape": [-1, "head_dim"]},
        {"from": LAYER + r"attn_output\.weight", "to": attn + "o", "transpose": [1, 0],
         "reshape": ["num_heads", "head_dim", "embed_dim"]},
        {"from": LAYER + r"attn_output\.bias", "to": attn + "o_bias"},
        {"from": LAYER + r"attn_sinks\.weight", "to": attn + "sinks"},
    ]  # fmt: skip
    if not permute:
        q, kv = d["num_heads"] * d["head_dim"], d["num_kv_heads"] * d["head_dim"]
        out.append({"from": LAYER + r"attn_qkv\.weight", "to": [attn + p for p in "qkv"],
                    "split": {"axis": 0, "sizes": [q, kv, kv]}, **HEADS_IN})  # fmt: skip
    qk_norm = {"from": LAYER + r"attn_(?P<p>[qk])_norm\.weight", "to": attn + "{p}_norm", **norm}
    if d.get("qk_norm") == "projection":
        qk_norm["reshape"] = [-1, "head_dim"]
    out.append(qk_norm)
    mlp = "layers/{l}/mlp/"
    linear = {"transpose": [1, 0]}
    stacked = {"transpose": [0, 2, 1]}
    out += [
        {"from": LAYER + r"ffn_(?P<p>gate|up|down)\.weight", "to": mlp + "{p}", **linear},
        {"from": LAYER + r"ffn_gate_inp\.weight", "to": mlp + "router", **linear},
        {"from": LAYER + r"ffn_gate_inp\.bias", "to": mlp + "router_bias"},
        {"from": LAYER + r"ffn_(?P<p>gate|up|down)_exps\.weight", "to": mlp + "{p}", **stacked},
        {"from": LAYER + r"ffn_(?P<p>gate|up|down)_exps\.bias", "to": mlp + "{p}_bias"},
        {"from": LAYER + r"ffn_gate_up_exps\.weight", "to": [mlp + "gate", mlp + "up"],
         "split": {"axis": 1}, **stacked},
        {"from": LAYER + r"ffn_gate_shexp\.weight", "to": mlp + "shared_gate_proj", **linear},
        {"from": LAYER + r"ffn_(?P<p>up|down)_shexp\.weight", "to": mlp + "shared_{p}", **linear},
        {"from": LAYER + r"ffn_gate_inp_shexp\.weight", "to": mlp + "shared_scale",
         "reshape": ["embed_dim"]},
    ]  # fmt: skip
    return out
