"""Writes the quantized-checkpoint goldens of tests/golden/quantized/ in a side environment that
holds the formats' own libraries (never ppl_jax's):

    /work/sidevenvs/quant: Python 3.11, torch 2.13.0 (CPU), transformers 5.24.0,
    compressed-tensors 0.20.1, gptqmodel 7.7.0 and autoawq 0.2.9 (both `pip install --no-deps`,
    with the few pure-Python packages gptqmodel imports: pypcre, logbar, threadpoolctl,
    device-smi, tokenicer, defuser, dill, pillow, requests)

    python tests/golden/make_quant_golden.py
    python tests/golden/make_quant_golden.py --copies ORIGINAL OUT   # `copies`

Each folder is a tiny Hugging Face checkpoint written the way its format's writer writes it, with
`golden.json`: the reference dequantization of every quantized weight (sha256 of its bytes, in
the dtype the reference computes it in; Hugging Face layout), and transformers' float32
log-probabilities of the targets of two rows of 24 tokens, the model's weights being that
reference dequantization (weight-only semantics: activations in float32).

- `gptq_sym` (Llama, 4 bits, groups of 16, symmetric, `checkpoint_format` gptq (v1: zero points
  stored minus one)) and `gptq_act_order` (4 bits, asymmetric, `desc_act` (a permuted `g_idx`),
  zero points of 0 forced in: v1's stored `z - 1` borrows across a word): packed by gptqmodel's
  own `TorchLinear.pack_original` and its v2-to-v1 conversion (what gptqmodel saves); the
  reference is gptqmodel's `TorchLinear.dequantize_weight` after its load-time v1-to-v2
  conversion, the kernel transformers runs.
- `awq` (Llama, 4 bits, groups of 16, GEMM layout): codes packed in AWQ's order
  [0, 2, 4, 6, 1, 3, 5, 7] by gptqmodel's `pack_awq`; the reference is autoawq's own
  `dequantize_gemm` (awq/utils/packing_utils.py), checked equal to gptqmodel's.
- `ct_int4` (compressed-tensors `pack-quantized`, 4 bits, groups of 16, asymmetric: packed zero
  points) and `ct_fp8` (`float-quantized`, float8_e4m3fn weights, a scale per output channel):
  quantized and compressed by compressed-tensors itself (`apply_quantization_config`,
  `calculate_qparams`, `ModelCompressor.compress_model`); the reference is its own
  decompressor, checked equal to what transformers' loader makes of the folder.
- `deepseek_v3_fp8` (DeepSeek-V3, float8_e4m3fn weights with `weight_scale_inv` per 16 x 16
  block, `weight_block_size` [16, 16]; `kv_a_proj_with_mqa` has 24 rows, one and a half
  blocks): quantized by DeepSeek's recipe (each block's amax / 448); the reference is
  transformers' `_dequantize_fp8_weight` (integrations/finegrained_fp8.py).
- `gpt_oss_mxfp4` (GPT-OSS experts in MXFP4: `*_blocks` uint8, two E2M1 codes per byte, low
  nibble first, `*_scales` E8M0 per 32 values): quantized by the OCP Microscaling Formats v1.0
  recipe (shared exponent floor(log2(amax)) - 2, codes rounded to nearest even, saturated);
  the reference is transformers' `convert_moe_packed_tensors` (integrations/mxfp4.py), checked
  equal to transformers' own MXFP4 loader (`Mxfp4Config(dequantize=True)`).

`tensors.safetensors` with `tensors.json` holds single quantized weights for the bits the models
do not cover (GPTQ 2, 3 and 8 bits in v1 and v2, compressed-tensors 2 and 8 bits packed,
`naive-quantized` int8 and FP8 blocks), each with its reference dequantization's digest.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import shutil

import numpy as np
import torch
import transformers as tf
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "quantized")
VOCAB, ROWS, LENGTH = 128, 2, 24
TOKENS = np.random.default_rng(0).integers(0, VOCAB, (ROWS, LENGTH)).tolist()


def digest(t: torch.Tensor) -> dict:
    """sha256 of a tensor's bytes (little-endian, row-major), with its shape and dtype."""
    t = t.detach().contiguous().cpu()
    raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
    return {
        "sha256": hashlib.sha256(raw.numpy().tobytes()).hexdigest(),
        "shape": list(t.shape),
        "dtype": str(t.dtype).removeprefix("torch."),
    }


def log_probs(model, tokens) -> list:
    """transformers' float32 log-probabilities of each next token, [rows, length - 1]."""
    with torch.no_grad():
        ids = torch.tensor(tokens)
        logits = model(ids).logits.float()
        lp = torch.log_softmax(logits, -1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
    return lp.tolist()


def llama(dtype) -> tf.LlamaForCausalLM:
    """The tiny Llama the weight-quantized layouts share (seed 0, norms perturbed)."""
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(
        tf.LlamaConfig(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            rms_norm_eps=1e-5, initializer_range=0.2, tie_word_embeddings=True,
        )
    )  # fmt: skip
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.3 * torch.randn_like(p))
    return model.to(dtype)


def linears(model) -> dict:
    """The decoder layers' projections by their stored names' heads (`model.layers.0.mlp.up_proj`)."""
    return {
        n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n
    }


def stored(model) -> dict:
    """The tensors `save_pretrained` writes for `model` (the checkpoint's names and layout)."""
    folder = os.path.join(OUT, ".stored")
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder)
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    shutil.rmtree(folder)
    return tensors


def write(name: str, model, tensors: dict, quantization: dict, reference: dict, extra=None):
    """The folder `name`: config.json with `quantization`, model.safetensors of `tensors`, and
    golden.json: the reference weights' digests, and transformers' float32 log-probs on the
    dequantized copy (the stored tensors, each quantized weight replaced by its `reference`,
    all in float32, read by `from_pretrained`)."""
    folder = os.path.join(OUT, name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    config = model.config.to_dict()
    config.pop("dtype", None)
    copy = os.path.join(OUT, ".dequantized")
    shutil.rmtree(copy, ignore_errors=True)
    os.makedirs(copy)
    with open(os.path.join(copy, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    names = set(stored(model))  # the float model's own tensors
    plain = {k: v.float() for k, v in tensors.items() if k in names and k not in reference}
    plain.update({k: v.float() for k, v in reference.items()})
    assert set(plain) == names, sorted(names ^ set(plain))
    save_file(plain, os.path.join(copy, "model.safetensors"), metadata={"format": "pt"})
    f32 = type(model).from_pretrained(copy, dtype=torch.float32)
    shutil.rmtree(copy)
    config["quantization_config"] = quantization
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(folder, "model.safetensors"),
              metadata={"format": "pt"})  # fmt: skip
    golden = {
        "tokens": TOKENS,
        "log_probs": log_probs(f32.eval(), TOKENS),
        "weights": {k: digest(v) for k, v in sorted(reference.items())},
        "versions": {"torch": torch.__version__, "transformers": tf.__version__},
        **(extra or {}),
    }
    with open(os.path.join(folder, "golden.json"), "w", encoding="utf-8") as f:
        json.dump(golden, f, indent=1)
    size = sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder))
    print(f"{name}: {size / 1024:.0f} KiB")


# ------------------------------------------------------------------------------ GPTQ and AWQ


def group_params(w: torch.Tensor, g_idx: torch.Tensor, groups: int, bits: int, sym: bool):
    """GPTQ's min-max quantizer per (row, group): scales [out, groups] float32, zero points
    [out, groups] int (symmetric: 2 ** (bits - 1))."""
    maxq = 2**bits - 1
    scales = torch.zeros(w.shape[0], groups)
    zeros = torch.zeros(w.shape[0], groups, dtype=torch.int32)
    for g in range(groups):
        cols = w[:, g_idx == g].float()
        lo, hi = cols.min(1).values.clamp(max=0), cols.max(1).values.clamp(min=0)
        if sym:
            hi = torch.maximum(lo.abs(), hi)
            scales[:, g] = 2 * hi / maxq
            zeros[:, g] = 2 ** (bits - 1)
        else:
            scales[:, g] = (hi - lo) / maxq
            zeros[:, g] = torch.round(-lo / scales[:, g]).to(torch.int32)
    return scales, zeros


def gptq_pack(linear, bits, group_size, sym, act_order, v1, generator, zero_some=False):
    """gptqmodel's own packing of `linear` (and its v2-to-v1 conversion when `v1`): the stored
    tensors, and gptqmodel's dequantization of them after its load-time conversion
    ([out, in] float16, the weight transformers' GPTQ kernel multiplies by)."""
    from gptqmodel.nn_modules.qlinear.torch import TorchLinear
    from gptqmodel.quantization.config import QuantizeConfig
    from gptqmodel.utils.model import (
        convert_gptq_v1_to_v2_format_module,
        convert_gptq_v2_to_v1_format_module,
    )

    out_f, in_f = linear.weight.shape
    size = in_f if group_size < 0 else group_size  # -1: one group
    groups = math.ceil(in_f / size)
    g_idx = torch.arange(in_f, dtype=torch.int32) // size
    if act_order:  # GPTQ's order of the columns (by the Hessian's diagonal): here drawn
        perm = torch.randperm(in_f, generator=generator)
        g_idx = torch.empty(in_f, dtype=torch.int32)
        g_idx[perm] = torch.arange(in_f, dtype=torch.int32) // size
    w = linear.weight.data.float()
    scales, zeros = group_params(w, g_idx, groups, bits, sym)
    if zero_some:  # zero points of 0 (a group of non-negative weights)
        zeros[::5, 0] = 0
    kwargs = dict(bits=bits, group_size=group_size, sym=sym, desc_act=act_order, in_features=in_f,
                  out_features=out_f, bias=False, pack_dtype=torch.int32, register_buffers=True)  # fmt: skip
    q = TorchLinear(**kwargs)
    q.pack_original(_linear(w), scales, zeros, g_idx)
    if v1:
        convert_gptq_v2_to_v1_format_module(q, QuantizeConfig(bits=bits))
    packed = {
        k: v.clone()
        for k, v in q.state_dict().items()
        if k in ("qweight", "qzeros", "scales", "g_idx")
    }
    loaded = TorchLinear(**kwargs)
    loaded.load_state_dict(packed, strict=False)
    if v1:
        convert_gptq_v1_to_v2_format_module(loaded, bits, torch.int32)
    return packed, loaded.dequantize_weight().T.contiguous()


def _linear(w: torch.Tensor) -> torch.nn.Linear:
    linear = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    linear.weight = torch.nn.Parameter(w, requires_grad=False)
    return linear


def gptq_model(name, sym, act_order, zero_some):
    model = llama(torch.float16)
    generator = torch.Generator().manual_seed(1)
    tensors, reference = stored(model), {}
    for head, linear in linears(model).items():
        packed, dequantized = gptq_pack(
            linear, 4, 16, sym, act_order, True, generator, zero_some=zero_some
        )
        del tensors[head + ".weight"]
        tensors.update({f"{head}.{k}": v for k, v in packed.items()})
        reference[head + ".weight"] = dequantized
    config = {"quant_method": "gptq", "bits": 4, "group_size": 16, "desc_act": act_order,
              "sym": sym, "checkpoint_format": "gptq", "true_sequential": True,
              "damp_percent": 0.1, "static_groups": False}  # fmt: skip
    write(name, model, tensors, config, reference)


def awq_reference():
    """autoawq's own dequantization (awq/utils/packing_utils.py, which imports torch only),
    loaded by its file (the package's __init__ imports its calibration datasets)."""
    root = importlib.util.find_spec("awq").submodule_search_locations[0]  # not imported
    path = os.path.join(root, "utils", "packing_utils.py")
    spec = importlib.util.spec_from_file_location("awq_packing_utils", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dequantize_gemm


def awq_model():
    from gptqmodel.quantization.awq.utils.packing_utils import dequantize_gemm, pack_awq

    reference_dequantize = awq_reference()
    model = llama(torch.float16)
    tensors, reference = stored(model), {}
    for head, linear in linears(model).items():
        w = linear.weight.data.float()  # [out, in]
        out_f, in_f = w.shape
        g_idx = torch.arange(in_f) // 16
        scales, zeros = group_params(w, g_idx, in_f // 16, 4, sym=False)
        scales = scales.half()
        codes = torch.clamp(torch.round(w / scales.float()[:, g_idx]) + zeros[:, g_idx], 0, 15)
        qweight, qzeros = pack_awq(codes.T.to(torch.int32).contiguous(), zeros.T.contiguous(), 4)
        st = scales.T.contiguous()
        want = reference_dequantize(qweight, qzeros, st, 4, 16)
        assert torch.equal(want, dequantize_gemm(qweight, qzeros, st, 4, 16))
        del tensors[head + ".weight"]
        tensors.update({f"{head}.qweight": qweight, f"{head}.qzeros": qzeros, f"{head}.scales": st})
        reference[head + ".weight"] = want.T.contiguous()
    config = {"quant_method": "awq", "bits": 4, "group_size": 16, "zero_point": True,
              "version": "gemm", "modules_to_not_convert": None}  # fmt: skip
    write("awq", model, tensors, config, reference)


# ------------------------------------------------------------------------ compressed-tensors


def ct_quantize(model, fmt: str, weights: dict, ignore=("lm_head",)):
    """`model` quantized and compressed in place by compressed-tensors itself (`weights`: the
    QuantizationArgs of every Linear): its scales and zero points from each group's, channel's,
    block's or the tensor's min and max (`calculate_qparams`). Returns (the scheme, the
    compressor)."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationArgs,
        QuantizationConfig,
        QuantizationScheme,
        QuantizationStatus,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.utils import calculate_qparams

    args = QuantizationArgs(**weights)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    qconfig = QuantizationConfig(config_groups={"group_0": scheme}, ignore=list(ignore),
                                 quantization_status=QuantizationStatus.FROZEN)  # fmt: skip
    apply_quantization_config(model, qconfig)
    for linear in (m for m in model.modules() if hasattr(m, "weight_scale")):
        w = linear.weight.data.float()
        if args.strategy == "group":
            w = w.reshape(w.shape[0], -1, args.group_size)
            lo, hi = w.amin(-1), w.amax(-1)
        elif args.strategy == "channel":
            lo, hi = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
        elif args.strategy == "block":
            bh, bw = args.block_structure
            rows, cols = math.ceil(w.shape[0] / bh), math.ceil(w.shape[1] / bw)
            lo, hi = torch.zeros(rows, cols), torch.zeros(rows, cols)
            for i in range(rows):
                for j in range(cols):
                    part = w[i * bh : (i + 1) * bh, j * bw : (j + 1) * bw]
                    lo[i, j], hi[i, j] = part.min(), part.max()
        else:
            lo, hi = w.amin().reshape(1), w.amax().reshape(1)
        scale, zero = calculate_qparams(lo, hi, args)
        linear.weight_scale.data = scale.to(linear.weight_scale.dtype).reshape(
            linear.weight_scale.shape
        )
        if hasattr(linear, "weight_zero_point"):
            zp = zero.to(linear.weight_zero_point.dtype).reshape(linear.weight_zero_point.shape)
            linear.weight_zero_point.data = zp
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format=fmt)
    compressor.compress_model(model)
    return scheme, compressor


def ct_model(name, fmt, weights):
    """A tiny Llama quantized and compressed by compressed-tensors (`ct_quantize`)."""
    from compressed_tensors.compressors.base import BaseCompressor

    model = llama(torch.bfloat16)
    scheme, compressor = ct_quantize(model, fmt, weights)
    folder = os.path.join(OUT, name)
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder)
    compressor.update_config(folder)
    tensors = load_file(os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    # The reference: compressed-tensors' decompressor on each module's stored tensors.
    decompressor = BaseCompressor.get_value_from_registry(fmt)
    reference = {}
    for head in linears(llama(torch.bfloat16)):
        local = {k[len(head) + 1 :]: v for k, v in tensors.items() if k.startswith(head + ".")}
        reference[head + ".weight"] = decompressor.decompress(local, scheme)["weight"]
    # transformers' own loader decompresses the folder to the same weights.
    loaded = tf.AutoModelForCausalLM.from_pretrained(
        folder, quantization_config=tf.CompressedTensorsConfig(dequantize=True)
    )
    for k, v in reference.items():
        got = loaded.state_dict()[k]
        assert torch.equal(got.to(v.dtype), v), k
    quantization = config.pop("quantization_config")
    plain = llama(torch.bfloat16)
    plain.config = tf.LlamaConfig.from_dict(config)
    write(name, plain, tensors, quantization, reference)


# ------------------------------------------------------------------------------- FP8, MXFP4


def fp8_blocks(w: torch.Tensor, block: tuple[int, int]):
    """DeepSeek-V3's block quantization: per `block` of the last two axes, scale = amax / 448
    (float32), weight = (w / scale) in float8_e4m3fn; returns (weight, weight_scale_inv)."""
    rows, cols = w.shape[-2:]
    sr, sc = math.ceil(rows / block[0]), math.ceil(cols / block[1])
    scale = torch.zeros(*w.shape[:-2], sr, sc)
    q = torch.zeros(w.shape, dtype=torch.float8_e4m3fn)
    for i in range(sr):
        for j in range(sc):
            part = w[
                ..., i * block[0] : (i + 1) * block[0], j * block[1] : (j + 1) * block[1]
            ].float()
            s = part.abs().amax((-1, -2)).clamp(min=1e-12) / 448.0
            scale[..., i, j] = s
            q[..., i * block[0] : (i + 1) * block[0], j * block[1] : (j + 1) * block[1]] = (
                part / s[..., None, None]
            ).to(torch.float8_e4m3fn)
    return q, scale


def deepseek_model():
    from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

    torch.manual_seed(0)
    model = tf.DeepseekV3ForCausalLM(
        tf.DeepseekV3Config(
            vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
            max_position_embeddings=64, initializer_range=0.2, rms_norm_eps=1e-5,
            num_hidden_layers=2, intermediate_size=64, moe_intermediate_size=16,
            q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
            v_head_dim=12, n_routed_experts=4, n_group=2, topk_group=1, num_experts_per_tok=2,
            routed_scaling_factor=2.5, n_shared_experts=1, first_k_dense_replace=1,
            norm_topk_prob=True, rope_interleave=True, tie_word_embeddings=False,
        )
    ).to(torch.bfloat16)  # fmt: skip
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.3 * torch.randn_like(p))
    tensors, reference = stored(model), {}
    for name in list(tensors):
        if ".layers." in name and tensors[name].ndim == 2 and ".mlp.gate." not in name:
            q, scale = fp8_blocks(tensors.pop(name), (16, 16))
            tensors[name] = q
            tensors[name.removesuffix("weight") + "weight_scale_inv"] = scale
            reference[name] = _dequantize_fp8_weight(q, scale, [16, 16], torch.float32)
    config = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
              "weight_block_size": [16, 16]}  # fmt: skip
    write("deepseek_v3_fp8", model, tensors, config, reference)


E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def mxfp4(x: torch.Tensor):
    """OCP Microscaling Formats v1.0 (MXFP4) of `x [..., rows, K]` along K in blocks of 32:
    (blocks [..., rows, K / 32, 16] uint8, two codes a byte, low nibble first; scales
    [..., rows, K / 32] uint8, E8M0: the shared exponent floor(log2(amax)) - 2 plus 127)."""
    *lead, rows, k = x.shape
    x = x.float().reshape(*lead, rows, k // 32, 32)
    amax = x.abs().amax(-1)
    exp = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp(min=1e-30))) - 2, -127.0)
    exp = exp.clamp(-127, 127)
    v = x / torch.exp2(exp)[..., None]
    mag = v.abs().clamp(max=6.0)
    # round to the nearest E2M1 magnitude, ties to the even code
    diff = (mag[..., None] - E2M1).abs()
    best = diff.min(-1, keepdim=True).values
    ties = (diff == best).to(torch.int64) * (1 + (torch.arange(8) % 2 == 0).to(torch.int64))
    code = ties.argmax(-1) + 8 * (v < 0).to(torch.int64) * (mag > 0).to(torch.int64)
    code = code.to(torch.uint8)
    blocks = code[..., 0::2] | (code[..., 1::2] << 4)
    return blocks.contiguous(), (exp + 127).to(torch.uint8)


def gpt_oss_model():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    torch.manual_seed(0)
    model = tf.GptOssForCausalLM(
        tf.GptOssConfig(
            vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
            head_dim=8, max_position_embeddings=64, initializer_range=0.2, rms_norm_eps=1e-5,
            num_hidden_layers=2, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
            sliding_window=8,
            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                             "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                             "original_max_position_embeddings": 16},
        )
    ).to(torch.bfloat16)  # fmt: skip
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 1.0)
            layer.mlp.experts.gate_up_proj_bias.normal_(0.0, 0.5)
        for name, p in model.named_parameters():
            if p.ndim == 1 and "sinks" not in name:
                p.add_(0.3 * torch.randn_like(p))
    tensors, reference = stored(model), {}
    for name in list(tensors):
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            blocks, scales = mxfp4(tensors.pop(name).transpose(1, 2))  # [E, out, in]
            tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
            reference[name] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    config = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
    }
    write("gpt_oss_mxfp4", model, tensors, config, reference)
    # transformers' own MXFP4 loader (dequantized) scores the folder as the reference does.
    folder = os.path.join(OUT, "gpt_oss_mxfp4")
    loaded = tf.GptOssForCausalLM.from_pretrained(
        folder, quantization_config=tf.Mxfp4Config(dequantize=True), dtype=torch.float32
    )
    for k, v in reference.items():
        assert torch.equal(loaded.state_dict()[k], v), k
    with open(os.path.join(folder, "golden.json"), encoding="utf-8") as f:
        golden = json.load(f)
    assert log_probs(loaded.eval(), TOKENS) == golden["log_probs"]


# ------------------------------------------------------------------------- single tensors


def tensors_golden():
    """`tensors.safetensors` and `tensors.json`: single quantized weights (their parts named
    `<entry>.<part>`) for the bits and strategies the models do not cover, each with its
    quantization_config and the digest of its reference dequantization."""
    from compressed_tensors.compressors.base import BaseCompressor
    from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

    generator = torch.Generator().manual_seed(2)
    tensors, entries = {}, {}

    def add(entry, parts, config, reference):
        tensors.update({f"{entry}.{k}": v.contiguous() for k, v in parts.items()})
        entries[entry] = {"quantization_config": config, "weight": f"{entry}.weight",
                          "reference": digest(reference)}  # fmt: skip

    for bits, v1, out_f, in_f in ((2, True, 40, 96), (2, False, 40, 96), (3, True, 64, 96),
                                  (3, False, 64, 96), (8, True, 40, 64), (8, False, 40, 64)):  # fmt: skip
        w = 0.2 * torch.randn(out_f, in_f, generator=generator)
        parts, ref = gptq_pack(_linear(w), bits, 16, False, True, v1, generator, zero_some=True)
        fmt = "gptq" if v1 else "gptq_v2"
        add(f"gptq{bits}_{fmt}", parts, {"quant_method": "gptq", "bits": bits, "group_size": 16,
            "desc_act": True, "sym": False, "checkpoint_format": fmt}, ref)  # fmt: skip
    w = 0.2 * torch.randn(40, 64, generator=generator)
    parts, ref = gptq_pack(_linear(w), 4, -1, True, False, False, generator)
    add("gptq4_one_group", parts, {"quant_method": "gptq", "bits": 4, "group_size": -1,
        "desc_act": False, "sym": True, "checkpoint_format": "gptq_v2"}, ref)  # fmt: skip

    cases = {
        "ct_pack8_channel": ("pack-quantized", dict(num_bits=8, type="int", symmetric=False, strategy="channel")),
        "ct_pack2_group": ("pack-quantized", dict(num_bits=2, type="int", symmetric=True, strategy="group", group_size=16)),
        "ct_pack4_tensor": ("pack-quantized", dict(num_bits=4, type="int", symmetric=False, strategy="tensor")),
        "ct_int8_channel": ("int-quantized", dict(num_bits=8, type="int", symmetric=True, strategy="channel")),
        "ct_naive8_group": ("naive-quantized", dict(num_bits=8, type="int", symmetric=False, strategy="group", group_size=16)),
        "ct_fp8_block": ("float-quantized", dict(num_bits=8, type="float", symmetric=True, strategy="block", block_structure=[16, 16])),
        "ct_fp8_tensor": ("float-quantized", dict(num_bits=8, type="float", symmetric=True, strategy="tensor")),
    }  # fmt: skip
    for entry, (fmt, args) in cases.items():
        module = torch.nn.Sequential(torch.nn.Linear(48, 40, bias=False)).to(torch.bfloat16)
        with torch.no_grad():
            module[0].weight.copy_(0.2 * torch.randn(40, 48, generator=generator))
        scheme, compressor = ct_quantize(module, fmt, args, ignore=())
        local = {k[2:]: v for k, v in module.state_dict().items()}
        decompressor = BaseCompressor.get_value_from_registry(fmt)
        ref = decompressor.decompress(dict(local), scheme)["weight"]
        config = compressor.quantization_config.model_dump(exclude=["quant_method"])
        add(
            entry,
            local,
            {"quant_method": "compressed-tensors", **json.loads(json.dumps(config))},
            ref,
        )

    w = 0.2 * torch.randn(40, 48, generator=generator)
    scale = w.abs().amax() / 448.0
    q = (w / scale).to(torch.float8_e4m3fn)
    ref = _dequantize_fp8_weight(q, scale.reshape(1), None, torch.float32)
    add("fp8_tensor", {"weight": q, "weight_scale_inv": scale.reshape(1)},
        {"quant_method": "fp8", "weight_block_size": None}, ref)  # fmt: skip

    folder = os.path.join(OUT, "tensors")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    save_file(tensors, os.path.join(folder, "tensors.safetensors"))
    with open(os.path.join(folder, "tensors.json"), "w", encoding="utf-8") as f:
        json.dump(entries, f, indent=1, sort_keys=True)
    size = sum(os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder))
    print(f"tensors: {size / 1024:.0f} KiB")


# ------------------------------------------------------------- copies of a float checkpoint


def copies(original: str, out: str):
    """Quantized copies of the float Hugging Face Llama directory `original` under `out` (round
    to nearest, no calibration), each written by its format's own writer as above: `gptq4`
    (4 bits, groups of 32, symmetric, v1), `awq4` (4 bits, groups of 32), `int8`
    (compressed-tensors pack-quantized, 8 bits per channel, symmetric), `fp8` (DeepSeek-V3's
    float8 blocks of 128 x 128). The unquantized tensors (embedding, norms) are kept as stored.
    docs/diagnostics.md's worked example compares them with `original`."""
    from gptqmodel.quantization.awq.utils.packing_utils import pack_awq

    def save(name, model, tensors, quantization):
        folder = os.path.join(out, name)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        config = {**model.config.to_dict(), "quantization_config": quantization}
        config.pop("dtype", None)
        with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2, sort_keys=True)
        save_file({k: v.contiguous() for k, v in tensors.items()},
                  os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})  # fmt: skip
        print(
            f"{folder}: {os.path.getsize(os.path.join(folder, 'model.safetensors')) / 1024:.0f} KiB"
        )

    def load():
        return tf.LlamaForCausalLM.from_pretrained(original, dtype=torch.float32)

    model = load()
    generator = torch.Generator().manual_seed(0)
    tensors = stored(model)
    for head, linear in linears(model).items():
        packed, _ = gptq_pack(linear, 4, 32, True, False, True, generator)
        del tensors[head + ".weight"]
        tensors.update({f"{head}.{k}": v for k, v in packed.items()})
    save("gptq4", model, tensors, {"quant_method": "gptq", "bits": 4, "group_size": 32,
         "desc_act": False, "sym": True, "checkpoint_format": "gptq"})  # fmt: skip

    tensors = stored(model)
    for head, linear in linears(model).items():
        w = linear.weight.data.float()
        g_idx = torch.arange(w.shape[1]) // 32
        scales, zeros = group_params(w, g_idx, w.shape[1] // 32, 4, sym=False)
        scales = scales.half()
        codes = torch.clamp(torch.round(w / scales.float()[:, g_idx]) + zeros[:, g_idx], 0, 15)
        qweight, qzeros = pack_awq(codes.T.to(torch.int32).contiguous(), zeros.T.contiguous(), 4)
        del tensors[head + ".weight"]
        tensors.update({f"{head}.qweight": qweight, f"{head}.qzeros": qzeros,
                        f"{head}.scales": scales.T.contiguous()})  # fmt: skip
    save("awq4", model, tensors, {"quant_method": "awq", "bits": 4, "group_size": 32,
         "zero_point": True, "version": "gemm"})  # fmt: skip

    tensors = stored(model)
    for name in list(tensors):
        if ".layers." in name and tensors[name].ndim == 2:
            q, scale = fp8_blocks(tensors.pop(name), (128, 128))
            tensors[name], tensors[name.removesuffix("weight") + "weight_scale_inv"] = q, scale
    save("fp8", model, tensors, {"quant_method": "fp8", "activation_scheme": "dynamic",
         "fmt": "e4m3", "weight_block_size": [128, 128]})  # fmt: skip

    model = load()
    _, compressor = ct_quantize(model, "pack-quantized",
                                dict(num_bits=8, type="int", symmetric=True, strategy="channel"))  # fmt: skip
    folder = os.path.join(out, "int8")
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder)
    compressor.update_config(folder)
    print(f"{folder}: {os.path.getsize(os.path.join(folder, 'model.safetensors')) / 1024:.0f} KiB")


def main():
    os.makedirs(OUT, exist_ok=True)
    gptq_model("gptq_sym", sym=True, act_order=False, zero_some=False)
    gptq_model("gptq_act_order", sym=False, act_order=True, zero_some=True)
    awq_model()
    ct_model(
        "ct_int4",
        "pack-quantized",
        dict(num_bits=4, type="int", symmetric=False, strategy="group", group_size=16),
    )
    ct_model("ct_fp8", "float-quantized",
             dict(num_bits=8, type="float", symmetric=True, strategy="channel"))  # fmt: skip
    deepseek_model()
    gpt_oss_model()
    tensors_golden()


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--copies"]:  # --copies ORIGINAL OUT
        copies(sys.argv[2], sys.argv[3])
    else:
        main()
