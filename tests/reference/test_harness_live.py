"""ppl_jax's harness model against lm-evaluation-harness's HF backend, live: the same requests
scored by both on the same tiny transformers models (tests/golden/references/) at a window
(`max_length`) other than the golden files', and the golden files of tests/golden/harness/ are
what HFLM computes today."""

from __future__ import annotations

import importlib.util
import os

import harness_tasks as tasks
import pytest
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM
from test_golden_current import assert_same

from ppl_jax.harness.model import PplJaxLM

import helpers

MAX_LENGTH = 16  # every context of the local tasks is truncated at some requests


def _requests(family: str) -> list[tuple[str, str]]:
    golden = tasks.load_golden()["families"][family]
    pairs = [tuple(r) for r in golden["edge"]["requests"]]
    for task in ("lambada_local", "arc_local", "hellaswag_local"):
        pairs += [tuple(r["args"]) for r in golden["tasks"][task]["requests"]]
    return pairs


@pytest.mark.parametrize("family", tasks.FAMILIES)
def test_loglikelihood_matches_the_hf_backend_live(family):
    import torch

    torch.set_num_threads(1)
    path = os.path.join(tasks.MODELS, family)
    # logits_cache=False: HFLM's one-token cache mis-scores requests that are the same tokens
    # split differently (see tests/golden/make_harness_golden.py).
    hf = HFLM(
        pretrained=path, tokenizer=path, max_length=MAX_LENGTH, batch_size=4, device="cpu",
        dtype="float32", logits_cache=False,
    )  # fmt: skip
    mine = PplJaxLM(checkpoint=path, seq_len=MAX_LENGTH, batch_size=8)
    pairs = [
        p for p in _requests(family) if len(hf.tok_encode(p[1], add_special_tokens=False)) <= 12
    ]
    reqs = [Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)]
    ref = hf.loglikelihood(reqs, disable_tqdm=True)
    got = mine.loglikelihood(reqs, disable_tqdm=True)
    worst = max(abs(a[0] - b[0]) / abs(a[0]) for a, b in zip(ref, got, strict=True))
    print(f"{family}: {len(reqs)} requests, largest relative difference {worst:.2e}")
    assert worst <= 1e-5
    assert [a[1] for a in ref] == [b[1] for b in got]
    assert any(a[1] for a in ref)
    docs = [Instance("loglikelihood_rolling", {}, (p[0] + p[1],), i) for i, p in enumerate(pairs)]
    ref_rolling = hf.loglikelihood_rolling(docs, disable_tqdm=True)
    got_rolling = mine.loglikelihood_rolling(docs)
    for a, b in zip(ref_rolling, got_rolling, strict=True):
        assert abs(a - b) <= 1e-5 * abs(a)


def test_harness_golden_numbers_are_current(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "make_harness_golden", os.path.join(helpers.GOLDEN, "make_harness_golden.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    fresh = module.numbers(tasks.write_tasks(str(tmp_path)))
    assert_same(tasks.load_golden(), fresh, "harness_golden.json")
