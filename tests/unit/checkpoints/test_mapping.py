"""Other trainers' Orbax layouts through the one opener: presets on trees laid out as MaxText and
the gemma library lay them out (INTEROP.md), user mapping files, the mapping's operations against
NumPy, and one sentence for every mismatch."""

from __future__ import annotations

import dataclasses
import itertools
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from ppl_jax.checkpoints import architecture, given, mapping, open_checkpoint
from ppl_jax.checkpoints.mapping import blocks, presets, storage
from ppl_jax.checkpoints.readers.foreign import ForeignOrbax
from ppl_jax.config.defaults import DEFAULT_RULES
from ppl_jax.errors import CheckpointError, ConfigError
from ppl_jax.models import registry
from ppl_jax.models.interface import nest_weights, weight_paths
from ppl_jax.runtime import mesh as mesh_lib
from ppl_jax.testing import TINY, random_params

C = TINY
SIZES = (
    f"base_emb_dim={C.embed_dim} base_num_query_heads={C.num_heads} "
    f"base_num_kv_heads={C.num_kv_heads} base_mlp_dim={C.mlp_dim} "
    f"base_num_decoder_layers={C.num_layers} head_dim={C.head_dim} vocab_size=300 "
    f"max_target_length={C.max_positions} model_vocab_size={C.vocab_size}"
)


def maxtext_tree(params, scanned: bool, vocab_pad: int = 300) -> dict:
    """ppl_jax params laid out as MaxText's Linen decoder stores them (INTEROP.md)."""
    p = weight_paths(params)
    n = C.num_layers
    pad = lambda x, axis: np.concatenate(  # noqa: E731
        [x, np.full(x.shape[:axis] + (vocab_pad - x.shape[axis],) + x.shape[axis + 1 :], 7.0,
                    np.float32)], axis=axis)  # fmt: skip
    names = {"attn_norm": "pre_self_attention_layer_norm/scale",
             "mlp_norm": "post_self_attention_layer_norm/scale",
             "attn/q": "self_attention/query/kernel", "attn/k": "self_attention/key/kernel",
             "attn/v": "self_attention/value/kernel", "attn/o": "self_attention/out/kernel",
             "mlp/gate": "mlp/wi_0/kernel", "mlp/up": "mlp/wi_1/kernel",
             "mlp/down": "mlp/wo/kernel"}  # fmt: skip
    tree = {
        "token_embedder/embedding": pad(np.asarray(p["embedding"]), 0),
        "decoder/decoder_norm/scale": np.asarray(p["final_norm"]),
        "decoder/logits_dense/kernel": pad(np.asarray(p["lm_head"]), 1),
    }
    for ours, theirs in names.items():
        layers = [np.asarray(p[f"layers/{i}/{ours}"]) for i in range(n)]
        if ours == "attn/q":
            layers = [x / np.sqrt(C.head_dim) for x in layers]
        if scanned:
            tree[f"decoder/layers/{theirs}"] = np.stack(layers, axis=1)
        else:
            for i, x in enumerate(layers):
                tree[f"decoder/layers_{i}/{theirs}"] = x
    return {f"params/params/{k}": v for k, v in tree.items()}


def save_manager(path, steps, tree, item="items", extra=None):
    with ocp.CheckpointManager(str(path)) as m:
        for step in steps:
            state = {**nest_weights(tree), "step": np.int32(step), **(extra or {})}
            m.save(step, args=ocp.args.Composite(**{item: ocp.args.StandardSave(state)}))
        m.wait_until_finished()


def targets(model, mesh=None):
    mesh = mesh or mesh_lib.make_mesh(4, 2)
    return mesh_lib.param_targets(model.abstract_params, model.logical_axes, mesh, DEFAULT_RULES)[0]


def assert_params_equal(got, want, rtol=1e-6):
    got, want = weight_paths(got), weight_paths(want)
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_allclose(np.asarray(got[name]), np.asarray(want[name]), rtol=rtol,
                                   atol=1e-7, err_msg=name)  # fmt: skip


@pytest.mark.parametrize("scanned", [True, False])
def test_maxtext_llama2_restores_the_params(tmp_path, scanned):
    params = random_params(C)
    save_manager(tmp_path / "run" / "checkpoints", [10, 20], maxtext_tree(params, scanned),
                 extra={"opt_state": {"mu": np.zeros(3, np.float32)}})  # fmt: skip
    ckpt = open_checkpoint(str(tmp_path / "run"), architecture=f"maxtext:default {SIZES}")
    assert isinstance(ckpt, ForeignOrbax) and ckpt.steps() == [10, 20]
    assert ckpt.location().item == "items"
    model = architecture.resolve(ckpt).model()
    assert model.description["vocab_size"] == C.vocab_size
    target = targets(model)
    got = ckpt.restore(10, target)
    assert_params_equal(got, params)
    for name, leaf in weight_paths(got).items():
        assert leaf.sharding == weight_paths(target)[name].sharding, name


def test_maxtext_nnx_param_only_checkpoint(tmp_path):
    # MaxText's NNX param-only checkpoints: each leaf wrapped as {"value": array}, no
    # params/params prefix (INTEROP.md); a bare directory.
    params = random_params(C)
    tree = {k.removeprefix("params/params/") + "/value": v
            for k, v in maxtext_tree(params, True).items()}  # fmt: skip
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(str(tmp_path / "nnx"), nest_weights(tree))
        checkpointer.wait_until_finished()
    ckpt = open_checkpoint(str(tmp_path / "nnx"), architecture=f"maxtext:default {SIZES}")
    assert ckpt.location().bare and ckpt.steps() == []
    assert_params_equal(ckpt.restore(None, targets(architecture.resolve(ckpt).model())), params)


def test_mapping_mismatches_are_one_sentence(tmp_path):
    params = random_params(C)
    tree = maxtext_tree(params, True)
    tree["params/params/decoder/extra/kernel"] = np.zeros(3, np.float32)
    save_manager(tmp_path / "a", [1], tree)
    ckpt = open_checkpoint(str(tmp_path / "a"), architecture=f"maxtext:default {SIZES}")
    with pytest.raises(CheckpointError, match=r"no mapping rule takes the stored weight "
                       r"'decoder/extra/kernel'; add a rule"):  # fmt: skip
        ckpt.restore(None, targets(architecture.resolve(ckpt).model()))
    # The architecture says 3 layers, the checkpoint stacks 2.
    more = SIZES.replace(f"base_num_decoder_layers={C.num_layers}", "base_num_decoder_layers=3")
    del tree["params/params/decoder/extra/kernel"]
    save_manager(tmp_path / "b", [1], tree)
    ckpt = open_checkpoint(str(tmp_path / "b"), architecture=f"maxtext:default {more}")
    # Refused before the model is built: what the mapping makes of the stored names has 2 layers.
    with pytest.raises(CheckpointError, match=r"the architecture describes 3 layers but the "
                       r"checkpoint stores 2"):  # fmt: skip
        architecture.resolve(ckpt).model()
    # The mapping's own sentence, for a target built anyway.
    model = registry.build(ckpt.description(), jnp.float32)
    with pytest.raises(CheckpointError, match=r"the model weights 'layers/2/attn/k', .* are given "
                       r"by no stored weight"):  # fmt: skip
        ckpt.restore(None, targets(model))
    wide = SIZES.replace(f"base_emb_dim={C.embed_dim}", "base_emb_dim=48")
    ckpt = open_checkpoint(str(tmp_path / "b"), architecture=f"maxtext:default {wide}")
    with pytest.raises(
        CheckpointError,
        match=r"stored 'decoder/decoder_norm/scale' \[32\] gives "
        r"\[32\] for model weight 'final_norm', which the architecture makes \[48\]",
    ):
        ckpt.restore(None, targets(architecture.resolve(ckpt).model()))  # fmt: skip
    with pytest.raises(CheckpointError, match="carries no architecture"):
        architecture.resolve(open_checkpoint(str(tmp_path / "b"))).model()
    with pytest.raises(ConfigError, match="'base_layers' is not a MaxText setting"):
        architecture.resolve(
            open_checkpoint(str(tmp_path / "b"), architecture="maxtext:llama2-7b base_layers=2")
        ).model()


def test_linen_trainstate_with_a_user_mapping_file(tmp_path):
    # A Linen-style tree of the user's own: the same weights, other names and axis orders.
    params = weight_paths(random_params(C))
    tree = {"params/Embed_0/embedding": params["embedding"], "params/head/kernel": params["lm_head"],
            "params/norm/scale": params["final_norm"]}  # fmt: skip
    for i in range(C.num_layers):
        blk = f"params/block_{i}"
        tree[f"{blk}/attn/query/kernel"] = np.asarray(params[f"layers/{i}/attn/q"]).reshape(
            C.embed_dim, -1
        )
        kv = np.stack([params[f"layers/{i}/attn/k"], params[f"layers/{i}/attn/v"]])
        tree[f"{blk}/attn/kv/kernel"] = np.transpose(kv, (0, 2, 1, 3))  # [2, kv, embed, hd]
        tree[f"{blk}/attn/out/kernel"] = params[f"layers/{i}/attn/o"]
        tree[f"{blk}/mlp/gate_up/kernel"] = np.concatenate(
            [params[f"layers/{i}/mlp/gate"], params[f"layers/{i}/mlp/up"]], axis=1)  # fmt: skip
        tree[f"{blk}/mlp/down/kernel"] = params[f"layers/{i}/mlp/down"]
        tree[f"{blk}/ln1/scale"] = np.asarray(params[f"layers/{i}/attn_norm"]) - 1.0
        tree[f"{blk}/ln2/scale"] = params[f"layers/{i}/mlp_norm"]
    tree["opt_state/0/count"] = np.int32(3)
    save_manager(tmp_path / "ck", [3], tree, item="default")
    (tmp_path / "arch.json").write_text(__import__("json").dumps(C.to_dict()))
    (tmp_path / "map.yaml").write_text(r"""
# the user's own names
rules:
  - {from: 'Embed_0/embedding', to: embedding}
  - {from: 'head/kernel', to: lm_head}
  - {from: 'norm/scale', to: final_norm}
  - {from: 'block_(?P<l>\d+)/attn/query/kernel', to: 'layers/{l}/attn/q', reshape: [embed_dim, num_heads, head_dim]}
  - {from: 'block_(?P<l>\d+)/attn/kv/kernel', to: ['layers/{l}/attn/k', 'layers/{l}/attn/v'],
     split: {axis: 0, squeeze: true}, transpose: [1, 0, 2]}
  - {from: 'block_(?P<l>\d+)/attn/out/kernel', to: 'layers/{l}/attn/o'}
  - {from: 'block_(?P<l>\d+)/mlp/gate_up/kernel', to: ['layers/{l}/mlp/gate', 'layers/{l}/mlp/up'], split: {axis: 1}}
  - {from: 'block_(?P<l>\d+)/mlp/down/kernel', to: 'layers/{l}/mlp/down'}
  - {from: 'block_(?P<l>\d+)/ln1/scale', to: 'layers/{l}/attn_norm', plus_one: true}
  - {from: 'block_(?P<l>\d+)/ln2/scale', to: 'layers/{l}/mlp_norm'}
""")
    ckpt = open_checkpoint(str(tmp_path / "ck"), architecture=str(tmp_path / "arch.json"),
                           mapping=str(tmp_path / "map.yaml"))  # fmt: skip
    assert ckpt.location().item == "default"
    got = ckpt.restore(3, targets(architecture.resolve(ckpt).model()))
    assert_params_equal(got, nest_weights(dict(params)))
    # A damaged file, an unknown key, a pattern that is not a regular expression.
    for text, msg in (("rules: [", "is not valid YAML at line"),
                      ("rules: [{from: a, to: b, scael: 2}]", r"unknown keys \['scael'\]"),
                      ("rules: [{from: '(', to: b}]", "is not a regular expression"),
                      ("rulez: []", "must hold 'rules'")):  # fmt: skip
        (tmp_path / "bad.yaml").write_text(text)
        with pytest.raises(CheckpointError, match=msg):
            presets.read_file(str(tmp_path / "bad.yaml"))


def test_python_entry_point_and_from_linen(monkeypatch):
    # The logits are checked in test_trainer_golden; here the entry point's own rules.
    golden = os.path.join(os.path.dirname(__file__), "..", "..", "golden")
    monkeypatch.syspath_prepend(os.path.abspath(golden))
    path = os.path.join(golden, "trainers", "linen_trainstate", "checkpoints")
    model = architecture.resolve(
        open_checkpoint(path, architecture="trainer_models:linen_model")
    ).model()
    assert model.honours_segments is False  # windows are never packed for it
    assert model.description["family"] == "linen" and model.vocab_size == 64
    with pytest.raises(ConfigError, match="'trainer_models:nothing' cannot be loaded"):
        architecture.resolve(open_checkpoint(path, architecture="trainer_models:nothing")).model()
    with pytest.raises(ConfigError, match="returned a str, not a ppl_jax.LanguageModel"):
        architecture.resolve(open_checkpoint(path, architecture="platform:python_version")).model()
    with pytest.raises(ConfigError, match="'json:loads' cannot be called without arguments"):
        architecture.resolve(open_checkpoint(path, architecture="json:loads")).model()


@pytest.mark.parametrize(
    "rule, reference",
    [
        ({"layers": {"axis": 1}, "layer": 2}, lambda x: x[:, 2]),
        ({"layers": {"axis": -1}, "layer": 1}, lambda x: x[..., 1]),
        (
            {"split": {"axis": 0, "sizes": [1, 2], "squeeze": True}, "to": ["a", "b"], "part": 0},
            lambda x: x[0],
        ),  # fmt: skip
        (
            {"split": {"axis": 2, "sizes": [1, 3]}, "to": ["a", "b"], "part": 1},
            lambda x: x[:, :, 1:],
        ),  # fmt: skip
        ({"transpose": [2, 0, 1]}, lambda x: np.transpose(x, (2, 0, 1))),
        ({"reshape": [-1, 4]}, lambda x: x.reshape(-1, 4)),
        ({"rope": {"axis": -1}}, lambda x: np.concatenate([x[..., 0::2], x[..., 1::2]], -1)),
        ({"cut": 0}, lambda x: x[:2]),
        ({"scale": "sqrt(head_dim)"}, lambda x: x * np.float32(2.0)),
        ({"plus_one": True}, lambda x: x + 1),
    ],
)
def test_each_operation_matches_numpy(rule, reference):
    """Each operation, on the whole tensor and on every block of a 2-way split of each axis of
    the result (each read as the stored region it needs), equals NumPy's."""
    x = np.random.default_rng(0).standard_normal((3, 4, 4)).astype(np.float32)
    want = reference(x)
    if "cut" in rule:
        want = x[:2]
    rule = dict(rule)
    to = rule.pop("to", "w")
    layer, part = rule.pop("layer", None), rule.pop("part", None)
    scale = float(mapping.evaluate(rule.get("scale", 1.0), {"head_dim": 4}, "scale"))
    src = mapping.Source("w", layer, part, {"from": "w", "to": to, **rule}, scale)
    stored = {"w": (x.shape, x.dtype)}
    assert mapping.out_shape(src, stored, want.shape, {"head_dim": 4}) == want.shape
    reads = []

    class Counting(storage.Arrays):
        def read(self, name, index):
            reads.append(index)
            return super().read(name, index)

    names = {"head_dim": 4}
    for block in itertools.product(*[(range(0, n), range(0, n // 2), range(n // 2, n))
                                     for n in want.shape]):  # fmt: skip
        if any(len(r) == 0 for r in block):
            continue
        got = blocks.read_block(src, stored, want.shape, block, Counting({"w": x}), names,
                                np.float32)  # fmt: skip
        np.testing.assert_allclose(got, want[tuple(slice(r.start, r.stop) for r in block)],
                                   rtol=1e-6)  # fmt: skip
    assert min(math.prod(s.stop - s.start for s in r) for r in reads) < x.size  # narrower reads


def test_blocks_of_the_hf_layouts_read_only_their_rows():
    """GPT-NeoX's per-head fused rows (view, split, transpose) and Phi-3's fused qkv_proj (split
    sizes, transpose, reshape): a block of heads equals NumPy's and reads only its own heads'
    rows."""
    rng = np.random.default_rng(3)
    h, hd, d = 4, 2, 6
    qkv = rng.standard_normal((h * 3 * hd, d)).astype(np.float32)  # rows [heads, 3, head_dim]
    rule = {"from": "w", "to": ["q", "k", "v"], "view": ["num_heads", 3, "head_dim", "embed_dim"],
            "split": {"axis": 1, "squeeze": True}, "transpose": [2, 0, 1]}  # fmt: skip
    names = {"num_heads": h, "head_dim": hd, "embed_dim": d}
    rows = qkv.reshape(h, 3, hd, d)
    reads = []

    class Counting(storage.Arrays):
        def read(self, name, index):
            reads.append(index)
            return super().read(name, index)

    for part in range(3):
        src = mapping.Source("w", None, part, rule, 1.0)
        want = np.transpose(rows[:, part], (2, 0, 1))  # [embed, heads, head_dim]
        block = (range(d), range(1, 3), range(hd))
        got = blocks.read_block(src, {"w": (qkv.shape, qkv.dtype)}, want.shape, block,
                                Counting({"w": qkv}), names, np.float32)  # fmt: skip
        np.testing.assert_array_equal(got, want[:, 1:3])
        assert reads[-1][0] == slice(1 * 3 * hd, 3 * 3 * hd)  # heads 1-2's rows only
    # Phi-3: [(h + 2 kv) * hd, d] rows q, k, v; k of 1 kv head.
    kv = 1
    fused = rng.standard_normal(((h + 2 * kv) * hd, d)).astype(np.float32)
    rule = {"from": "w", "to": ["q", "k", "v"], "split": {"axis": 0, "sizes": [h * hd, kv * hd,
            kv * hd]}, "transpose": [1, 0], "reshape": ["embed_dim", -1, "head_dim"]}  # fmt: skip
    src = mapping.Source("w", None, 0, rule, 1.0)
    want = fused[: h * hd].T.reshape(d, h, hd)
    got = blocks.read_block(src, {"w": (fused.shape, fused.dtype)}, want.shape,
                            (range(d), range(2, 4), range(hd)), Counting({"w": fused}), names,
                            np.float32)  # fmt: skip
    np.testing.assert_array_equal(got, want[:, 2:4])
    assert reads[-1][0] == slice(2 * hd, 4 * hd)


def test_rope_permutation_turns_interleaved_into_rotate_half():
    # q·k after interleaved RoPE (pairs 2i, 2i+1) on the stored weights equals q·k after
    # rotate-half RoPE (pairs i, i+half) on the permuted ones: the scores are the same.
    rng = np.random.default_rng(1)
    hd, theta = 8, 10000.0
    q, k = rng.standard_normal(hd), rng.standard_normal(hd)
    inv = theta ** (-np.arange(0, hd, 2) / hd)

    def interleaved(x, p):
        a = p * inv
        x1, x2 = x[0::2], x[1::2]
        out = np.empty_like(x)
        out[0::2], out[1::2] = x1 * np.cos(a) - x2 * np.sin(a), x2 * np.cos(a) + x1 * np.sin(a)
        return out

    def half(x, p):
        a = p * inv
        x1, x2 = x[: hd // 2], x[hd // 2 :]
        return np.concatenate([x1 * np.cos(a) - x2 * np.sin(a), x2 * np.cos(a) + x1 * np.sin(a)])

    perm = lambda x: np.concatenate([x[0::2], x[1::2]])  # noqa: E731  (the `rope` operation)
    for p_q, p_k in ((5, 2), (9, 9), (3, 0)):
        want = interleaved(q, p_q) @ interleaved(k, p_k)
        assert np.isclose(half(perm(q), p_q) @ half(perm(k), p_k), want, rtol=1e-12)


GEMMA = {"qk_norm": "head", "embed_dim": 16, "num_heads": 4, "num_kv_heads": 2, "head_dim": 8, "mlp_dim": 32,
         "vocab_size": 40, "num_layers": 2, "family": "gemma3"}  # fmt: skip


def gemma_target() -> dict:
    d, h, kv, hd, f = (
        GEMMA[k] for k in ("embed_dim", "num_heads", "num_kv_heads", "head_dim", "mlp_dim")
    )
    t = {"embedding": (GEMMA["vocab_size"], d), "final_norm": (d,)}
    for i in range(GEMMA["num_layers"]):
        for n in ("attn_norm", "post_attn_norm", "mlp_norm", "post_mlp_norm"):
            t[f"layers/{i}/{n}"] = (d,)
        t |= {f"layers/{i}/attn/q": (d, h, hd), f"layers/{i}/attn/k": (d, kv, hd),
              f"layers/{i}/attn/v": (d, kv, hd), f"layers/{i}/attn/o": (h, hd, d),
              f"layers/{i}/attn/q_norm": (hd,), f"layers/{i}/attn/k_norm": (hd,),
              f"layers/{i}/mlp/gate": (d, f), f"layers/{i}/mlp/up": (d, f),
              f"layers/{i}/mlp/down": (f, d)}  # fmt: skip
    return {k: jax.ShapeDtypeStruct(v, jnp.float32) for k, v in t.items()}


@pytest.mark.parametrize("flat", [False, True])
def test_gemma_preset_resolves_nested_and_flat_trees(flat):
    d, h, kv, hd, f = (
        GEMMA[k] for k in ("embed_dim", "num_heads", "num_kv_heads", "head_dim", "mlp_dim")
    )
    stored = {"embedder/input_embedding": (GEMMA["vocab_size"] + 8, d), "final_norm/scale": (d,)}
    for i in range(GEMMA["num_layers"]):
        layer = f"layer_{i}"
        stored |= {
            f"{layer}/{n}/scale": (d,)
            for n in ("pre_attention_norm", "post_attention_norm", "pre_ffw_norm", "post_ffw_norm")
        }
        stored |= {f"{layer}/attn/q_einsum/w": (h, d, hd), f"{layer}/attn/kv_einsum/w": (2, kv, d, hd),
                   f"{layer}/attn/_query_norm/scale": (hd,), f"{layer}/attn/_key_norm/scale": (hd,),
                   f"{layer}/attn/attn_vec_einsum/w": (h, hd, d),
                   f"{layer}/mlp/gating_einsum": (2, f, d), f"{layer}/mlp/linear": (f, d)}  # fmt: skip
    if flat:
        stored = {f"transformer/{k}": v for k, v in stored.items()}
    stored = {k: (v, np.float32) for k, v in stored.items()}
    assert presets.detect(list(stored)) == "gemma"
    rules = presets.rules_for("gemma", GEMMA)
    sources = mapping.resolve(rules, stored, gemma_target(), GEMMA, "test")
    k = sources["layers/1/attn/k"]
    assert k.stored.endswith("layer_1/attn/kv_einsum/w") and k.part == 0
    assert sources["layers/0/mlp/up"].part == 1 and sources["final_norm"].rule["plus_one"]
    # With a family that applies `1+w` itself, the preset leaves the norms as stored.
    rules = presets.rules_for("gemma", {**GEMMA, "norm_offset": 1.0})
    assert not any(r.get("plus_one") for r in rules)


def test_scanned_blocks_of_layers_with_stride_and_offset():
    # MaxText's Gemma 3 scans blocks of sub-layers: layers_{sub} stacked over blocks on axis 1.
    rules = [{"from": r"layers/layers_(?P<sub>\d)/w", "to": "layers/{layer}/w",
              "layers": {"axis": 1, "stride": 3, "offset": "sub"}}]  # fmt: skip
    stored = {f"layers/layers_{s}/w": ((4, 2), np.float32) for s in range(3)}
    target = {f"layers/{i}/w": jax.ShapeDtypeStruct((4,), jnp.float32) for i in range(6)}
    sources = mapping.resolve(rules, stored, target, {}, "test")
    assert (sources["layers/4/w"].stored, sources["layers/4/w"].layer) == ("layers/layers_1/w", 1)
    assert (sources["layers/2/w"].stored, sources["layers/2/w"].layer) == ("layers/layers_2/w", 0)


def test_stored_sharding_follows_the_weight():
    mesh = mesh_lib.make_mesh(4, 2)
    P = jax.sharding.PartitionSpec
    sharding = jax.sharding.NamedSharding(mesh, P(None, "model", None))  # q [embed, heads, hd]
    leaf = jax.ShapeDtypeStruct((8, 4, 2), jnp.float32, sharding=sharding)
    src = mapping.Source("q", 0, None, {"from": "q", "to": "q", "layers": {"axis": 1}}, 1.0)
    stored = {"q": ((8, 2, 4, 2), np.float32)}
    got = blocks.stored_sharding([(src, leaf)], (8, 2, 4, 2), stored, {})
    assert got.spec == P(None, None, "model", None)
    src = dataclasses.replace(
        src, layer=None, rule={"from": "q", "to": "q", "transpose": [1, 0, 2]}
    )
    stored = {"q": ((4, 8, 2), np.float32)}
    assert blocks.stored_sharding([(src, leaf)], (4, 8, 2), stored, {}).spec == P(
        "model", None, None
    )
    # A part of a split along the sharded axis: its shards do not line up, replicated.
    src = mapping.Source("q", None, 1, {"from": "q", "to": ["a", "b"], "split": {"axis": 1}}, 1.0)
    stored = {"q": ((8, 8, 2), np.float32)}
    assert blocks.stored_sharding([(src, leaf)], (8, 8, 2), stored, {}).spec == P(None, None, None)


def test_watch_an_empty_run_folder_until_steps_appear(tmp_path):
    # A MaxText run that has not finalized a step yet: no steps (watch mode waits), then its steps.
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    ckpt = open_checkpoint(str(tmp_path / "run"), architecture=f"maxtext:default {SIZES}")
    assert ckpt.steps() == []
    save_manager(tmp_path / "run" / "checkpoints", [4], maxtext_tree(random_params(C), True))
    assert ckpt.steps() == [4] and isinstance(ckpt, ForeignOrbax)


# --------------------------------------------------- issue 26: hostile rules and MaxText settings


def test_a_pattern_that_would_backtrack_answers_at_once():
    """`(.*.*)*Z` makes a backtracking matcher run for hours on a long name; RE2 matches in time
    linear in the name, and constructs that need backtracking are refused in one sentence."""
    import time

    rules = [{"from": "(.*.*)*Z", "to": "w"}]
    stored = {"a" * 20_000: ((1,), np.float32)}
    target = {"w": jax.ShapeDtypeStruct((1,), jnp.float32)}
    start = time.monotonic()
    with pytest.raises(CheckpointError, match="no mapping rule takes the stored weight"):
        mapping.resolve(rules, stored, target, {}, "test")
    assert time.monotonic() - start < 2.0
    for pattern in (r"(a)\1", r"(?=a)a", r"(?<!b)a"):
        with pytest.raises(CheckpointError, match="is not a regular expression RE2 accepts"):
            mapping.resolve([{"from": pattern, "to": "w"}], stored, target, {}, "test")
    with pytest.raises(CheckpointError, match="longer than 2000 characters"):
        mapping.check_rules([{"from": "a" * 2001, "to": "w"}], "test")


@pytest.mark.parametrize(
    "rule, message",
    [
        ("{from: 5, to: w}", r"rule 1 \('5'\): 'from' must be a regular expression"),
        ("{from: a, to: [1, 2]}", "'to' must be a weight name, a list of names, or null"),
        ("{from: a, to: w, layers: 'x'}", "'layers' must be {axis: integer"),
        ("{from: a, to: w, layers: {axis: x}}", "'layers' must be {axis: integer"),
        ("{from: a, to: w, layers: {axis: 0, stride: 0}}", "stride: integer >= 1"),
        ("{from: a, to: w, transpose: [9, 9]}", "'transpose' must be a permutation of the axes"),
        ("{from: a, to: w, transpose: 'x'}", "'transpose' must be a permutation"),
        ("{from: a, to: w, split: 3}", "'split' must be {axis: integer"),
        ("{from: a, to: w, split: {axis: 0}}", "'split' needs 'to' to be a list"),
        ("{from: a, to: [v, w], split: {axis: 0, sizes: [1]}}", "one per part"),
        ("{from: a, to: w, reshape: 7}", "'reshape' must be a list of sizes"),
        ("{from: a, to: w, rope: 1}", "'rope' must be {axis: integer}"),
        ("{from: a, to: w, cut: [0]}", "'cut' must be an axis"),
        ("{from: a, to: w, scale: [2]}", "'scale' must be a number or an expression"),
        ("{from: a, to: w, plus_one: 'yes'}", "'plus_one' must be true or false"),
        ("{from: a, to: w, stack: {axis: 0}}", "'stack' must be {axis: integer, index:"),
        ("5", r"'rules' must be a list of rules"),
    ],
)
def test_rules_of_the_wrong_type_are_one_sentence(tmp_path, rule, message):
    (tmp_path / "bad.yaml").write_text(f"rules: [{rule}]")
    with pytest.raises(CheckpointError, match=message) as e:
        presets.read_file(str(tmp_path / "bad.yaml"))
    assert "\n" not in str(e.value) and len(str(e.value)) < 400


@pytest.mark.parametrize(
    "rule, message",
    [
        ({"transpose": [1, 0, 2]}, r"transpose \[1, 0, 2\] of 2 axes"),
        ({"layers": {"axis": 5}}, "stacks layers on axis 5"),
        ({"split": {"axis": 4}, "to": ["w", "v"]}, "split axis 4 of 2 axes"),
        ({"reshape": ["nope", 2]}, "reshape='nope' is not a number"),
        ({"reshape": [5, 5]}, r"reshape \[5, 5\] cannot hold \[4, 6\]"),
        ({"scale": "10 ** 10 ** 10"}, "scale='10 \\*\\* 10 \\*\\* 10' is not a number"),
        ({"rope": {"axis": 0}, "cut": 7}, "cut axis 7 of 2 axes"),
    ],
)
def test_operations_that_do_not_fit_the_stored_tensor_are_one_sentence(rule, message):
    to = rule.pop("to", "w")
    rules = [{"from": "a", "to": to, **rule}]
    stored = {"a": ((4, 6), np.float32)}
    target = {
        n: jax.ShapeDtypeStruct((4, 6), jnp.float32) for n in ([to] if isinstance(to, str) else to)
    }
    with pytest.raises(CheckpointError, match=message) as e:
        mapping.resolve(rules, stored, target, {}, "test")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "setting, message",
    [
        ("maxtext:", "names no MaxText model"),
        ("maxtext: base_emb_dim=64", "names no MaxText model"),
        ("maxtext:default model_vocab_size=abc", "model_vocab_size=abc is not a number greater"),
        ("maxtext:default model_vocab_size=-5", "model_vocab_size=-5 is not a number greater"),
        ("maxtext:default model_vocab_size=0", "model_vocab_size=0 is not a number greater"),
        ("maxtext:default model_vocab_size=40000", "is more than the stored vocabulary"),
        ("maxtext:default base_emb_dim=0", "base_emb_dim=0 is not a number greater than 0"),
        ("maxtext:default base_num_decoder_layers=-2", "base_num_decoder_layers=-2 is not"),
        ("maxtext:default head_dim=x", "head_dim='x' is not a whole number"),
        ("maxtext:default rope_max_timescale=-1", "rope_max_timescale=-1 is not a number"),
    ],
)
def test_maxtext_settings_that_are_not_sizes_are_one_sentence(setting, message):
    with pytest.raises(ConfigError, match=message) as e:
        given.parse(setting)
    assert "\n" not in str(e.value)


def test_stored_sharding_skips_axes_the_mesh_does_not_divide():
    """A stacked-layer axis of 4 layers on a model axis of 8: not a candidate (it would not
    divide), the weight's own axis takes the mesh axis."""
    mesh = mesh_lib.make_mesh(1, 8)
    P = jax.sharding.PartitionSpec
    sharding = jax.sharding.NamedSharding(mesh, P(None, "model"))
    leaf = jax.ShapeDtypeStruct((64, 512), jnp.float32, sharding=sharding)
    rule = {"from": "w", "to": "layers/{layer}/w", "layers": {"axis": 1}}
    pieces = [(mapping.Source("w", i, None, rule, 1.0), leaf) for i in range(4)]
    stored = {"w": ((64, 4, 512), np.float32)}
    assert blocks.stored_sharding(pieces, (64, 4, 512), stored, {}).spec == P(None, None, "model")
