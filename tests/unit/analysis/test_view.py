"""The token view (`ppl-jax view`): the page holds what tokens.parquet holds.

Each test writes a small tokens.parquet by the schema of the issue 9 spec, builds the page, parses
it back with the standard library (html.parser, json) and checks it against the file.
"""

from __future__ import annotations

import html.parser
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pyarrow as pa  # noqa: E402  (the `test` extra installs it)
import pyarrow.parquet as pq  # noqa: E402
import pytest

from ppl_jax.analysis import view

NASTY = "</script><b>bold</b> & <!--"
TEXTS = ["the", " cat", "\n", " ", "\t", "é", NASTY, "", " sat", "\n\n", "<b>", "x"]


def corpus(seed: int, lengths: tuple[int, ...] = (5, 9, 3, 12), top_k: int = 0, reference=False):
    """Rows of a tokens.parquet (shuffled, as a run may write them) for documents of `lengths`
    scored tokens; document 2 of `len(lengths) + 1` documents has none (left out of the file)."""
    rng = np.random.default_rng(seed)
    docs = [d if d < 2 else d + 1 for d in range(len(lengths))]
    document = np.concatenate([np.full(n, d) for d, n in zip(docs, lengths, strict=True)])
    offset = np.concatenate([np.arange(n) + 1 for n in lengths])  # offset 0 unscored (no BOS)
    n = len(document)
    token_id = rng.integers(0, len(TEXTS), n)
    nll = rng.gamma(2.0, 2.0, n).astype(np.float32)
    cols = {
        "dataset": ["toy"] * n,
        "document": document.astype(np.int64),
        "offset": offset.astype(np.int64),
        "position": (offset + 1).astype(np.int32),
        "token_id": token_id.astype(np.int32),
        "token": [TEXTS[i] for i in token_id],
        "nll": nll,
        "surprisal": (nll / np.float32(math.log(2))).astype(np.float32),
        "entropy": rng.gamma(2.0, 1.5, n).astype(np.float32),
        "correct": rng.random(n) < 0.3,
    }
    types = {"position": pa.int32(), "token_id": pa.int32()}
    if top_k:
        ids = np.stack([rng.permutation(len(TEXTS))[:top_k] for _ in range(n)]).astype(np.int32)
        probs = np.sort(rng.dirichlet(np.ones(len(TEXTS)), n)[:, :top_k], axis=1)[:, ::-1]
        cols["top_ids"] = ids.tolist()
        cols["top_tokens"] = [[TEXTS[i] for i in row] for row in ids]
        cols["top_probs"] = probs.astype(np.float32).tolist()
        types.update(top_ids=pa.list_(pa.int32()), top_probs=pa.list_(pa.float32()))
    if reference:
        ref = (nll + rng.normal(0, 0.5, n)).astype(np.float32)
        cols["kl"] = rng.gamma(1.0, 0.01, n).astype(np.float32)
        cols["reference_nll"] = ref
        cols["same_top1"] = rng.random(n) < 0.9
        cols["delta_logprob"] = (ref - nll).astype(np.float32)
    perm = rng.permutation(n)
    return (
        {
            k: (np.asarray(v)[perm] if not isinstance(v, list) else [v[i] for i in perm])
            for k, v in cols.items()
        },
        types,
        len(lengths) + 1,
    )


def write(folder, cols, types, num_docs, top_k=0, reference=False, dataset="toy"):
    os.makedirs(folder, exist_ok=True)
    table = pa.table({k: pa.array(v, type=types.get(k)) for k, v in cols.items()})
    meta = {
        "dataset": dataset,
        "protocol": "document",
        "top_k": top_k,
        "reference": reference,
        "tokenizer": "toy",
        "num_tokens": table.num_rows,
        "nll_sum": float(np.sum(np.asarray(cols["nll"], np.float64))),
    }
    names = [f"toy.txt:{i + 1}" for i in range(num_docs)]
    table = table.replace_schema_metadata(
        {"ppl_jax": json.dumps(meta), "documents": json.dumps(names)}
    )
    pq.write_table(table, os.path.join(folder, "tokens.parquet"), row_group_size=7)
    return str(folder)


class Page(html.parser.HTMLParser):
    """Every start tag with its attributes, the text outside scripts, and the scripts' text."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags, self.scripts, self.text, self._in = [], [], [], None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._in = dict(attrs)
            self.scripts.append((dict(attrs), ""))

    def handle_endtag(self, tag):
        if tag == "script":
            self._in = None

    def handle_data(self, data):
        if self._in is not None:
            attrs, text = self.scripts[-1]
            self.scripts[-1] = (attrs, text + data)
        else:
            self.text.append(data)

    def data(self) -> dict:
        (blob,) = [t for a, t in self.scripts if a.get("id") == "ppl-data"]
        return json.loads(blob)


def load(path: str) -> tuple[Page, str]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return Page(text), text


def by_document(cols) -> dict[int, dict[str, list]]:
    """The file's rows per document, sorted by offset (the independent side of the checks)."""
    out = {}
    order = np.lexsort((cols["offset"], cols["document"]))
    for i in order:
        d = out.setdefault(int(cols["document"][i]), {k: [] for k in cols})
        for k in cols:
            d[k].append(cols[k][i])
    return out


@pytest.mark.parametrize("top_k,reference", [(0, False), (3, True)])
def test_page_holds_the_documents_and_tokens_of_the_file(tmp_path, top_k, reference):
    cols, types, num_docs = corpus(0, top_k=top_k, reference=reference)
    folder = write(tmp_path / "run", cols, types, num_docs, top_k, reference)
    assert view.main([folder]) == 0
    page, raw = load(os.path.join(folder, "view.html"))
    data = page.data()
    docs = by_document(cols)
    # Exactly the file's documents, ordered by mean surprisal (float64 from the NLL), highest first.
    means = {
        d: float(np.mean(np.asarray(v["nll"], np.float64))) / math.log(2) for d, v in docs.items()
    }
    assert [e["document"] for e in data["documents"]] == sorted(means, key=lambda d: -means[d])
    assert len(set(means.values())) == len(means)  # the order is not decided by ties
    for e in data["documents"]:
        want = docs[e["document"]]
        assert e["source"] == f"toy.txt:{e['document'] + 1}"
        assert e["tokens"] == e["shown"] == len(want["nll"])
        assert e["mean"] == [pytest.approx(means[e["document"]], abs=1e-12)]
        assert e["offset"] == [int(x) for x in want["offset"]] == sorted(e["offset"])
        assert e["id"] == [int(x) for x in want["token_id"]]
        assert e["position"] == [int(x) for x in want["position"]]
        assert e["text"] == want["token"]
        (side,) = e["sides"]
        np.testing.assert_allclose(side["surprisal"], want["surprisal"], rtol=0, atol=5.01e-5)
        np.testing.assert_allclose(side["entropy"], want["entropy"], rtol=0, atol=5.01e-5)
        assert side["correct"] == [int(x) for x in want["correct"]]
        assert ("top" in side) == bool(top_k) and ("kl" in side) == reference
        if top_k:
            assert side["top"] == [list(map(int, x)) for x in want["top_ids"]]
            np.testing.assert_allclose(
                np.array(side["top_p"]), np.array(want["top_probs"]), rtol=5.01e-4
            )
            for ids, texts in zip(side["top"], want["top_tokens"], strict=True):
                assert [data["vocab"][str(i)] for i in ids] == texts
        if reference:
            np.testing.assert_allclose(side["kl"], want["kl"], rtol=0, atol=5.01e-5)
            np.testing.assert_allclose(
                side["delta_logprob"], want["delta_logprob"], rtol=0, atol=5.01e-5
            )
            assert side["same_top1"] == [int(x) for x in want["same_top1"]]
    sel = data["selection"]
    assert (sel["documents"], sel["corpus_documents"], sel["left_out_documents"]) == (4, 5, 0)
    assert "Nothing was left out." in " ".join(page.text)
    assert "1 document of the corpus had no scored token" in " ".join(page.text)
    assert data["runs"][0]["mean"] == pytest.approx(
        float(np.sum(np.asarray(cols["nll"], np.float64))) / len(cols["nll"]) / math.log(2)
    )


def test_page_loads_nothing_from_the_network(tmp_path):
    cols, types, num_docs = corpus(1, top_k=2)
    folder = write(tmp_path / "run", cols, types, num_docs, top_k=2)
    path, _ = view.view(folder)
    page, raw = load(path)
    for tag, attrs in page.tags:
        for name in ("src", "href", "action", "srcset", "data", "poster"):
            assert name not in attrs, (tag, attrs)
        assert tag not in ("link", "img", "iframe", "object", "embed", "base"), tag
    csp = [a["content"] for t, a in page.tags if a.get("http-equiv") == "Content-Security-Policy"]
    assert csp and "default-src 'none'" in csp[0]
    code = "".join(t for a, t in page.scripts if "id" not in a)
    assert not re.search(r"https?:|//[a-z]|fetch\(|XMLHttpRequest|import\(|url\(", code)
    assert "http://" not in raw and "https://" not in raw


def test_token_text_cannot_escape_the_data_element(tmp_path):
    cols, types, num_docs = corpus(2, top_k=2)
    assert NASTY in cols["token"] and "<b>" in cols["token"]
    folder = write(tmp_path / "run", cols, types, num_docs, top_k=2)
    path, _ = view.view(folder)
    page, raw = load(path)
    # Two scripts only (the data and the code), and no <b> element came out of a token's text.
    assert [t for t, _ in page.tags].count("script") == 2
    assert "b" not in [t for t, _ in page.tags]
    assert raw.count("</script>") == 2 and "<b>" not in raw
    texts = [t for e in page.data()["documents"] for t in e["text"]]
    assert NASTY in texts and "<b>" in texts  # the text itself comes back unchanged
    assert sorted(texts) == sorted(cols["token"])


def test_compare_colours_the_change_b_minus_a(tmp_path):
    cols_a, types, num_docs = corpus(3, reference=True)
    cols_b = dict(cols_a)
    rng = np.random.default_rng(9)
    nll_b = cols_a["nll"] * rng.uniform(0.5, 1.5, len(cols_a["nll"]))
    # B is much more surprised on the two documents A finds easiest: they change most.
    docs_a = by_document(cols_a)
    easiest = sorted(docs_a, key=lambda d: np.mean(docs_a[d]["nll"]))[:2]
    nll_b = (nll_b + 8.0 * np.isin(cols_a["document"], easiest)).astype(np.float32)
    cols_b["nll"] = nll_b
    cols_b["surprisal"] = (nll_b / np.float32(math.log(2))).astype(np.float32)
    a = write(tmp_path / "a", cols_a, types, num_docs, reference=True)
    b = write(tmp_path / "b", cols_b, types, num_docs, reference=True)
    out = str(tmp_path / "cmp.html")
    assert view.main([a, "--compare", b, "--out", out]) == 0
    page, _ = load(out)
    data = page.data()
    da, db = by_document(cols_a), by_document(cols_b)
    assert len(data["documents"]) == len(da) and [r["label"] for r in data["runs"]] == ["A", "B"]
    order_a = [e["document"] for e in data["documents"]]
    for e in data["documents"]:
        d = e["document"]
        sa = np.asarray(da[d]["surprisal"], np.float64)
        sb = np.asarray(db[d]["surprisal"], np.float64)
        np.testing.assert_allclose(e["delta"], sb - sa, rtol=0, atol=5.01e-5)
        mean_a, mean_b = (
            np.mean(np.asarray(x[d]["nll"], np.float64)) / math.log(2) for x in (da, db)
        )
        assert e["diff"] == pytest.approx(mean_b - mean_a, abs=1e-12)
        assert e["mean"] == [pytest.approx(mean_a, abs=1e-12), pytest.approx(mean_b, abs=1e-12)]
        np.testing.assert_allclose(e["sides"][1]["surprisal"], sb, rtol=0, atol=5.01e-5)
    assert not os.path.exists(os.path.join(a, "view.html"))
    # Bounded, a comparison keeps the documents that changed most (|mean B - A|), still listed
    # by mean surprisal of A.
    change = {e["document"]: abs(e["diff"]) for e in data["documents"]}
    kept = sorted(change, key=lambda d: -change[d])[:2]
    _, small = view.view(a, compare=b, out=out, max_documents=2)
    got = [e["document"] for e in small["documents"]]
    assert sorted(got) == sorted(kept) == sorted(easiest)
    assert got == [e for e in order_a if e in kept]


def test_the_page_is_bounded_and_says_what_it_left_out(tmp_path):
    lengths = (4, 6, 8, 10, 12, 14)
    cols, types, num_docs = corpus(4, lengths=lengths)
    folder = write(tmp_path / "run", cols, types, num_docs)
    docs = by_document(cols)
    means = {d: float(np.mean(np.asarray(v["nll"], np.float64))) for d, v in docs.items()}
    ranked = sorted(means, key=lambda d: -means[d])
    # 3 documents at most: the 3 most surprising.
    _, data = view.view(folder, max_documents=3)
    assert [e["document"] for e in data["documents"]] == ranked[:3]
    left = sum(len(docs[d]["nll"]) for d in ranked[3:])
    page, _ = load(os.path.join(folder, "view.html"))
    assert f"Left out: 3 documents ({left} tokens)." in " ".join(page.text)
    # A token budget: the most surprising documents first, the last one cut, the rest left out.
    n0, n1 = len(docs[ranked[0]]["nll"]), len(docs[ranked[1]]["nll"])
    _, data = view.view(folder, max_tokens=n0 + n1 - 1)
    shown = {e["document"]: e["shown"] for e in data["documents"]}
    assert shown == {ranked[0]: n0, ranked[1]: n1 - 1}
    cut = data["documents"][[e["document"] for e in data["documents"]].index(ranked[1])]
    assert cut["offset"] == [int(x) for x in docs[ranked[1]]["offset"][: n1 - 1]]
    assert cut["tokens"] == n1
    assert data["selection"]["cut_tokens"] == 1 and data["selection"]["left_out_documents"] == 4


def test_mistakes_exit_2_with_one_line(tmp_path, capsys):
    assert view.main([str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ppl-jax view: error:") and err.count("\n") == 1
    assert "missing does not exist; give a run's output.dir" in err
    (tmp_path / "empty").mkdir()
    assert view.main([str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tokens.parquet does not exist" in err
    assert "output.tokens=true" in err
    cols, types, num_docs = corpus(5)
    a = write(tmp_path / "a", cols, types, num_docs)
    # Another token id at one place: named by its document and offset.
    other = dict(cols)
    i = int(np.lexsort((cols["offset"], cols["document"]))[7])
    other["token_id"] = cols["token_id"].copy()
    other["token_id"][i] += 1
    b = write(tmp_path / "b", other, types, num_docs)
    assert view.main([a, "--compare", b]) == 2
    err = capsys.readouterr().err
    d, o = int(cols["document"][i]), int(cols["offset"][i])
    assert err.count("\n") == 1 and err.startswith("ppl-jax view: error:")
    assert f"document {d} (toy.txt:{d + 1}) offset {o} the token id" in err
    # Another dataset; fewer tokens.
    c = write(tmp_path / "c", cols, types, num_docs, dataset="other")
    assert view.main([a, "--compare", c]) == 2
    assert "the dataset is 'toy' in A and 'other' in B" in capsys.readouterr().err
    # One token fewer: in the middle of the corpus, or at its end.
    order = np.lexsort((cols["offset"], cols["document"]))
    for k, words in (
        (order[5], "the scored token 5 is document"),
        (order[-1], f"only A scored {view.Run(a)._where(len(order) - 1)}"),
    ):
        keep = np.arange(len(order)) != k
        fewer = {c: [v[j] for j in np.flatnonzero(keep)] for c, v in cols.items()}
        e = write(tmp_path / f"e{k}", fewer, types, num_docs)
        assert view.main([e, "--compare", a] if "only A" not in words else [a, "--compare", e]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "did not score the same tokens" in err
        assert words in err, err
    # A column missing; a token twice (two runs' files pasted together).
    lacking = {k: v for k, v in cols.items() if k != "entropy"}
    f = write(tmp_path / "f", lacking, types, num_docs)
    assert view.main([f]) == 2
    assert "lacks the column(s) entropy" in capsys.readouterr().err
    twice = {k: np.concatenate([v, v[:1]]) for k, v in cols.items()}
    g = write(tmp_path / "g", twice, types, num_docs)
    assert view.main([g]) == 2
    d, o = int(cols["document"][0]), int(cols["offset"][0])
    assert f"holds document {d} (toy.txt:{d + 1}) offset {o} twice" in capsys.readouterr().err
    # Not a Parquet file; a flag out of range; an output folder that does not exist.
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tokens.parquet").write_text("not parquet")
    for argv, words in (
        ([str(bad)], "is not a readable tokens.parquet"),
        ([a, "--max_documents", "0"], "--max_documents=0 must be at least 1"),
        ([a, "--out", str(tmp_path / "no" / "v.html")], "does not exist; create it first"),
    ):
        assert exit_code(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("ppl-jax view: error:") and err.count("\n") == 1, err
        assert words in err


def exit_code(argv: list[str]) -> int:
    """`view.main`'s status, whether it returns it or argparse exits with it."""
    try:
        return view.main(argv)
    except SystemExit as e:
        return e.code


def test_without_pyarrow_the_error_says_what_to_install(tmp_path, monkeypatch, capsys):
    cols, types, num_docs = corpus(6)
    folder = write(tmp_path / "run", cols, types, num_docs)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # import fails
    assert view.main([folder]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'ppl_jax[diagnostics]'" in err


def test_the_command_line_entry_point(tmp_path):
    cols, types, num_docs = corpus(7)
    folder = write(tmp_path / "run", cols, types, num_docs)
    cmd = [sys.executable, "-m", "ppl_jax", "view"]
    ok = subprocess.run([*cmd, folder, "--max_documents", "2"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    docs = by_document(cols)
    top2 = sorted(docs, key=lambda d: -np.mean(np.asarray(docs[d]["nll"], np.float64)))[:2]
    tokens = sum(len(docs[d]["nll"]) for d in top2)
    assert ok.stdout.strip() == f"view: {folder}/view.html (2 of 4 documents, {tokens} tokens)"
    bad = subprocess.run([*cmd, str(tmp_path / "nowhere")], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
    assert bad.stderr.startswith("ppl-jax view: error:")


def test_markers_in_names_and_paths_stay_text(tmp_path):
    """A run folder, dataset or document named with the page template's markers (`@SCRIPT@`,
    `@DATA@`) leaves the page whole: two scripts, the data parses, the names come back."""
    cols, types, num_docs = corpus(8)
    folder = write(tmp_path / "run@SCRIPT@@DATA@", cols, types, num_docs, dataset="d@SCRIPT@")
    names = [f"x@SCRIPT@{i}@TITLE@.txt:1" for i in range(num_docs)]
    path = os.path.join(folder, "tokens.parquet")
    table = pq.read_table(path)
    meta = {**table.schema.metadata, b"documents": json.dumps(names).encode()}
    pq.write_table(table.replace_schema_metadata(meta), path)
    out, _ = view.view(folder, out=str(tmp_path / "v.html"))
    page, raw = load(out)
    assert [t for t, _ in page.tags].count("script") == 2
    data = page.data()
    assert {e["source"] for e in data["documents"]} <= set(names)
    assert data["runs"][0]["dataset"] == "d@SCRIPT@" and "@SCRIPT@@DATA@" in data["runs"][0]["path"]
    code = [t for a, t in page.scripts if "id" not in a]
    assert len(code) == 1 and raw.count('"use strict";') == 1
    assert "run@SCRIPT@@DATA@" in " ".join(page.text)  # the header names the folder, as text


def test_documents_are_named_by_their_first_words(tmp_path):
    tokens = ["\n", "  Pride", " and", " Prejudice", ",", " by", " Jane", " Austen", ".", "\n"]
    tokens += [" It", " is", " a", " truth", " universally", " acknowledged"]
    n = len(tokens)
    cols = {
        "dataset": ["toy"] * n,
        "document": np.zeros(n, np.int64),
        "offset": np.arange(n, dtype=np.int64),
        "position": np.arange(n, dtype=np.int32) + 1,
        "token_id": np.arange(n, dtype=np.int32),
        "token": tokens,
        "nll": np.ones(n, np.float32),
        "surprisal": np.full(n, 1 / math.log(2), np.float32),
        "entropy": np.ones(n, np.float32),
        "correct": np.ones(n, bool),
    }
    folder = write(tmp_path / "run", cols, {}, 1)
    _, data = view.view(folder)
    (doc,) = data["documents"]
    assert doc["title"] == "Pride and Prejudice, by Jane Austen. It is a truth …"
    assert doc["source"] == "toy.txt:1"
    from ppl_jax.analysis.view_data import title

    assert (
        title(tokens[3:], first_offset=3)
        == "…Prejudice, by Jane Austen. It is a truth universally …"
    )
    assert title([" a", " b"], 0) == "a b" and title([" ", "\n"], 0) == "(no text)"
    assert title(["x" * 80], 0) == "x" * 59 + " …"


def test_the_page_wraps_between_words_and_keeps_every_list_column(tmp_path):
    """Tokens wrap at spaces (`overflow-wrap:anywhere` only breaks a word longer than a line;
    `word-break:break-all` broke words anywhere); the list's document column takes what the
    number columns leave (`max-width:0; width:100%`), so B - A is not cut off on a laptop's
    screen (checked in headless Chromium at 1024 and 1366 pixels)."""
    cols, types, num_docs = corpus(9)
    a = write(tmp_path / "a", cols, types, num_docs)
    out, _ = view.view(a, compare=a, out=str(tmp_path / "c.html"))
    _, raw = load(out)
    style = re.search(r"<style>(.*)</style>", raw, re.S).group(1)
    tokens = re.search(r"#tokens\{([^}]*)\}", style).group(1)
    assert "break-all" not in style and "overflow-wrap:anywhere" in tokens
    assert re.search(r"#list td\.src\{max-width:0;width:100%;", style)
    assert re.search(r"#list th,#list td\{[^}]*white-space:nowrap", style)


def test_view_modules_stay_short():
    root = os.path.dirname(view.__file__)
    for name in ("view.py", "view_data.py", "view_page.py"):
        with open(os.path.join(root, name)) as f:
            assert len(f.readlines()) <= 400, name


@pytest.mark.parametrize(
    "scale, outer, decimals", [(1.5e-3, 0.002, 6), (0.04, 0.05, 4), (0.6, 1.0, 4), (30.0, 4.0, 4)]
)
def test_compare_scale_fits_the_pages_changes(tmp_path, scale, outer, decimals):
    """A bfloat16-against-float32 page changes each token by thousandths of a bit: on the fixed
    scale (-0.1 to 0.1 bits the middle bin) every token was white. The bins now follow the
    page's changes; the values are printed with the decimals the scale needs."""
    cols_a, types, num_docs = corpus(4)
    rng = np.random.default_rng(2)
    cols_b = dict(cols_a)
    surprisal_b = cols_a["surprisal"].astype(np.float64) + scale * rng.uniform(
        -1, 1, len(cols_a["nll"])
    )
    cols_b["surprisal"] = surprisal_b.astype(np.float32)
    cols_b["nll"] = (surprisal_b * math.log(2)).astype(np.float32)
    a = write(tmp_path / "a", cols_a, types, num_docs)
    b = write(tmp_path / "b", cols_b, types, num_docs)
    _, data = view.view(a, compare=b, out=str(tmp_path / "c.html"))
    diff = data["scale"]["diff"]
    assert diff["edges"][-1] == pytest.approx(outer) and diff["edges"][0] == pytest.approx(-outer)
    assert diff["adapted"] == (outer < 4.0) and diff["decimals"] == decimals
    ratios = np.asarray(diff["edges"]) / outer
    np.testing.assert_allclose(ratios, np.asarray(view.DIFF_EDGES) / 4.0)
    deltas = np.concatenate([e["delta"] for e in data["documents"]])
    # Both colours are used, not one white bin (the middle bin is |B - A| < outer / 40).
    bins = np.searchsorted(diff["edges"], deltas, side="right")
    assert (bins < 5).any() and (bins > 5).any()
    # The deltas keep the digits that tell them apart.
    true = np.concatenate(
        [
            np.asarray(by_document(cols_b)[e["document"]]["surprisal"], np.float64)
            - np.asarray(by_document(cols_a)[e["document"]]["surprisal"], np.float64)
            for e in data["documents"]
        ]
    )
    np.testing.assert_allclose(deltas, true, rtol=0, atol=0.51 * 10.0**-decimals)
