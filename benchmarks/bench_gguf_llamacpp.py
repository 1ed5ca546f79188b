"""Benchmark: ppl_jax against llama.cpp's `llama-perplexity` on the same GGUF files.

    python -m benchmarks.bench_gguf_llamacpp export /tmp/demo/demo-f32.gguf
    llama-quantize /tmp/demo/demo-f32.gguf /tmp/demo/demo-Q4_0.gguf Q4_0        # llama.cpp's own
    llama-perplexity -m /tmp/demo/demo-Q4_0.gguf -f /tmp/demo/heldout.txt -c 512 -b 512
    python -m benchmarks.bench_gguf_llamacpp score /tmp/demo/demo-Q4_0.gguf /tmp/demo/heldout.txt

`export` writes ppl_jax's demo model (a 4-layer Llama trained on bytes) as a float32 GGUF file
the way llama.cpp's converter lays out a Llama (q and k rows permuted per head), with a
vocabulary of the 256 bytes (GPT-2's byte spelling, so that both tokenizers give the bytes as
ids; one merge of two bytes the text never holds, as llama.cpp needs the key), and the held-out
text beside it (the demo's held-out standard-library modules). `score` computes
`llama-perplexity`'s statistic with ppl_jax on a GGUF file: the ids cut into chunks of `--n_ctx`,
each chunk scored alone, the second half of its next-token predictions counted. llama.cpp is not
part of ppl_jax: build it yourself (docs/checkpoints.md gives the figures measured this way).
"""

from __future__ import annotations

import argparse
import os

import gguf
import jax
import jax.numpy as jnp
import numpy as np

from ppl_jax.checkpoints import open_checkpoint, resolve_architecture
from ppl_jax.config import held_out_paths
from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.models.interface import weight_paths
from ppl_jax.runtime import mesh as mesh_lib
from ppl_jax.scoring import token_nll
from ppl_jax.tokenizer.gguf import byte_alphabet

DEMO = os.path.join(os.path.dirname(os.path.dirname(__file__)), "ppl_jax", "demo", "checkpoint")


def _params(ckpt) -> dict[str, np.ndarray]:
    model = resolve_architecture(ckpt).model()
    mesh = mesh_lib.make_mesh(-1, 1)
    target = mesh_lib.param_targets(model.abstract_params, model.logical_axes, mesh,
                                    DEFAULT_RULES)[0]  # fmt: skip
    return {
        k: np.asarray(v, np.float32) for k, v in weight_paths(ckpt.restore(None, target)).items()
    }


def export(out: str) -> None:
    """The demo model as a float32 GGUF file `out`, and `heldout.txt` beside it."""
    ckpt = open_checkpoint(DEMO)
    d, p = ckpt.description(), _params(ckpt)
    e, hd = d["embed_dim"], d["head_dim"]

    def permuted(x: np.ndarray) -> np.ndarray:  # [embed, heads, head_dim] -> GGUF's q or k
        pairs = np.stack([x[..., : hd // 2], x[..., hd // 2 :]], axis=-1).reshape(x.shape)
        return pairs.reshape(e, -1).T.copy()

    w = gguf.GGUFWriter(out, "llama")
    w.add_name("ppl_jax demo")
    w.add_file_type(0)
    for key, value in (("block_count", d["num_layers"]), ("context_length", d["max_positions"]),
                       ("embedding_length", e), ("feed_forward_length", d["mlp_dim"]),
                       ("head_count", d["num_heads"]), ("head_count_kv", d["num_kv_heads"]),
                       ("rope_freq_base", d["rope_theta"]), ("layer_norm_rms_eps", d["norm_eps"]),
                       ("key_length", hd), ("value_length", hd), ("rope_dimension_count", hd),
                       ("vocab_size", 256)):  # fmt: skip
        getattr(w, f"add_{key}")(value)
    spelling = byte_alphabet()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([spelling[b] for b in range(256)])
    w.add_token_types([1] * 256)
    w.add_token_merges([f"{spelling[0]} {spelling[1]}"])
    w.add_add_bos_token(False)
    w.add_tensor("token_embd.weight", p["embedding"])
    w.add_tensor("output_norm.weight", p["final_norm"])
    for i in range(d["num_layers"]):
        layer = f"layers/{i}/"
        w.add_tensor(f"blk.{i}.attn_norm.weight", p[layer + "attn_norm"])
        w.add_tensor(f"blk.{i}.attn_q.weight", permuted(p[layer + "attn/q"]))
        w.add_tensor(f"blk.{i}.attn_k.weight", permuted(p[layer + "attn/k"]))
        w.add_tensor(f"blk.{i}.attn_v.weight", p[layer + "attn/v"].reshape(e, -1).T.copy())
        w.add_tensor(f"blk.{i}.attn_output.weight", p[layer + "attn/o"].reshape(-1, e).T.copy())
        w.add_tensor(f"blk.{i}.ffn_norm.weight", p[layer + "mlp_norm"])
        for part in ("gate", "up", "down"):
            w.add_tensor(f"blk.{i}.ffn_{part}.weight", p[layer + f"mlp/{part}"].T.copy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    text = "\n\n".join(open(f, encoding="utf-8").read() for f in held_out_paths().split(","))
    with open(os.path.join(os.path.dirname(out), "heldout.txt"), "w", encoding="utf-8") as f:
        f.write(text)
    print(f"{out}: {os.path.getsize(out):,} bytes; heldout.txt: {len(text.encode()):,} bytes")


def score(path: str, text: str, n_ctx: int) -> None:
    """`llama-perplexity`'s statistic of the GGUF file `path` on `text` (bytes as ids)."""
    ids = np.frombuffer(open(text, "rb").read(), np.uint8).astype(np.int32)
    chunks = ids[: len(ids) // n_ctx * n_ctx].reshape(-1, n_ctx)
    ckpt = open_checkpoint(path)
    model = resolve_architecture(ckpt).model()
    mesh = mesh_lib.make_mesh(-1, 1)
    target = mesh_lib.param_targets(model.abstract_params, model.logical_axes, mesh,
                                    DEFAULT_RULES)[0]  # fmt: skip
    params = ckpt.restore(None, target)
    positions = jnp.arange(n_ctx)[None]

    @jax.jit
    def nll(t):
        pos = jnp.broadcast_to(positions, t.shape)[:, :-1]
        return token_nll(model.apply(params, t[:, :-1], pos, jnp.ones_like(pos)), t[:, 1:])

    first = n_ctx // 2
    out = np.concatenate(
        [np.asarray(nll(jnp.asarray(chunks[i : i + 8])), np.float64)[:, first:]
         for i in range(0, len(chunks), 8)]
    )  # fmt: skip
    types = ckpt.quantization(None)["types"]
    print(f"{path}: {len(chunks)} chunks of {n_ctx}, {out.size:,} scored, "
          f"PPL = {np.exp(out.mean()):.6f} ({types})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("export").add_argument("out")
    s = sub.add_parser("score")
    s.add_argument("path")
    s.add_argument("text")
    s.add_argument("--n_ctx", type=int, default=512)
    args = parser.parse_args()
    if args.command == "export":
        export(args.out)
    else:
        score(args.path, args.text, args.n_ctx)


if __name__ == "__main__":
    main()
