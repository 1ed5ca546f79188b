"""The config: every key explained, the stride rule, the corpus name, the journal keys."""

import pytest

from ppl_jax.config.defaults import (
    DEMO_CORPUS_NAME,
    KEY_MEANINGS,
    PROTOCOLS,
    describe_keys,
    flat_keys,
    get_config,
    held_out_paths,
)
from ppl_jax.config.settings import from_config
from ppl_jax.errors import ConfigError
from ppl_jax.evaluation.spec import RunSpec


def settings(**overrides) -> RunSpec:
    c = get_config()
    for key, value in overrides.items():
        section, name = key.split("__")
        setattr(getattr(c, section), name, value)
    return from_config(c)


def test_every_key_has_a_meaning_and_every_meaning_a_key():
    keys = list(flat_keys(get_config()))
    assert len(keys) == len(set(keys)) > 25
    assert set(keys) == set(KEY_MEANINGS)
    assert all(KEY_MEANINGS[k].strip() and "\n" not in KEY_MEANINGS[k] for k in keys)
    assert all(p.name == name and p.note.strip() for name, p in PROTOCOLS.items())


def test_described_defaults_are_the_config_values():
    rows = {key: shown for key, shown, _ in describe_keys()}
    assert list(rows) == list(flat_keys(get_config()))
    assert rows["eval.seq_len"] == "256"
    assert rows["eval.stride"] == "unset"
    assert rows["data.separator"] == '"\\n\\n"'
    assert rows["output.resume"] == "true"
    assert rows["data.allow_tokenizer_mismatch"] == "false"
    assert rows["output.journal_every"] == "50"
    assert rows["mesh.rules"].startswith("batch:data vocab:model embed:-")
    assert rows["data.path"] == "the demo's held-out text"


@pytest.mark.parametrize(
    ("protocol", "seq_len", "stride", "expected"),
    [
        ("sliding", 256, None, 128),  # the demo: half-overlapping windows, as before
        ("sliding", 64, None, 32),
        ("hf_strided", 1, None, 1),  # at least 1
        ("hf_strided", 7, None, 3),
        ("sliding", 64, 64, 64),
        ("hf_strided", 64, 1, 1),
        ("lm_eval_rolling", 64, None, None),  # issue 7: failed with "stride=128 outside 1..64"
        ("gptq_chunks", 64, None, None),
        ("lm_eval_rolling", 64, 500, None),  # ignored, even when set
        ("gptq_chunks", 16, 0, None),
    ],
)
def test_stride_is_derived_and_used_only_where_a_protocol_has_one(
    protocol, seq_len, stride, expected
):
    s = settings(eval__protocol=protocol, eval__seq_len=seq_len, eval__stride=stride)
    assert s.protocol.stride == expected


@pytest.mark.parametrize("stride", [0, 65, -1])
@pytest.mark.parametrize("protocol", ["sliding", "hf_strided"])
def test_a_stride_that_is_set_is_checked(protocol, stride):
    with pytest.raises(ConfigError, match=f"eval.stride={stride} is outside 1..eval.seq_len"):
        settings(eval__protocol=protocol, eval__seq_len=64, eval__stride=stride)


def test_default_stride_is_unset():
    assert get_config().eval.stride is None


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/data/wikitext/wiki.test.raw", "wiki.test"),
        ("~/corpora/novel.txt", "novel"),
        ("/data/c4/val/*.jsonl", "val/*.jsonl"),
        ("/data/c4/a.json, /data/c4/b.json", "c4"),
        ("/data/c4/x/a.json,/data/c4/y/b.json", "c4"),
        ("/a.txt,/b.txt", "a+b"),
    ],
)
def test_corpus_name_is_derived_from_the_files(path, name):
    assert settings(data__path=path, data__format="text").data.name == name


def test_demo_corpus_name_only_for_the_demo_path():
    assert get_config().data.name == ""
    assert settings().data.name == DEMO_CORPUS_NAME
    assert settings(data__path=held_out_paths().split(",")[0]).data.name == "textwrap.py"
    assert settings(data__path="/x/a.txt", data__name="my-corpus").data.name == "my-corpus"


def test_journal_and_tokenizer_keys():
    s = settings()
    assert (s.journal_every, s.resume, s.data.allow_tokenizer_mismatch) == (50, True, False)
    s = settings(output__journal_every=1, output__resume=False, data__allow_tokenizer_mismatch=True)
    assert (s.journal_every, s.resume, s.data.allow_tokenizer_mismatch) == (1, False, True)
    with pytest.raises(ConfigError, match="output.journal_every=0 must be at least 1"):
        settings(output__journal_every=0)
    with pytest.raises(ConfigError, match="output.resume=None is neither true nor false"):
        settings(output__resume=None)


def test_the_demo_text_ships_with_the_package_fixed_and_licensed():
    """The demo scored the running interpreter's standard library (bits per byte 1.9176 /
    1.9185 / 1.9192 on 3.11 / 3.12 / 3.13): its held-out text is now CPython 3.11.7's copy of
    the held-out modules, inside the package, with the PSF licence and each file's SHA-256."""
    import hashlib
    import os
    import re

    from ppl_jax.config.defaults import HELD_OUT_MODULES, demo_checkpoint_dir

    folder = os.path.join(os.path.dirname(demo_checkpoint_dir()), "held_out")
    paths = held_out_paths().split(",")
    assert paths == [os.path.join(folder, f"{m}.txt") for m in HELD_OUT_MODULES]
    with open(os.path.join(folder, "README.txt"), encoding="utf-8") as f:
        readme = f.read()
    listed = dict(
        (name, digest) for digest, name in re.findall(r"^([0-9a-f]{64})  (\S+)$", readme, re.M)
    )
    found = {}
    for path in paths:
        with open(path, "rb") as f:
            found[os.path.basename(path)] = hashlib.sha256(f.read()).hexdigest()
    assert found == listed
    assert sum(os.path.getsize(p) for p in paths) == 177_487  # a few hundred KB at most
    with open(os.path.join(folder, "LICENSE.txt"), encoding="utf-8") as f:
        assert "PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2" in f.read()
    assert "CPython 3.11.7" in readme
