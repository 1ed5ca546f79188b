"""Absurd or hostile configs and mapping files are one sentence, within seconds and bounded
memory, naming the key and the file: sizes are checked before anything sized by them is built
(`ppl_jax.models.bounds`), every zero or negative chunk, kernel, interval and step of the
2025-26 families and every NaN is refused by name, and a mapping file is read as a bounded
regular file of YAML without aliases (`ppl_jax.checkpoints.mapping.presets.read_file`). The command
line's exit 2 for such a config: tests/e2e/test_errors_cli.py."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import threading
import time
import tracemalloc

import jax.numpy as jnp
import pytest

from ppl_jax import testing
from ppl_jax.checkpoints import given
from ppl_jax.checkpoints.formats import safetensors
from ppl_jax.checkpoints.mapping import presets
from ppl_jax.errors import CheckpointError, PplJaxError
from ppl_jax.models import bounds, registry
from ppl_jax.runtime import paths

import helpers


def _config(tmp_path, family: str, **change) -> str:
    """The golden `family`'s config.json alone (no weights: nothing but the config is read),
    with `change`."""
    path = tmp_path / family
    path.mkdir()
    config = json.loads(
        open(os.path.join(helpers.GOLDEN, "families", family, "config.json")).read()
    )
    (path / "config.json").write_text(json.dumps({**config, **change}))
    return str(path)


def _one_sentence(fn, *args, seconds: float = 5.0, megabytes: float = 64.0) -> str:
    tracemalloc.start()
    start = time.monotonic()
    try:
        with pytest.raises(CheckpointError) as e:
            fn(*args)
        took = time.monotonic() - start
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    message = str(e.value)
    assert took < seconds and peak < megabytes, (took, peak, message)
    assert "\n" not in message and len(message) < 400, message
    return message


@pytest.mark.parametrize(
    "family, change, named",
    [
        # a structure over every layer was built before the sizes were checked (3 GB in 60 s)
        ("olmo3", {"num_hidden_layers": 10**9}, "num_hidden_layers=1000000000 is not a whole "
         "number from 1 to 1,024"),
        ("mamba2", {"chunk_size": 0}, "chunk_size=0 is not a whole number from 1"),
        ("falcon_h1", {"mamba_chunk_size": -8}, "mamba_chunk_size=-8 is not a whole number from 1"),
        ("nemotron_h", {"chunk_size": 0}, "chunk_size=0 is not a whole number from 1"),
        ("mamba2", {"conv_kernel": 0}, "conv_kernel=0 is not a whole number from 1"),
        ("falcon_h1", {"mamba_d_conv": 0}, "mamba_d_conv=0 is not a whole number from 1"),
        ("qwen3_next", {"linear_conv_kernel_dim": 0}, "linear_conv_kernel_dim=0 is not a whole"),
        ("llama4", {"no_rope_layer_interval": 0}, "no_rope_layer_interval=0 is not a whole number"),
        ("qwen3_next", {"decoder_sparse_step": 0}, "decoder_sparse_step=0 is not a whole number"),
        ("llama4", {"interleave_moe_layer_step": 0}, "interleave_moe_layer_step=0 is not a whole"),
        ("qwen3_5", {"linear_num_key_heads": 0}, "linear_num_key_heads=0 is not a whole number"),
        ("nemotron_h", {"mamba_head_dim": -1}, "mamba_head_dim=-1 is not a whole number from 1"),
        ("deepseek_v3", {"moe_intermediate_size": 0}, "moe_intermediate_size=0 is not a whole"),
        ("gemma2", {"query_pre_attn_scalar": 0}, "query_pre_attn_scalar=0 is not a number above 0"),
        ("gpt_oss", {"swiglu_limit": float("nan")}, "swiglu_limit=nan is not a finite number"),
        ("gpt_oss", {"rope_scaling": {"rope_type": "yarn", "factor": float("inf")}},
         "rope_scaling.factor=inf is not a finite number"),
        ("phi3", {"partial_rotary_factor": -0.5}, "partial_rotary_factor=-0.5 is not a fraction"),
    ],
)  # fmt: skip
def test_an_absurd_config_is_one_sentence_naming_the_key_and_the_file(
    tmp_path, family, change, named
):
    path = _config(tmp_path, family, **change)
    message = _one_sentence(safetensors.read_description, path)
    assert message.startswith(f"{os.path.join(path, 'config.json')}: "), message
    assert named in message, message


def test_every_2025_family_reads_its_own_golden_config(tmp_path):
    """The control: the bounds refuse none of the golden configs."""
    for family in ("olmo3", "mamba2", "falcon_h1", "nemotron_h", "qwen3_next", "qwen3_5",
                   "llama4", "gpt_oss", "deepseek_v3", "smollm3"):  # fmt: skip
        assert safetensors.read_description(_config(tmp_path, family))["vocab_size"] > 0


def test_a_family_declares_its_own_config_size_keys(monkeypatch):
    """A size that only one family's config.json names is that family's to declare
    (`Family.hf_sizes`), and is held to its bound before its reader runs; the keys every config
    names alike are `bounds.COMMON_HF_SIZES`, and a key no family declares is not a size."""
    mamba2 = registry.families()["mamba2"]
    assert mamba2.hf_sizes["chunk_size"] == ("ssm_chunk", 1)
    assert "chunk_size" not in bounds.COMMON_HF_SIZES
    path = os.path.join(helpers.GOLDEN, "families", "mamba2", "config.json")
    config = json.loads(open(path).read())
    registry.read_hf_config({**config, "scan_width": 10**9})  # no family's size: not checked
    renamed = dataclasses.replace(
        mamba2, hf_sizes={**mamba2.hf_sizes, "scan_width": ("ssm_chunk", 1)}
    )
    monkeypatch.setitem(registry.families(), "mamba2", renamed)
    with pytest.raises(CheckpointError, match=r"scan_width=1000000000 is not a whole number"):
        registry.read_hf_config({**config, "scan_width": 10**9})


@pytest.mark.parametrize(
    "change, named",
    [
        ({"ssm_chunk": 0}, "the architecture's ssm_chunk=0 is not a size ppl_jax builds"),
        ({"ssm_conv": -1}, "the architecture's ssm_conv=-1 is not a size"),
        ({"norm_eps": float("nan")}, "the architecture's norm_eps=nan is not a finite number"),
    ],
)
def test_a_stored_description_is_bounded_the_same_way(tmp_path, change, named):
    description = safetensors.read_description(_config(tmp_path, "mamba2"))
    assert named in _one_sentence(registry.build, {**description, **change}, jnp.float32)


def test_a_description_file_names_itself(tmp_path):
    bad = tmp_path / "arch.json"
    bad.write_text(json.dumps({**testing.TINY.to_dict(), "num_layers": 0}))
    message = _one_sentence(given.parse, str(bad))
    assert message.startswith(f"{str(bad)!r}: the architecture's num_layers=0"), message


# ----------------------------------------------------------------------------- mapping files


def _refused_within(fn, seconds: float = 5.0) -> str:
    """`fn()`'s one sentence (a `PplJaxError`), from a daemon thread that must end within `seconds`
    (a read that blocks on a FIFO would hang the test otherwise)."""
    found: list[BaseException | None] = [None]

    def call():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - reported below
            found[0] = e

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "still reading after 5 s"
    assert isinstance(found[0], PplJaxError), repr(found[0])
    return str(found[0])


def test_a_fifo_without_a_writer_and_dev_zero_are_refused_at_once(tmp_path):
    fifo = tmp_path / "map.yaml"
    os.mkfifo(fifo)
    for path in (str(fifo), "/dev/zero", str(tmp_path)):
        message = _refused_within(lambda path=path: presets.read_file(path))
        assert f"checkpoint.mapping: cannot read {path!r} (not a regular file)" in message
    # A config.json or a description that is a FIFO: no wait either.
    message = _refused_within(lambda: paths.read_json_object(str(fifo), ""))
    assert message == f"{str(fifo)!r} cannot be read (not a regular file)."
    message = _refused_within(lambda: given.parse(str(fifo)))
    assert "is not a config.json, a description JSON" in message


def test_a_mapping_file_is_read_with_a_byte_limit(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("rules: []\n" + "#" * presets.MAX_FILE_BYTES)
    message = _one_sentence(presets.read_file, str(big))
    assert "(larger than 1,048,576 bytes)" in message


def test_yaml_aliases_are_refused(tmp_path):
    """A "billion laughs": nine levels of nine aliases each, 10^9 nodes from 600 bytes."""
    lines = ['a0: &a0 ["x"]']
    lines += [f"a{i}: &a{i} [{', '.join(f'*a{i - 1}' for _ in range(9))}]" for i in range(1, 10)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\nrules: *a9\n")
    message = _one_sentence(presets.read_file, str(bomb))
    assert f"checkpoint.mapping {str(bomb)!r} uses the YAML alias *a0 at line 2" in message
    plain = tmp_path / "plain.yaml"
    shutil.copy(bomb, plain)
    plain.write_text("rules: [{from: '(?P<name>.*)', to: '{name}'}]\n")  # without: read
    assert presets.read_file(str(plain))["rules"][0]["to"] == "{name}"


@pytest.mark.slow
def test_no_number_of_any_golden_config_is_a_traceback(tmp_path):
    """Every number of every family's golden config.json set to 0, -1 and 10^9: read and built
    (abstract), or one sentence; never another exception, never seconds."""
    from ppl_jax.errors import PplJaxError

    found = []
    families = sorted(os.listdir(os.path.join(helpers.GOLDEN, "families")))
    for family in families:
        with open(os.path.join(helpers.GOLDEN, "families", family, "config.json")) as f:
            config = json.load(f)
        numbers = [k for k, v in config.items() if isinstance(v, int | float)
                   and not isinstance(v, bool)]  # fmt: skip
        for key in numbers:
            for value in (0, -1, 10**9):
                path = tmp_path / f"{family}-{key}-{value}"
                path.mkdir()
                (path / "config.json").write_text(json.dumps({**config, key: value}))
                start = time.monotonic()
                try:
                    registry.build(safetensors.read_description(str(path)), jnp.float32)
                except PplJaxError:
                    pass
                except Exception as e:  # noqa: BLE001 - the finding
                    found.append(f"{family} {key}={value}: {type(e).__name__}: {e}"[:200])
                if time.monotonic() - start > 5:
                    found.append(f"{family} {key}={value}: {time.monotonic() - start:.0f} s")
    assert found == []
