"""The command line on WikiText-2 test from the PPL_JAX_TEST_DATA folder, through the shipped
config file `configs/wikitext2.py:<path>` (collected only when that variable names a folder)."""

import math
import os

import pytest
from test_cli import REQUIRED_KEYS, run_cli

pytestmark = pytest.mark.e2e  # the command line, as tests/e2e/


def test_demo_checkpoint_on_wikitext2_test(tmp_path, demo_checkpoint, test_data):
    wikitext = os.path.join(test_data, "wikitext-2", "test.txt")
    proc, r = run_cli(
        f"--config.checkpoint.dir={demo_checkpoint}",
        "--config.eval.batch_size=16",
        "--config.eval.stride=256",
        tmp_path=tmp_path,
        config=f"configs/wikitext2.py:{wikitext}",
    )
    assert REQUIRED_KEYS <= set(r)
    raw = open(wikitext, "rb").read()
    # Byte tokens: every byte after the first is scored, the tail included.
    assert r["num_tokens"] == len(raw) - 1
    assert r["num_bytes"] == len(raw) - 1
    assert r["num_words"] == len(raw[1:].decode("utf-8").split())
    assert r["num_documents"] == 1
    assert r["num_windows"] == 1 + math.ceil((len(raw) - 1 - 256) / 256)
    assert r["perplexity"] == pytest.approx(math.exp(r["nll_sum"] / r["num_tokens"]), rel=1e-12)
    assert r["bits_per_byte"] == pytest.approx(r["nll_sum"] / r["num_bytes"] / math.log(2))
    assert r["word_perplexity"] == pytest.approx(math.exp(r["nll_sum"] / r["num_words"]))
    # A trained model: far below the 8 bits of a uniform byte model.
    assert r["bits_per_byte"] < 4.0
    assert r["checkpoint"]["path"] == os.path.abspath(demo_checkpoint)
    assert r["config"]["data"]["path"] == wikitext
    assert r["config"]["data"]["name"] == "wikitext-2-test"
    for label in ("perplexity", "bits per byte", "gzip -9", "word perplexity", "tokens/s"):
        assert label in proc.stdout


def test_the_suite_example_config_names_three_datasets_of_the_shared_folder(test_data):
    """configs/suite_example.py on the shared folder: three datasets, each with its domain tag
    and budget, checked as the command line checks them (the run itself is in the README)."""
    import importlib.util

    from ppl_jax.config.settings import from_config

    spec = importlib.util.spec_from_file_location(
        "suite_example",
        os.path.join(os.path.dirname(__file__), "..", "..", "configs", "suite_example.py"),
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    s = from_config(module.get_config(test_data))
    names = [d.name for d, _ in s.datasets]
    assert names == ["wikitext-2", "tinyshakespeare", "botchan"]
    assert all(os.path.isfile(d.path) for d, _ in s.datasets)
    assert {dict(d.tags)["domain"] for d, _ in s.datasets} == {"encyclopedia", "fiction"}
    assert s.is_training_run
    with pytest.raises(FileNotFoundError, match="suite_example"):
        module.get_config(os.path.join(test_data, "nowhere"))
