"""Per-token outputs: one Parquet row per scored target token (`tokens.parquet`; docs/diagnostics.md).

`TokenWriter` is a sink fed batch by batch with the per-token arrays the scoring step returns
(`[B, width - 1]` host arrays; index `[r, p - 1]` is the target at row position `p`). It maps
each scored target of the batch's layout rows back to its document, its offset in the document
and its position in the window, and writes row groups of `row_group_size` rows as they fill, so
host memory stays bounded whatever the corpus size. The file is written under a temporary name in
its folder and renamed over `path` on `close` (after an fsync): it is complete or absent.

Columns (`schema`): `dataset` (string), `document` (int64, 0-based, corpus order), `offset`
(int64, the token's index among its document's tokens; -1 for a BOS token scored as a target,
which `lm_eval_rolling` does with `eval.add_bos`; a `sliding` separator token belongs to the
document before it, at offsets past that document's own tokens), `position` (int32, the target's
position in its window = tokens of context it saw, prefix/BOS included), `token_id` (int32),
`token` (string, `Tokenizer.token_texts`), `nll` (float32, nats, the device's value), `surprisal`
(float32, bits, nll / ln 2), `entropy` (float32, nats), `correct` (bool, top-1); with `top_k > 0`
`top_ids` (list<int32>), `top_tokens` (list<string>), `top_probs` (list<float32>), most probable
first; with a reference model `kl` (float32, nats, KL(reference || model)), `reference_nll`
(float32, nats), `same_top1` (bool), `delta_logprob` (float32, nats, log p_model - log p_ref of
the target = reference_nll - nll); per copy of a study, `kl/<copy>`, `nll/<copy>`, ...
(`ppl_jax.metrics.study.token_fields`); with `extra_columns`, theirs (the long-context measures:
`ppl_jax.evaluation.passes.long_context.TokenColumns`). Key-value metadata: `ppl_jax` (JSON:
dataset, protocol, top_k, reference, copies, tokenizer, num_tokens, nll_sum) and `documents`
(JSON list of document sources). pyarrow is an optional dependency (`pip install
'ppl_jax[diagnostics]'`), imported only here, inside functions: `import ppl_jax` works without it.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from typing import Any

import numpy as np

from ppl_jax.errors import ConfigError, DataError
from ppl_jax.metrics import study
from ppl_jax.outputs import files
from ppl_jax.outputs.folder import _UMASK, write_error
from ppl_jax.plans.protocols import Plan
from ppl_jax.plans.windows import NO_PREFIX
from ppl_jax.tokenizer import Tokenizer

NAME = files.TOKENS
METADATA_KEY = "ppl_jax"
DOCUMENTS_KEY = "documents"
LN2 = math.log(2.0)
_BASE = ("nll", "entropy", "correct")
_TOP = ("top_ids", "top_logprobs")
_REFERENCE = ("kl", "reference_nll", "same_top1")


def check_available() -> None:
    """Raises ConfigError unless pyarrow (with Parquet) can be imported; call it before any
    expensive work of a run that writes per-token outputs."""
    try:
        import pyarrow  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise ConfigError(
            "output.tokens=true needs pyarrow: pip install 'ppl_jax[diagnostics]'"
        ) from None


def schema(top_k: int = 0, reference: bool = False, extra: Any = ()) -> Any:
    """The `pyarrow.Schema` of `tokens.parquet` (see the module docstring), without metadata;
    `extra`: `(name, NumPy dtype)` of more columns."""
    import pyarrow as pa

    fields = [
        ("dataset", pa.string()),
        ("document", pa.int64()),
        ("offset", pa.int64()),
        ("position", pa.int32()),
        ("token_id", pa.int32()),
        ("token", pa.string()),
        ("nll", pa.float32()),
        ("surprisal", pa.float32()),
        ("entropy", pa.float32()),
        ("correct", pa.bool_()),
    ]
    if top_k > 0:
        fields += [
            ("top_ids", pa.list_(pa.int32())),
            ("top_tokens", pa.list_(pa.string())),
            ("top_probs", pa.list_(pa.float32())),
        ]
    if reference:
        fields += [
            ("kl", pa.float32()),
            ("reference_nll", pa.float32()),
            ("same_top1", pa.bool_()),
            ("delta_logprob", pa.float32()),
        ]
    fields += [(name, pa.from_numpy_dtype(np.dtype(dtype))) for name, dtype in extra]
    return pa.schema([pa.field(name, kind, nullable=False) for name, kind in fields])


class TokenWriter:
    """Writes `tokens.parquet` while scoring (an observer of the scoring loop,
    `ppl_jax.scoring.observers.ScoreObserver`); use as a context manager, or call `close` (or
    `abort` on failure) yourself.

    Args:
      path: the file to write (its folder must exist).
      plan: the protocol's plan, whose windows the layout rows name.
      tokenizer: for the `token` and `top_tokens` texts and the metadata.
      dataset: the run's `data.name`, written in every row.
      top_k: entries per target in the `top_*` columns (0: none).
      reference: whether the reference-model columns are written.
      copies, both_directions: a study's copies, by name, whose columns are written (the step's
        `copy<i>/*` arrays), and whether with `kl_reverse/<copy>`.
      row_group_size: rows per Parquet row group; at most one row group (plus one batch) is
        held in memory.
      extra_columns: more columns, or None: `fields` (`(name, NumPy dtype)`), and a call with
        the batch's targets' indices in the plan's token stream and their `nll` returning the
        columns' `[n]` values by name.

    Attributes:
      num_tokens: rows written so far (scored targets added).
      nll_sum: float64 sum of the float32 `nll` values added, nats.
    """

    def __init__(
        self,
        path: str,
        plan: Plan,
        tokenizer: Tokenizer,
        dataset: str,
        top_k: int = 0,
        reference: bool = False,
        row_group_size: int = 65536,
        extra_columns: Any = None,
        copies: tuple[str, ...] = (),
        both_directions: bool = False,
    ):
        check_available()
        import pyarrow.parquet as pq

        if row_group_size < 1 or top_k < 0:
            raise ValueError(f"row_group_size={row_group_size}, top_k={top_k}")
        self.path = path
        self.num_tokens = 0
        self.nll_sum = 0.0
        self._plan, self._tokenizer, self._dataset = plan, tokenizer, dataset
        self._top_k, self._reference, self._group = int(top_k), bool(reference), row_group_size
        self._extra, self._copies = extra_columns, (tuple(copies), bool(both_directions))
        extra = (*getattr(self._extra, "fields", ()), *study.token_fields(*self._copies))
        self._schema = schema(self._top_k, self._reference, extra)
        self._pending: list[dict[str, np.ndarray]] = []
        self._pending_rows = 0
        self._decoded: np.ndarray | None = None  # `_texts`: ids whose text is in the table
        self._vocab: list[str] = []
        self._vocab_texts: Any = None
        w = plan.windows
        self._has_prefix = (w.prefix != NO_PREFIX).astype(np.int64)
        self._row_lengths = w.row_lengths()
        fd, self._tmp = tempfile.mkstemp(
            prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=os.path.dirname(path) or "."
        )
        self._file = os.fdopen(fd, "wb")
        try:
            os.fchmod(fd, 0o666 & ~_UMASK)  # as open() would create it (mkstemp gives 0600)
            # Parquet names a list's strings by their path (pyarrow ignores "top_tokens").
            dictionary = ["dataset", "token"] + (["top_tokens.list.element"] if top_k else [])
            self._writer = pq.ParquetWriter(
                self._file, self._schema, compression="zstd", use_dictionary=dictionary
            )
        except BaseException:
            self._file.close()
            self._remove_tmp()
            raise

    def __enter__(self) -> TokenWriter:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.close() if exc_type is None else self.abort()

    def should_stop(self, i: int) -> bool:
        return False

    def on_batch(self, i: int, rows: list[tuple[int, ...]], host: Any) -> None:
        """`add(rows, host.extras)`."""
        self.add(rows, host.extras)

    def add(self, rows: list[tuple[int, ...]], arrays: dict[str, np.ndarray]) -> None:
        """Adds the scored targets of one batch.

        Args:
          rows: the batch's layout rows (`Layout.batch_rows(i)`): per row the window ids it
            holds, packed from row position 0 as `Windows.fill` packs them (empty: padding).
          arrays: host arrays `[B, width - 1]` (B = len(rows)), index `[r, p - 1]` = the target
            at row position `p`: `nll` float32 nats, `entropy` float32 nats, `correct` bool;
            with top_k `top_ids` int32 and `top_logprobs` float32 (natural log), `[B, W-1, k]`;
            with a reference `kl`, `reference_nll` float32 nats and `same_top1` bool.

        Raises:
          ValueError: a missing array, or one whose shape does not hold the rows.
        """
        if self._writer is None:
            raise ValueError("TokenWriter.add after close or abort")
        r, col, k, pos = self._targets(rows)
        w = self._plan.windows
        g = w.starts[k] + pos - self._has_prefix[k]  # index of the target in w.tokens
        document = w.document[k]
        stream = document < 0  # a window of a stream protocol may span documents
        if stream.any():
            found = np.searchsorted(self._plan.doc_starts, g[stream], side="right") - 1
            document[stream] = np.maximum(found, 0)  # before the first document: the BOS
        offset = g - self._plan.doc_starts[document]
        if self._plan.per_document and self._plan.add_bos:
            offset -= 1  # lm_eval_rolling places BOS inside each document's tokens
        cols = {
            "document": document,
            "offset": offset,
            "position": pos.astype(np.int32),
            "token_id": w.tokens[g].astype(np.int32),
        }
        for name in self._array_names():
            cols[name] = self._take(arrays, name, len(rows), r, col)
        nll = cols["nll"].astype(np.float32, copy=False)
        if self._extra is not None:
            cols.update(self._extra(g, nll))
        self.nll_sum += float(nll.sum(dtype=np.float64))
        self.num_tokens += int(nll.size)
        self._pending.append(cols)
        self._pending_rows += int(nll.size)
        if self._pending_rows >= self._group:
            try:
                self._flush(final=False)
            except OSError as e:  # disk full: nothing half-written is left
                self.abort()
                raise self._write_error(e) from None

    def close(self) -> str:
        """Writes what is buffered and the metadata, fsyncs, and renames the file to `path`.
        Returns `path`."""
        if self._writer is None:
            raise ValueError("TokenWriter.close after close or abort")
        try:
            self._flush(final=True)
            meta = {
                "dataset": self._dataset,
                "protocol": self._plan.protocol,
                "top_k": self._top_k,
                "reference": self._reference,
                "copies": list(self._copies[0]),
                "tokenizer": self._tokenizer.name,
                "num_tokens": self.num_tokens,
                "nll_sum": self.nll_sum,
            }
            self._writer.add_key_value_metadata(
                {
                    METADATA_KEY: json.dumps(meta, allow_nan=False),
                    DOCUMENTS_KEY: json.dumps(list(self._plan.sources)),
                }
            )
            self._writer.close()
            self._writer = None
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            os.replace(self._tmp, self.path)
        except OSError as e:
            self.abort()
            raise self._write_error(e) from None
        except BaseException:
            self.abort()
            raise
        return self.path

    def _write_error(self, e: OSError) -> ConfigError:
        """The one-sentence error of a write that failed (no space left, ...); the partial file
        is removed and an older file at `path` is kept."""
        return write_error(os.path.dirname(self.path) or ".", os.path.basename(self.path), e)

    def abort(self) -> None:
        """Removes the partial file; nothing is left of it (an older file at `path` is kept)."""
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
            self._writer = None
        with contextlib.suppress(Exception):
            self._file.close()
        self._pending, self._pending_rows = [], 0
        self._remove_tmp()

    def _remove_tmp(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._tmp)

    def _array_names(self) -> tuple[str, ...]:
        named = _BASE + (_TOP if self._top_k else ()) + (_REFERENCE if self._reference else ())
        return named + study.token_arrays(*self._copies)

    def _targets(
        self, rows: list[tuple[int, ...]]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """`(row, column, window, position)` `[n] int64` of each scored target of `rows`, in row
        order: column `p - 1` of the arrays for row position `p`; position in the window."""
        seg_row, seg_begin, seg_window = [], [], []
        for r, ids in enumerate(rows):
            at = 0
            for k in ids:
                seg_row.append(r)
                seg_begin.append(at)
                seg_window.append(k)
                at += int(self._row_lengths[k])
        k_s = np.asarray(seg_window, np.int64)
        first = self._plan.windows.first_scored[k_s]
        count = self._row_lengths[k_s] - first
        seg = np.repeat(np.arange(k_s.size), count)
        pos = first[seg] + np.arange(seg.size) - np.repeat(np.cumsum(count) - count, count)
        col = np.asarray(seg_begin, np.int64)[seg] + pos - 1
        return np.asarray(seg_row, np.int64)[seg], col, k_s[seg], pos

    def _take(self, arrays: dict[str, np.ndarray], name: str, batch: int, r, col) -> np.ndarray:
        if name not in arrays:
            raise ValueError(f"TokenWriter.add: no {name!r} array")
        x = np.asarray(arrays[name])
        tail = (self._top_k,) if name in _TOP else ()
        need = col.max() + 1 if col.size else 0
        fits = x.ndim == 2 + len(tail) and x.shape[0] == batch and x.shape[2:] == tail
        if not fits or x.shape[1] < need:
            raise ValueError(
                f"TokenWriter.add: {name!r} has shape {x.shape}, expected [{batch}, >= {need}]"
                f"{''.join(f', {t}' for t in tail)}"
            )
        return x[r, col]

    def _flush(self, final: bool) -> None:
        """Writes full row groups of the buffer (and the rest when `final`)."""
        if not self._pending:
            return
        cols = {name: np.concatenate([p[name] for p in self._pending]) for name in self._pending[0]}
        n = cols["nll"].size
        done = 0
        while n - done >= self._group or (final and done < n):
            stop = min(n, done + self._group)
            self._writer.write_table(
                self._table({k: v[done:stop] for k, v in cols.items()}),
                row_group_size=self._group,
            )
            done = stop
        rest = {k: v[done:] for k, v in cols.items()}
        self._pending = [rest] if done < n else []
        self._pending_rows = n - done

    def _texts(self, ids: np.ndarray) -> Any:
        """`pyarrow` string array of the token texts of `ids` (`[n]`), each id decoded once per
        writer: a table of the vocabulary's texts (plus "" for ids outside it) grows as ids
        appear, and rows take from it (no sort per row group)."""
        import pyarrow as pa

        size = self._tokenizer.vocab_size
        flat = ids.reshape(-1).astype(np.int64)
        flat = np.where((flat >= 0) & (flat < size), flat, size)  # outside the vocabulary: ""
        if self._decoded is None:
            self._decoded, self._vocab = np.zeros(size + 1, bool), [""] * (size + 1)
        fresh = ~self._decoded[flat]
        if fresh.any() or self._vocab_texts is None:
            new = np.unique(flat[fresh])
            for i, text in zip(new.tolist(), self._tokenizer.token_texts(new), strict=True):
                self._vocab[i] = text
            self._decoded[new] = True
            self._vocab_texts = pa.array(self._vocab, pa.string())
        return self._vocab_texts.take(pa.array(flat))

    def _table(self, cols: dict[str, np.ndarray]) -> Any:
        import pyarrow as pa

        n = cols["nll"].size
        nll = cols["nll"].astype(np.float32)
        out: dict[str, Any] = {
            "dataset": pa.repeat(pa.scalar(self._dataset, pa.string()), n),
            "document": cols["document"].astype(np.int64),
            "offset": cols["offset"].astype(np.int64),
            "position": cols["position"],
            "token_id": cols["token_id"],
            "token": self._texts(cols["token_id"]),
            "nll": nll,
            "surprisal": (nll.astype(np.float64) / LN2).astype(np.float32),
            "entropy": cols["entropy"].astype(np.float32),
            "correct": cols["correct"].astype(bool),
        }
        if self._top_k:
            k = self._top_k
            offsets = pa.array(np.arange(0, n * k + 1, k, dtype=np.int32))
            ids = cols["top_ids"].astype(np.int32).reshape(-1)
            probs = np.exp(cols["top_logprobs"].astype(np.float64)).astype(np.float32)
            out["top_ids"] = pa.ListArray.from_arrays(offsets, pa.array(ids))
            out["top_tokens"] = pa.ListArray.from_arrays(offsets, self._texts(ids))
            out["top_probs"] = pa.ListArray.from_arrays(offsets, pa.array(probs.reshape(-1)))
        if self._reference:
            ref = cols["reference_nll"].astype(np.float32)
            out["kl"] = cols["kl"].astype(np.float32)
            out["reference_nll"] = ref
            out["same_top1"] = cols["same_top1"].astype(bool)
            out["delta_logprob"] = (ref.astype(np.float64) - nll).astype(np.float32)
        for name, _ in getattr(self._extra, "fields", ()):
            out[name] = cols[name]
        out.update(study.token_columns(cols, *self._copies))
        return pa.Table.from_pydict(out, schema=self._schema)


def read_tokens(path: str, columns: list[str] | None = None) -> Any:
    """The rows of a `tokens.parquet` as a `pyarrow.Table` (all columns, or `columns`).

    Raises:
      ConfigError: pyarrow is missing. DataError: `path` is missing or not a tokens file.
    """
    check_available()
    import pyarrow.parquet as pq

    _check_file(path)
    return pq.read_table(path, columns=columns)


def read_metadata(path: str) -> dict[str, Any]:
    """The `ppl_jax` metadata of a `tokens.parquet` (dataset, protocol, top_k, reference,
    tokenizer, num_tokens, nll_sum in nats), plus `documents`: the document sources, in corpus
    order (index = the `document` column).

    Raises:
      ConfigError: pyarrow is missing. DataError: `path` is missing or not a tokens file.
    """
    check_available()
    import pyarrow.parquet as pq

    _check_file(path)
    kv = pq.read_metadata(path).metadata or {}
    if METADATA_KEY.encode() not in kv:
        raise DataError(f"{path!r} has no ppl_jax metadata; it is not a ppl_jax tokens.parquet.")
    meta = json.loads(kv[METADATA_KEY.encode()])
    meta[DOCUMENTS_KEY] = json.loads(kv.get(DOCUMENTS_KEY.encode(), b"[]"))
    return meta


def _check_file(path: str) -> None:
    if not os.path.isfile(path):
        raise DataError(f"no such file {path!r}; write one with output.tokens=true.")
    with open(path, "rb") as f:
        head = f.read(4)
    if head != b"PAR1":
        raise DataError(f"{path!r} is not a Parquet file (a ppl_jax tokens.parquet).")
