"""ppl_jax's harness model against lm-evaluation-harness's own HF backend (HFLM), through the
numbers HFLM gave on the same tiny transformers models (tests/golden/harness/, written by
tests/golden/make_harness_golden.py): per-request log-likelihoods within 1e-5 relative and the
same greedy flags, the same tokens, identical task metrics from a real `simple_evaluate` run on
the local LAMBADA-, ARC-, HellaSwag- and wikitext-shaped tasks; the edge cases of tokenization;
batch size and packing; refusals."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

lm_eval = pytest.importorskip("lm_eval")

import harness_tasks as tasks  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402

from ppl_jax.errors import ConfigError, DataError  # noqa: E402
from ppl_jax.harness.model import PplJaxLM  # noqa: E402

GOLDEN = tasks.load_golden()
REL = 1e-5


@pytest.fixture(scope="module")
def models() -> dict[str, PplJaxLM]:
    return {
        f: PplJaxLM(
            checkpoint=os.path.join(tasks.MODELS, f),
            seq_len=tasks.MAX_LENGTH,
            batch_size=tasks.BATCH_SIZE,
        )
        for f in tasks.FAMILIES
    }


@pytest.fixture(scope="module")
def evaluated(models, tmp_path_factory) -> dict:
    """simple_evaluate of each model on every local task (one run per model)."""
    from lm_eval.tasks import TaskManager

    include = tasks.write_tasks(str(tmp_path_factory.mktemp("tasks")))
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    return {
        f: lm_eval.simple_evaluate(
            model=lm,
            tasks=list(tasks.TASK_NAMES),
            task_manager=TaskManager(include_path=include, include_defaults=False),
            log_samples=True,
            bootstrap_iters=0,
        )
        for f, lm in models.items()
    }


def _close(a: float, b: float, rel: float = REL) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


@pytest.mark.parametrize("family", tasks.FAMILIES)
@pytest.mark.parametrize("task", tasks.TASK_NAMES)
def test_task_requests_match_the_hf_backend(evaluated, family, task):
    """Every request of every task: the same strings, log-likelihood within 1e-5 relative,
    the same greedy flag (loglikelihood tasks)."""
    golden = GOLDEN["families"][family]["tasks"][task]["requests"]
    samples = sorted(evaluated[family]["samples"][task], key=lambda s: s["doc_id"])
    mine = [
        ([a[k] for k in sorted(a)] if isinstance(a, dict) else list(a), r[0])
        for s in samples
        for a, r in zip(s["arguments"], s["resps"], strict=True)
    ]
    assert len(mine) == len(golden)
    for (args, answer), ref in zip(mine, golden, strict=True):
        assert args == ref["args"]
        if task == "wikitext_local":
            assert _close(float(answer), ref["answer"]), (args, answer, ref["answer"])
        else:
            assert _close(answer[0], ref["answer"][0]), (args, answer, ref["answer"])
            assert bool(answer[1]) == ref["answer"][1]


@pytest.mark.parametrize("family", tasks.FAMILIES)
@pytest.mark.parametrize("task", tasks.TASK_NAMES)
def test_task_metrics_match_the_hf_backend(evaluated, family, task):
    """acc and acc_norm identical; perplexity, word_perplexity, byte_perplexity and bits per byte
    within float32 summation (the exp of a mean log-likelihood of ~30 nats per token)."""
    golden = GOLDEN["families"][family]["tasks"][task]["metrics"]
    results = evaluated[family]["results"][task]
    assert golden
    for metric, value in golden.items():
        mine = results[f"{metric},none"]
        if metric in ("acc", "acc_norm"):
            assert mine == value, metric
        else:
            assert _close(mine, value, 1e-5), (metric, mine, value)


@pytest.mark.parametrize("family", tasks.FAMILIES)
def test_edge_cases_tokenize_and_score_as_the_hf_backend(models, family):
    """Empty contexts (the prefix token), continuations starting with a space, a context's
    trailing space, a context longer than the window (left-truncated), text that starts with the
    prefix token's text, multibyte text, and continuations the model predicts greedily."""
    golden = GOLDEN["families"][family]["edge"]
    lm = models[family]
    assert lm.prefix_token_id == golden["prefix_token_id"]
    seen = []
    scorer = lm.scorer
    original = scorer.loglikelihood_tokens

    def record(contexts, continuations, nbytes, progress=False):
        seen.extend([list(c), list(k)] for c, k in zip(contexts, continuations, strict=True))
        return original(contexts, continuations, nbytes, progress)

    scorer.loglikelihood_tokens = record
    try:
        reqs = [
            Instance("loglikelihood", {}, tuple(p), i) for i, p in enumerate(golden["requests"])
        ]
        answers = lm.loglikelihood(reqs, disable_tqdm=True)
    finally:
        del scorer.loglikelihood_tokens
    assert seen == golden["tokens"]
    assert any(g for _, g in golden["answers"]) and not all(g for _, g in golden["answers"])
    for (lp, greedy), (ref_lp, ref_greedy) in zip(answers, golden["answers"], strict=True):
        assert _close(lp, ref_lp)
        assert greedy == ref_greedy
    # Span bits per byte: of each continuation's UTF-8 bytes.
    last = lm.last_loglikelihood
    nbytes = [len(c.encode("utf-8")) for _, c in golden["requests"]]
    np.testing.assert_array_equal(last.num_bytes, nbytes)
    expected = [-lp / math.log(2) / b for (lp, _), b in zip(answers, nbytes, strict=True)]
    np.testing.assert_allclose(last.bits_per_byte, expected, rtol=1e-12)


@pytest.mark.parametrize("family", tasks.FAMILIES)
def test_rolling_documents_tokenize_as_the_hf_backend(models, family):
    golden = GOLDEN["families"][family]
    texts = [r["args"][0] for r in golden["tasks"]["wikitext_local"]["requests"]]
    assert [models[family].tok_encode(t) for t in texts] == golden["rolling_tokens"]


def test_a_continuation_longer_than_the_window_is_refused(models):
    """HFLM asserts; ppl_jax says why in one sentence."""
    assert GOLDEN["families"]["gpt2"]["edge"]["too_long_refused"]
    with pytest.raises(DataError, match="longer than the model's window of 32"):
        models["gpt2"].loglikelihood([Instance("loglikelihood", {}, tasks.TOO_LONG, 0)], True)


def test_generate_until_is_refused_naming_the_served_request_types(models):
    with pytest.raises(ConfigError, match="loglikelihood_rolling") as e:
        models["gpt2"].generate_until([Instance("generate_until", {}, ("a", {}), 0)])
    assert str(e.value).count(". ") == 0 and "generate_until" in str(e.value)


def test_batch_size_and_packing_do_not_change_the_answers(models):
    """The edge requests scored by backends of other batch sizes, packed or not."""
    lm = models["llama"]
    golden = GOLDEN["families"]["llama"]["edge"]
    ctx, cont = zip(*golden["tokens"], strict=True)
    nbytes = [len(c.encode()) for _, c in golden["requests"]]
    base = lm.scorer.loglikelihood_tokens(ctx, cont, nbytes)
    for batch_size, packing in ((8, False), (16, True), (24, False)):
        other = PplJaxLM.from_params(
            lm.scorer.model,
            lm.scorer.params,
            lm.scorer.mesh,
            lm.ppl_tokenizer,
            seq_len=tasks.MAX_LENGTH,
            batch_size=batch_size,
            packing=packing,
        ).scorer.loglikelihood_tokens(ctx, cont, nbytes)
        np.testing.assert_allclose(other.logprob, base.logprob, rtol=1e-6)
        np.testing.assert_array_equal(other.greedy, base.greedy)


def test_the_model_is_registered_and_declared_as_an_entry_point():
    from lm_eval.api.registry import get_model

    assert get_model("ppl_jax") is PplJaxLM
    root = os.path.dirname(os.path.dirname(os.path.dirname(tasks.GOLDEN)))
    with open(os.path.join(root, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    section = text.split('[project.entry-points."lm_eval.models"]\n', 1)[1].split("\n\n")[0]
    assert f'ppl_jax = "{PplJaxLM.__module__}:{PplJaxLM.__name__}"' in section.splitlines()
    # What a harness that reads entry points loads (upstream's registry materialises it).
    from importlib.metadata import EntryPoint

    value = f"{PplJaxLM.__module__}:{PplJaxLM.__name__}"
    assert EntryPoint("ppl_jax", value, "lm_eval.models").load() is PplJaxLM
    assert 'harness = ["lm-eval>=0.4.5"]' in text.splitlines()


def test_model_args_win_over_the_command_lines_batch_size():
    lm = PplJaxLM.create_from_arg_string(
        f"checkpoint={os.path.join(tasks.MODELS, 'gpt2')},seq_len=16,batch_size=16",
        {"batch_size": 1, "device": "cpu", "max_batch_size": None},
    )
    assert (lm.batch_size, lm.max_length, lm.rank, lm.world_size) == (16, 16, 0, 1)
    with pytest.raises(ConfigError, match="unknown key"):
        PplJaxLM(checkpoint=os.path.join(tasks.MODELS, "gpt2"), pretrained="x")
    with pytest.raises(ConfigError, match="checkpoint=DIR"):
        PplJaxLM()


def test_set_params_scores_with_the_new_params_without_compiling_again(models):
    """A training loop builds the model once and gives it each step's params."""
    import jax

    lm = models["gpt2"]
    golden = GOLDEN["families"]["gpt2"]["edge"]
    reqs = [Instance("loglikelihood", {}, tuple(p), i) for i, p in enumerate(golden["requests"])]
    before = lm.loglikelihood(reqs, disable_tqdm=True)
    old = lm.scorer.params
    new = jax.tree.map(lambda a: a * 0.5, old)
    fresh = PplJaxLM.from_params(
        lm.scorer.model, new, lm.scorer.mesh, lm.ppl_tokenizer, seq_len=tasks.MAX_LENGTH,
        batch_size=tasks.BATCH_SIZE,
    ).loglikelihood(reqs, disable_tqdm=True)  # fmt: skip
    traces = lm.scorer.evaluator.traces
    lm.set_params(new)
    try:
        after = lm.loglikelihood(reqs, disable_tqdm=True)
    finally:
        lm.set_params(old)
    assert lm.scorer.evaluator.traces == traces
    assert after == fresh
    assert all(abs(a[0] - b[0]) > 1e-3 for a, b in zip(after, before, strict=True))


def test_an_orbax_step_scores_as_a_numpy_reference(tiny_checkpoint):
    """An Orbax checkpoint step (the tiny random Llama, byte tokenizer: no BOS or EOS, so the
    prefix token is given): each request's log-likelihood and greedy flag from a float64 NumPy
    forward pass over HFLM's row."""
    import helpers

    seq_len = 16
    lm = PplJaxLM(
        checkpoint=tiny_checkpoint, step=3, seq_len=seq_len, batch_size=8, prefix_token_id="10"
    )
    pairs = [
        ("hello", " world"),
        ("", "abc"),
        ("x" * 40, " tail"),
        ("The end", "."),
        ("a", "b" * 16),
    ]
    answers = lm.loglikelihood([Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)])
    params = helpers.random_params(helpers.TINY, 0)
    for (context, continuation), (lp, greedy) in zip(pairs, answers, strict=True):
        if context:
            ctx = lm.tok_encode(context)
            cont = lm.tok_encode(context + continuation)[len(ctx) :]
        else:
            ctx, cont = [lm.prefix_token_id], lm.tok_encode(continuation, add_special_tokens=False)
        row = np.asarray((ctx + cont)[-(seq_len + 1) :])
        nll = helpers.reference_token_nll(params, helpers.TINY, row)[-len(cont) :]
        logits = helpers.reference_logits(params, helpers.TINY, row[:-1])[-len(cont) :]
        assert abs(lp + nll.sum()) <= 1e-4 * nll.sum()
        assert greedy == bool((logits.argmax(-1) == row[-len(cont) :]).all())


def test_a_tokenizer_without_bos_or_eos_needs_a_prefix_token_first(tiny_checkpoint, monkeypatch):
    # Refused when the model is made, before any weight is read (not after the tasks are built),
    # in the words of the caller: the library's, or the command line's --model_args.
    from ppl_jax.checkpoints.readers.own import OwnOrbax

    def no_weights(*args, **kwargs):
        raise AssertionError("weights read before the prefix token was checked")

    monkeypatch.setattr(OwnOrbax, "restore", no_weights)
    with pytest.raises(ConfigError, match=r"neither a BOS nor an EOS .* pass prefix_token_id=ID "
                       r"to PplJaxLM \(or PplJaxLM.from_params\)\.$"):  # fmt: skip
        PplJaxLM(checkpoint=tiny_checkpoint, seq_len=16)
    with pytest.raises(ConfigError, match=r"give prefix_token_id=ID in --model_args\.$"):
        PplJaxLM.create_from_arg_string(f"checkpoint={tiny_checkpoint},seq_len=16")
    monkeypatch.undo()
    lm = PplJaxLM(checkpoint=tiny_checkpoint, seq_len=16, prefix_token_id=10)
    assert lm.loglikelihood([Instance("loglikelihood", {}, ("a", "bc"), 0)])[0][0] < 0
