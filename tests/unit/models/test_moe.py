"""The MoE layer (ppl_jax.models.layers.moe.dropless) against a NumPy float64 loop over experts
(transformers' math), against transformers' own blocks (golden files of
tests/golden/make_moe_golden.py), invariance to batch size, order and mesh, and a memory guard."""

import functools
import math
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding

from ppl_jax.checkpoints import mapping
from ppl_jax.checkpoints.mapping import blocks, storage
from ppl_jax.errors import CheckpointError
from ppl_jax.models.families import mixture
from ppl_jax.models.layers.moe import dropless, experts
from ppl_jax.runtime import mesh as mesh_lib

import helpers

GOLDEN = os.path.join(helpers.GOLDEN, "moe")


def reference(x, router, gate, up, down, top_k, norm_topk_prob, shared_expert=None, chosen=None):
    """NumPy float64, token by token and expert by expert, as transformers' `*SparseMoeBlock`;
    ties go to the lower expert index unless `chosen [tokens, top_k]` names the experts."""
    f64 = lambda a: np.asarray(a, np.float64)  # noqa: E731
    x, router, gate, up, down = map(f64, (x, router, gate, up, down))
    silu = lambda h: h / (1 + np.exp(-h))  # noqa: E731
    logits = x @ router
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    for t in range(len(x)):
        experts = np.argsort(-probs[t], kind="stable")[:top_k] if chosen is None else chosen[t]
        weights = probs[t, experts]
        if norm_topk_prob:
            weights = weights / weights.sum()
        for e, w in zip(experts, weights, strict=True):
            out[t] += w * ((silu(x[t] @ gate[e]) * (x[t] @ up[e])) @ down[e])
    if shared_expert is not None:
        s_gate, s_up, s_down, s_scale = map(f64, shared_expert)
        scale = 1 / (1 + np.exp(-(x @ s_scale)))
        out += scale[:, None] * ((silu(x @ s_gate) * (x @ s_up)) @ s_down)
    return out


def random_layer(rng, embed, mlp, experts, shared_mlp=0, router_scale=1.0):
    def draw(*shape):
        return jnp.asarray(rng.standard_normal(shape) * shape[-2] ** -0.5, jnp.float32)

    params = {
        "router": draw(embed, experts) * router_scale,
        "gate": draw(experts, embed, mlp),
        "up": draw(experts, embed, mlp),
        "down": draw(experts, mlp, embed),
    }
    if shared_mlp:
        params["shared_expert"] = (
            draw(embed, shared_mlp),
            draw(embed, shared_mlp),
            draw(shared_mlp, embed),
            draw(embed, 1)[:, 0],
        )
    return params


def rel_diff(a, b) -> float:
    """max |a - b| / max |b|."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


LAYER = jax.jit(dropless.moe_mlp, static_argnames=("top_k", "norm_topk_prob", "tile"))


def call(params, x, top_k, norm):
    """`moe_mlp` jitted (once per shape) on a dict of params (`shared_expert`: its four weights)."""
    p = dict(params)
    return LAYER(x, **p, top_k=top_k, norm_topk_prob=norm)


# (name, experts, top_k, norm_topk_prob, shared expert width)
STYLES = [
    ("mixtral", 8, 2, True, 0),
    ("qwen3_moe", 64, 8, True, 0),
    ("qwen3_moe_unnormalised", 64, 8, False, 0),
    ("qwen2_moe_shared", 16, 4, False, 40),
]


@pytest.mark.parametrize("name,experts,top_k,norm,shared_mlp", STYLES, ids=[s[0] for s in STYLES])
def test_equals_numpy_float64(name, experts, top_k, norm, shared_mlp):
    rng = np.random.default_rng(experts + top_k + shared_mlp)
    params = random_layer(rng, 32, 48, experts, shared_mlp)
    x = jnp.asarray(rng.standard_normal((3, 21, 32)), jnp.float32)
    y = call(params, x, top_k, norm)
    assert y.shape == x.shape and y.dtype == jnp.float32
    ref = reference(x.reshape(-1, 32), **params, top_k=top_k, norm_topk_prob=norm)
    assert rel_diff(y.reshape(-1, 32), ref) < 1e-6


@pytest.mark.parametrize(
    "sizes,tile",
    [([5, 0, 9, 1, 0, 17, 3, 13], 4), ([0] * 7 + [48], 16), ([48] + [0] * 7, 64)],
)
def test_cpu_tiles_equal_ragged_dot(sizes, tile):
    """The CPU path equals `jax.lax.ragged_dot` (the TPU/GPU path), empty experts included."""
    rng = np.random.default_rng(len(sizes) + tile)
    p = random_layer(rng, 16, 24, len(sizes))
    xs = jnp.asarray(rng.standard_normal((sum(sizes), 16)), jnp.float32)
    gs = jnp.asarray(sizes, jnp.int32)
    rows = jnp.arange(xs.shape[0], dtype=jnp.int32)  # each row its own token, weight 1
    ones = jnp.ones(xs.shape[0], jnp.float32)
    weights = (p["gate"], p["up"], p["down"])
    tiled = jax.jit(experts._tiled_sum, static_argnums=5)(xs, rows, ones, weights, gs, tile)
    row_expert = jnp.repeat(jnp.arange(len(sizes)), gs, total_repeat_length=xs.shape[0])
    ragged = jax.jit(experts.SWIGLU.ragged)(xs, gs, row_expert, *weights)
    np.testing.assert_allclose(tiled, ragged, rtol=1e-5, atol=1e-6)


def hf_to_ppl(z):
    """A golden file's transformers-layout weights as `moe_mlp` arguments."""
    mlp = z["down_proj"].shape[-1]
    params = {
        "router": z["router"].T,
        "gate": z["gate_up_proj"][:, :mlp].transpose(0, 2, 1),
        "up": z["gate_up_proj"][:, mlp:].transpose(0, 2, 1),
        "down": z["down_proj"].transpose(0, 2, 1),
    }
    if "shared_expert_gate" in z:
        params["shared_expert"] = (
            z["shared_gate_proj"].T,
            z["shared_up_proj"].T,
            z["shared_down_proj"].T,
            z["shared_expert_gate"][0],
        )
    return {k: jax.tree.map(jnp.asarray, v) for k, v in params.items()}


def load_golden(name):
    with np.load(os.path.join(GOLDEN, f"{name}.npz")) as z:
        return {k: z[k] for k in z.files}


GOLDEN_CASES = [
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "qwen3_moe_unnormalised",
    "olmoe",
    "tie_inside",
]


@pytest.mark.parametrize("name", GOLDEN_CASES)
def test_equals_transformers_golden(name):
    z = load_golden(name)
    top_k, norm = int(z["top_k"]), bool(z["norm_topk_prob"])
    params = hf_to_ppl(z)
    y = call(params, jnp.asarray(z["x"]), top_k, norm)
    assert rel_diff(y, z["y"]) < 1e-6
    flat = jnp.asarray(z["x"]).reshape(-1, z["x"].shape[-1])
    _, chosen = dropless.route(flat, params["router"], top_k, norm)
    assert [sorted(r) for r in np.asarray(chosen).tolist()] == [
        sorted(r) for r in z["experts"].tolist()
    ]


def test_tied_experts_are_chosen_as_transformers_chooses_them():
    """Experts 2 and 5 have identical router rows and are the top 2 of most tokens: ppl_jax picks
    both exactly where transformers does, with weights 1/2 each."""
    z = load_golden("tie_inside")
    params = hf_to_ppl(z)
    flat = jnp.asarray(z["x"]).reshape(-1, z["x"].shape[-1])
    weights, chosen = dropless.route(flat, params["router"], 2, True)
    both = [set(r) == {2, 5} for r in z["experts"].tolist()]
    assert sum(both) >= 20
    assert [set(r) == {2, 5} for r in np.asarray(chosen).tolist()] == both
    np.testing.assert_array_equal(np.asarray(weights)[np.array(both)], 0.5)
    assert np.asarray(chosen)[np.array(both)].tolist() == [[2, 5]] * sum(both)  # lower first


def test_tie_at_the_kth_place_goes_to_the_lower_index():
    """Experts 2 and 5 tie; where they straddle the k-th place ppl_jax takes 2, where transformers
    on CPU takes either (std::nth_element's order). Elsewhere the choices and outputs agree."""
    z = load_golden("tie_boundary")
    params = hf_to_ppl(z)
    x = jnp.asarray(z["x"]).reshape(-1, z["x"].shape[-1])
    _, chosen = dropless.route(x, params["router"], 3, True)
    ours, theirs = np.asarray(chosen), z["experts"]
    straddles = np.array([(2 in r) != (5 in r) for r in theirs.tolist()])
    assert straddles.any() and not straddles.all()
    for row, straddle in zip(ours.tolist(), straddles, strict=True):
        assert not straddle or (2 in row and 5 not in row)
    same = np.array([set(a) == set(b) for a, b in zip(ours.tolist(), theirs.tolist(), strict=True)])
    assert same[~straddles].all()
    y = np.asarray(call(params, jnp.asarray(z["x"]), 3, True)).reshape(x.shape)
    assert rel_diff(y[same], z["y"].reshape(x.shape)[same]) < 1e-6
    # Where they differ, ppl_jax is the float64 loop with the lower index of the tied pair.
    p = {k: v for k, v in params.items()}
    assert rel_diff(y, reference(x, **p, top_k=3, norm_topk_prob=True)) < 1e-6


def sharded_params(module, mesh, rules):
    state = nnx.state(module, nnx.Param)
    out = {}
    for path, var in jax.tree_util.tree_flatten_with_path(
        state, is_leaf=lambda v: isinstance(v, nnx.Variable)
    )[0]:
        name = str(getattr(path[0], "key", path[0]))
        axes = var.get_metadata()["logical_axes"]
        spec = mesh_lib.logical_to_spec(axes, var.shape, mesh, rules)
        out[name] = jax.device_put(var[...], NamedSharding(mesh, spec))
    return out


SHARED_NAMES = ("shared_gate_proj", "shared_up", "shared_down", "shared_scale")
EXPERT_RULES = tuple(r for r in mesh_lib.DEFAULT_RULES if r[0] != "mlp") + (
    ("experts", "model"),
    ("mlp", None),
)


@pytest.mark.slow
def test_invariant_to_batch_size_order_and_mesh():
    spec = dropless.MoeSpec(embed_dim=32, mlp_dim=48, num_experts=16, top_k=4, shared_mlp_dim=24)
    module = dropless.MoeMLP(spec, nnx.Rngs(0))
    tokens = jnp.asarray(np.random.default_rng(0).standard_normal((16, 8, 32)), jnp.float32)

    def run(params, x, mesh=None, set_mesh=False):
        p = dict(params)
        p["shared_expert"] = tuple(p.pop(k) for k in SHARED_NAMES)
        if mesh is None:
            return np.asarray(call(p, x, 4, True))
        x = jax.device_put(x, NamedSharding(mesh, jax.sharding.PartitionSpec("data")))
        if not set_mesh:  # the partitioner alone
            return np.asarray(call(p, x, 4, True))
        with jax.set_mesh(mesh):  # as the Scorer compiles: each data shard routed on its own
            return np.asarray(call(p, x, 4, True))

    plain = {k: v[...] for k, v in nnx.to_flat_state(nnx.state(module, nnx.Param))}
    plain = {k[0]: v for k, v in plain.items()}
    whole = run(plain, tokens)
    ref = reference(
        tokens.reshape(-1, 32),
        *(plain[k] for k in ("router", "gate", "up", "down")),
        top_k=4,
        norm_topk_prob=True,
        shared_expert=tuple(plain[k] for k in SHARED_NAMES),
    )
    assert rel_diff(whole.reshape(-1, 32), ref) < 1e-6
    diffs = {}
    for batch in (1, 4):
        parts = [run(plain, tokens[i : i + batch]) for i in range(0, 16, batch)]
        diffs[f"batch {batch}"] = rel_diff(np.concatenate(parts), whole)
    perm = np.random.default_rng(1).permutation(16 * 8)
    shuffled = run(plain, tokens.reshape(-1, 32)[perm].reshape(16, 8, 32)).reshape(-1, 32)
    diffs["shuffled"] = rel_diff(shuffled[np.argsort(perm)].reshape(whole.shape), whole)
    for (data, model), rules in (((8, 1), mesh_lib.DEFAULT_RULES), ((4, 2), EXPERT_RULES)):
        mesh = mesh_lib.make_mesh(data, model)
        params = sharded_params(module, mesh, rules)
        if model == 2:
            assert params["gate"].sharding.spec[0] == "model"
        diffs[f"mesh {data}x{model}"] = rel_diff(run(params, tokens, mesh), whole)
        diffs[f"mesh {data}x{model}, set"] = rel_diff(run(params, tokens, mesh, True), whole)
    assert max(diffs.values()) < 1e-6, diffs


def _sort_sizes(hlo_text: str) -> set[int]:
    """The lengths of the arrays that the compiled module sorts."""
    return {int(n) for n in re.findall(r"= \(s32\[(\d+)\]\{0\}, [^=]*\bsort\(", hlo_text)}


def test_each_data_shard_is_routed_and_sorted_on_its_own():
    """Under the mesh (`jax.set_mesh`, as the Scorer compiles), each of 8 data shards sorts its
    own 64 assignments (16 rows x 8 tokens x top 4 / 8): no device sorts or computes the whole
    batch's 512. Without the mesh set, the partitioner gathers the routing and sorts all 512."""
    rng = np.random.default_rng(0)
    params = random_layer(rng, 32, 48, 16)
    x = jnp.asarray(rng.standard_normal((16, 8, 32)), jnp.float32)
    mesh = mesh_lib.make_mesh(8, 1)
    x = jax.device_put(x, NamedSharding(mesh, jax.sharding.PartitionSpec("data")))
    layer = jax.jit(functools.partial(dropless.moe_mlp, top_k=4, norm_topk_prob=True))
    assert _sort_sizes(layer.lower(x, **params).compile().as_text()) == {512}
    with jax.set_mesh(mesh):
        assert experts.data_shards() == 8
        compiled = layer.lower(x, **params).compile()
    assert _sort_sizes(compiled.as_text()) == {64}
    assert experts.data_shards() == 1
    assert rel_diff(np.asarray(compiled(x, **params)), np.asarray(layer(x, **params))) < 1e-6


def _largest_buffer_elements(hlo_text: str) -> int:
    largest = 0
    for dims in re.findall(r"[fsu](?:32|16|8|64)\[([0-9,]+)\]", hlo_text):
        largest = max(largest, math.prod(int(d) for d in dims.split(",")))
    return largest


def test_compiled_layer_holds_no_tokens_experts_mlp_buffer():
    tokens, embed, mlp, experts, top_k = 1024, 32, 128, 32, 4  # tokens*experts*mlp = 4.2M
    abstract = [
        jax.ShapeDtypeStruct(s, jnp.float32)
        for s in (
            (tokens, embed),
            (embed, experts),
            (experts, embed, mlp),
            (experts, embed, mlp),
            (experts, mlp, embed),
        )
    ]
    layer = lambda x, r, g, u, d: dropless.moe_mlp(x, r, g, u, d, top_k=top_k, norm_topk_prob=True)  # noqa: E731
    compiled = jax.jit(layer).lower(*abstract).compile()
    full = tokens * experts * mlp
    assert _largest_buffer_elements(compiled.as_text()) < full // 4
    memory = compiled.memory_analysis()
    if memory is not None:
        assert memory.temp_size_in_bytes < full * 4 // 4
    # The check can fail: the dense all-experts computation, and jax.lax.ragged_dot's own CPU
    # lowering (masked dense), do hold such buffers.
    dense = lambda x, g, u, d: jnp.einsum(  # noqa: E731
        "tef,efd->td",
        jax.nn.silu(jnp.einsum("td,edf->tef", x, g)) * jnp.einsum("td,edf->tef", x, u),
        d,
    )
    assert (
        _largest_buffer_elements(
            jax.jit(dense).lower(*abstract[:1], *abstract[2:]).compile().as_text()
        )
        >= full
    )
    rows = jax.ShapeDtypeStruct((tokens * top_k, embed), jnp.float32)
    sizes = jax.ShapeDtypeStruct((experts,), jnp.int32)
    ragged = jax.jit(jax.lax.ragged_dot).lower(rows, abstract[2], sizes).compile()
    assert _largest_buffer_elements(ragged.as_text()) >= tokens * top_k * experts * embed


def test_module_params_and_bfloat16():
    spec = dropless.MoeSpec(embed_dim=32, mlp_dim=48, num_experts=8, top_k=2, shared_mlp_dim=16)
    module = dropless.MoeMLP(spec, nnx.Rngs(0), jnp.bfloat16)
    axes = {
        k[0]: v.get_metadata()["logical_axes"]
        for k, v in nnx.to_flat_state(nnx.state(module, nnx.Param))
    }
    assert axes["router"] == ("embed", "experts")
    assert axes["gate"] == axes["up"] == ("experts", "embed", "mlp")
    assert axes["down"] == ("experts", "mlp", "embed")
    x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 8, 32)), jnp.bfloat16)
    y = nnx.jit(lambda m, x: m(x))(module, x)
    assert y.dtype == jnp.bfloat16 and y.shape == x.shape
    params = {k[0]: v[...].astype(jnp.float32) for k, v in nnx.to_flat_state(nnx.state(module))}
    params["shared_expert"] = tuple(params.pop(k) for k in SHARED_NAMES)
    assert rel_diff(y, call(params, x.astype(jnp.float32), 2, True)) < 2e-2


def test_spec_from_transformers_configs():
    mixtral = mixture.moe_spec(
        {
            "model_type": "mixtral",
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "num_hidden_layers": 3,
        }
    )
    assert mixtral == dropless.MoeSpec(64, 96, 8, 2, True, 0)
    qwen2 = {
        "model_type": "qwen2_moe",
        "hidden_size": 64,
        "intermediate_size": 256,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 128,
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "norm_topk_prob": False,
        "num_hidden_layers": 6,
        "decoder_sparse_step": 2,
        "mlp_only_layers": [3],
    }
    assert mixture.moe_spec(qwen2) == dropless.MoeSpec(64, 32, 60, 4, False, 128)
    assert mixture.sparse_layers(qwen2) == (1, 5)
    assert mixture.sparse_layers({**qwen2, "model_type": "olmoe"}) == tuple(range(6))
    # transformers 5.23 writes Qwen3-MoE's expert count as num_local_experts; defaults fill gaps.
    qwen3 = {"model_type": "qwen3_moe", "hidden_size": 64, "moe_intermediate_size": 32,
             "num_local_experts": 16, "num_hidden_layers": 2}  # fmt: skip
    assert mixture.moe_spec(qwen3) == dropless.MoeSpec(64, 32, 16, 8, False, 0)
    assert mixture.sparse_layers(qwen3) == (0, 1)
    with pytest.raises(CheckpointError, match="num_experts_per_tok"):
        dropless.MoeSpec(64, 32, 4, 5)
    # decoder_sparse_step 0 was a ZeroDivisionError; now one sentence (issue 26).
    for step in (0, -2, "x", 1.5):
        with pytest.raises(CheckpointError, match=r"decoder_sparse_step=.* is not a whole number"):
            mixture.sparse_layers({**qwen2, "decoder_sparse_step": step})


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_accelerators_lower_to_ragged_dot(platform):
    """Lowered for GPU or TPU (no device needed), the layer is `ragged_dot`, without the CPU loop."""
    shapes = ((64, 32), (32, 8), (8, 32, 48), (8, 32, 48), (8, 48, 32))
    abstract = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
    lowered = LAYER.trace(*abstract, top_k=2, norm_topk_prob=True).lower(
        lowering_platforms=(platform,)
    )
    text = lowered.as_text()
    assert "ragged_dot" in text and "while" not in text
    cpu = LAYER.trace(*abstract, top_k=2, norm_topk_prob=True).lower().as_text()
    assert "ragged_dot" not in cpu and "while" in cpu
    # Under the Scorer's mesh (data=8): ragged_dot inside one manual computation over `data`.
    batched = [jax.ShapeDtypeStruct((16, 4, 32), jnp.float32), *abstract[1:]]
    with jax.set_mesh(mesh_lib.make_mesh(8, 1)):
        traced = LAYER.trace(*batched, top_k=2, norm_topk_prob=True)
        text = traced.lower(lowering_platforms=(platform,)).as_text()
    assert "ragged_dot" in text and "while" not in text
    assert text.count("sdy.manual_computation") == 1


@pytest.mark.parametrize("name,model_type", [("mixtral", "mixtral"), ("qwen2_moe", "qwen2_moe")])
def test_mixture_rules_stack_per_expert_tensors(name, model_type):
    """Per-expert tensors as transformers 5.23 writes them (Mixtral w1/w3/w2, others
    gate/up/down_proj) stack into the layout that the golden file's fused weights give."""
    z = load_golden(name)
    mlp = z["down_proj"].shape[-1]
    prefix = "layers.0.block_sparse_moe" if model_type == "mixtral" else "layers.0.mlp"
    names = ("w1", "w3", "w2") if model_type == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    tensors = {f"{prefix}.gate.weight": z["router"]}
    for e in range(z["router"].shape[0]):
        tensors[f"{prefix}.experts.{e}.{names[0]}.weight"] = z["gate_up_proj"][e, :mlp]
        tensors[f"{prefix}.experts.{e}.{names[1]}.weight"] = z["gate_up_proj"][e, mlp:]
        tensors[f"{prefix}.experts.{e}.{names[2]}.weight"] = z["down_proj"][e]
    for ours in ("gate_proj", "up_proj", "down_proj"):
        if f"shared_{ours}" in z:
            tensors[f"layers.0.mlp.shared_expert.{ours}.weight"] = z[f"shared_{ours}"]
    if "shared_expert_gate" in z:
        tensors["layers.0.mlp.shared_expert_gate.weight"] = z["shared_expert_gate"]
    spec = dropless.MoeSpec(
        z["x"].shape[-1], mlp, z["router"].shape[0], int(z["top_k"]), bool(z["norm_topk_prob"]),
        z["shared_down_proj"].shape[-1] if "shared_down_proj" in z else 0,
    )  # fmt: skip
    got = hf_block_params(tensors, spec, model_type)
    want = hf_to_ppl(z)
    if "shared_expert" in want:
        want.update(zip(SHARED_NAMES, want.pop("shared_expert"), strict=True))
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)


def hf_block_params(tensors: dict, spec: dropless.MoeSpec, model_type: str) -> dict:
    """Layer 0's MoE block (`MoeMLP`'s names and layouts, NumPy) from transformers' stored
    tensors (names without `model.`), read through the mixture family's mapping rules."""
    d, f, e, sh = spec.embed_dim, spec.mlp_dim, spec.num_experts, spec.shared_mlp_dim
    shapes = {"router": (d, e), "gate": (e, d, f), "up": (e, d, f), "down": (e, f, d)}
    if sh:
        shapes |= {"shared_gate_proj": (d, sh), "shared_up": (d, sh), "shared_down": (sh, d),
                   "shared_scale": (d,)}  # fmt: skip
    desc = {"model_type": model_type, "tie_embeddings": True, "embed_dim": d,
            "moe_shared_mlp_dim": sh}  # fmt: skip
    target = {f"layers/0/mlp/{k}": jax.ShapeDtypeStruct(v, jnp.float32) for k, v in shapes.items()}
    stored = {n: (np.shape(v), np.asarray(v).dtype) for n, v in tensors.items()}
    sources = mapping.resolve(mixture.rules(desc), stored, target, desc, "test")
    out = {}
    for name, leaf in target.items():
        whole = tuple(range(n) for n in leaf.shape)
        out[name.rsplit("/", 1)[1]] = blocks.read_block(
            sources[name], stored, leaf.shape, whole, storage.Arrays(tensors), desc, np.float32
        )
    return out
