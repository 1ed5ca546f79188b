"""The token view's data: a run's tokens.parquet read and checked, the documents chosen, and
the JSON the page embeds (`page_data`), for `ppl_jax.analysis.view` (the command) and
`ppl_jax.analysis.view_page` (the page).

Reads `tokens.parquet` (written with `output.tokens=true`; the schema is in
`ppl_jax.outputs.tokens`). A document is named in the page by its first words (`title`), its
source (`path:line`) kept beside them. The selection rule, the size budget and the comparison of
two runs are described in `ppl_jax.analysis.view`'s docstring.
"""

from __future__ import annotations

import functools
import json
import math
import os
from typing import Any

import numpy as np

from ppl_jax.analysis.view_scale import DECIMALS, SCALE, diff_scale
from ppl_jax.errors import ConfigError, DataError
from ppl_jax.outputs import files

PARQUET = files.TOKENS
DEFAULT_MAX_DOCUMENTS = 200
DEFAULT_MAX_TOKENS = 100_000
PROB_DIGITS = 4  # significant digits of the top-k probabilities
REQUIRED = ("dataset", "document", "offset", "position", "token_id", "token", "nll")
REQUIRED += ("surprisal", "entropy", "correct")
NUMERIC = ("document", "offset", "position", "token_id", "surprisal", "entropy", "correct")
TOP = ("top_ids", "top_probs")
REFERENCE = ("kl", "delta_logprob", "same_top1")


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

    copy: str | None = None  # a study's copy whose `kl/<copy>`, ... the page shows (`view --copy`)

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
        # The writer adds its key-value metadata to the file's footer when it closes the file.
        kv = {**(schema.metadata or {}), **(pq.read_metadata(path).metadata or {})}
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
        named = {c: f"{c}/{run.copy}" if run.copy else c for c in REFERENCE}
        self.np.update((c, self.table[n].to_numpy()) for c, n in named.items() if n in names)
        self.order = np.lexsort((self.np["offset"], self.np["document"]))
        self.sorted_documents = self.np["document"][self.order]
        self.top = all(c in names for c in TOP)
        self.reference = all(n in names for n in named.values())

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
    each with `document`, `source`, `title` (`title`), `tokens` (scored), `shown`, `mean` (per run, bits), `diff`
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
    documents, deltas = [], []
    for d in sel["order"]:
        entry = _document(runs, tables, sel, d, vocab)
        if "delta" in entry:
            deltas.append(entry["delta"])
        documents.append(entry)
    scale = dict(SCALE)
    if len(runs) == 2:
        scale["diff"] = diff_scale(np.concatenate(deltas) if deltas else np.zeros(0))
        for entry in documents:
            entry["delta"] = _floats(entry["delta"], scale["diff"]["decimals"])
    return {
        "runs": [_describe(r, "AB"[i] if len(runs) == 2 else "") for i, r in enumerate(runs)],
        "selection": _selection(runs, sel, documents, max_documents, max_tokens),
        "scale": scale,
        "vocab": vocab,
        "documents": documents,
    }


def _document(
    runs: list[Run], tables: list[Any], sel: dict[str, Any], d: int, vocab: dict[str, str]
) -> dict[str, Any]:
    """Document `d`'s entry in the page (`page_data`), its top-k texts added to `vocab`; with two
    runs its `delta` (float64, rounded with the page's scale)."""
    rows = [t.rows(d, sel["shown"][d]) for t in tables]
    a = tables[0].np
    text = tables[0].table["token"].take(rows[0]).to_pylist()
    offsets = a["offset"][rows[0]].tolist()
    entry = {
        "document": d,
        "source": runs[0].name(d),
        "title": title(text, offsets[0] if offsets else 0),
        "tokens": sel["tokens"][d],
        "shown": sel["shown"][d],
        "mean": [m[d] for m in sel["means"]],
        "diff": sel["means"][1][d] - sel["means"][0][d] if len(runs) == 2 else None,
        "offset": offsets,
        "position": a["position"][rows[0]].tolist(),
        "id": a["token_id"][rows[0]].tolist(),
        "text": text,
        "sides": [t.side(r, vocab) for t, r in zip(tables, rows, strict=True)],
    }
    if len(runs) == 2:
        sa, sb = (t.np["surprisal"][r] for t, r in zip(tables, rows, strict=True))
        entry["delta"] = sb.astype(np.float64) - sa
    return entry


def _selection(
    runs: list[Run], sel: dict, documents: list, max_documents: int, max_tokens: int
) -> dict:
    """The page's `selection`: the rule, the limits, and what was shown, left out and cut."""
    return {
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
    }


def title(texts: list[str], first_offset: int, words: int = 10, chars: int = 60) -> str:
    """A document's name in the page: its first words (at most `words`, whitespace runs joined
    by one space, whole words within `chars` characters; a first word longer than that is cut),
    from the text of its first shown tokens; `…` before them when its first tokens are not shown
    (offset > 0: without a BOS token the first token is never scored) and after them when the
    text goes on; `(no text)` for whitespace only."""
    joined, at = "", 0
    while at < len(texts) and len(joined.split()) <= words and len(joined) <= 4 * chars:
        joined += texts[at]
        at += 1
    found = joined.split()
    kept: list[str] = []
    for word in found[:words]:
        if len(" ".join([*kept, word])) > chars:
            break
        kept.append(word)
    out = " ".join(kept) if kept else (found[0][: chars - 1] if found else "")
    if not out:
        return "(no text)"
    more = at < len(texts) or len(found) > len(kept) or (not kept and bool(found))
    return ("…" if first_offset > 0 else "") + out + (" …" if more else "")


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
