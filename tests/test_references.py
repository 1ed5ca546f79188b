"""Each named protocol, end to end through `evaluate` on a Hugging Face directory, against its
reference implementation run on the same directory in PyTorch (or lm-evaluation-harness itself).

Two tiny random families share the real GPT-2 tokenizer (`tokenizers/gpt2.json`): GPT-2, whose
tokenizer adds no BOS (the harness's prefix token is EOS 50256), and Llama, whose tokenizer
prepends a BOS `<s>` (id 50257) through its post-processor, so the harness's `tok_encode` adds it.

- `hf_strided`: the Hugging Face guide "Perplexity of fixed-length models", with the exact NLL sum
  of the labels that are not -100 in place of `outputs.loss`.
- `gptq_chunks`: the GPTQ/AWQ `testenc` loop, NLL summed over each chunk's `seqlen - 1` targets.
- `lm_eval_rolling`: `HFLM.loglikelihood_rolling` per document, and the wikitext task's own
  `process_results` and aggregations for word and byte perplexity and bits per byte.
- `sliding`: documents tokenized one by one, joined by the separator's tokens (BOS first where
  the tokenizer adds one), every token after the first scored once (`ppl_jax.windows.sliding`).

Then the result of each protocol does not depend on batch size, mesh, packing or length buckets.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

from ppl_jax import report
from ppl_jax.config import Settings, get_config
from ppl_jax.evaluate import evaluate

import helpers

torch = pytest.importorskip("torch", reason="the references run in PyTorch")
tf = pytest.importorskip("transformers", reason="the references need transformers")
if not os.path.isfile(helpers.GPT2_TOKENIZER):
    pytest.skip(
        f"the GPT-2 tokenizer is absent ({helpers.GPT2_TOKENIZER})", allow_module_level=True
    )

L = 16  # eval.seq_len of most runs
RTOL = 1e-5  # NLL sums against a reference
INVARIANT_RTOL = 1e-6  # NLL sums of the same run under another batch size, mesh or layout

# Documents of the stream protocols: words, numbers, WikiText's " @-@ ", multibyte UTF-8 (CJK,
# accents, an emoji), a newline and a tab inside a document.
STREAM_TEXTS = [
    " = Valkyria Chronicles III = ",
    " Senjō no Valkyria 3 : Unrecorded Chronicles ( Japanese : 戦場のヴァルキュリア3 , lit . "
    "Valkyria of the Battlefield 3 ) , commonly referred to as Valkyria Chronicles III outside "
    "Japan , is a tactical role @-@ playing video game developed by Sega and Media.Vision .",
    "Café naïve — déjà vu 😀 costs €5 ; ok?",
    "def f(x):\n    return x ** 2  # a tab\there",
    "The end.",
]

# The source of lm_eval_rolling's documents, cut to exact token counts.
PARAGRAPH = (
    "The game began development in 2010 , carrying over a large portion of the work done on "
    "Valkyria Chronicles II . While it retained the standard features of the series , it also "
    "underwent multiple adjustments , such as making the game more forgiving for series "
    "newcomers . Character designer Raita Honjou and composer Hitoshi Sakimoto both returned "
    "from previous entries , along with Valkyria Chronicles II director Takeshi Ozawa . A large "
    "team of writers handled the script . The game 's opening theme was sung by May 'n . It met "
    "with positive sales in Japan , and was praised by both Japanese and western critics . After "
    "release , it received downloadable content , along with an expanded edition in November of "
    "that year . It was also adapted into manga and an original video animation series . Due to "
    "low sales of Valkyria Chronicles II , Valkyria Chronicles III was not localized , but a fan "
    "translation compatible with the game 's expanded edition was released in 2014 ."
)
# Token counts (GPT-2 tokens, before any BOS) of lm_eval_rolling's documents at L = 16: one
# token, short, L - 1, L, L + 1 (with the Llama BOS: L, L + 1, L + 2), several windows.
DOC_TOKENS = [1, 5, 15, 16, 17, 60, 100]
EXTRA_DOCS = ["  Leading spaces,\na newline and a\ttab, then trailing ones  ", "é"]


# ------------------------------------------------------------------------------------ models


def _tokenizer(family: str):
    """GPT-2's tokenizer as saved beside a GPT-2 model, or with a prepended `<s>` for Llama."""
    if family == "gpt2":
        return tf.PreTrainedTokenizerFast(
            tokenizer_file=helpers.GPT2_TOKENIZER,
            bos_token="<|endoftext|>",
            eos_token="<|endoftext|>",
        )
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_file(helpers.GPT2_TOKENIZER)
    tok.add_special_tokens(["<s>"])
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return tf.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="<|endoftext|>"
    )


def _model(family: str, vocab_size: int):
    if family == "gpt2":
        return tf.GPT2LMHeadModel(
            tf.GPT2Config(
                vocab_size=vocab_size,
                n_embd=32,
                n_layer=2,
                n_head=4,
                n_positions=64,
                initializer_range=0.2,
                bos_token_id=50256,
                eos_token_id=50256,
            )
        )
    return tf.LlamaForCausalLM(
        tf.LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            initializer_range=0.2,
            bos_token_id=vocab_size - 1,
            eos_token_id=50256,
        )
    )


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """PyTorch on one thread while this module runs: its default pool fights XLA's CPU threads
    for the cores and makes each tiny forward a hundred times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class Family:
    """A saved tiny model: its directory, and the model and tokenizer read back from it."""

    def __init__(self, name: str, path: str):
        self.name, self.path = name, path
        self.model = tf.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.tokenizer = tf.AutoTokenizer.from_pretrained(path)
        self.bos = [self.tokenizer.bos_token_id] if name == "llama" else []

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids


@pytest.fixture(scope="module")
def families(tmp_path_factory) -> dict[str, Family]:
    root = tmp_path_factory.mktemp("references")
    out = {}
    for name in ("gpt2", "llama"):
        path = str(root / name)
        tok = _tokenizer(name)
        torch.manual_seed(0)
        model = _model(name, len(tok)).eval()
        with torch.no_grad():  # norm scales and biases start at 1 and 0; make them matter
            for p in model.parameters():
                if p.dim() == 1:
                    p.add_(0.2 * torch.randn_like(p))
        model.save_pretrained(path)
        tok.save_pretrained(path)
        out[name] = Family(name, path)
    # The BOS policies the two families are here to cover.
    assert out["gpt2"].tokenizer("a b").input_ids == out["gpt2"].encode("a b")
    assert out["llama"].tokenizer("a b").input_ids == [50257] + out["llama"].encode("a b")
    return out


# -------------------------------------------------------------------------------------- data


def _write_jsonl(path, texts: list[str]) -> str:
    with open(path, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def stream_corpus(tmp_path_factory) -> dict:
    """The stream documents as `jsonl` (all) and as `lines` (those without a line end)."""
    root = tmp_path_factory.mktemp("stream")
    lines = [t for t in STREAM_TEXTS if "\n" not in t]
    (root / "docs.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {
        "jsonl": _write_jsonl(root / "docs.jsonl", STREAM_TEXTS),
        "lines": str(root / "docs.txt"),
        "jsonl_texts": STREAM_TEXTS,
        "lines_texts": lines,
    }


def _cut(encode, source: str, n: int) -> str:
    """The shortest prefix of `source` that encodes to exactly `n` tokens."""
    for end in range(1, len(source) + 1):
        if len(encode(source[:end])) == n:
            return source[:end]
    raise AssertionError(f"no prefix of the source has {n} tokens")


@pytest.fixture(scope="module")
def rolling_docs(families, tmp_path_factory) -> tuple[str, list[str]]:
    encode = families["gpt2"].encode
    words = PARAGRAPH.split(" ")
    texts = [_cut(encode, " ".join(words[7 * i :]), n) for i, n in enumerate(DOC_TOKENS)]
    texts += EXTRA_DOCS
    assert [len(encode(t)) for t in texts[: len(DOC_TOKENS)]] == DOC_TOKENS
    path = _write_jsonl(tmp_path_factory.mktemp("rolling") / "docs.jsonl", texts)
    return path, texts


# -------------------------------------------------------------------------------- ppl_jax runs

_RUNS: dict = {}


def run(
    family: Family,
    protocol: str,
    data_path: str,
    data_format: str = "jsonl",
    seq_len: int = L,
    stride: int | None = None,
    **overrides,
):
    """`evaluate` through the config, as the command line does (memoized by the settings).

    Overrides are `section__key=value`. Returns (Evaluation, the results.json dict).
    """
    c = get_config()
    c.checkpoint.dir = family.path
    c.checkpoint.format = "hf"
    c.data.path = data_path
    c.data.format = data_format
    c.eval.protocol = protocol
    c.eval.seq_len = seq_len
    c.eval.stride = stride
    c.output.progress = False
    c.output.gzip_baseline = False
    for name, value in overrides.items():
        section, field = name.split("__")
        setattr(getattr(c, section), field, value)
    settings = Settings.from_config(c)
    if settings not in _RUNS:
        ev = evaluate(settings)
        _RUNS[settings] = (ev, report.results_dict(ev, settings, c))
    return _RUNS[settings]


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


# -------------------------------------------------------------------------- PyTorch references


def _logits(model, ids) -> torch.Tensor:
    """`[1, T, vocab]` float32 logits of a `[1, T]` id tensor."""
    with torch.no_grad():
        return model(ids).logits.float()


class Reference:
    """A reference run: per window that scores something, its NLL sum (nats, float64) and count
    of scored targets, in window order; and the token ids it read."""

    def __init__(self, ids: list[int]):
        self.ids, self.window_nll, self.window_tokens = ids, [], []

    def add(self, nll: float, count: int) -> None:
        if count:
            self.window_nll.append(nll)
            self.window_tokens.append(count)

    @property
    def nll_sum(self) -> float:
        return float(np.sum(self.window_nll))

    @property
    def num_tokens(self) -> int:
        return int(np.sum(self.window_tokens))


def hf_guide(family: Family, texts: list[str], max_length: int, stride: int) -> Reference:
    """The guide's loop, with the exact NLL sum and count of the labels that are not -100 in
    place of `outputs.loss` (their mean)."""
    encodings = family.tokenizer("\n\n".join(texts), return_tensors="pt")
    ref = Reference(encodings.input_ids[0].tolist())
    seq_len = encodings.input_ids.size(1)
    prev_end_loc = 0
    for begin_loc in range(0, seq_len, stride):
        end_loc = min(begin_loc + max_length, seq_len)
        trg_len = end_loc - prev_end_loc  # may be different from stride on last loop
        input_ids = encodings.input_ids[:, begin_loc:end_loc]
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        log_probs = torch.log_softmax(_logits(family.model, input_ids), dim=-1)
        labels = target_ids[:, 1:]  # the model shifts the labels by one
        keep = labels != -100
        picked = log_probs[:, :-1].gather(-1, labels.clamp(min=0)[..., None])[..., 0]
        ref.add(-float(picked[keep].double().sum()), int(keep.sum()))
        prev_end_loc = end_loc
        if end_loc == seq_len:
            break
    return ref


def gptq_recipe(family: Family, texts: list[str], seqlen: int) -> Reference:
    """GPTQ/AWQ's evaluation loop, summing (not averaging) the NLL of each chunk's
    `seqlen - 1` targets."""
    testenc = family.tokenizer("\n\n".join(texts), return_tensors="pt").input_ids
    ref = Reference(testenc[0].tolist())
    nsamples = testenc.numel() // seqlen
    for i in range(nsamples):
        batch = testenc[:, (i * seqlen) : ((i + 1) * seqlen)]
        shift_logits = _logits(family.model, batch)[:, :-1, :]
        shift_labels = batch[:, 1:]
        loss = torch.nn.functional.cross_entropy(
            shift_logits.reshape(-1, shift_logits.size(-1)),
            shift_labels.reshape(-1),
            reduction="sum",
        )
        ref.add(float(loss), shift_labels.numel())
    return ref


def sliding_reference(
    family: Family, texts: list[str], separator: str, seq_len: int, stride: int
) -> Reference:
    """Every token after the first scored once, by windows of `seq_len` inputs every `stride`
    tokens, each token by the first window that predicts it."""
    ids = list(family.bos)
    for i, text in enumerate(texts):
        if i and separator:
            ids += family.encode(separator)
        ids += family.encode(text)
    ref = Reference(ids)
    scored_upto, begin = 0, 0  # ids[0] is never a target
    while scored_upto < len(ids) - 1:
        window = torch.tensor([ids[begin : begin + seq_len + 1]])
        log_probs = torch.log_softmax(_logits(family.model, window[:, :-1]), dim=-1)[0]
        nll, count = 0.0, 0
        for j in range(1, window.size(1)):
            if begin + j > scored_upto:
                nll -= float(log_probs[j - 1, window[0, j]])
                count += 1
        ref.add(nll, count)
        scored_upto = begin + window.size(1) - 1
        begin += stride
    return ref


def assert_matches(ev, results, ref: Reference) -> None:
    """The same tokens read, the same windows, counts equal, NLL sums within `RTOL`."""
    assert ev.plan.windows.tokens.tolist() == ref.ids  # the same stream, BOS included
    assert ev.totals.window_tokens.tolist() == ref.window_tokens
    np.testing.assert_allclose(ev.totals.window_nll, ref.window_nll, rtol=RTOL)
    assert results["num_tokens"] == ev.sums.num_tokens == ref.num_tokens
    assert rel(ev.sums.nll_sum, ref.nll_sum) < RTOL
    worst = np.max(np.abs(ev.totals.window_nll - ref.window_nll) / np.abs(ref.window_nll))
    print(
        f"{ev.plan.protocol}: {ref.num_tokens} tokens in {len(ref.window_tokens)} windows, "
        f"NLL sum rel {rel(ev.sums.nll_sum, ref.nll_sum):.1e}, worst window rel {worst:.1e}"
    )


# ------------------------------------------------------------------------------ hf_strided


HF_STRIDED_CASES = [("gpt2", 16, 16), ("gpt2", 16, 5), ("gpt2", 9, 4), ("llama", 16, 8)]


@pytest.mark.parametrize("family,max_length,stride", HF_STRIDED_CASES)
def test_hf_strided_matches_the_hf_guide(families, stream_corpus, family, max_length, stride):
    fam = families[family]
    ref = hf_guide(fam, STREAM_TEXTS, max_length, stride)
    ev, results = run(fam, "hf_strided", stream_corpus["jsonl"], seq_len=max_length, stride=stride)
    assert_matches(ev, results, ref)
    assert results["protocol"]["unscored_tokens"] == len(ref.ids) - len(fam.bos) - ref.num_tokens


# ----------------------------------------------------------------------------- gptq_chunks


@pytest.mark.parametrize("family,seqlen", [("gpt2", 16), ("gpt2", 24), ("llama", 16)])
def test_gptq_chunks_match_the_gptq_recipe(families, stream_corpus, family, seqlen):
    fam = families[family]
    ref = gptq_recipe(fam, STREAM_TEXTS, seqlen)
    numel, nsamples = len(ref.ids), len(ref.ids) // seqlen
    assert numel % seqlen  # the tail the recipe drops is not empty
    ev, results = run(fam, "gptq_chunks", stream_corpus["jsonl"], seq_len=seqlen)
    assert_matches(ev, results, ref)
    assert ev.sums.num_windows == nsamples and ref.num_tokens == nsamples * (seqlen - 1)
    # ppl_jax counts the text's tokens: the BOS that the Llama tokenizer puts in `testenc` is
    # not text (it is position 0 of chunk 0, never a target either way).
    unscored = numel - len(fam.bos) - nsamples * (seqlen - 1)
    assert results["protocol"]["unscored_tokens"] == ev.plan.unscored_tokens == unscored


# -------------------------------------------------------------------------- lm_eval_rolling


def harness(family: Family, texts: list[str], max_length: int):
    """lm-evaluation-harness's own loglikelihood_rolling (HFLM on the directory, CPU, float32).

    Returns (per-document log-likelihoods, per-document token counts, the prefix token).
    """
    pytest.importorskip("accelerate", reason="lm-eval's HFLM imports accelerate (lm-eval[hf])")
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    lm = HFLM(
        pretrained=family.path,
        tokenizer=family.path,
        max_length=max_length,
        batch_size=3,
        device="cpu",
        dtype="float32",
    )
    requests = [
        Instance(request_type="loglikelihood_rolling", doc={}, arguments=(t,), idx=i)
        for i, t in enumerate(texts)
    ]
    lls = lm.loglikelihood_rolling(requests, disable_tqdm=True)
    return np.asarray(lls, np.float64), [len(lm.tok_encode(t)) for t in texts], lm.prefix_token_id


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_lm_eval_rolling_matches_the_harness(families, rolling_docs, tmp_path, family):
    from lm_eval.api.metrics import bits_per_byte, weighted_perplexity
    from lm_eval.tasks.wikitext.preprocess_wikitext import process_results

    fam = families[family]
    path, texts = rolling_docs
    ref_ll, ref_tokens, prefix = harness(fam, texts, L)
    assert prefix == (fam.bos[0] if fam.bos else 50256)  # BOS, else EOS
    assert ref_tokens == [len(fam.bos) + len(fam.encode(t)) for t in texts]
    ev, results = run(fam, "lm_eval_rolling", path, output__per_document=True)
    assert results["protocol"]["prefix_token_id"] == prefix
    # documents.jsonl, as the command line writes it
    written = report.write_documents(ev.documents, str(tmp_path))
    docs = [json.loads(line) for line in open(written, encoding="utf-8")]
    ll = np.asarray([d["loglikelihood"] for d in docs])
    assert [d["num_tokens"] for d in docs] == ref_tokens
    assert results["num_tokens"] == ev.sums.num_tokens == sum(ref_tokens)
    assert np.abs(ll - ref_ll).max() < 1e-3
    assert rel(ev.sums.nll_sum, -ref_ll.sum()) < RTOL
    assert rel(-ll.sum(), -ref_ll.sum()) < RTOL
    # The wikitext task's counts and aggregations, fed the harness's log-likelihoods.
    per_doc = [process_results({"page": t}, (x,)) for t, x in zip(texts, ref_ll, strict=True)]
    words = [r["word_perplexity"][1] for r in per_doc]
    nbytes = [r["byte_perplexity"][1] for r in per_doc]
    assert words == [len(re.split(r"\s+", t)) for t in texts]
    assert [d["num_words"] for d in docs] == words and ev.sums.num_words == sum(words)
    assert [d["num_bytes"] for d in docs] == nbytes and ev.sums.num_bytes == sum(nbytes)
    m = ev.metrics
    assert m["word_perplexity"] == pytest.approx(
        weighted_perplexity([r["word_perplexity"] for r in per_doc]), rel=RTOL
    )
    assert m["byte_perplexity"] == pytest.approx(
        weighted_perplexity([r["byte_perplexity"] for r in per_doc]), rel=RTOL
    )
    assert m["bits_per_byte"] == pytest.approx(
        bits_per_byte([r["bits_per_byte"] for r in per_doc]), rel=RTOL
    )
    assert results["word_perplexity"] == m["word_perplexity"]
    print(
        f"lm_eval_rolling {family}: tokens {sum(ref_tokens)}, max |dll| "
        f"{np.abs(ll - ref_ll).max():.2e}, rel {rel(ev.sums.nll_sum, -ref_ll.sum()):.2e}"
    )


# ---------------------------------------------------------------------------------- sliding


@pytest.mark.parametrize(
    "family,fmt,seq_len,stride,separator",
    [
        ("gpt2", "jsonl", 16, 16, "\n\n"),
        ("gpt2", "lines", 16, 5, "\n\n"),
        ("llama", "jsonl", 16, 8, " | "),
    ],
)
def test_sliding_matches_its_reference(
    families, stream_corpus, family, fmt, seq_len, stride, separator
):
    fam = families[family]
    texts = stream_corpus[f"{fmt}_texts"]
    ref = sliding_reference(fam, texts, separator, seq_len, stride)
    ev, results = run(
        fam,
        "sliding",
        stream_corpus[fmt],
        fmt,
        seq_len=seq_len,
        stride=stride,
        data__separator=separator,
    )
    assert_matches(ev, results, ref)
    assert ref.num_tokens == len(ref.ids) - 1
    assert results["protocol"]["unscored_tokens"] == (0 if fam.bos else 1)


# ------------------------------------------------------------------------------- invariance

# (family, protocol, seq_len, stride) of a run above, the base of each invariance check.
BASES = {
    "sliding": ("gpt2", 16, 16),
    "hf_strided": ("llama", 16, 8),
    "gptq_chunks": ("gpt2", 16, None),
    "lm_eval_rolling": ("gpt2", 16, None),  # absolute positions: a packing slip shows
}
MESHES = {
    "bs1-1x8": {"eval__batch_size": 1, "mesh__data": 1, "mesh__model": 8},
    "bs2-2x4": {"eval__batch_size": 2, "mesh__data": 2, "mesh__model": 4},
}
LAYOUTS = {
    "nopack": {"eval__packing": False},
    "pack-3buckets": {"eval__packing": True, "eval__length_buckets": 3},
    "nopack-3buckets-bs2-2x4": {
        "eval__packing": False,
        "eval__length_buckets": 3,
        **MESHES["bs2-2x4"],
    },
}
INVARIANCE_CASES = [(p, name) for p in BASES for name in MESHES] + [
    ("lm_eval_rolling", name) for name in LAYOUTS
]


@pytest.mark.parametrize(
    "protocol,variant", INVARIANCE_CASES, ids=[f"{p}-{v}" for p, v in INVARIANCE_CASES]
)
def test_result_does_not_depend_on_batch_mesh_or_layout(
    families, stream_corpus, rolling_docs, protocol, variant
):
    family, seq_len, stride = BASES[protocol]
    data = rolling_docs[0] if protocol == "lm_eval_rolling" else stream_corpus["jsonl"]
    args = (families[family], protocol, data, "jsonl", seq_len, stride)
    common = {"output__per_document": True} if protocol == "lm_eval_rolling" else {}
    # eval.batch_size 8, mesh 8x1, packing on, 1 bucket: the defaults (the runs above)
    base, _ = run(*args, **common)
    assert (base.mesh_shape["data"], base.mesh_shape["model"], base.layout.batch_size) == (8, 1, 8)
    overrides = {**MESHES, **LAYOUTS}[variant]
    ev, _ = run(*args, **common, **overrides)
    assert ev.mesh_shape["data"] == overrides.get("mesh__data", 8)
    assert ev.layout.batch_size == overrides.get("eval__batch_size", 8)
    assert ev.sums.num_tokens == base.sums.num_tokens
    assert ev.sums.num_windows == base.sums.num_windows
    assert (ev.sums.num_bytes, ev.sums.num_words) == (base.sums.num_bytes, base.sums.num_words)
    assert rel(ev.sums.nll_sum, base.sums.nll_sum) < INVARIANT_RTOL
    if protocol == "lm_eval_rolling":
        if variant.startswith("nopack-3buckets"):
            assert len(set(ev.layout.widths)) > 1  # the buckets are really used
        if variant == "pack-3buckets":
            assert ev.layout.max_segments > 1  # and rows really hold several windows
        assert base.layout.max_segments > 1  # the default packs
        ll = np.asarray([d["loglikelihood"] for d in ev.documents])
        ll0 = np.asarray([d["loglikelihood"] for d in base.documents])
        np.testing.assert_allclose(ll, ll0, rtol=INVARIANT_RTOL, atol=1e-4)
