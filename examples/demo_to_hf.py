"""Write the demo checkpoint (a 4-layer Llama trained on Python's standard library, byte
tokenizer) as a Hugging Face directory, the original of docs/diagnostics.md's worked example of
comparing quantized copies:

    python examples/demo_to_hf.py /tmp/quant/original

Each ppl_jax weight goes back to transformers' Llama name and layout (`[out, in]` projections;
ppl_jax's rules split them into heads on the way in); the directory scores as the demo does.
"""

import json
import os
import sys

import numpy as np
from safetensors.numpy import save_file

import ppl_jax
from ppl_jax.models.interface import weight_paths
from ppl_jax.runtime import DEFAULT_RULES, param_targets

out = sys.argv[1] if len(sys.argv) > 1 else "original"
ckpt = ppl_jax.open_checkpoint(
    os.path.join(os.path.dirname(ppl_jax.__file__), "demo", "checkpoint")
)
d = ckpt.description()
model = ppl_jax.resolve_architecture(ckpt).model()
target, _ = param_targets(
    model.abstract_params, model.logical_axes, ppl_jax.make_mesh(), DEFAULT_RULES
)
restored = ckpt.restore(None, target)
params = {k: np.asarray(v, np.float32) for k, v in weight_paths(restored).items()}
tensors = {
    "model.embed_tokens.weight": params["embedding"],
    "model.norm.weight": params["final_norm"],
}
for i in range(d["num_layers"]):
    at, to = f"layers/{i}/", f"model.layers.{i}."
    for p in "qkv":
        w = params[f"{at}attn/{p}"]  # [embed, heads, head_dim]
        tensors[f"{to}self_attn.{p}_proj.weight"] = w.reshape(w.shape[0], -1).T
    o = params[f"{at}attn/o"]  # [heads, head_dim, embed]
    tensors[f"{to}self_attn.o_proj.weight"] = o.reshape(-1, o.shape[-1]).T
    for p in ("gate", "up", "down"):
        tensors[f"{to}mlp.{p}_proj.weight"] = params[f"{at}mlp/{p}"].T
    tensors[f"{to}input_layernorm.weight"] = params[f"{at}attn_norm"]
    tensors[f"{to}post_attention_layernorm.weight"] = params[f"{at}mlp_norm"]
config = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": d["vocab_size"],
    "hidden_size": d["embed_dim"], "intermediate_size": d["mlp_dim"],
    "num_hidden_layers": d["num_layers"], "num_attention_heads": d["num_heads"],
    "num_key_value_heads": d["num_kv_heads"], "head_dim": d["head_dim"],
    "max_position_embeddings": d["max_positions"], "rms_norm_eps": d["norm_eps"],
    "rope_theta": d["rope_theta"], "tie_word_embeddings": d["tie_embeddings"],
    "hidden_act": "silu", "torch_dtype": "float32",
}  # fmt: skip
os.makedirs(out, exist_ok=True)
save_file(
    {k: np.ascontiguousarray(v) for k, v in tensors.items()}, os.path.join(out, "model.safetensors")
)
with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as f:
    json.dump(config, f, indent=2)
print(f"wrote {out}: {len(tensors)} tensors (score it with --config.data.tokenizer=byte)")
