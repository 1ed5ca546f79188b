"""The device checks' `families` part (`benchmarks.families_check`, run by `gpu_check` and
`tpu_check`) on CPU in its tiny mode: one family end to end into the JSON, every golden family's
kernel per kind of layer, and a spent budget that skips the rest."""

from __future__ import annotations

import json

import jax.numpy as jnp
import pytest

from benchmarks import families_check as fc
from ppl_jax.models.layers import kernels

KEYS = {"device", "peak_bf16_flops", "seq_len", "dtype", "tiny", "families", "skipped"}
ROW = {
    "widths", "attention", "attention_layers", "attention_note", "params", "flops_per_token",
    "compile_and_first_step_seconds", "step_seconds", "tokens_per_second", "mfu",
    "nll_per_token", "seconds",
}  # fmt: skip


def test_one_family_end_to_end_into_the_json(tmp_path):
    out = tmp_path / "f.json"
    report = fc.run(["qwen3"], tiny=True, seq_len=8192, seconds=60, out=str(out))
    assert json.loads(out.read_text()) == report  # written after each family, as it goes
    fc.write(report, str(out))
    report = json.loads(out.read_text())
    assert set(report) == KEYS and report["tiny"] and report["seq_len"] == fc.TINY_SEQ
    row = report["families"]["qwen3"]
    assert set(row) == ROW, row.get("error")
    assert row["widths"] == "golden" and row["attention_layers"] == {"attention": "xla"}
    assert row["tokens_per_second"] > 0 and row["mfu"] is None  # no peak for a CPU
    assert 0 < row["nll_per_token"] < 2 * 6  # random weights: about log(320) = 5.8 nats


def test_every_family_reports_a_kernel_per_kind_of_layer():
    for family in fc.families():
        for tiny in (True, False):
            d, widths = fc.description(family, tiny, 8192)
            assert widths == ("golden" if tiny or family not in fc.RELEASED else "released")
            for platform in ("gpu", "tpu"):
                got = fc.attention_of(d, platform, jnp.bfloat16)
                kinds = kernels.layer_needs(d) if kernels.head_dim(d) else {}
                assert set(got["attention_layers"]) == set(kinds), family
                assert set(got["attention_layers"].values()) <= set(kernels.KERNELS), family
    assert len(fc.families()) >= 20 and "mamba2" in fc.families()


def test_a_spent_budget_skips_the_rest():
    report = fc.run(["qwen3", "gemma2"], tiny=True, seq_len=8192, seconds=0)
    assert report["families"] == {} and report["skipped"] == ["qwen3", "gemma2"]


def test_flops_per_token_follows_the_stated_convention():
    """Qwen3's and Mixtral's golden shapes by hand: 2 x matmul params (tied: the table once, as
    the head; experts by top-k / experts) plus 2 x 2 x layers x heads x head width x (T + 1) / 2."""
    from ppl_jax.models import registry

    d, _ = fc.description("qwen3", True, 64)
    model = registry.build(d, jnp.bfloat16)
    e, hd, h, kv, f = d["embed_dim"], d["head_dim"], d["num_heads"], d["num_kv_heads"], d["mlp_dim"]
    per_layer = e * hd * (2 * h + 2 * kv) + 3 * e * f
    matmul = d["num_layers"] * per_layer + d["vocab_size"] * e
    assert d["tie_embeddings"]
    attn = 2 * 2 * d["num_layers"] * h * hd * 65 / 2
    assert fc.flops_per_token(model, d, 64) == pytest.approx(2 * matmul + attn)
    # Mixtral's experts by their share of the routing (2 of 4), the head untied (no table).
    d, _ = fc.description("mixtral", True, 64)
    model = registry.build(d, jnp.bfloat16)
    e, f, n = d["embed_dim"], d["moe_mlp_dim"], d["moe_experts"]
    hd = d.get("head_dim") or e // d["num_heads"]
    attn_proj = e * hd * (2 * d["num_heads"] + 2 * d["num_kv_heads"])
    per_layer = attn_proj + e * n + 3 * e * f * n * d["moe_top_k"] / n  # the router, the experts
    matmul = d["num_layers"] * per_layer + d["vocab_size"] * e
    attn = 2 * 2 * d["num_layers"] * d["num_heads"] * hd * 65 / 2
    assert not d["tie_embeddings"] and n == 4 and d["moe_top_k"] == 2
    assert fc.flops_per_token(model, d, 64) == pytest.approx(2 * matmul + attn)
    assert fc.peak_flops("NVIDIA H200") == 989e12 and fc.peak_flops("TPU v5 lite") == 197e12
    assert fc.peak_flops("TPU v5") == 459e12 and fc.peak_flops("TPU v6 lite") == 918e12
    assert fc.peak_flops("cpu") is None


@pytest.mark.slow
def test_every_family_end_to_end():
    """Every golden family scored in the tiny mode (about 90 s on two CPU cores)."""
    report = fc.run(fc.families(), tiny=True, seq_len=8192, seconds=600)
    assert report["skipped"] == [] and set(report["families"]) == set(fc.families())
    for family, row in report["families"].items():
        assert set(row) == ROW, (family, row.get("error"))


def test_the_checks_runner_bounds_the_parts_and_writes_one_json(tmp_path):
    """`check_runner.run_parts` (gpu_check's and tpu_check's): each part its budget cut to what
    is left, a part not started once the total is spent, the JSON after each, an unknown part
    refused in one sentence."""
    from benchmarks import check_runner

    seen = []
    parts = {"a": lambda s: seen.append(s) or {"exit": 0}, "b": lambda s: seen.append(s) or {}}
    out = tmp_path / "check.json"
    report = check_runner.run_parts("x_check", parts, {"a": 3, "b": 9}, ["a", "b"], 8.0, str(out))
    assert seen[0] == 3 and 7 < seen[1] <= 8 and report["parts"]["a"] == {"exit": 0}
    assert json.loads(out.read_text())["budgets"] == {"a": 3, "b": 9}
    report = check_runner.run_parts("x_check", parts, {"a": 3, "b": 9}, ["a", "b"], 4.0, str(out))
    assert report["parts"]["b"] == {"exit": "not run: the check's time was spent"}
    assert json.loads(out.read_text())["parts"] == report["parts"]
    with pytest.raises(SystemExit, match="x_check: unknown parts"):
        check_runner.run_parts("x_check", parts, {}, ["c"], 4.0, str(out))
