"""Benchmark: tokens/s of each model family of issues 17 and 24 in ppl_jax against transformers on the same
weights, on this machine, in one run.

    python -m benchmarks.bench_families                      # every family, float32
    python -m benchmarks.bench_families --families=qwen3,gemma2 --batch=4 --seq_len=512
    python -m benchmarks.bench_families --families=llama --layer_seq_lens=256,1024,4096
    # on cores shared with other work, one thread each (torch's threads suffer most from it):
    XLA_FLAGS=--xla_cpu_multi_thread_eigen=false OMP_NUM_THREADS=1 python -m benchmarks.bench_families

Per family, a random model of the shape below (transformers 5 class, seed 0) is saved with
`save_pretrained` and read back by both: transformers (`AutoModelForCausalLM`, float32, eager
attention where the family needs it for soft-caps, `torch.no_grad`, all CPU threads) computes
the logits and the float32 log-softmax of the targets; ppl_jax (`safetensors.read_description` +
`safetensors.load_params`, `model.attention=xla`, jitted, the vocabulary-blocked scorer) computes the
per-token NLL of the same `[batch, seq_len]` random tokens. Each is timed as the median of
`--repeats` calls after one warm-up call (compilation excluded), the two taking turns in each
round, and by its fastest call (on shared cores torch's timings spread much more than XLA's: one
call of the same Qwen3.5 forward took 1.8 s and, minutes later, 14 s); the largest per-token difference between them is printed as a check. With
`--layer_seq_lens`, one layer of each kind alone (ppl_jax's softmax attention, Gated DeltaNet and
Mamba2 at width 512: `_layers`) is timed in microseconds per token at each length, against the
attention layer (`layer_costs`). Writes JSON (`{"families": [...], "layers": [...]}`) to `--out`.

Shapes: hidden 512, 8 layers, 8 heads (2 key-value heads where the family has GQA), MLP 1408,
vocabulary 32,000 (39-59M parameters), with each family's own features (Gemma 2's soft-caps
and windows of 256, Phi-3's longrope past 256 positions, GPT-NeoX's partial rotary, SmolLM3's NoPE
every fourth layer); Mixtral and
Qwen3-MoE with 8 experts of width 704, top 2 (the dense models' active MLP width); GPT-OSS
(sinks, windows of 128 on alternate layers, YaRN past 256), Llama 4 (chunks of 256, every fourth
layer NoPE, routed blocks on alternate layers: top 1 plus a shared expert) and DeepSeek-V3 (MLA
with ranks 256/128, YaRN with its softmax scale, 4 groups of which 2 kept, a dense first layer)
with the same experts; Mamba2 with 16 heads of 64, state 64, chunks of 64; Qwen3.5 with 6 Gated
DeltaNet layers (4 key heads, 8 value heads of 64) and 2 gated attention layers; Qwen3-Next with
the same layers and on every layer the same 8 experts (top 2) plus a shared expert of 704;
Nemotron-H with the pattern `M E M * M - M E` (Mamba2 of 16 heads of 64 in 2 groups, state 64;
the same experts, sigmoid-routed, 2 of 4 groups, scaled by 2.5, a shared expert); Falcon-H1 with
8 layers of attention and that Mamba2 in parallel and every µP multiplier away from 1.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers as tf
from absl import app, flags
from flax import nnx

from ppl_jax.checkpoints.formats import safetensors
from ppl_jax.models import registry
from ppl_jax.models.decoders import hybrid
from ppl_jax.models.layers import gated_delta, ssd
from ppl_jax.runtime import DEFAULT_RULES, make_mesh, param_targets
from ppl_jax.scoring import token_nll

COMMON = dict(
    vocab_size=32000,
    hidden_size=512,
    intermediate_size=1408,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=2,
    max_position_embeddings=4096,
)


_YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "original_max_position_embeddings": 256,
}


def _configs() -> dict:
    longrope = {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [1.0] * 32,
        "long_factor": [2.0] * 32,
    }
    return {
        "llama": tf.LlamaConfig(**COMMON),
        "qwen3": tf.Qwen3Config(**COMMON, head_dim=64),
        "olmo2": tf.Olmo2Config(**COMMON),
        "olmo3": tf.Olmo3Config(**COMMON, sliding_window=256),
        "gemma2": tf.Gemma2Config(**COMMON, head_dim=64, sliding_window=256),
        "gemma3": tf.Gemma3TextConfig(**COMMON, head_dim=64, sliding_window=256),
        "phi3": tf.Phi3Config(
            **{**COMMON, "num_key_value_heads": 8},
            original_max_position_embeddings=256,
            rope_parameters=longrope,
            pad_token_id=0,
        ),
        "gpt_neox": tf.GPTNeoXConfig(
            **{k: v for k, v in COMMON.items() if k != "num_key_value_heads"}, rotary_pct=0.25
        ),
        # mixtures: 8 experts of width 704, top 2 (the active MLP width of the dense models)
        "mixtral": tf.MixtralConfig(
            **{**COMMON, "intermediate_size": 704}, num_local_experts=8, num_experts_per_tok=2
        ),
        "qwen3_moe": tf.Qwen3MoeConfig(
            **COMMON, head_dim=64, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=704
        ),
        # issue 24: SmolLM3 (no RoPE on every fourth layer), then the mixtures with the same 8
        # experts of width 704, top 2 (Llama 4: top 1 plus its shared
        # expert), with each family's attention
        "smollm3": tf.SmolLM3Config(**COMMON, no_rope_layer_interval=4, pad_token_id=0),
        "gpt_oss": tf.GptOssConfig(
            **{**COMMON, "intermediate_size": 704},
            head_dim=64,
            num_local_experts=8,
            num_experts_per_tok=2,
            sliding_window=128,
            rope_parameters={**_YARN, "truncate": False},
        ),
        "llama4": tf.Llama4TextConfig(
            **{**COMMON, "intermediate_size": 704},
            head_dim=64,
            intermediate_size_mlp=1408,
            num_local_experts=8,
            num_experts_per_tok=1,
            interleave_moe_layer_step=2,
            attention_chunk_size=256,
            floor_scale=128,
        ),
        "deepseek_v3": tf.DeepseekV3Config(
            **{**COMMON, "num_key_value_heads": 8},
            moe_intermediate_size=704,
            q_lora_rank=256,
            kv_lora_rank=128,
            qk_nope_head_dim=64,
            qk_rope_head_dim=32,
            v_head_dim=64,
            n_routed_experts=8,
            n_group=4,
            topk_group=2,
            num_experts_per_tok=2,
            first_k_dense_replace=1,
            rope_parameters={**_YARN, "mscale": 1.0, "mscale_all_dim": 1.0},
        ),
        # the scans (issue 24): transformers runs its PyTorch fallbacks of them on the CPU
        "mamba2": tf.Mamba2Config(
            vocab_size=32000, hidden_size=512, num_hidden_layers=8, num_heads=16, head_dim=64,
            n_groups=1, state_size=64, chunk_size=64, expand=2,
        ),
        "qwen3_5": tf.Qwen3_5TextConfig(
            **COMMON, head_dim=64, linear_num_key_heads=4, linear_key_head_dim=64,
            linear_num_value_heads=8, linear_value_head_dim=64,
        ),
        # Qwen3.5's layers with Qwen3-Next's projections and, on every layer, the 8 experts of
        # width 704 (top 2, renormalised) plus a gated shared expert of width 704
        "qwen3_next": tf.Qwen3NextConfig(
            **COMMON, head_dim=64, linear_num_key_heads=4, linear_key_head_dim=64,
            linear_num_value_heads=8, linear_value_head_dim=64, num_experts=8,
            num_experts_per_tok=2, moe_intermediate_size=704, shared_expert_intermediate_size=704,
        ),
        # the pattern M E M * M - M E: 4 Mamba2 layers (16 heads of 64 in 2 groups, state 64),
        # one attention layer, one squared-ReLU MLP, 2 sigmoid-routed MoE layers (top 2 of 8 of
        # width 704, group-limited to 2 of 4 groups, scaled by 2.5, a shared expert of 704)
        "nemotron_h": tf.NemotronHConfig(
            **{k: v for k, v in COMMON.items() if k != "num_hidden_layers"}, head_dim=64,
            layers_block_type=["linear_attention", "moe", "linear_attention", "full_attention",
                               "linear_attention", "mlp", "linear_attention", "moe"],
            mamba_num_heads=16, mamba_head_dim=64, n_groups=2, ssm_state_size=64, chunk_size=64,
            n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=704,
            moe_shared_expert_intermediate_size=704, n_group=4, topk_group=2,
            routed_scaling_factor=2.5,
        ),
        # 8 layers of attention and Mamba2 (16 heads of 64 in 2 groups, state 64) in parallel,
        # then the MLP; the gated RMSNorm and every µP multiplier away from 1
        "falcon_h1": tf.FalconH1Config(
            **COMMON, mamba_d_ssm=1024, mamba_n_heads=16, mamba_d_head=64, mamba_n_groups=2,
            mamba_d_state=64, mamba_chunk_size=64, mamba_rms_norm=True,
            embedding_multiplier=2.0, lm_head_multiplier=0.5, mlp_multipliers=[1.5, 0.7],
            key_multiplier=1.3, attention_in_multiplier=0.8, attention_out_multiplier=1.2,
            ssm_multipliers=[0.5, 1.5, 0.8, 1.25, 2.0], ssm_in_multiplier=0.7,
            ssm_out_multiplier=1.1,
        ),
    }  # fmt: skip


def _layers() -> dict:
    """One layer of each kind at the families' width 512, ppl_jax's modules (random weights)."""
    rngs = nnx.Rngs(0)
    return {
        # Llama's attention: 8 heads of 64, 2 key-value heads, rotary, the `xla` attention
        "attention": hybrid.Attention(hybrid.AttentionSpec(512, 8, 2, 64, rope=(
            ("rope_theta", 10000.0), ("rope_type", "default"))), rngs, jnp.float32),
        # Qwen3.5's Gated DeltaNet: 4 key heads of 64 serving 8 value heads of 64, chunks of 64
        "gated_deltanet": gated_delta.GatedDeltaNet(
            gated_delta.GatedDeltaSpec(512, 4, 64, 8, 64), rngs, jnp.float32),
        # Mamba2: 16 heads of 64 (inner width 1024), 1 group, state 64, chunks of 64
        "mamba2": ssd.Mamba2Mixer(ssd.Mamba2Spec(512, 16, 64, 1, 64, chunk=64), rngs, jnp.float32),
    }  # fmt: skip


def layer_costs(batch: int, seq_lens: list[int], repeats: int) -> list[dict]:
    """Microseconds per token of one layer of each kind of `_layers` alone (jitted, float32,
    compilation excluded, median of `repeats` calls on one `[batch, seq_len, 512]` input), at
    each of `seq_lens`, and each against the attention layer at the same length."""
    rows = []
    for seq_len in seq_lens:
        x = jax.random.normal(jax.random.key(0), (batch, seq_len, 512), jnp.float32)
        pos = jnp.broadcast_to(jnp.arange(seq_len, dtype=jnp.int32), (batch, seq_len))
        seg = jnp.ones((batch, seq_len), jnp.int32)
        cost = {}
        for kind, layer in _layers().items():
            graph, state = nnx.split(layer)
            args = (x, pos, seg) if kind == "attention" else (x, seg)
            step = jax.jit(lambda s, *a, g=graph: nnx.merge(g, s)(*a))
            run = lambda f=step, s=state, a=args: f(s, *a).block_until_ready()  # noqa: E731
            run()
            cost[kind] = float(np.median(_median_time(run, repeats))) / (batch * seq_len) * 1e6
        for kind, us in cost.items():
            rows.append({"seq_len": seq_len, "layer": kind, "us_per_token": us,
                         "against_attention": us / cost["attention"]})  # fmt: skip
    return rows


_FAMILIES = flags.DEFINE_list("families", list(_configs()), "Families to run.")
_LAYER_LENGTHS = flags.DEFINE_list(
    "layer_seq_lens", [], "If given, also time one layer of each kind alone at these lengths."
)
_BATCH = flags.DEFINE_integer("batch", 4, "Rows per call.")
_SEQ = flags.DEFINE_integer("seq_len", 512, "Tokens per row.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls per side.")
_OUT = flags.DEFINE_string("out", "bench_families.json", "Where the JSON goes.")


def _median_time(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def run_family(name: str, config, batch: int, seq_len: int, repeats: int) -> dict:
    torch.manual_seed(0)
    kwargs = {"attn_implementation": "eager"} if name.startswith("gemma") else {}
    model = tf.AutoModelForCausalLM.from_config(config, **kwargs).eval()
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, (batch, seq_len + 1))
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        desc = safetensors.read_description(tmp)
        ours = registry.build(desc, jnp.float32)
        target, _ = param_targets(
            ours.abstract_params, ours.logical_axes, make_mesh(-1, 1), DEFAULT_RULES
        )
        params = safetensors.load_params(tmp, target)
    x = jnp.asarray(tokens[:, :-1], jnp.int32)
    y = jnp.asarray(tokens[:, 1:], jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(seq_len, dtype=jnp.int32), x.shape)
    seg = jnp.ones_like(x)
    step = jax.jit(lambda p: token_nll(ours.apply(p, x, pos, seg), y))
    ids = torch.tensor(tokens)

    def theirs():
        with torch.no_grad():
            logits = model(ids[:, :-1]).logits.float()
            lp = torch.log_softmax(logits, -1)
            return -lp.gather(-1, ids[:, 1:, None])[..., 0]

    ppl = lambda: step(params).block_until_ready()  # noqa: E731
    diff = float(np.max(np.abs(np.asarray(ppl()) - theirs().numpy())))  # warm-up, and a check
    ppl_times, hf_times = [], []
    for _ in range(repeats):  # taking turns
        ppl_times += _median_time(ppl, 1)
        hf_times += _median_time(theirs, 1)
    n = batch * seq_len
    params_m = sum(p.numel() for p in model.parameters()) / 1e6
    return {
        "family": name,
        "params_M": round(params_m, 1),
        "ppl_jax_tokens_per_s": n / float(np.median(ppl_times)),
        "transformers_tokens_per_s": n / float(np.median(hf_times)),
        # the fastest call of each: what each side does when the shared cores let it run
        "ppl_jax_best_tokens_per_s": n / min(ppl_times),
        "transformers_best_tokens_per_s": n / min(hf_times),
        "max_nll_difference": diff,
    }


def main(argv) -> None:
    del argv
    configs = _configs()
    rows = []
    print(
        f"jax {jax.__version__}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"transformers {tf.__version__}, {os.cpu_count()} CPUs; "
        f"batch {_BATCH.value} x {_SEQ.value}, float32"
    )
    print(
        "| family | params | ppl_jax tokens/s | transformers tokens/s | ratio | ratio of the "
        "fastest calls | max NLL diff |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in _FAMILIES.value:
        r = run_family(name, configs[name], _BATCH.value, _SEQ.value, _REPEATS.value)
        rows.append(r)
        ratio = r["ppl_jax_tokens_per_s"] / r["transformers_tokens_per_s"]
        best = r["ppl_jax_best_tokens_per_s"] / r["transformers_best_tokens_per_s"]
        print(
            f"| {name} | {r['params_M']}M | {r['ppl_jax_tokens_per_s']:,.0f} | "
            f"{r['transformers_tokens_per_s']:,.0f} | {ratio:.2f} | {best:.2f} | "
            f"{r['max_nll_difference']:.1e} |",
            flush=True,
        )
    layers = []
    if _LAYER_LENGTHS.value:
        print("\n| layer | tokens per row | µs per token | against attention |")
        print("| --- | --- | --- | --- |")
        layers = layer_costs(_BATCH.value, [int(n) for n in _LAYER_LENGTHS.value], _REPEATS.value)
        for r in layers:
            print(
                f"| {r['layer']} | {r['seq_len']} | {r['us_per_token']:.1f} | "
                f"{r['against_attention']:.2f} |",
                flush=True,
            )
    with open(_OUT.value, "w") as f:
        json.dump({"families": rows, "layers": layers}, f, indent=1)


if __name__ == "__main__":
    app.run(main)
