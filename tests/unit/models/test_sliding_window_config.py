"""`sliding_window` of 0 or null in a `config.json` (REVIEW item 27): where some layer slides,
transformers refuses null (`create_sliding_window_causal_mask`: "Could not find a
`sliding_window` argument") and with 0 lets the layer attend to no key (its mask
`kv_idx > q_idx - sliding_window`); neither is full attention, which ppl_jax scored without a
word. Refused in one sentence naming the key; null where no layer is named sliding (Mistral's,
Phi-3's, Mixtral's) stays full attention, as transformers has it."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from ppl_jax.checkpoints.formats import safetensors
from ppl_jax.errors import CheckpointError
from ppl_jax.models import registry

import helpers

FAMILIES = os.path.join(helpers.GOLDEN, "families")
# Families whose layer_types (or the family's default) name sliding layers.
NAMED = ["gpt_oss", "gemma2", "gemma3", "olmo3"]
# Families whose window, when set, is on every layer (no layer_types).
EVERY = ["phi3", "mixtral", os.path.join("..", "hf", "mistral")]


def config(name: str, **changes) -> dict:
    with open(os.path.join(FAMILIES, name, "config.json"), encoding="utf-8") as f:
        return {**json.load(f), **changes}


@pytest.mark.parametrize("name", NAMED + EVERY)
def test_a_window_of_0_on_sliding_layers_is_refused(name):
    with pytest.raises(CheckpointError, match=r"sliding_window=0 on the sliding layers \(0[,)].*"
                       r"attend to no key there; set sliding_window to the model's window"):  # fmt: skip
        registry.read_hf_config(config(name, sliding_window=0))


@pytest.mark.parametrize("name", NAMED)
def test_a_null_window_on_named_sliding_layers_is_refused(name):
    for c in (config(name, sliding_window=None), config(name, sliding_window=None,
                                                         layer_types=None)):  # fmt: skip
        c = {k: v for k, v in c.items() if v is not None or k == "sliding_window"}
        with pytest.raises(CheckpointError, match="sliding_window=null .* transformers refuses"):
            registry.read_hf_config(c)


@pytest.mark.parametrize("name", EVERY)
def test_a_null_window_without_named_layers_is_full_attention(name):
    assert registry.read_hf_config(config(name))["sliding_layers"]  # the golden slides
    d = registry.read_hf_config(config(name, sliding_window=None))
    assert not d.get("sliding_layers") and not d.get("sliding_window")


def test_a_window_of_0_with_no_sliding_layer_is_full_attention():
    c = config("gpt_oss", sliding_window=0)
    c["layer_types"] = ["full_attention"] * len(c["layer_types"])
    assert not registry.read_hf_config(c).get("sliding_layers")
    # Qwen2's rule: the window off without use_sliding_window, whatever its value.
    d = registry.read_hf_config(config("qwen2_moe", sliding_window=0, use_sliding_window=False))
    assert not d.get("sliding_layers")


def test_the_sentence_names_the_config_file(tmp_path):
    folder = tmp_path / "gpt_oss"
    shutil.copytree(os.path.join(FAMILIES, "gpt_oss"), folder)
    (folder / "config.json").write_text(json.dumps(config("gpt_oss", sliding_window=0)))
    with pytest.raises(CheckpointError, match=f"^{folder}/config.json: sliding_window=0 on"):
        safetensors.read_description(str(folder))
