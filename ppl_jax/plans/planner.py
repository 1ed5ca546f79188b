"""The datasets of a run, each read, prepared, cut to its budget and planned once.

A dataset is `data.*` (one run, one dataset) or an entry of `suite` (several, each with its own
name, files, format, tags, preparation, budget and protocol settings; see
`ppl_jax.evaluation.spec.RunSpec.suite` and `configs/suite_example.py`). `plan_dataset` (public as
`ppl_jax.prepare`) turns one into a
`Dataset`: its `Plan` (windows and counts, `ppl_jax.plans.protocols`) and batch `Layout`, which every
checkpoint step of a sweep scores again without reading or tokenizing anything.

Budgets (`max_documents`, `max_tokens`) are deterministic: the first documents in file order
(`sample_seed=-1`), or those of a seeded permutation (`numpy.random.default_rng(seed)`), kept in
file order. `max_tokens` counts the documents' own tokens (no BOS, no separator) in that order
and cuts the document that crosses it at a token boundary (`token_prefix`), so that the texts
hold `max_tokens` tokens (a token or two fewer where the prefix tokenizes differently); the cut
text is scored as any document (its bytes and words are those of the prefix). A preparation
that reports its own per-document counts (`lm_eval_wikitext`) is cut at the last whole document
instead, since its counts are the whole text's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import numpy as np

from ppl_jax.data import documents as data
from ppl_jax.data import preparations
from ppl_jax.data.spec import DatasetSpec
from ppl_jax.plans import plan_cache, protocols, token_cache
from ppl_jax.plans.layout import Layout, plan_layout
from ppl_jax.plans.protocols import Plan, PlanInputs
from ppl_jax.plans.spec import BatchSpec, ProtocolSpec
from ppl_jax.plans.windows import Windows
from ppl_jax.runtime import distributed
from ppl_jax.tokenizer import Tokenizer


@dataclasses.dataclass
class Dataset:
    """One dataset, ready to score.

    Attributes:
      data, protocol: its specs.
      plan: what its protocol scores (windows, bytes, words).
      layout: the windows' batches (`ppl_jax.plans.layout`).
    """

    data: DatasetSpec
    protocol: ProtocolSpec
    plan: Plan
    layout: Layout

    @property
    def name(self) -> str:
        return self.data.name

    @property
    def tags(self) -> dict[str, str]:
        return dict(self.data.tags)


def read(ds: DatasetSpec, tok: Tokenizer | None = None) -> tuple[list[data.Document], Any]:
    """The dataset's documents after its preparation (and its budget, given the tokenizer), and
    the per-document counts a preparation reports in place of the text's
    (`preparations.Prepared.doc_counts`), or None.

    Raises:
      DataError, ConfigError: as `data.read_documents` and `preparations.apply_preparation`.
    """
    docs = data.read_documents(
        ds.path, "text" if ds.preparation else ds.format, ds.errors, ds.jsonl_field
    )
    counts = None
    if ds.preparation:
        prepared = preparations.apply_preparation(ds.preparation, docs)
        docs, counts = prepared.documents, prepared.doc_counts
    return (docs, counts) if tok is None else cut(docs, counts, ds, tok)


def documents(ds: DatasetSpec, tok: Tokenizer) -> Iterable[data.Document]:
    """The dataset's documents after its preparation and budget, streamed
    (`data.iter_documents`) where it has neither, else read whole."""
    if not ds.preparation and not ds.has_budget:
        return data.iter_documents(ds.path, ds.format, ds.errors, ds.jsonl_field)
    return cut(*read(ds), ds, tok)[0]


def cut(
    docs: list[data.Document], counts: Any, ds: DatasetSpec, tok: Tokenizer
) -> tuple[list[data.Document], Any]:
    """`docs` (and `counts`) cut to the dataset's budget (all of them when it has none)."""
    if ds.has_budget:
        keep, last = budget(docs, ds, tok, whole=counts is not None)
        if last is not None:
            docs = [*docs]
            docs[last[0]] = token_prefix(docs[last[0]], last[1], tok)
            if not docs[last[0]].text:  # a first token that is part of a character
                keep = keep[keep != last[0]]
        docs = [docs[i] for i in keep]
        if counts is not None:
            counts = tuple(np.asarray(c)[keep] for c in counts)
    return docs, counts


def budget(
    docs: list[data.Document], ds: DatasetSpec, tok: Tokenizer, whole: bool = False
) -> tuple[np.ndarray, tuple[int, int] | None]:
    """The indices (ascending) of the documents `ds.max_documents` and `ds.max_tokens` keep,
    and `(index, tokens)` of the one `max_tokens` cuts to its first `tokens` tokens (None: no
    cut). With `whole`, the document that crosses `max_tokens` is left out instead (the first
    is kept whole)."""
    order = np.arange(len(docs))
    if ds.sample_seed >= 0:
        order = np.random.default_rng(ds.sample_seed).permutation(len(docs))
    if ds.max_documents:
        order = order[: ds.max_documents]
    if ds.max_tokens:
        kept, total, chunk = [], 0, 64
        for at in range(0, len(order), chunk):
            ids = order[at : at + chunk]
            lengths = [t.size for t in tok.encode([docs[i].text for i in ids])]
            for i, n in zip(ids, lengths, strict=True):
                if total + n > ds.max_tokens and (kept or not whole):
                    if whole or total == ds.max_tokens:
                        return np.sort(np.asarray(kept, np.int64)), None
                    kept.append(int(i))
                    return np.sort(np.asarray(kept, np.int64)), (int(i), ds.max_tokens - total)
                kept.append(int(i))
                total += n
        order = np.asarray(kept, np.int64)
    return np.sort(order), None


def token_prefix(doc: data.Document, n: int, tok: Tokenizer) -> data.Document:
    """`doc` cut after its first `n` tokens (n >= 1): its text up to the end of their bytes (a
    character they split is left out), shortened a token at a time while the prefix, tokenized
    alone, has more than `n` tokens (a tokenizer may merge the cut's edge differently)."""
    ids, lengths = tok.encode_with_bytes([doc.text])[0]
    raw = doc.text.encode("utf-8")
    for k in range(min(n, ids.size), 0, -1):
        text = raw[: int(lengths[:k].sum(dtype=np.int64))].decode("utf-8", errors="ignore")
        if tok.encode([text])[0].size <= n:
            return data.Document(text, doc.source)
    return data.Document("", doc.source)


def inputs(ds: DatasetSpec, protocol: ProtocolSpec, tok: Tokenizer, vocab_size: int) -> PlanInputs:
    """What the dataset's protocol plans it with (`protocols.PlanInputs`): its window, stride,
    BOS (resolved for `tok`), separator and options."""
    return PlanInputs(
        tokenizer=tok,
        vocab_size=vocab_size,
        seq_len=protocol.seq_len,
        stride=protocol.stride,
        add_bos=protocols.resolve_add_bos(protocol.add_bos, tok),
        separator=ds.separator,
        options=protocol.options,
    )


def plan(
    ds: DatasetSpec,
    protocol: ProtocolSpec,
    docs: list[data.Document],
    counts: Any,
    tok: Tokenizer,
    vocab_size: int,
) -> Plan:
    """The dataset's protocol plan (`Protocol.plan`)."""
    return protocol.convention.plan(docs, inputs(ds, protocol, tok, vocab_size), doc_counts=counts)


def batches(p: Plan, batch: BatchSpec, segments: bool = True, rows_multiple: int = 0) -> Layout:
    """The batch layout of a plan's windows with the run's settings (`lay_out`)."""
    return lay_out(p.windows, batch, segments, rows_multiple)


def lay_out(
    windows: Windows, batch: BatchSpec, segments: bool = True, rows_multiple: int = 0
) -> Layout:
    """The batch layout of `windows` (`ppl_jax.plans.layout.plan_layout`) with the run's settings.
    Windows are packed only for a model that keeps segments apart (`segments`:
    `LanguageModel.honours_segments`, False for one whose attention cannot, as cuDNN's).

    With `rows_multiple` (the mesh's `data` axis), the rows are shared evenly between the
    batches they need: each batch takes `ceil(rows / batches)` rows, rounded up to that
    multiple, where that is fewer than `eval.batch_size` and keeps the number of batches (one
    compiled shape, as many steps, only the last batch's empty rows gone: 18 windows in batches
    of 8 were 3 batches of 24 rows, 25% padding, and are 3 of 6). A plan whose rows all fit in
    one batch gets a batch of only as many rows as it needs (three documents in the default 8
    rows were 70-80% padding). The layout's `batch_size` is then below `eval.batch_size`; the
    run's fingerprint names it (`Provenance`), since a journal's batch `i` holds other windows.
    """
    pack = batch.packing and segments
    layout = plan_layout(windows, batch.batch_size, pack=pack, num_buckets=batch.length_buckets)
    if rows_multiple > 0:
        rows = max(len(layout.rows), 1)
        per_batch = -(-rows // -(-rows // layout.batch_size))
        needed = -(-per_batch // rows_multiple) * rows_multiple
        if needed < layout.batch_size:
            even = plan_layout(windows, needed, pack=pack, num_buckets=batch.length_buckets)
            if even.num_batches <= layout.num_batches and _positions(even) <= _positions(layout):
                layout = even
    return layout


def _positions(layout: Layout) -> int:
    """Positions of all the layout's batches, their empty rows included."""
    return layout.batch_size * sum(layout.widths)


def plan_dataset(
    ds: DatasetSpec,
    protocol: ProtocolSpec,
    tok: Tokenizer,
    vocab_size: int,
    batch: BatchSpec,
    segments: bool = True,
    rows_multiple: int = 0,
) -> Dataset:
    """Reads, prepares, budgets, tokenizes and plans one dataset (or finds it in `ds.cache_dir`,
    see `planned`), and lays out its batches: public as `ppl_jax.prepare`.

    Args:
      ds: the dataset's data spec.
      protocol: the dataset's protocol spec.
      tok: the model's tokenizer.
      vocab_size: the model's vocabulary size.
      batch: the run's batch layout.
      segments: whether the model keeps segments apart (see `batches`).
      rows_multiple: the mesh's `data` axis, to lay a plan of fewer rows than a batch in a
        smaller batch (see `batches`); 0: every batch has `batch.batch_size` rows.
    """
    p = planned(ds, protocol, tok, vocab_size)[0]
    return Dataset(ds, protocol, p, batches(p, batch, segments, rows_multiple))


def planned(
    ds: DatasetSpec,
    protocol: ProtocolSpec,
    tok: Tokenizer,
    vocab_size: int,
    read_first: tuple[list[data.Document], Any] | None = None,
) -> tuple[Plan, list[data.Document] | None, dict[str, Any]]:
    """The dataset's plan: from `ds.cache_dir` when an entry of the same key is there
    (`ppl_jax.plans.plan_cache`; its token stream memory-mapped, nothing read or tokenized); else,
    where the token cache applies (`ppl_jax.plans.token_cache`: no preparation, no budget, a
    per-document protocol), from the token cache, tokenized in shares across processes in
    bounded memory; else read (or `read_first`, the documents already read), cut to its budget,
    planned, and cached (with several processes and a cache, by process 0 alone while the others
    wait, and then memory-mapped by all).

    Returns:
      (the plan, the documents when they were read here or given, else None, the cache entry's
      extras: {} unless the entry was read).
    """
    import jax

    entry = plan_cache.key(ds, protocol, tok, vocab_size) if ds.cache_dir else None
    if entry is not None:
        found = plan_cache.load(ds.cache_dir, entry)
        # All processes take the same path (the token cache's has barriers): a process that
        # looks after another one wrote the entry must not take it alone.
        if all(distributed.flags_of_all(found is not None)):
            return found[0], None, found[1]
    if entry is not None and read_first is None and token_cache.applies(ds, protocol.convention):
        return streamed(ds, protocol, tok, vocab_size, entry), None, {}
    if entry is not None and read_first is None and jax.process_count() > 1:
        # A shared cache: process 0 reads and plans, the others wait and memory-map its plan.
        def write() -> None:
            plan_cache.save(
                ds.cache_dir, entry, plan(ds, protocol, *cut(*read(ds), ds, tok), tok, vocab_size)
            )

        found = plan_cache.made_once(ds.cache_dir, entry, write, f"data {ds.name!r}")
        return found[0], None, found[1]
    docs, counts = read_first if read_first is not None else read(ds)
    docs, counts = cut(docs, counts, ds, tok)
    p = plan(ds, protocol, docs, counts, tok, vocab_size)
    if entry is not None:
        p = dataclasses.replace(p, tokens_digest=protocols.tokens_digest(p.windows.tokens))
        plan_cache.save(ds.cache_dir, entry, p)
    return p, docs, {}


def streamed(
    ds: DatasetSpec, protocol: ProtocolSpec, tok: Tokenizer, vocab_size: int, key: str
) -> Plan:
    """The dataset's plan through the token cache: the corpus tokenized (in shares, unless its
    entry is complete: `token_cache.build`), then the plan (`Protocol.stream_plan`) written by
    process 0 into the plan cache (`ppl_jax.plans.plan_cache`, entry `key`) and memory-mapped by
    every process.

    Raises:
      DataError, ConfigError: as `token_cache.build` and the plan; on the other processes, a
        DataError that points to process 0's log when its planning failed.
    """
    import jax

    # Only process 0 plans. The entry is dropped once it has (`write` returns), before every
    # process reads the plan back: the two are not held at once.
    held = [token_cache.build(ds, tok)]
    if jax.process_index() != 0:
        held.clear()
    given = inputs(ds, protocol, tok, vocab_size)

    def write() -> None:
        entry = held.pop()
        plan_cache.save_built(
            ds.cache_dir, key, lambda path: protocol.convention.stream_plan(entry, given, path)
        )

    return plan_cache.made_once(ds.cache_dir, key, write, f"data {ds.name!r}")[0]
