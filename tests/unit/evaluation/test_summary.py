"""results.json and the summary on real small evaluations: strict JSON whatever the text, what
ran, and a summary that reads right (plurals, inf and undefined metrics, HF directories)."""

import copy
import datetime
import importlib.metadata
import json
import math
import sys

import jax
import pytest

from ppl_jax.config.defaults import get_config
from ppl_jax.config.settings import from_config
from ppl_jax.evaluation import summary
from ppl_jax.evaluation.run import evaluate
from ppl_jax.evaluation.spec import RunSpec
from ppl_jax.outputs import console

# Chinese has no spaces: hundreds of byte tokens, one whitespace-separated word per file.
CHINESE = "这是一个没有空格的中文句子，用来测试单词困惑度。" * 8


def run(checkpoint: str, path: str) -> tuple[dict, RunSpec]:
    c = get_config()
    c.checkpoint.dir = checkpoint
    c.data.path = path
    c.eval.seq_len = 32
    c.output.progress = False
    settings = from_config(c)
    return summary.results_dict(evaluate(settings), c), settings


@pytest.fixture(scope="module")
def chinese(tiny_checkpoint, tmp_path_factory):
    folder = tmp_path_factory.mktemp("zh") / "chinese"
    folder.mkdir()
    for name in ("a.txt", "b.txt"):
        (folder / name).write_text(CHINESE, encoding="utf-8")
    return run(tiny_checkpoint, f"{folder}/a.txt,{folder}/b.txt")


@pytest.fixture(scope="module")
def blank(tiny_checkpoint, tmp_path_factory):
    path = tmp_path_factory.mktemp("blank") / "spaces.txt"
    # The first byte is context only (sliding scores every token after the first): the scored
    # text is whitespace, without a word. (A corpus of whitespace alone is refused.)
    path.write_text("x \n\t \n   \n", encoding="utf-8")
    return run(tiny_checkpoint, str(path))


def test_overflowing_word_perplexity_is_null_with_a_note(chinese):
    r, settings = chinese
    assert r["num_words"] == 2  # one per file: the separator "\n\n" splits them
    # The random tiny model spends ~5.5 nats a byte: exp(nll_sum / 2) is far beyond float64.
    assert r["nll_sum"] / r["num_words"] > 710
    assert r["word_perplexity"] is None
    assert r["notes"]["word_perplexity"].startswith(
        "inf (overflow: exp(nll_sum / num_words) = exp("
    )
    # The other metrics are finite and exact.
    assert r["perplexity"] == pytest.approx(math.exp(r["nll_sum"] / r["num_tokens"]), rel=1e-12)
    assert r["bits_per_byte"] == pytest.approx(r["nll_sum"] / r["num_bytes"] / math.log(2))
    assert set(r["notes"]) == {"word_perplexity"}
    json.dumps(r, allow_nan=False)  # strict JSON
    table = console.summary_table(r)
    assert "word perplexity  inf (overflow: exp(nll_sum / num_words) = exp(" in table
    assert "2 documents" in table and settings.data.name == r["data"]["name"] == "chinese"


def test_a_corpus_without_words_is_null_and_undefined(blank):
    r, settings = blank
    assert r["num_words"] == 0 and r["num_tokens"] > 0
    assert r["word_perplexity"] is None
    assert r["notes"] == {"word_perplexity": "undefined (no words)"}
    text = json.dumps(r, allow_nan=False)
    assert "NaN" not in text and "Infinity" not in text
    table = console.summary_table(r)
    assert "word perplexity  undefined (no words)" in table
    assert "(1 document," in table and "1 process\n" in table and "1 compiled shape," in table
    assert r["data"]["name"] == "spaces"


def test_results_say_what_ran(chinese):
    r, _ = chinese
    run_info = r["run"]
    for package in ("ppl_jax", "jax", "jaxlib", "flax", "orbax-checkpoint"):
        assert run_info["versions"][package] == importlib.metadata.version(package)
    assert run_info["versions"]["jax"] == jax.__version__
    assert run_info["command"] == sys.argv
    assert run_info["platform"] == "cpu"
    assert run_info["device_count"] == jax.device_count() == 8  # conftest's fake devices
    assert run_info["device_kind"] == jax.devices()[0].device_kind
    assert run_info["process_count"] == 1 == r["num_processes"]
    started = datetime.datetime.fromisoformat(run_info["started_utc"])
    finished = datetime.datetime.fromisoformat(run_info["finished_utc"])
    assert started.utcoffset() == finished.utcoffset() == datetime.timedelta(0)
    now = datetime.datetime.now(datetime.UTC)
    assert started <= finished <= now
    assert (now - finished).total_seconds() < 600
    assert (finished - started).total_seconds() == pytest.approx(r["wall_seconds"], abs=1.0)


def test_summary_names_the_checkpoint_step_or_its_one_set_of_weights(chinese):
    r, _ = chinese
    assert f"@ step {r['checkpoint']['step']}" in console.summary_table(r)
    # What `evaluate` reports for a checkpoint of one set of weights (a Hugging Face directory):
    # no step; the table does not ask the format.
    hf = copy.deepcopy(r)
    hf["checkpoint"].update(step=None, format="hf")
    table = console.summary_table(hf)
    assert "@ one set of weights" in table and "step None" not in table


@pytest.mark.parametrize(
    ("count", "noun", "plural_form", "expected"),
    [
        (1, "document", None, "1 document"),
        (2, "document", None, "2 documents"),
        (0, "window", None, "0 windows"),
        (1, "process", "processes", "1 process"),
        (16, "process", "processes", "16 processes"),
        (4096, "byte", None, "4,096 bytes"),
    ],
)
def test_plural(count, noun, plural_form, expected):
    assert console.plural(count, noun, plural_form) == expected
