"""Per-token outputs (`ppl_jax.outputs.tokens`): every scored target of every protocol lands in one row of
tokens.parquet with its document, offset, position and token, whatever the packing and batch size;
the file is complete or absent; and `Tokenizer.token_texts` for each kind of tokenizer.

The per-token arrays are synthetic: the `nll` of a target is its index in the plan's token array
plus 0.5 (NaN where nothing is scored), so a row taken from the wrong cell is caught, and each
document/offset is checked against the document's own text, not against `plan.doc_starts`."""

import math
import os
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from ppl_jax.data.documents import Document
from ppl_jax.errors import ConfigError, DataError
from ppl_jax.outputs import tokens as tokens_lib
from ppl_jax.plans.layout import plan_layout
from ppl_jax.plans.protocols import PlanInputs, get
from ppl_jax.plans.windows import NO_PREFIX
from ppl_jax.tokenizer import ByteTokenizer, HFTokenizer, SentencePieceTokenizer

import helpers

FIXTURES = os.path.join(helpers.REPO, "tests", "golden", "tokenizers")
BOS, EOS, VOCAB = 256, 257, 258
MODEL_VOCAB = 300  # padded past the tokenizer's: top-k ids may have no text


class SpecialBytes(ByteTokenizer):
    """Bytes plus BOS 256 and EOS 257 (lm_eval_rolling needs a prefix token)."""

    name = "bytes+specials"
    vocab_size = VOCAB
    bos_id = BOS
    eos_id = EOS


def docs_of(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [
        Document("".join(chr(c) for c in rng.integers(97, 123, size=n)), f"d{i}.txt")
        for i, n in enumerate(lengths)
    ]


DOCS = docs_of([5, 0, 13, 1, 30, 9, 17])
# (protocol, seq_len, stride, add_bos)
PLANS = [
    ("sliding", 8, 3, False),
    ("sliding", 8, 8, True),
    ("hf_strided", 8, 3, True),
    ("hf_strided", 6, 5, False),
    ("gptq_chunks", 8, None, True),
    ("gptq_chunks", 5, None, False),
    ("lm_eval_rolling", 8, None, True),
    ("lm_eval_rolling", 4, None, False),
]
LAYOUTS = [(1, False, 1), (3, True, 1), (4, True, 3), (2, False, 3)]  # batch, pack, buckets


SEPARATOR = "\n\n"  # data.separator


def make_plan(protocol, seq_len, stride, add_bos, docs=DOCS):
    return get(protocol).plan(
        docs, PlanInputs(SpecialBytes(), MODEL_VOCAB, seq_len, stride, add_bos, separator=SEPARATOR)
    )


def batch_arrays(p, rows, width, top_k):
    """Synthetic step outputs `[B, width - 1]` for `rows`, each value encoding the target's index
    `g` in `p.windows.tokens`; also returns the float64 sum of the scored nll."""
    w = p.windows
    filled = w.fill(rows, width)
    g_at = np.full((len(rows), width), -1, np.int64)  # token index at each row position
    for r, ids in enumerate(rows):
        at = 0
        for k in ids:
            at += int(w.prefix[k] != NO_PREFIX)
            n = int(w.lengths[k])
            g_at[r, at : at + n] = np.arange(w.starts[k], w.starts[k] + n)
            at += n
    mask = filled["target_mask"][:, 1:]
    g = g_at[:, 1:]
    assert (w.tokens[g[mask]] == filled["tokens"][:, 1:][mask]).all()  # the test's own mapping
    nll = np.where(mask, g + 0.5, np.nan).astype(np.float32)
    arrays = {
        "nll": nll,
        "entropy": (filled["positions"][:, 1:] + 0.25).astype(np.float32),
        "correct": g % 2 == 0,
        "kl": (g * 0.125).astype(np.float32),
        "reference_nll": (nll + g % 3).astype(np.float32),
        "same_top1": g % 3 == 0,
    }
    if top_k:
        i = np.arange(top_k)
        arrays["top_ids"] = ((g[..., None] * 7 + i) % MODEL_VOCAB).astype(np.int32)
        arrays["top_logprobs"] = (-0.5 * (i + 1) - 0.01 * (g[..., None] % 5)).astype(np.float32)
    return arrays, float(nll[mask].astype(np.float64).sum())


def write(path, p, layout, top_k=0, reference=False, row_group_size=65536, dataset="toy"):
    """Feeds every batch of `layout`; returns (the writer, closed, the expected nll sum)."""
    total = 0.0
    with tokens_lib.TokenWriter(
        path, p, SpecialBytes(), dataset, top_k, reference, row_group_size
    ) as writer:
        for i in range(layout.num_batches):
            rows = layout.batch_rows(i)
            arrays, s = batch_arrays(p, rows, layout.widths[i], top_k)
            writer.add(rows, arrays)
            total += s
            assert writer._pending_rows < row_group_size  # at most one row group buffered
    return writer, total


def expected_text(p, docs):
    """Per document, the bytes its offsets index: its text, then (stream protocols) the
    separator that follows it in the stream."""
    if p.per_document:
        return [d.text.encode() for d in docs]
    joiner = get(p.protocol).between(SEPARATOR)
    return [(d.text + (joiner if i < len(docs) - 1 else "")).encode() for i, d in enumerate(docs)]


def byte_text(i):
    return bytes([i]).decode("utf-8", errors="replace") if i < 256 else ""


@pytest.mark.parametrize("batch,pack,buckets", LAYOUTS)
@pytest.mark.parametrize("protocol,seq_len,stride,add_bos", PLANS)
def test_each_scored_target_is_one_row(
    tmp_path, protocol, seq_len, stride, add_bos, batch, pack, buckets
):
    p = make_plan(protocol, seq_len, stride, add_bos)
    w = p.windows
    layout = plan_layout(w, batch, pack=pack, num_buckets=buckets)
    top_k = 3 if batch == 3 else 0
    path = str(tmp_path / "tokens.parquet")
    writer, nll_sum = write(path, p, layout, top_k=top_k, reference=True)
    t = tokens_lib.read_tokens(path).to_pydict()
    n = int(w.num_scored().sum())
    assert len(t["nll"]) == n == writer.num_tokens
    # Each target once, as the protocol scores it.
    g = np.asarray(t["nll"], np.float64) - 0.5
    assert np.isfinite(g).all() and (g == np.round(g)).all()
    g = g.astype(np.int64)
    assert sorted(g.tolist()) == np.flatnonzero(w.scored_token_mask()).tolist()
    # Position: the target's place in its window, from the windows directly.
    pos_of = {}
    for k in range(w.num_windows):
        has_prefix = int(w.prefix[k] != NO_PREFIX)
        for j in range(int(w.first_scored[k]), int(w.lengths[k]) + has_prefix):
            pos_of[int(w.starts[k]) + j - has_prefix] = j
    assert t["position"] == [pos_of[x] for x in g.tolist()]
    assert t["entropy"] == [x + 0.25 for x in t["position"]]
    assert t["token_id"] == w.tokens[g].tolist()
    assert t["correct"] == (g % 2 == 0).tolist()
    # Document and offset: the token is the document's own (or BOS at offset -1).
    texts = expected_text(p, DOCS)
    pairs = list(zip(t["document"], t["offset"], strict=True))
    assert len(set(pairs)) == n
    for (d, o), tid in zip(pairs, t["token_id"], strict=True):
        if o == -1:
            assert tid == BOS and add_bos
        else:
            assert texts[d][o] == tid, (d, o)
    if protocol == "sliding" or (protocol == "lm_eval_rolling" and not add_bos):
        # Every text token after the first is scored.
        assert len(pairs) == sum(len(x) for x in texts) - (not add_bos) * (protocol == "sliding")
    assert t["token"] == [byte_text(i) for i in t["token_id"]]
    assert set(t["dataset"]) == {"toy"}
    # The numbers.
    nll = np.asarray(t["nll"], np.float32)
    assert np.array_equal(
        np.asarray(t["surprisal"], np.float32), (nll / np.float64(math.log(2))).astype(np.float32)
    )
    assert writer.nll_sum == pytest.approx(nll_sum, rel=1e-12)
    assert writer.nll_sum == pytest.approx(float(nll.astype(np.float64).sum()), rel=1e-12)
    meta = tokens_lib.read_metadata(path)
    assert meta["nll_sum"] == writer.nll_sum and meta["num_tokens"] == n
    assert meta["protocol"] == protocol and meta["documents"] == [d.source for d in DOCS]
    assert np.array_equal(t["kl"], (g * 0.125).astype(np.float32))
    assert t["same_top1"] == (g % 3 == 0).tolist()
    ref = np.asarray(t["reference_nll"], np.float32)
    assert np.array_equal(ref, (nll + g % 3).astype(np.float32))
    assert np.array_equal(np.asarray(t["delta_logprob"], np.float32), ref - nll)
    if top_k:
        i = np.arange(top_k)
        ids = (g[:, None] * 7 + i) % MODEL_VOCAB
        assert t["top_ids"] == ids.tolist()
        assert t["top_tokens"] == [[byte_text(x) for x in row] for row in ids.tolist()]
        logp = (-0.5 * (i + 1) - 0.01 * (g[:, None] % 5)).astype(np.float32)
        np.testing.assert_allclose(t["top_probs"], np.exp(logp.astype(np.float64)), rtol=1e-6)
    assert os.listdir(tmp_path) == ["tokens.parquet"]  # no temporary file left


@pytest.mark.parametrize("top_k,reference", [(0, False), (2, False), (0, True), (4, True)])
def test_columns_and_metadata(tmp_path, top_k, reference):
    p = make_plan("sliding", 8, 4, True)
    path = str(tmp_path / "t.parquet")
    write(path, p, plan_layout(p.windows, 2), top_k, reference, dataset="wiki")
    f = pq.ParquetFile(path)
    names = f.schema_arrow.names
    base = "dataset document offset position token_id token nll surprisal entropy correct"
    expected = base.split()
    expected += ["top_ids", "top_tokens", "top_probs"] if top_k else []
    expected += ["kl", "reference_nll", "same_top1", "delta_logprob"] if reference else []
    assert names == expected
    assert f.schema_arrow.equals(tokens_lib.schema(top_k, reference))
    meta = tokens_lib.read_metadata(path)
    assert {k: meta[k] for k in ("dataset", "protocol", "top_k", "reference", "tokenizer")} == {
        "dataset": "wiki",
        "protocol": "sliding",
        "top_k": top_k,
        "reference": reference,
        "tokenizer": "bytes+specials",
    }
    group = f.metadata.row_group(0)
    chunks = {group.column(i).path_in_schema: group.column(i) for i in range(group.num_columns)}
    dictionary = {"dataset", "token"} | ({"top_tokens.list.element"} if top_k else set())
    for leaf, chunk in chunks.items():
        assert chunk.compression == "ZSTD"
        assert ("RLE_DICTIONARY" in chunk.encodings) == (leaf in dictionary), leaf
    if top_k:
        lengths = [len(x) for x in tokens_lib.read_tokens(path, ["top_ids"])["top_ids"].to_pylist()]
        assert set(lengths) == {top_k}


def test_row_groups_are_bounded(tmp_path):
    p = make_plan("lm_eval_rolling", 8, None, False)
    path = str(tmp_path / "t.parquet")
    writer, _ = write(path, p, plan_layout(p.windows, 3, pack=True), row_group_size=7)
    meta = pq.ParquetFile(path).metadata
    sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert meta.num_row_groups == math.ceil(writer.num_tokens / 7) > 2
    assert sizes[:-1] == [7] * (len(sizes) - 1) and 0 < sizes[-1] <= 7
    assert sum(sizes) == writer.num_tokens


def test_abort_and_errors_leave_nothing(tmp_path):
    p = make_plan("sliding", 8, 8, False)
    layout = plan_layout(p.windows, 2)
    path = str(tmp_path / "tokens.parquet")
    rows = layout.batch_rows(0)
    arrays, _ = batch_arrays(p, rows, layout.widths[0], 0)

    w = tokens_lib.TokenWriter(path, p, SpecialBytes(), "toy", row_group_size=4)
    w.add(rows, arrays)  # row groups already written to the temporary file
    assert len(os.listdir(tmp_path)) == 1
    w.abort()
    assert os.listdir(tmp_path) == []

    with pytest.raises(RuntimeError, match="stop"):
        with tokens_lib.TokenWriter(path, p, SpecialBytes(), "toy") as w:
            w.add(rows, arrays)
            raise RuntimeError("stop")
    assert os.listdir(tmp_path) == []

    with pytest.raises(ValueError, match="'entropy' has shape"):
        with tokens_lib.TokenWriter(path, p, SpecialBytes(), "toy") as w:
            w.add(rows, {**arrays, "entropy": arrays["entropy"][:, :2]})
    with pytest.raises(ValueError, match="no 'top_ids' array"):
        with tokens_lib.TokenWriter(path, p, SpecialBytes(), "toy", top_k=2) as w:
            w.add(rows, arrays)
    assert os.listdir(tmp_path) == []

    with open(path, "wb") as f:  # a file of an earlier run is replaced only by a finished one
        f.write(b"old")
    tokens_lib.TokenWriter(path, p, SpecialBytes(), "toy").abort()
    assert os.listdir(tmp_path) == ["tokens.parquet"] and open(path, "rb").read() == b"old"
    with pytest.raises(DataError, match="not a Parquet file"):
        tokens_lib.read_metadata(path)
    with pytest.raises(DataError, match="no such file"):
        tokens_lib.read_tokens(str(tmp_path / "absent.parquet"))


def test_an_empty_file_is_valid(tmp_path):
    p = make_plan("sliding", 8, 8, False)
    path = tokens_lib.TokenWriter(str(tmp_path / "t.parquet"), p, SpecialBytes(), "toy").close()
    assert tokens_lib.read_tokens(path).num_rows == 0
    assert tokens_lib.read_metadata(path)["num_tokens"] == 0


def test_without_pyarrow(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ConfigError, match=r"pip install 'ppl_jax\[diagnostics\]'"):
        tokens_lib.check_available()
    # ppl_jax and this module import without pyarrow.
    code = "import sys; sys.modules['pyarrow'] = None; import ppl_jax, ppl_jax.outputs.tokens"
    env = {**os.environ, "PYTHONPATH": helpers.REPO}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=helpers.REPO)


# ---------------------------------------------------------------- Tokenizer.token_texts

ASCII = "Hello  world, tokens: 42."
ASCII_UNIGRAM = "hello world, tokens 42."  # in that model's vocabulary, whitespace normalized


def test_token_texts_bytes():
    tok = ByteTokenizer()
    ids = tok.encode(["a é"])[0]
    assert tok.token_texts(ids) == ["a", " ", "\ufffd", "\ufffd"]  # é is two bytes
    assert tok.token_texts(np.array([[72, 256], [-1, 10]])) == ["H", "", "", "\n"]


@pytest.mark.parametrize(
    "name,lead,text",
    [
        ("bytelevel_bpe.json", "", ASCII),
        ("llama_bpe.json", " ", ASCII),
        ("sp_bpe.model", " ", ASCII),
        ("sp_unigram.model", " ", ASCII_UNIGRAM),
    ],
)
def test_token_texts_spell_the_text(name, lead, text):
    """Token texts of an ASCII text join to the text (after the "▁" a SentencePiece-style model
    puts first); a character split over byte tokens gives U+FFFD; specials are spelled out."""
    path = os.path.join(FIXTURES, name)
    tok = (SentencePieceTokenizer if name.endswith(".model") else HFTokenizer).from_file(path)
    ids = tok.encode([text])[0]
    texts = tok.token_texts(ids)
    assert len(texts) == ids.size and "".join(texts) == lead + text
    assert all(texts)  # every token of the text has some text
    emoji = tok.encode(["\U0001f600"])[0]  # in none of these vocabularies: bytes or <unk>
    joined = "".join(tok.token_texts(emoji))
    assert "\ufffd" in joined or joined.strip() == "<unk>"
    specials = [i for i in (tok.bos_id, tok.eos_id) if i is not None]
    assert specials
    for i, text in zip(specials, tok.token_texts(np.asarray(specials)), strict=True):
        assert text and tok.token_id(text) == i
    assert tok.token_texts(np.array([tok.vocab_size, tok.vocab_size + 40])) == ["", ""]


def test_token_texts_are_cached(monkeypatch):
    tok = SentencePieceTokenizer.from_file(os.path.join(FIXTURES, "sp_bpe.model"))
    calls = []
    original = tok._token_texts
    monkeypatch.setattr(tok, "_token_texts", lambda ids: calls.append(list(ids)) or original(ids))
    first = tok.token_texts(np.array([5, 9, 5, 7]))
    assert calls == [[5, 7, 9]]  # each id decoded once
    assert tok.token_texts(np.array([9, 5, 11])) == [first[1], first[0], original([11])[0]]
    assert calls == [[5, 7, 9], [11]]
