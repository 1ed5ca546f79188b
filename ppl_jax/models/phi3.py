"""Phi-3 and Phi-4 (Hugging Face `phi3`): the Llama decoder whose checkpoints fuse q, k and v
into `qkv_proj` (the q rows, then k, then v) and gate and up into `gate_up_proj` (gate, then up;
`ppl_jax.checkpoints.hf` splits them on reading), with `longrope` scaling (short or long factors
by the window's length against `original_max_position_embeddings`, which Phi-3 stores beside
`rope_parameters` and which wins), `partial_rotary_factor` (Phi-4-mini) and an optional sliding
window on every layer. As transformers 5.23's `modeling_phi3`.
"""

from __future__ import annotations

from typing import Any

from ppl_jax.models import hf_config
from ppl_jax.models.llama import LlamaConfig


def from_hf_config(c: dict[str, Any]) -> LlamaConfig:
    """The architecture of a `phi3` `config.json`.

    Raises:
      CheckpointError: an activation other than silu, an unsupported rope scaling. KeyError: a
        required field is missing.
    """
    hf_config.check_activation(c, "hidden_act", "silu", ("silu",))
    return hf_config.hf_config(c, **hf_config.hf_sliding(c, "phi3", int(c["num_hidden_layers"])))
