"""`python -m ppl_jax.view RESULTS_DIR`: one offline HTML page of a run's per-token surprisal.

    python -m ppl_jax.view results/base                      # writes results/base/view.html
    python -m ppl_jax.view results/base --compare results/bf16 --out diff.html

Reads `RESULTS_DIR/tokens.parquet` (written with `output.tokens=true`; the schema is in
`ppl_jax.tokens`) and writes one self-contained HTML file: no script, style sheet, font or image is
loaded from anywhere (a Content-Security-Policy of `default-src 'none'` makes the browser refuse
any), and the data travels inside the page as JSON. The page lists the documents by mean
surprisal (bits per token, -log2 p, from the NLL in float64) and shows a document's tokens in
order, coloured on a fixed scale of bits; hovering a token shows its text, probability exp(-NLL),
surprisal, predictive entropy, whether it was the model's first choice, the top-k alternatives
and, from a reference model, KL(reference || model) and the change of log-probability.

With `--compare OTHER`, both runs must have scored the same tokens (the same dataset, documents,
offsets and token ids); the page colours each token by the change of surprisal B - A in bits
(blue: B is less surprised, red: more) and lists each document's mean change.

Size: the page holds at most `--max_documents` documents (default 200) and `--max_tokens`
tokens (default 100,000). It keeps the documents with the highest mean surprisal (with
`--compare`, the largest mean change |B - A|), then fills the token budget in that order, each
document from its first scored token; a document that does not fit whole is cut, and once the
budget is spent the rest are left out. The page says what it left out. Values are printed with
4 decimals (probabilities with 4 significant digits).

A user's mistake prints one line, `ppl-jax view: error: ...`, and exits with status 2.
"""

from __future__ import annotations

import argparse
import functools
import html
import json
import math
import os
import sys
from typing import Any, NoReturn

import numpy as np

from ppl_jax.errors import ConfigError, DataError, PplJaxError
from ppl_jax.outputs import OutputDir

PROG = "ppl-jax view"
PARQUET = "tokens.parquet"
DEFAULT_MAX_DOCUMENTS = 200
DEFAULT_MAX_TOKENS = 100_000
DECIMALS = 4  # bits and nats in the page
PROB_DIGITS = 4  # significant digits of the top-k probabilities
REQUIRED = ("dataset", "document", "offset", "position", "token_id", "token", "nll")
REQUIRED += ("surprisal", "entropy", "correct")
NUMERIC = ("document", "offset", "position", "token_id", "surprisal", "entropy", "correct")
TOP = ("top_ids", "top_probs")
REFERENCE = ("kl", "delta_logprob", "same_top1")
# Colour scales: bin i holds values in [edges[i-1], edges[i]). Surprisal in bits (ColorBrewer
# YlOrRd); the change B - A in bits (ColorBrewer RdBu, blue where B is less surprised).
SURPRISAL_EDGES = (1, 2, 4, 6, 8, 10, 12, 16)
SURPRISAL_COLORS = "#ffffcc #ffeda0 #fed976 #feb24c #fd8d3c #fc4e2a #e31a1c #bd0026 #800026"
DIFF_EDGES = (-4, -2, -1, -0.5, -0.1, 0.1, 0.5, 1, 2, 4)
DIFF_COLORS = "#053061 #2166ac #4393c3 #92c5de #d1e5f0 #f7f7f7 #fddbc7 #f4a582 #d6604d #b2182b"
DIFF_COLORS += " #67001f"


def _parquet() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(
            "reading tokens.parquet needs pyarrow; pip install 'ppl_jax[diagnostics]'."
        ) from None
    return pq


def parquet_path(path: str) -> str:
    """`path/tokens.parquet` for a results folder, `path` itself for a file."""
    return os.path.join(path, PARQUET) if os.path.isdir(path) else path


class Run:
    """One run's tokens.parquet: its metadata and, sorted by (document, offset), the columns
    that identify and weigh each scored token.

    Attributes:
      path: the Parquet file.
      meta: the `ppl_jax` key-value metadata (dataset, protocol, top_k, reference, tokenizer, ...).
      names: the source name of every document of the corpus (metadata `documents`).
      columns: the file's column names.
      document, offset: `[n]` int64; token_id: `[n]` int64; nll: `[n]` float64, nats.
    """

    def __init__(self, path: str):
        pq = _parquet()
        if not os.path.exists(path):
            raise DataError(f"{path} does not exist; give a run's output.dir or its {PARQUET}.")
        self.path = path = parquet_path(path)
        if not os.path.exists(path):
            raise DataError(
                f"{path} does not exist; run ppl-jax with output.tokens=true to write the "
                f"per-token output, then view its output.dir."
            )
        try:
            schema = pq.read_schema(path)
            self.columns = list(schema.names)
            missing = [c for c in REQUIRED if c not in self.columns]
            if missing:
                raise DataError(
                    f"{path} lacks the column(s) {', '.join(missing)}; it is not a tokens.parquet "
                    f"of ppl_jax (write it again with output.tokens=true)."
                )
            table = pq.read_table(path, columns=["document", "offset", "token_id", "nll"])
        except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
            raise DataError(f"{path} is not a readable tokens.parquet ({e}).") from None
        kv = schema.metadata or {}
        self.meta = _json_meta(kv, b"ppl_jax", dict, path)
        self.names = [str(n) for n in _json_meta(kv, b"documents", list, path)]
        order = np.lexsort((table["offset"].to_numpy(), table["document"].to_numpy()))
        self.document = table["document"].to_numpy().astype(np.int64)[order]
        self.offset = table["offset"].to_numpy().astype(np.int64)[order]
        self.token_id = table["token_id"].to_numpy().astype(np.int64)[order]
        self.nll = table["nll"].to_numpy().astype(np.float64)[order]
        if not len(self.nll):
            raise DataError(f"{path} holds no scored token; nothing to show.")
        twice = np.flatnonzero(
            (self.document[1:] == self.document[:-1]) & (self.offset[1:] == self.offset[:-1])
        )
        if len(twice):
            raise DataError(
                f"{path} holds {self._where(int(twice[0]))} twice, not one row per scored token; "
                f"view each run's own tokens.parquet."
            )
        bad = np.flatnonzero(~np.isfinite(self.nll))
        if len(bad):
            raise DataError(
                f"{path} has a non-finite NLL at {self._where(int(bad[0]))}; score the run again "
                f"(ppl-jax stops on a NaN or an infinity)."
            )

    def _where(self, i: int) -> str:
        d = int(self.document[i])
        name = f" ({self.names[d]})" if 0 <= d < len(self.names) else ""
        return f"document {d}{name} offset {int(self.offset[i])}"

    @functools.cached_property
    def dataset(self) -> str:
        """The dataset name: metadata `dataset`, else the `dataset` column's first value."""
        if self.meta.get("dataset") is not None:
            return str(self.meta["dataset"])
        first = _parquet().ParquetFile(self.path).read_row_group(0, columns=["dataset"])
        return str(first["dataset"][0].as_py()) if first.num_rows else "?"

    def documents(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`(document ids, first row of each, token count of each)`, each `[d]` int64."""
        ids, first, counts = np.unique(self.document, return_index=True, return_counts=True)
        return ids, first, counts

    def name(self, d: int) -> str:
        return self.names[d] if 0 <= d < len(self.names) else f"document {d}"


def _json_meta(kv: dict, key: bytes, kind: type, path: str) -> Any:
    if key not in kv:
        return kind()
    try:
        value = json.loads(kv[key])
    except ValueError:
        raise DataError(
            f"{path}: its metadata {key.decode()!r} is not JSON; write the file again with ppl-jax."
        ) from None
    if not isinstance(value, kind):
        raise DataError(
            f"{path}: its metadata {key.decode()!r} is not a JSON {kind.__name__}; write the "
            f"file again with ppl-jax."
        )
    return value


def first_difference(a: Run, b: Run) -> str | None:
    """What first differs between the scored tokens of two runs, or None when they are the same
    (the same dataset, and the same documents, offsets and token ids)."""
    if a.dataset != b.dataset:
        return f"the dataset is {a.dataset!r} in A and {b.dataset!r} in B"
    n = min(len(a.document), len(b.document))
    moved = np.flatnonzero((a.document[:n] != b.document[:n]) | (a.offset[:n] != b.offset[:n]))
    if len(moved):
        i = int(moved[0])
        return f"the scored token {i:,} is {a._where(i)} in A and {b._where(i)} in B"
    if len(a.document) != len(b.document):
        longer, label = (a, "A") if len(a.document) > n else (b, "B")
        return (
            f"A scored {len(a.document):,} tokens and B {len(b.document):,}; only {label} scored "
            f"{longer._where(n)}"
        )
    other = np.flatnonzero(a.token_id != b.token_id)
    if len(other):
        i = int(other[0])
        return (
            f"at {a._where(i)} the token id is {int(a.token_id[i])} in A and "
            f"{int(b.token_id[i])} in B"
        )
    return None


def select(runs: list[Run], max_documents: int, max_tokens: int) -> dict[str, Any]:
    """Which documents, and how many of their tokens, the page holds (the rule is in the module
    docstring).

    Returns:
      `order`: the chosen document ids in the page's order (mean surprisal of run A, highest
      first; ties by id); `shown`: id -> tokens shown (its first ones by offset); `tokens`: id ->
      scored tokens; `means`: per run, id -> mean surprisal in bits (float64, over all its scored
      tokens); `documents`: documents with a scored token; `left_out`: the documents and tokens
      left out; `cut`: documents shown in part and their tokens not shown.
    """
    ids, first, counts = runs[0].documents()
    means = [np.add.reduceat(r.nll, first) / counts / math.log(2) for r in runs]
    key = np.abs(means[1] - means[0]) if len(runs) == 2 else means[0]
    shown, budget = {}, max_tokens
    for i in np.lexsort((ids, -key))[:max_documents]:
        if budget <= 0:
            break
        shown[int(i)] = k = int(min(counts[i], budget))
        budget -= k
    page = sorted(shown, key=lambda i: (-means[0][i], ids[i]))
    return {
        "order": [int(ids[i]) for i in page],
        "shown": {int(ids[i]): shown[i] for i in page},
        "tokens": {int(ids[i]): int(counts[i]) for i in page},
        "means": [{int(ids[i]): float(m[i]) for i in page} for m in means],
        "documents": len(ids),
        "left_out": (len(ids) - len(page), int(np.sum(counts)) - int(np.sum(counts[page]))),
        "cut": (
            sum(int(shown[i] < counts[i]) for i in page),
            int(np.sum(counts[page])) - sum(shown.values()),
        ),
    }


def _floats(x: Any, decimals: int = DECIMALS) -> list:
    values = np.round(np.asarray(x, dtype=np.float64), decimals)
    out = values.tolist()
    if not np.all(np.isfinite(values)):
        out = [v if math.isfinite(v) else None for v in out]
    return out


class _Rows:
    """The rows of the chosen documents in one run's file, read once, sorted by (document,
    offset); `rows(d, k)` picks document d's first k tokens, `side` their values for the page."""

    def __init__(self, run: Run, documents: list[int]):
        table = _parquet().read_table(run.path, filters=[("document", "in", documents)])
        self.table = table.combine_chunks()  # one chunk per column: `take` and numpy are fast
        names = self.table.column_names
        self.np = {c: self.table[c].to_numpy(zero_copy_only=False) for c in NUMERIC}
        self.np.update((c, self.table[c].to_numpy()) for c in REFERENCE if c in names)
        self.order = np.lexsort((self.np["offset"], self.np["document"]))
        self.sorted_documents = self.np["document"][self.order]
        self.top = all(c in names for c in TOP)
        self.reference = all(c in names for c in REFERENCE)

    def rows(self, d: int, k: int) -> np.ndarray:
        start = int(np.searchsorted(self.sorted_documents, d))
        return self.order[start : start + k]

    def side(self, rows: np.ndarray, vocab: dict[str, str]) -> dict[str, Any]:
        """Per-token values of one run at `rows`: surprisal (bits), entropy (nats), correct,
        and the top-k alternatives and reference values when the file has them."""
        c = {name: a[rows] for name, a in self.np.items()}
        side = {
            "surprisal": _floats(c["surprisal"]),
            "entropy": _floats(c["entropy"]),
            "correct": c["correct"].astype(int).tolist(),
        }
        if self.top:
            ids = self.table["top_ids"].take(rows).to_pylist()
            side["top"] = ids
            side["top_p"] = [
                [float(f"{p:.{PROB_DIGITS}g}") for p in ps]
                for ps in self.table["top_probs"].take(rows).to_pylist()
            ]
            if "top_tokens" in self.table.column_names:
                for i, texts in zip(
                    ids, self.table["top_tokens"].take(rows).to_pylist(), strict=True
                ):
                    vocab.update((str(t), s) for t, s in zip(i, texts, strict=True))
        if self.reference:
            side["kl"] = _floats(c["kl"])
            side["delta_logprob"] = _floats(c["delta_logprob"])
            side["same_top1"] = c["same_top1"].astype(int).tolist()
        return side


def page_data(runs: list[Run], max_documents: int, max_tokens: int) -> dict[str, Any]:
    """The JSON the page embeds (`<script type="application/json" id="ppl-data">`).

    Keys: `runs` (per run: label, path, dataset, protocol, tokenizer, top_k, reference, tokens,
    mean surprisal in bits), `selection` (the rule and what was left out), `scale` (colour bins),
    `vocab` (token id -> text, for the top-k alternatives) and `documents` in the page's order,
    each with `document`, `source`, `tokens` (scored), `shown`, `mean` (per run, bits), `diff`
    (mean B - A in bits, or None), the shown tokens' `offset`, `position`, `id` and `text`, and
    `sides` (per run: `surprisal` bits, `entropy` nats, `correct` 0/1, and when present `top`
    ids with `top_p` probabilities, `kl` and `delta_logprob` in nats, `same_top1` 0/1); with
    two runs, `delta`: per token, surprisal B - A in bits. Values are rounded to `DECIMALS`.

    Raises:
      DataError: with two runs, they scored different tokens.
    """
    if len(runs) == 2:
        differs = first_difference(*runs)
        if differs:
            raise DataError(
                f"{runs[0].path} and {runs[1].path} did not score the same tokens ({differs}); "
                f"compare two runs on the same data."
            )
    sel = select(runs, max_documents, max_tokens)
    tables = [_Rows(r, sel["order"]) for r in runs]
    vocab: dict[str, str] = {}
    documents = []
    for d in sel["order"]:
        rows = [t.rows(d, sel["shown"][d]) for t in tables]
        a = tables[0].np
        entry = {
            "document": d,
            "source": runs[0].name(d),
            "tokens": sel["tokens"][d],
            "shown": sel["shown"][d],
            "mean": [m[d] for m in sel["means"]],
            "diff": sel["means"][1][d] - sel["means"][0][d] if len(runs) == 2 else None,
            "offset": a["offset"][rows[0]].tolist(),
            "position": a["position"][rows[0]].tolist(),
            "id": a["token_id"][rows[0]].tolist(),
            "text": tables[0].table["token"].take(rows[0]).to_pylist(),
            "sides": [t.side(r, vocab) for t, r in zip(tables, rows, strict=True)],
        }
        if len(runs) == 2:
            sa, sb = (
                t.np["surprisal"][r].astype(np.float64) for t, r in zip(tables, rows, strict=True)
            )
            entry["delta"] = _floats(sb - sa)
        documents.append(entry)
    return {
        "runs": [_describe(r, "AB"[i] if len(runs) == 2 else "") for i, r in enumerate(runs)],
        "selection": {
            "rule": (
                "the documents with the largest mean change |B - A|"
                if len(runs) == 2
                else "the documents with the highest mean surprisal"
            ),
            "max_documents": max_documents,
            "max_tokens": max_tokens,
            "documents": sel["documents"],
            "corpus_documents": len(runs[0].names),
            "shown_documents": len(documents),
            "shown_tokens": sum(e["shown"] for e in documents),
            "left_out_documents": sel["left_out"][0],
            "left_out_tokens": sel["left_out"][1],
            "cut_documents": sel["cut"][0],
            "cut_tokens": sel["cut"][1],
        },
        "scale": {
            "surprisal": {"edges": list(SURPRISAL_EDGES), "colors": SURPRISAL_COLORS.split()},
            "diff": {"edges": list(DIFF_EDGES), "colors": DIFF_COLORS.split()},
        },
        "vocab": vocab,
        "documents": documents,
    }


def _describe(r: Run, label: str) -> dict[str, Any]:
    return {
        "label": label,
        "path": r.path,
        "dataset": r.dataset,
        "protocol": r.meta.get("protocol"),
        "tokenizer": r.meta.get("tokenizer"),
        "top_k": int(r.meta.get("top_k") or 0),
        "reference": bool(r.meta.get("reference")),
        "tokens": len(r.nll),
        "mean": float(np.sum(r.nll) / len(r.nll) / math.log(2)),
    }


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def left_out(sel: dict[str, Any]) -> str:
    """One paragraph saying what the page holds and what it left out."""
    s = sel
    text = (
        f"Shown: {s['shown_documents']:,} of {_n(s['documents'], 'document')} with scored tokens "
        f"({_n(s['shown_tokens'], 'token')}), {s['rule']} first, at most "
        f"{_n(s['max_documents'], 'document')} and {_n(s['max_tokens'], 'token')} "
        f"(--max_documents, --max_tokens)."
    )
    if s["left_out_documents"]:
        text += (
            f" Left out: {_n(s['left_out_documents'], 'document')} "
            f"({_n(s['left_out_tokens'], 'token')})."
        )
    if s["cut_documents"]:
        text += (
            f" Cut: {_n(s['cut_documents'], 'document')} shown from its first scored token up to "
            f"the token budget ({_n(s['cut_tokens'], 'token')} not shown)."
        )
    if not s["left_out_documents"] and not s["cut_documents"]:
        text += " Nothing was left out."
    unscored = s["corpus_documents"] - s["documents"]
    if unscored > 0:
        text += f" {_n(unscored, 'document')} of the corpus had no scored token."
    return text


def _run_line(r: dict[str, Any]) -> str:
    protocol = r["protocol"] if isinstance(r["protocol"], str) else json.dumps(r["protocol"])
    tokenizer = r["tokenizer"] if isinstance(r["tokenizer"], str) else json.dumps(r["tokenizer"])
    return (
        f"{r['label'] + ': ' if r['label'] else ''}{r['path']}: dataset {r['dataset']}, "
        f"protocol {protocol}, tokenizer {tokenizer}, {r['tokens']:,} scored tokens, "
        f"mean surprisal {r['mean']:.{DECIMALS}f} bits/token"
        + (f", top-{r['top_k']} alternatives" if r["top_k"] else "")
        + (", with a reference model" if r["reference"] else "")
    )


def _script_json(data: Any) -> str:
    """JSON safe inside a `<script>` element: `<`, `>` and `&` (only ever inside JSON strings)
    become `\\u003c`, `\\u003e`, `\\u0026`, so no token text can close the element."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    for ch in "<>&\u2028\u2029":
        text = text.replace(ch, f"\\u{ord(ch):04x}")
    return text


def _css_bins(prefix: str, colors: list[str]) -> str:
    rules = []
    for i, c in enumerate(colors):
        r, g, b = (int(c[j : j + 2], 16) for j in (1, 3, 5))
        ink = "#fff" if 0.299 * r + 0.587 * g + 0.114 * b < 140 else "#111"
        rules.append(f".{prefix}{i}{{background:{c};color:{ink}}}")
    return "\n".join(rules)


def render(data: dict[str, Any]) -> str:
    """The page: static HTML (the runs, what was left out), the data as JSON, inline CSS and JS."""
    compare = len(data["runs"]) == 2
    title = "ppl_jax token view: " + (
        " vs ".join(os.path.basename(os.path.dirname(r["path"])) or r["path"] for r in data["runs"])
    )
    header = "".join(f"<p>{html.escape(_run_line(r))}</p>" for r in data["runs"])
    header += f'<p class="note">{html.escape(left_out(data["selection"]))}</p>'
    css = _css_bins("s", data["scale"]["surprisal"]["colors"])
    css += "\n" + _css_bins("d", data["scale"]["diff"]["colors"])
    return (
        _TEMPLATE.replace("@TITLE@", html.escape(title))
        .replace("@HEADER@", header)
        .replace("@BINS@", css)
        .replace("@MODE@", "compare" if compare else "single")
        .replace("@DATA@", _script_json(data))
        .replace("@SCRIPT@", _SCRIPT)
    )


def write(html_text: str, out: str) -> str:
    """Writes the page atomically (a temporary file beside it, then `os.replace`).

    Raises:
      ConfigError: the folder of `out` does not exist or cannot be written.
    """
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise ConfigError(f"--out={out}: the folder {folder} does not exist; create it first.")
    try:
        return OutputDir(folder, None).write_bytes(os.path.basename(out), html_text.encode())
    except OSError as e:
        raise ConfigError(
            f"--out={out} cannot be written ({e.strerror}); choose another path."
        ) from None


def view(
    path: str,
    compare: str | None = None,
    out: str | None = None,
    max_documents: int = DEFAULT_MAX_DOCUMENTS,
    max_tokens: int = DEFAULT_MAX_TOKENS,
) -> tuple[str, dict[str, Any]]:
    """Writes the token view of the run at `path` (a results folder or its tokens.parquet),
    compared with the run at `compare` if given, to `out` (default: `view.html`, or
    `view_compare.html` with `compare`, beside the first run's tokens.parquet).

    Returns:
      `(the page's path, the embedded data)`.

    Raises:
      DataError: a tokens.parquet is missing or unreadable, or the two runs scored other tokens.
      ConfigError: pyarrow is missing, or `out` cannot be written.
    """
    runs = [Run(path)] + ([Run(compare)] if compare else [])
    data = page_data(runs, max_documents, max_tokens)
    if out is None:
        name = "view_compare.html" if compare else "view.html"
        out = os.path.join(os.path.dirname(os.path.abspath(runs[0].path)), name)
    return write(render(data), out), data


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, as for every other mistake
        self.exit(2, f"{PROG}: error: {message} (see --help)\n")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(
        prog="python -m ppl_jax.view",
        description="One offline HTML page of a run's per-token surprisal (from tokens.parquet, "
        "written with output.tokens=true), or of the change between two runs on the same data.",
    )
    parser.add_argument("results", help="the run's output.dir (or its tokens.parquet)")
    parser.add_argument("--compare", help="a second run on the same data: colours B - A")
    parser.add_argument("--out", help="the page (default: RESULTS_DIR/view.html)")
    parser.add_argument(
        "--max_documents",
        type=int,
        default=DEFAULT_MAX_DOCUMENTS,
        help="documents in the page, the most surprising first (default %(default)s)",
    )
    parser.add_argument(
        "--max_tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        help="tokens in the page, over all its documents (default %(default)s)",
    )
    args = parser.parse_args(argv)
    for flag in ("max_documents", "max_tokens"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag}={getattr(args, flag)} must be at least 1")
    try:
        out, data = view(args.results, args.compare, args.out, args.max_documents, args.max_tokens)
    except PplJaxError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    s = data["selection"]
    print(
        f"view: {out} ({s['shown_documents']:,} of {s['documents']:,} documents, "
        f"{s['shown_tokens']:,} tokens)"
    )
    return 0


_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy"
 content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>@TITLE@</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#111;background:#fff;
 height:100vh;display:flex;flex-direction:column}
header{padding:8px 16px;border-bottom:1px solid #ccc}
header p{margin:2px 0}
.note{color:#444}
main{display:flex;flex:1;min-height:300px}
#list{flex:0 0 auto;max-width:48%;overflow:auto;border-right:1px solid #ccc}
#list table{border-collapse:collapse;width:100%}
#list th,#list td{padding:2px 6px;text-align:right;white-space:nowrap}
#list th{position:sticky;top:0;background:#eee;cursor:pointer}
#list td.src{text-align:left;max-width:18em;overflow:hidden;text-overflow:ellipsis}
#list tr.sel{outline:2px solid #333}
#list tbody tr:hover{background:#f3f3f3;cursor:pointer}
#doc{flex:1;overflow:auto;padding:8px 16px}
#tokens{font:13px/1.9 ui-monospace,monospace;white-space:pre-wrap;word-break:break-all;
 tab-size:4}
#tokens span{border-right:1px solid rgba(0,0,0,.15)}
#tokens span.miss{text-decoration:underline dotted}
.legend span{display:inline-block;padding:0 6px;font-size:12px}
#tip{position:fixed;display:none;width:max-content;max-width:calc(100vw - 16px);background:#fff;border:1px solid #888;
 padding:6px 8px;font-size:12px;box-shadow:2px 2px 6px rgba(0,0,0,.2);pointer-events:none}
#tip table{border-collapse:collapse}
#tip td{padding:0 4px}
#tip .tt{font-family:ui-monospace,monospace;white-space:pre}
#tip .sides{display:flex;gap:12px}
#tip .side{margin-top:4px}
#tip tr.target{font-weight:bold}
@BINS@
</style>
</head>
<body data-mode="@MODE@">
<header>
<h1 style="font-size:16px;margin:4px 0">@TITLE@</h1>
@HEADER@
<noscript><p>This page needs JavaScript (inline, no network) to show the tokens.</p></noscript>
<div id="controls"></div>
</header>
<main><div id="list"></div><div id="doc"><div id="dochead"></div><div id="tokens"></div></div></main>
<div id="tip"></div>
<script type="application/json" id="ppl-data">@DATA@</script>
<script>@SCRIPT@</script>
</body>
</html>
"""

_SCRIPT = r"""
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("ppl-data").textContent);
  const two = D.runs.length === 2;
  const $ = (id) => document.getElementById(id);
  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }
  function bin(edges, x) { let i = 0; while (i < edges.length && x >= edges[i]) i++; return i; }
  function f(x) { return x === null || x === undefined ? "n/a" : x.toFixed(4); }
  function sg(x) { return x === null ? "n/a" : (x > 0 ? "+" : "") + x.toFixed(4); }
  function pr(p) { return p >= 0.001 ? p.toFixed(4) : p.toExponential(3); }
  function shown(t) {  // whitespace made visible: a mark, then the line break or tab itself
    if (t === "") return "\u2205";
    return t.replace(/\r/g, "\u240d").replace(/\t/g, "\u21e5\t").replace(/\n/g, "\u21b5\n");
  }
  let colour = two ? "delta" : "a", sortBy = two ? "diff" : "a", current = null;

  function legend() {
    const box = el("div", undefined, "legend");
    const s = colour === "delta" ? D.scale.diff : D.scale.surprisal;
    const p = colour === "delta" ? "d" : "s";
    box.appendChild(el("span", colour === "delta"
      ? "surprisal B \u2212 A, bits (blue: B less surprised, red: more):"
      : "surprisal" + (two ? " " + colour.toUpperCase() : "") + ", bits:"));
    for (let i = 0; i <= s.edges.length; i++) {
      const lo = i ? s.edges[i - 1] : null, hi = i < s.edges.length ? s.edges[i] : null;
      const label = lo === null ? "< " + hi : hi === null ? "\u2265 " + lo : lo + " to " + hi;
      box.appendChild(el("span", label, p + i));
    }
    box.appendChild(el("span", "dotted underline: not the model's first choice" +
      (two ? " (" + (colour === "b" ? "B" : "A") + ")" : "")));
    return box;
  }

  function controls() {
    const c = $("controls");
    c.textContent = "";
    if (two) {
      const sel = el("select");
      const options = [["delta", "change B \u2212 A"], ["a", "surprisal A"], ["b", "surprisal B"]];
      for (const [v, t] of options) {
        const o = el("option", t);
        o.value = v;
        o.selected = v === colour;
        sel.appendChild(o);
      }
      sel.onchange = () => { colour = sel.value; controls(); if (current) show(current); };
      c.appendChild(el("span", "colour by: "));
      c.appendChild(sel);
    }
    c.appendChild(legend());
  }

  function list() {
    const cols = [["#", null], ["document", null], ["tokens", null]];
    cols.push(["bits/token" + (two ? " A" : ""), "a"]);
    if (two) cols.push(["bits/token B", "b"], ["B \u2212 A", "diff"]);
    const t = el("table"), h = el("tr");
    for (const [name, key] of cols) {
      const th = el("th", name + (key && key === sortBy ? " \u25be" : ""));
      if (key) th.title = key === "diff" ? "sort: largest change |B \u2212 A| first" : "sort";
      if (key) th.onclick = () => { sortBy = key; list(); };
      h.appendChild(th);
    }
    t.appendChild(el("thead")).appendChild(h);
    const body = t.appendChild(el("tbody"));
    const docs = D.documents.slice();
    const key = (d) =>
      sortBy === "a" ? -d.mean[0] : sortBy === "b" ? -d.mean[1] : -Math.abs(d.diff);
    docs.sort((x, y) => key(x) - key(y) || x.document - y.document);
    for (const d of docs) {
      const r = el("tr");
      r.appendChild(el("td", String(d.document)));
      r.appendChild(el("td", d.source, "src")).title = d.source;
      r.appendChild(el("td", d.shown < d.tokens ? d.shown + " of " + d.tokens : String(d.tokens)));
      r.appendChild(el("td", f(d.mean[0])));
      if (two) {
        r.appendChild(el("td", f(d.mean[1])));
        r.appendChild(el("td", sg(d.diff)));
      }
      if (d === current) r.className = "sel";
      r.onclick = () => { current = d; list(); show(d); };
      body.appendChild(r);
    }
    $("list").textContent = "";
    $("list").appendChild(t);
  }

  function show(d) {
    const head = $("dochead");
    head.textContent = "";
    let line = "document " + d.document + ": " + d.source + ", " + d.tokens +
      " scored tokens, mean " + f(d.mean[0]) + " bits/token";
    if (two) line += " (A), " + f(d.mean[1]) + " (B), B \u2212 A " + sg(d.diff);
    if (d.shown < d.tokens) line += "; only its first " + d.shown + " tokens are in this page";
    head.appendChild(el("p", line));
    const box = $("tokens"), frag = document.createDocumentFragment();
    const s = D.scale, v = d.sides[colour === "b" ? 1 : 0];
    for (let i = 0; i < d.id.length; i++) {
      const cls = colour === "delta" ? "d" + bin(s.diff.edges, d.delta[i])
        : "s" + bin(s.surprisal.edges, v.surprisal[i]);
      const sp = el("span", shown(d.text[i]), cls + (v.correct[i] ? "" : " miss"));
      sp.dataset.i = i;
      frag.appendChild(sp);
    }
    box.textContent = "";
    box.appendChild(frag);
  }

  function side(d, i, v, who) {
    const box = el("div", undefined, "side");
    if (who) box.appendChild(el("b", who));
    const s = v.surprisal[i];
    box.appendChild(el("div", "probability " + pr(Math.pow(2, -s))));
    box.appendChild(el("div", "surprisal " + f(s) + " bits"));
    box.appendChild(el("div", "entropy " + f(v.entropy[i]) + " nats (" +
      f(v.entropy[i] / Math.LN2) + " bits)"));
    box.appendChild(el("div", v.correct[i] ? "the model's first choice" : "not its first choice"));
    if (v.kl) {
      box.appendChild(el("div", "KL(reference \u2016 model) " + f(v.kl[i]) + " nats"));
      box.appendChild(el("div", "\u0394 log p (model \u2212 reference) " +
        sg(v.delta_logprob[i]) + " nats"));
      box.appendChild(el("div", "same first choice as the reference: " +
        (v.same_top1[i] ? "yes" : "no")));
    }
    if (v.top) {
      box.appendChild(el("div", "top " + v.top[i].length + ":"));
      const t = el("table");
      v.top[i].forEach((id, j) => {
        const r = el("tr");
        const text = D.vocab[id] !== undefined ? JSON.stringify(D.vocab[id]) : "id " + id;
        r.appendChild(el("td", j + 1 + "."));
        r.appendChild(el("td", text, "tt"));
        r.appendChild(el("td", pr(v.top_p[i][j])));
        if (id === d.id[i]) r.className = "target";
        t.appendChild(r);
      });
      box.appendChild(t);
    }
    return box;
  }

  function details(d, i) {
    const tip = el("div");
    tip.appendChild(el("div", JSON.stringify(d.text[i]), "tt"));
    tip.appendChild(el("div", "document " + d.document + ", offset " + d.offset[i] +
      ", context " + d.position[i] + " tokens, token id " + d.id[i]));
    if (two) tip.appendChild(el("div", "surprisal B \u2212 A: " + sg(d.delta[i]) + " bits"));
    const row = el("div", undefined, "sides");
    d.sides.forEach((v, k) => row.appendChild(side(d, i, v, two ? "AB"[k] : "")));
    tip.appendChild(row);
    return tip;
  }

  const tip = $("tip");
  $("tokens").addEventListener("mousemove", (e) => {
    const sp = e.target.closest("span[data-i]");
    if (!sp || !current) { tip.style.display = "none"; return; }
    tip.textContent = "";
    tip.appendChild(details(current, +sp.dataset.i));
    tip.style.display = "block";
    const below = e.clientY + 16 + tip.offsetHeight <= window.innerHeight;
    const x = Math.min(e.clientX + 14, window.innerWidth - tip.offsetWidth - 4);
    const y = below ? e.clientY + 16 : e.clientY - tip.offsetHeight - 8;
    tip.style.left = Math.max(0, x) + "px";
    tip.style.top = Math.max(0, y) + "px";
  });
  $("tokens").addEventListener("mouseleave", () => { tip.style.display = "none"; });

  controls();
  current = D.documents.slice().sort((x, y) =>
    (two ? Math.abs(y.diff) - Math.abs(x.diff) : y.mean[0] - x.mean[0]) ||
    x.document - y.document)[0] || null;
  list();
  if (current) show(current);
})();
"""


if __name__ == "__main__":
    sys.exit(main())
