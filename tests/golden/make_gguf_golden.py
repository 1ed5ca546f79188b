"""Writes the GGUF golden files (tests/golden/gguf/) in a side environment of its own:

    ~/.pyenv/versions/3.11.7/bin/python -m venv /work/sidevenvs/gguf
    /work/sidevenvs/gguf/bin/pip install torch==2.13.0 transformers==5.24.0 gguf==0.19.0 \
        sentencepiece tokenizers
    /work/sidevenvs/gguf/bin/python tests/golden/make_gguf_golden.py

For each case of `CASES`: a tiny random transformers model (seed 0) and a tokenizer trained on
`TRAIN_TEXT` (byte-level BPE with `tokenizers`, or SentencePiece BPE with byte fallback), written
as a GGUF file the way llama.cpp's `convert_hf_to_gguf.py` writes it (its tensor names from the
`gguf` package's own name map, the Llama architecture's q/k rows permuted per head, Gemma's norms
stored as `1 + w`, GPT-2's `Conv1D` weights transposed, experts stacked, GPT-OSS's gate and up
split; the metadata keys of the converter and of its vocabulary writers). The tensors are stored
in the types of the case's plan: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and MXFP4 quantize
the model's weights with `gguf.quants.quantize`; the K-quants and IQ types (which the `gguf`
package dequantizes but does not quantize) are random valid blocks (random quants, scales set to
give the weights a sane spread), so those files test dequantization and layout, not
quantization quality. 1-D tensors are F32, as llama.cpp keeps them.

Beside each `<case>.gguf`, `<case>.json` holds transformers' view of the file: the ids of
`HELD_OUT` from `AutoTokenizer.from_pretrained(folder, gguf_file=...)` (with and without special
tokens) and the float32 log-probability of every next token of the first `SEQ` ids from
`AutoModelForCausalLM.from_pretrained(folder, gguf_file=..., dtype=torch.float32)` (transformers
dequantizes with the `gguf` package and undoes the converter's layouts itself). Where
transformers' GGUF config lacks a field llama.cpp fixes (Gemma's attention scale: llama.cpp's
`head_dim ** -0.5`), the load overrides it (`overrides`); OLMo 2, which transformers does not load
from GGUF, is scored as the original model with its weights replaced by their quantize-dequantize
round trip (`reference: round trip`). Before a case is written, an all-F32 copy of the same model
is loaded back by transformers and must give the original model's logits: the writer's layouts
are transformers' loader's.

tests/unit/checkpoints/test_gguf_golden.py reads these files with ppl_jax. Nothing here imports
ppl_jax.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import gguf
import numpy as np
import sentencepiece as spm
import torch
import transformers as tf
from gguf import GGMLQuantizationType as Q
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "gguf")
SEQ = 64
TRAIN_TEXT = (
    "The committee met on Tuesday to review the budget for the new library, which had grown by "
    "nearly a third since the spring. Several members argued that the reading rooms should open "
    "earlier, while others wanted the money spent on the roof. In 1887 the railway reached the "
    "town; within a decade its population had doubled, and the old market square was paved with "
    "stone brought from the quarry at Hill End. Rain fell over the valley for six days, and the "
    "river rose until the lower fields were under water. The miller's daughter kept a diary of "
    "the flood: the height of the water each morning, the animals moved to the barn, the bread "
    "baked for the neighbours whose ovens were ruined. Forty years later her grandson found it "
    "in a tin box under the stairs and gave it to the museum, where it lies open beside a map of "
    "the old parish. Visitors read that on the fourth day the bridge gave way at noon, and that "
    "by evening the church bells were rung to call the men to the embankment. "
) * 3
HELD_OUT = (
    "On the fifth day the rain stopped; the water fell by 12 inches before noon. She wrote: "
    '"We counted 37 sheep, 4 cows and the old horse."  Then,\n\nat last, the sun. '
    "<|endoftext|> Café naïve façade — 2024-06-01, 3.14159 and ünïcödé 日本語 ☃!"
)
# tokenizer.ggml.token_type values (llama.cpp's `TokenType`).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
ARCH = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}
NUMPY_TYPES = {Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.MXFP4}
# Byte offsets of each block's float16 scales (ggml-common.h), for the random blocks.
SCALES = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,),
          Q.IQ4_NL: (0,), Q.IQ4_XS: (0,), Q.IQ2_XXS: (0,), Q.IQ2_XS: (0,), Q.IQ2_S: (0,),
          Q.IQ3_XXS: (0,), Q.IQ3_S: (0,), Q.IQ1_S: (0,), Q.TQ1_0: (52,), Q.TQ2_0: (64,)}  # fmt: skip


# ---------------------------------------------------------------------------------- tokenizers


def bpe_vocab(specials: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>")) -> dict:
    """A byte-level BPE as `_set_vocab_gpt2` writes it: tokens in GPT-2's byte spelling, control
    tokens for the specials, merges "a b"."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator([TRAIN_TEXT], trainer)
    spec = json.loads(tok.to_str())
    by_id = {i: t for t, i in spec["model"]["vocab"].items()}
    tokens = [by_id[i] for i in range(len(by_id))]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    types = [CONTROL if t in specials else NORMAL for t in tokens]
    return {"model": "gpt2", "tokens": tokens, "types": types, "merges": merges,
            "bos": 0, "eos": 0}  # fmt: skip


def spm_vocab(gemma: bool = False) -> dict:
    """A SentencePiece BPE with byte fallback as `_create_vocab_sentencepiece` writes it: pieces,
    scores and types (unknown, control, byte, normal); Gemma's with its special tokens first and
    two user-defined all-space tokens, spelled with spaces as the converter pre-normalizes them."""
    folder = tempfile.mkdtemp()
    with open(os.path.join(folder, "train.txt"), "w") as f:
        f.write(TRAIN_TEXT.replace(". ", ".\n"))
    ids = dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3) if gemma else {}
    extra = dict(control_symbols=["<mask>", "<start_of_turn>"],
                 user_defined_symbols=["▁▁", "▁▁▁"]) if gemma else {}  # fmt: skip
    spm.SentencePieceTrainer.train(
        input=os.path.join(folder, "train.txt"), model_prefix=os.path.join(folder, "sp"),
        vocab_size=320, model_type="bpe", byte_fallback=True, character_coverage=1.0,
        minloglevel=2, **ids, **extra,
    )  # fmt: skip
    sp = spm.SentencePieceProcessor(model_file=os.path.join(folder, "sp.model"))
    shutil.rmtree(folder)
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        piece = sp.id_to_piece(i)
        kind = (UNKNOWN if sp.is_unknown(i) else CONTROL if sp.is_control(i) else
                UNUSED if sp.is_unused(i) else BYTE if sp.is_byte(i) else NORMAL)  # fmt: skip
        if gemma and piece in ("▁▁", "▁▁▁"):
            piece, kind = piece.replace("▁", " "), USER_DEFINED
        tokens.append(piece)
        scores.append(sp.get_score(i))
        types.append(kind)
    out = {"model": "llama", "tokens": tokens, "types": types, "scores": scores,
           "bos": sp.bos_id(), "eos": sp.eos_id(), "unk": sp.unk_id()}  # fmt: skip
    if gemma:
        out["pad"] = sp.pad_id()
    return out


# ------------------------------------------------------------------------------------ tensors


def random_blocks(shape: tuple[int, ...], qtype: Q, rng: np.random.Generator) -> np.ndarray:
    """Random valid blocks of `qtype` for a tensor of `shape` (see the module docstring), with
    the weights' spread about 1 / sqrt(row)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n = int(np.prod(shape)) // block
    raw = rng.integers(0, 256, (n, size), dtype=np.uint8)

    def with_scale(scale: float) -> np.ndarray:
        out = raw.copy()
        for at in SCALES[qtype]:
            values = (scale * rng.uniform(0.5, 1.0, n)).astype(np.float16)
            out[:, at : at + 2] = values.view(np.uint8).reshape(n, 2)
        return out

    rng_state = rng.bit_generator.state
    spread = gguf.quants.dequantize(with_scale(1.0), qtype).std()
    rng.bit_generator.state = rng_state
    target = 1.0 / np.sqrt(shape[-1])
    blocks = with_scale(float(target / spread))
    return blocks.reshape(*shape[:-1], shape[-1] // block * size)


def stored(array: np.ndarray, qtype: Q, rng: np.random.Generator) -> np.ndarray:
    if qtype in NUMPY_TYPES:
        return gguf.quants.quantize(array.astype(np.float32), qtype)
    return random_blocks(array.shape, qtype, rng)


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's `LlamaModel.permute`: each head's rows in interleaved pairs."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def gguf_tensors(model, arch: str, case: dict) -> list[tuple[str, np.ndarray]]:
    """The model's tensors as the converter names and lays them out (float32)."""
    cfg = model.config
    names = gguf.get_tensor_name_map(ARCH[arch], cfg.num_hidden_layers)
    out = []
    for hf_name, t in model.state_dict().items():
        w = t.detach().float().numpy()
        if hf_name.endswith((".attn.bias", ".attn.masked_bias")) or hf_name == "lm_head.weight" \
                and cfg.tie_word_embeddings:  # fmt: skip
            continue
        if arch == "llama" and hf_name.endswith(("q_proj.weight", "q_proj.bias")):
            w = permute(w, cfg.num_attention_heads)
        if arch == "llama" and hf_name.endswith(("k_proj.weight", "k_proj.bias")):
            w = permute(w, cfg.num_key_value_heads)
        if arch in ("gemma2", "gemma3") and hf_name.endswith("norm.weight"):
            w = w + np.float32(1.0)
        if arch == "gpt2" and hf_name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            w = w.T
        base, _, suffix = hf_name.rpartition(".")
        pieces = [(base, suffix, w)]
        if base.endswith("mlp.experts.gate_up_proj") or hf_name.endswith("experts.gate_up_proj"):
            stem = hf_name.removesuffix(".gate_up_proj").removesuffix("gate_up_proj").rstrip(".")
            if arch == "gpt-oss":  # [E, hidden, 2ff] interleaved -> gate, up [E, ff, hidden]
                wt = np.swapaxes(w, -1, -2)
                pieces = [(stem + ".gate_proj", "weight", wt[:, ::2]),
                          (stem + ".up_proj", "weight", wt[:, 1::2])]  # fmt: skip
            else:  # [E, 2ff, hidden] -> gate, up
                half = w.shape[1] // 2
                pieces = [(stem + ".gate_proj", "weight", w[:, :half]),
                          (stem + ".up_proj", "weight", w[:, half:])]  # fmt: skip
        elif hf_name.endswith("experts.gate_up_proj_bias"):
            stem = hf_name.removesuffix(".gate_up_proj_bias")
            pieces = [(stem + ".gate_proj", "bias", w[..., ::2]),
                      (stem + ".up_proj", "bias", w[..., 1::2])]  # fmt: skip
        elif hf_name.endswith("experts.down_proj"):
            wt = np.swapaxes(w, -1, -2) if arch == "gpt-oss" else w
            pieces = [(hf_name, "weight", wt)]
        elif hf_name.endswith("experts.down_proj_bias"):
            pieces = [(hf_name.removesuffix("_bias"), "bias", w)]
        elif hf_name.endswith("self_attn.sinks"):
            pieces = [(hf_name, "weight", w)]
        for base, suffix, data in pieces:
            name = names.get_name(base)
            assert name is not None, (arch, hf_name, base)
            out.append((f"{name}.{suffix}", np.ascontiguousarray(data)))
    return out


# ------------------------------------------------------------------------------------ writing


def write_gguf(path: str, arch: str, model, case: dict, vocab: dict, types: dict) -> None:
    """The file: the converter's metadata keys, the vocabulary, the tensors in their types."""
    rng = np.random.default_rng(1)
    cfg = model.config
    w = gguf.GGUFWriter(path, arch)
    w.add_name(case["name"])
    w.add_file_type(case["file_type"])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_block_count(cfg.num_hidden_layers)
    for key, value in case["metadata"](cfg).items():
        getattr(w, f"add_{key}")(value)
    w.add_tokenizer_model(vocab["model"])
    w.add_tokenizer_pre(case.get("pre", "default"))
    w.add_token_list(vocab["tokens"])
    w.add_token_types(vocab["types"])
    if "merges" in vocab:
        w.add_token_merges(vocab["merges"])
    if "scores" in vocab:
        w.add_token_scores(vocab["scores"])
    w.add_bos_token_id(vocab["bos"])
    w.add_eos_token_id(vocab["eos"])
    if "unk" in vocab:
        w.add_unk_token_id(vocab["unk"])
    if "pad" in vocab:
        w.add_pad_token_id(vocab["pad"])
    if "add_bos" in case:
        w.add_add_bos_token(case["add_bos"])
    for name, data in gguf_tensors(model, arch, case):
        if name.endswith("ffn_gate_inp_shexp.weight"):  # [1, hidden] kept 1-D, as transformers
            data = data.reshape(-1)  # expects (llama.cpp reads either)
        kept = ("_norm.weight", "ffn_gate_inp.weight", "position_embd.weight")  # the converter's
        if data.ndim == 1 or name.endswith(kept):  # float32 tensors
            qtype = Q.F32
        else:
            qtype = types(name) if callable(types) else types
        w.add_tensor(name, stored(data, qtype, rng), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def common(cfg, head_dim: int | None = None, rope: bool = True) -> dict:
    """`TextModel.set_gguf_parameters`' keys."""
    out = {
        "context_length": cfg.max_position_embeddings,
        "embedding_length": cfg.hidden_size,
        "feed_forward_length": cfg.intermediate_size,
        "head_count": cfg.num_attention_heads,
        "head_count_kv": cfg.num_key_value_heads,
        "layer_norm_rms_eps": cfg.rms_norm_eps,
    }
    if rope:
        out["rope_freq_base"] = cfg.rope_parameters["rope_theta"]
    if head_dim is not None:
        out.update(key_length=head_dim, value_length=head_dim)
    return out


def _perturbed(model) -> None:
    """1-D weights perturbed (a norm or bias read wrongly shows)."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=gen))


def build(case: dict, vocab_size: int):
    torch.manual_seed(0)
    cfg = case["config"](vocab_size)
    model = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    _perturbed(model)
    return model


def logits_of(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double()


def write_case(case: dict) -> None:
    name = case["name"]
    vocab = case["vocab"]()
    model = build(case, len(vocab["tokens"]))
    arch = case["arch"]
    folder = tempfile.mkdtemp()
    try:
        # The writer's layouts are transformers' loader's: an all-F32 copy reads back exactly.
        check = os.path.join(folder, "f32.gguf")
        write_gguf(check, arch, model, case, vocab, Q.F32)
        probe = list(range(3, 3 + SEQ))
        if case.get("reference") != "round trip":
            back = tf.AutoModelForCausalLM.from_pretrained(
                folder, gguf_file="f32.gguf", dtype=torch.float32, **case.get("overrides", {})
            ).eval()
            diff = (logits_of(back, probe) - logits_of(model, probe)).abs().max().item()
            assert diff < 1e-4, (name, diff)
            os.remove(check)
        path = os.path.join(folder, f"{name}.gguf")
        write_gguf(path, arch, model, case, vocab, case["types"])
        # (the generic class where transformers loads no GGUF config of the architecture)
        auto = tf.PreTrainedTokenizerFast if case.get("reference") else tf.AutoTokenizer
        tok = auto.from_pretrained(folder, gguf_file=f"{name}.gguf")
        ids = tok(HELD_OUT)["input_ids"]
        plain = tok.encode(HELD_OUT, add_special_tokens=False)
        if case.get("reference") == "round trip":
            ref = round_trip(model, path)
        else:
            ref = tf.AutoModelForCausalLM.from_pretrained(
                folder, gguf_file=f"{name}.gguf", dtype=torch.float32,
                **case.get("overrides", {}),
            ).eval()  # fmt: skip
        window = ids[:SEQ]
        logp = torch.log_softmax(logits_of(ref, window), dim=-1)
        targets = torch.tensor(window[1:])
        lp = logp[:-1].gather(1, targets[:, None])[:, 0].float().tolist()
        golden = {
            "file": f"{name}.gguf", "architecture": arch, "model_type": case["model_type"],
            "reference": case.get("reference", "transformers gguf_file"),
            "overrides": case.get("overrides", {}), "text": HELD_OUT, "ids": ids,
            "plain_ids": plain, "bos_id": vocab["bos"], "eos_id": vocab["eos"],
            "add_bos": ids[: len(ids) - len(plain)] == [vocab["bos"]], "seq": len(window),
            "log_probs": lp, "nll_sum": -float(np.sum(np.asarray(lp, np.float64))),
        }  # fmt: skip
        os.makedirs(OUT, exist_ok=True)
        shutil.copy(path, os.path.join(OUT, f"{name}.gguf"))
        with open(os.path.join(OUT, f"{name}.json"), "w") as f:
            json.dump(golden, f)
        print(name, os.path.getsize(path), "bytes,", len(plain), "tokens, nll", golden["nll_sum"])
    finally:
        shutil.rmtree(folder)


def round_trip(model, path: str):
    """The original model with each weight replaced by what the file stores of it, brought back
    with the `gguf` package: by name (OLMo 2 has no other layout change), and for GPT-OSS's
    experts the converter's split and transposes undone (gate and up interleaved again)."""
    reader = gguf.GGUFReader(path)
    stored = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors}
    names = gguf.get_tensor_name_map(
        ARCH[reader.fields["general.architecture"].contents()], model.config.num_hidden_layers
    )
    out = type(model)(model.config).eval()
    state = {}
    for hf_name, t in model.state_dict().items():
        base, _, suffix = hf_name.rpartition(".")
        if "mlp.experts." in hf_name:
            stem = names.get_name(base + ".gate_proj").removesuffix("_gate_exps")
            if suffix == "gate_up_proj":
                gate = stored[f"{stem}_gate_exps.weight"].transpose(0, 2, 1)
                up = stored[f"{stem}_up_exps.weight"].transpose(0, 2, 1)
                data = np.stack([gate, up], axis=-1).reshape(t.shape)
            elif suffix == "gate_up_proj_bias":
                gate, up = stored[f"{stem}_gate_exps.bias"], stored[f"{stem}_up_exps.bias"]
                data = np.stack([gate, up], axis=-1).reshape(t.shape)
            elif suffix == "down_proj":
                data = stored[f"{stem}_down_exps.weight"].transpose(0, 2, 1)
            else:
                data = stored[f"{stem}_down_exps.bias"]
        elif hf_name == "lm_head.weight" and model.config.tie_word_embeddings:
            data = stored["token_embd.weight"]
        elif suffix == "sinks":
            data = stored[f"{names.get_name(hf_name)}.weight"]
        else:
            data = stored[f"{names.get_name(base)}.{suffix}"]
        state[hf_name] = torch.from_numpy(np.ascontiguousarray(data).reshape(t.shape))
    out.load_state_dict(state)
    return out


# ------------------------------------------------------------------------------------ cases


def _llama(v):
    return tf.LlamaConfig(vocab_size=v, hidden_size=256, intermediate_size=32,
                          num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                          head_dim=16, max_position_embeddings=128, rms_norm_eps=1e-5,
                          tie_word_embeddings=True, initializer_range=0.1)  # fmt: skip


KQUANT_PLAN = {
    "token_embd.weight": Q.Q4_K,
    "blk.0.attn_q.weight": Q.Q4_K, "blk.0.attn_k.weight": Q.Q5_K, "blk.0.attn_v.weight": Q.Q6_K,
    "blk.0.attn_output.weight": Q.Q8_0, "blk.0.ffn_gate.weight": Q.Q2_K,
    "blk.0.ffn_up.weight": Q.Q3_K, "blk.0.ffn_down.weight": Q.Q4_0,
    "blk.1.attn_q.weight": Q.IQ4_XS, "blk.1.attn_k.weight": Q.IQ2_XXS,
    "blk.1.attn_v.weight": Q.IQ3_S, "blk.1.attn_output.weight": Q.IQ4_NL,
    "blk.1.ffn_gate.weight": Q.IQ2_XS, "blk.1.ffn_up.weight": Q.IQ3_XXS,
    "blk.1.ffn_down.weight": Q.Q5_0,
}  # fmt: skip
SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
             num_key_value_heads=1, max_position_embeddings=128, rms_norm_eps=1e-5,
             initializer_range=0.2)  # fmt: skip


def _mixed(name: str) -> Q:
    """Block-of-32 types over a small model's tensors, by name."""
    for part, qtype in (("token_embd", Q.Q8_0), ("output.", Q.Q4_1), ("attn_q.", Q.F16),
                        ("attn_k.", Q.BF16), ("attn_v.", Q.Q5_1), ("attn_output", Q.Q5_0),
                        ("ffn_gate", Q.Q4_0), ("ffn_up", Q.IQ4_NL), ("ffn_down", Q.Q8_0)):  # fmt: skip
        if part in name:
            return qtype
    return Q.Q8_0


CASES = [
    {
        "name": "llama_kquants", "arch": "llama", "model_type": "llama", "file_type": 15,
        "config": _llama, "vocab": spm_vocab, "types": lambda n: KQUANT_PLAN[n],
        "metadata": lambda c: {**common(c, c.head_dim), "vocab_size": c.vocab_size,
                               "rope_dimension_count": c.head_dim},
    },
    {
        "name": "llama_bpe", "arch": "llama", "model_type": "llama", "file_type": 7,
        "config": lambda v: tf.LlamaConfig(vocab_size=v, **SMALL, head_dim=16,
                                           attention_bias=True, tie_word_embeddings=False),
        "vocab": bpe_vocab, "pre": "llama-bpe", "add_bos": True, "types": _mixed,
        "overrides": {"attention_bias": True},  # transformers' GGUF config drops the biases
        "metadata": lambda c: {**common(c, c.head_dim), "vocab_size": c.vocab_size,
                               "rope_dimension_count": c.head_dim},
    },
    {
        "name": "qwen3", "arch": "qwen3", "model_type": "qwen3", "file_type": 7,
        "config": lambda v: tf.Qwen3Config(vocab_size=v, **SMALL, head_dim=16,
                                           tie_word_embeddings=True),
        "vocab": bpe_vocab, "pre": "qwen2", "types": Q.Q5_0,
        "overrides": {"head_dim": 16},  # transformers' GGUF config reads no key_length
        "metadata": lambda c: common(c, c.head_dim),
    },
    {
        "name": "qwen2", "arch": "qwen2", "model_type": "qwen2", "file_type": 2,
        "config": lambda v: tf.Qwen2Config(vocab_size=v, **SMALL, tie_word_embeddings=True),
        "vocab": bpe_vocab, "pre": "qwen2", "types": Q.Q4_0,
        "metadata": lambda c: common(c),
    },
    {
        "name": "qwen2moe", "arch": "qwen2moe", "model_type": "qwen2_moe", "file_type": 2,
        "config": lambda v: tf.Qwen2MoeConfig(vocab_size=v, **SMALL, moe_intermediate_size=32,
                                              shared_expert_intermediate_size=32, num_experts=4,
                                              num_experts_per_tok=2, tie_word_embeddings=True),
        "vocab": bpe_vocab, "pre": "qwen2", "types": Q.Q4_0,
        "overrides": {"moe_intermediate_size": 32, "shared_expert_intermediate_size": 32},
        "metadata": lambda c: {**common(c), "expert_count": c.num_experts,
                               "expert_used_count": c.num_experts_per_tok,
                               "expert_feed_forward_length": c.moe_intermediate_size,
                               "expert_shared_feed_forward_length":
                                   c.shared_expert_intermediate_size},
    },
    {
        "name": "gpt2", "arch": "gpt2", "model_type": "gpt2", "file_type": 1,
        "config": lambda v: tf.GPT2Config(vocab_size=v, n_embd=32, n_layer=1, n_head=2,
                                          n_positions=64, initializer_range=0.2),
        "vocab": bpe_vocab, "types": lambda n: Q.Q8_0 if "embd" in n else Q.Q4_1,
        "overrides": {"n_positions": 64},  # transformers reads context_length as n_ctx
        "metadata": lambda c: {"context_length": c.n_positions, "embedding_length": c.n_embd,
                               "feed_forward_length": 4 * c.n_embd, "head_count": c.n_head,
                               "layer_norm_eps": c.layer_norm_epsilon},
    },
    {
        "name": "qwen3moe", "arch": "qwen3moe", "model_type": "qwen3_moe", "file_type": 7,
        "config": lambda v: tf.Qwen3MoeConfig(vocab_size=v, **SMALL, head_dim=16,
                                              moe_intermediate_size=32, num_experts=4,
                                              num_experts_per_tok=2, norm_topk_prob=True,
                                              tie_word_embeddings=True),
        "vocab": bpe_vocab, "pre": "qwen2", "types": lambda n: Q.Q4_0 if "exps" in n else Q.Q8_0,
        "overrides": {"moe_intermediate_size": 32},  # not read by transformers' GGUF config
        "metadata": lambda c: {**common(c, c.head_dim), "expert_count": c.num_experts,
                               "expert_used_count": c.num_experts_per_tok,
                               "expert_feed_forward_length": c.moe_intermediate_size},
    },
    {
        "name": "gemma2", "arch": "gemma2", "model_type": "gemma2", "file_type": 7,
        "config": lambda v: tf.Gemma2Config(vocab_size=v, **{**SMALL, "num_hidden_layers": 2},
                                            head_dim=16, query_pre_attn_scalar=16,
                                            sliding_window=8, attn_logit_softcapping=2.0,
                                            final_logit_softcapping=3.0, pad_token_id=0),
        "vocab": lambda: spm_vocab(gemma=True), "types": Q.Q4_0,
        "overrides": {"head_dim": 16, "query_pre_attn_scalar": 16, "attn_logit_softcapping": 2.0,
                      "final_logit_softcapping": 3.0},  # softcaps: transformers reads none
        "metadata": lambda c: {**common(c, c.head_dim), "sliding_window": c.sliding_window,
                               "attn_logit_softcapping": c.attn_logit_softcapping,
                               "final_logit_softcapping": c.final_logit_softcapping},
    },
    {
        "name": "gemma3", "arch": "gemma3", "model_type": "gemma3_text", "file_type": 1,
        "config": lambda v: tf.Gemma3TextConfig(vocab_size=v, **{**SMALL, "num_hidden_layers": 2},
                                                head_dim=16, query_pre_attn_scalar=16,
                                                sliding_window=8, pad_token_id=0),
        "vocab": lambda: spm_vocab(gemma=True),
        "types": lambda n: Q.Q8_0 if "embd" in n else Q.Q4_1,
        "overrides": {"head_dim": 16, "query_pre_attn_scalar": 16},
        "metadata": lambda c: {
            **common(c, c.head_dim, rope=False), "sliding_window": c.sliding_window,
            "rope_freq_base": c.rope_parameters["full_attention"]["rope_theta"],
            "rope_freq_base_swa": c.rope_parameters["sliding_attention"]["rope_theta"]},
    },
    {
        "name": "phi3", "arch": "phi3", "model_type": "phi3", "file_type": 7,
        "config": lambda v: tf.Phi3Config(vocab_size=v, **SMALL, pad_token_id=0, bos_token_id=1,
                                          eos_token_id=2, tie_word_embeddings=True),
        "vocab": spm_vocab, "types": Q.Q5_1, "overrides": {"pad_token_id": 0},
        "metadata": lambda c: {**common(c), "rope_scaling_orig_ctx_len": 128,
                               "rope_dimension_count": c.hidden_size // c.num_attention_heads,
                               "sliding_window": 0},
    },
    {
        "name": "olmo2", "arch": "olmo2", "model_type": "olmo2", "file_type": 7,
        "config": lambda v: tf.Olmo2Config(vocab_size=v, **SMALL, pad_token_id=0,
                                           tie_word_embeddings=True),
        "vocab": bpe_vocab, "pre": "llama-bpe", "types": Q.Q8_0, "reference": "round trip",
        "metadata": lambda c: common(c),
    },
    {
        "name": "gpt_oss", "arch": "gpt-oss", "model_type": "gpt_oss", "file_type": 38,
        "config": lambda v: tf.GptOssConfig(vocab_size=v, **{**SMALL, "num_hidden_layers": 2,
                                                              "intermediate_size": 32},
                                            head_dim=16, num_local_experts=4,
                                            num_experts_per_tok=2, sliding_window=8,
                                            tie_word_embeddings=False),
        "vocab": bpe_vocab, "pre": "gpt-4o", "reference": "round trip",
        "types": lambda n: Q.MXFP4 if "exps.weight" in n else Q.Q4_0,
        "metadata": lambda c: {
            **common(c, c.head_dim), "expert_count": c.num_local_experts,
            "expert_used_count": c.num_experts_per_tok,
            "expert_feed_forward_length": c.intermediate_size,
            "sliding_window": c.sliding_window, "rope_scaling_type": gguf.RopeScalingType.YARN,
            "rope_scaling_factor": c.rope_parameters["factor"],
            "rope_scaling_orig_ctx_len": c.rope_parameters["original_max_position_embeddings"],
            "rope_scaling_yarn_beta_fast": c.rope_parameters["beta_fast"],
            "rope_scaling_yarn_beta_slow": c.rope_parameters["beta_slow"]},
    },
]  # fmt: skip


def main() -> None:
    import sys

    chosen = sys.argv[1:]
    for case in CASES:
        if not chosen or case["name"] in chosen:
            write_case(case)


if __name__ == "__main__":
    main()
