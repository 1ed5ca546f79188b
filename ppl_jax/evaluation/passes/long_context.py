"""The long-context measures of a run that scores documents whole (`whole_documents`; docs/long-context.md):
loss by position in the document to its full length with 95% bands over documents, the context
gain of every token, and LongPPL (Fang et al., ICLR 2025), from one job.

- **Full context**: the run's own pass. `Gather`, an observer of the per-token arrays the step
  returns (`StepOptions.per_token`), keeps each target's NLL by its index in the plan's token
  stream.
- **Short context** (`eval.short_context` C, `eval.short_targets` S): before the run's pass, the
  model scores every target at position >= C again, with C to C + S - 1 tokens of context taken
  from its own window (`short_context.short_pass`: `windows.short_windows`, the LongPPL
  reference's `trunc_len` and `sliding_window`). A token's **context gain** is
  `NLL(short) - NLL(full)`, nats: positive where the far context helped (LongPPL's long-short
  difference). The short NLLs are known before the
  run's pass, so `tokens.parquet` carries `nll_short` and `context_gain` per token.
- **LongPPL** (`ppl_jax.metrics.longppl`): key tokens are those whose short NLL exceeds the full
  one by more than `longppl.alpha` and whose full NLL is below `-longppl.beta`, found by an
  evaluator: the scored model on its own tokens (no `longppl.evaluator.dir`), or another
  checkpoint with its own tokenizer, which scores the same documents with both contexts before the
  run's pass (`short_context.evaluator_keys`; its tokens with BOS where its tokenizer adds one, as
  the reference's `evaluator_tokenizer(text)` does); its key tokens are carried to the scored
  model's tokens by character offsets. LongPPL is the perplexity of the scored model over its key
  tokens, token-weighted over documents.

Memory: 4 bytes per token of the plan's stream for each pass's NLLs (full, short; an evaluator's
two more over its own stream). Every pass is an ordinary scoring pass of the one compiled step
(any mesh, packing, batch size), so the measures do not depend on them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from ppl_jax.checkpoints import DTYPES, open_checkpoint
from ppl_jax.checkpoints import architecture as architecture_lib
from ppl_jax.errors import ConfigError, DataError, settings_named
from ppl_jax.evaluation.spec import LongContextSpec, RunSpec
from ppl_jax.metrics import longppl, position
from ppl_jax.models.interface import LanguageModel
from ppl_jax.plans import planner, protocols
from ppl_jax.plans.protocols import Plan, PlanInputs
from ppl_jax.plans.windows import NO_PREFIX, Windows
from ppl_jax.runtime import mesh as mesh_lib
from ppl_jax.tokenizer import Tokenizer


@dataclasses.dataclass
class KeyEvaluator:
    """LongPPL's evaluator model, opened and planned before any weight is read.

    Attributes:
      ckpt, step, model, tokenizer: its checkpoint, step, model and own tokenizer.
      target, shardings: its params' restore targets and shardings on the run's mesh.
      plan: `whole_documents` of the run's documents with its tokenizer (BOS as it adds one).
      name: its directory, for the report.
    """

    ckpt: Any
    step: int | None
    model: LanguageModel
    tokenizer: Tokenizer
    target: Any
    shardings: Any
    plan: Plan
    name: str

    def restore(self) -> Any:
        """Its params, on the mesh."""
        with settings_named("longppl.evaluator"):
            return self.ckpt.restore(self.step, self.target)


def check(
    spec: RunSpec,
    plan: Plan,
    model: LanguageModel,
    mesh: Any,
    docs: list | None,
    tok: Tokenizer,
) -> KeyEvaluator | None:
    """Every check of the long-context measures that needs no weights; opens and plans LongPPL's
    evaluator when one is named (`docs`: the run's documents, or None to read them again, cut
    to the dataset's budget by the run's tokenizer `tok`, as the run's plan was).

    Raises:
      ConfigError: short-context windows beyond the model's (or the evaluator's) positions, an
        evaluator without a tokenizer or with too few positions for the run's windows.
    """
    lc: LongContextSpec | None = spec.diagnostics.long_context
    if lc is None:
        return None
    width = lc.short_context + lc.short_targets - 1
    if width > model.max_positions:
        raise ConfigError(
            f"eval.short_context={lc.short_context} with eval.short_targets={lc.short_targets} "
            f"needs windows of {width} tokens, beyond the model's {model.max_positions} "
            f"positions; use fewer short targets."
        )
    if lc.evaluator is None:
        return None
    e = lc.evaluator
    with settings_named("longppl.evaluator"):  # its own keys, not the scored model's
        ckpt = open_checkpoint(e.checkpoint_dir, e.checkpoint_format)
        step = ckpt.resolve_step(e.checkpoint_step)
        model_e = architecture_lib.resolve(ckpt, step).model(e.dtype, "auto")
        tok = ckpt.tokenizer(step)
    if tok is None:
        raise ConfigError(
            f"longppl.evaluator.dir={e.checkpoint_dir!r} holds no tokenizer (tokenizer.json or "
            f"tokenizer.model); LongPPL's evaluator reads the text with its own tokenizer."
        )
    if docs is None:
        docs = list(planner.documents(spec.data, tok))
    add_bos = protocols.resolve_add_bos("auto", tok)
    plan_e = plan_of(spec, docs, tok, model_e.vocab_size, add_bos)
    # Positions in the evaluator's own tokens: its longest window, as its tokenizer cut it.
    longest = int(plan_e.windows.row_lengths().max(initial=1)) - 1
    for what, n in (("its longest window", longest), ("the short-context windows", width)):
        if n > model_e.max_positions:
            raise ConfigError(
                f"LongPPL's evaluator {e.checkpoint_dir!r} has {model_e.max_positions} "
                f"positions, fewer than {what} ({n} of its own tokens); choose a lower "
                f"eval.seq_len."
            )
    target, shardings = mesh_lib.param_targets(
        model_e.abstract_params, model_e.logical_axes, mesh, spec.mesh.rules, DTYPES[e.dtype]
    )
    return KeyEvaluator(ckpt, step, model_e, tok, target, shardings, plan_e, e.checkpoint_dir)


def plan_of(spec: RunSpec, docs: list, tok: Tokenizer, vocab_size: int, add_bos: bool) -> Plan:
    """The run's protocol over `docs` with another tokenizer (LongPPL's evaluator)."""
    protocol = spec.protocol
    given = PlanInputs(
        tok, vocab_size, protocol.seq_len, protocol.stride, add_bos, spec.data.separator,
        protocol.options,
    )  # fmt: skip
    return protocol.convention.plan(docs, given)


class Gather:
    """Keeps each target's NLL by its index in the windows' token stream, from the per-token
    arrays of `Scorer.score`'s step (`StepOptions.per_token`): an observer of the loop
    (`ppl_jax.scoring.observers.ScoreObserver`).

    Attributes:
      nll: `[N] float32`, nats; NaN where no target of the pass was seen.
    """

    def __init__(self, windows: Windows):
        self.windows = windows
        self.nll = np.full(windows.tokens.size, np.nan, np.float32)
        self._rows = windows.row_lengths()
        self._prefix = (windows.prefix != NO_PREFIX).astype(np.int64)

    def should_stop(self, i: int) -> bool:
        return False

    def on_batch(self, i: int, rows: list[tuple[int, ...]], host: Any) -> None:
        """`add(rows, host.extras)`."""
        self.add(rows, host.extras)

    def close(self) -> None:
        pass

    def add(self, rows: list[tuple[int, ...]], arrays: dict[str, np.ndarray]) -> None:
        """One batch: `rows` its rows' window ids, `arrays` its per-token host arrays
        (`[batch, seq]`: `scored`, `slot`, `nll`)."""
        r, c = np.nonzero(arrays["scored"])
        slot = arrays["slot"][r, c].astype(np.int64) - 1
        width = max((len(row) for row in rows), default=0) or 1
        ids = np.full((len(rows), width), -1, np.int64)
        begin = np.zeros((len(rows), width), np.int64)
        for i, row in enumerate(rows):
            if row:
                ids[i, : len(row)] = row
                begin[i, 1 : len(row)] = np.cumsum(self._rows[list(row[:-1])])
        k = ids[r, slot]
        g = self.windows.starts[k] + (c + 1 - begin[r, slot]) - self._prefix[k]
        self.nll[g] = arrays["nll"][r, c]


class TokenColumns:
    """`tokens.parquet`'s long-context columns (`TokenWriter`'s `extra_columns`), per target:
    `nll_short` (float32, nats: its NLL with the short context; its `nll` where its context is
    not longer than the short one) and `context_gain` (float32, nats: `nll_short - nll`, 0
    there). (LongPPL's key tokens are not a column: with the model as its own evaluator they
    are known only once the run's pass is done.)

    Args:
      short: `[N] float32`, the short-context NLLs by stream index (NaN: not scored again).
    """

    fields = (("nll_short", "float32"), ("context_gain", "float32"))

    def __init__(self, short: np.ndarray):
        self.short = short

    def __call__(self, g: np.ndarray, nll: np.ndarray) -> dict[str, np.ndarray]:
        nll = np.asarray(nll, np.float32)
        short = self.short[g]
        short = np.where(np.isnan(short), nll, short).astype(np.float32)
        gain = (short.astype(np.float64) - nll).astype(np.float32)
        return {"nll_short": short, "context_gain": gain}


def targets(windows: Windows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(stream index, position, document)` `[n] int64` of every scored target of `windows`,
    in window order (a target's position: the tokens of context it saw in its window)."""
    count = windows.num_scored()
    k = np.repeat(np.arange(windows.num_windows), count)
    step = np.arange(k.size) - np.repeat(np.cumsum(count) - count, count)
    pos = windows.first_scored[k] + step
    prefix = (windows.prefix != NO_PREFIX).astype(np.int64)
    return windows.starts[k] + pos - prefix[k], pos, windows.document[k]


def matched_keys(
    plan: Plan, tok: Tokenizer, plan_e: Plan, tok_e: Tokenizer, docs: list, keys_e: np.ndarray
) -> np.ndarray:
    """`[N] bool`: the scored model's tokens (over its plan's stream) that lie inside the
    character spans of the evaluator's key tokens (`keys_e`, over the evaluator's plan
    `plan_e`; `longppl.merge_intervals`, `longppl.within`), document by document. The model as
    its own evaluator goes through the same matching (as the reference does): where its
    tokenizer trims spaces from its offsets, a whitespace token of no width between two key
    tokens lies inside their joined span and is counted.

    Raises:
      DataError: a tokenizer whose character offsets give other tokens than the plan's (a
        document is tokenized again for them).
    """
    out = np.zeros(plan.windows.tokens.size, bool)
    plans = ((plan, tok, None), (plan_e, tok_e, keys_e))
    for d, doc in enumerate(docs):
        spans = []
        for p, t, keys in plans:
            lo = int(p.doc_starts[d])
            hi = int(p.doc_starts[d + 1]) if d + 1 < len(docs) else p.windows.tokens.size
            bos = int(p.add_bos)
            ids, offsets = t.char_spans(doc.text)
            if not np.array_equal(ids, p.windows.tokens[lo + bos : hi]):
                raise DataError(
                    f"document {d} ({doc.source}): the character offsets of {t.name} give other "
                    f"tokens than the run scored; LongPPL cannot match its key tokens."
                )
            spans.append((lo + bos, offsets, None if keys is None else keys[lo + bos : hi]))
        (start, offsets, _), (_, offsets_e, keys_d) = spans
        slices = longppl.merge_intervals(offsets_e[keys_d])
        out[start : start + offsets.shape[0]] = longppl.within(offsets, slices)
    return out


def measures(
    spec: RunSpec,
    windows: Windows,
    full: np.ndarray,
    short: np.ndarray | None,
    keys: tuple[np.ndarray, int, str] | None = None,
    match: Callable[[np.ndarray], np.ndarray] | None = None,
) -> dict[str, Any]:
    """The long-context results: `{"position_curve": position.document_curve(...),
    "long_context": {"short_context", "short_targets", "context_gain", "longppl"}, "keys":
    [N] bool}` (the last two only with a short context; `keys`: LongPPL's key tokens over the
    stream).

    Args:
      windows: the run's plan's windows (`whole_documents`: one per document, or its pieces).
      full: `[N] float32`, the run's NLL by stream index; short: the short-context one (or
        None); keys: `([N] bool key tokens over the stream, the key tokens the evaluator found
        in its own tokens, the evaluator's name)`, or None: the model is its own evaluator, its
        key tokens (from `full` and `short`) carried through `match` (`matched_keys` of its
        own plan and tokenizer).

    Raises:
      ValueError: a target of the plan the run's pass did not score (a bug).
    """
    g, pos, doc = targets(windows)
    nll = full[g]
    if np.isnan(nll).any():
        raise ValueError("a target of the plan has no NLL from the run's pass")
    lc = spec.diagnostics.long_context
    short_g = None if short is None else short[g]
    curve = position.document_curve(
        nll,
        pos,
        doc,
        windows.seq_len + 1,
        short_g,
        spec.bootstrap_samples,
        spec.seed,
    )
    # A position is one in the document unless a long document was cut into several windows.
    split = windows.num_windows != np.unique(windows.document).size
    curve["positions"] = "window" if split else "document"
    out: dict[str, Any] = {"position_curve": curve}
    if lc is None:
        return out
    gain = curve.pop("context_gain")
    if keys is None:
        own = longppl.key_tokens(full, short, lc.alpha, lc.beta)
        keys = (match(own), int(own[g].sum()), "the scored model")
    mask, found, name = keys
    key_nll = nll[mask[g]]
    out["long_context"] = {
        "short_context": lc.short_context,
        "short_targets": lc.short_targets,
        "context_gain": gain,
        "longppl": longppl.summary(key_nll, nll, lc.alpha, lc.beta, name, found),
    }
    out["keys"] = mask
    return out


def summary_lines(found: dict[str, Any]) -> list[str]:
    """The console lines of `measures(...)["long_context"]`."""
    gain, lp = found["context_gain"], found["longppl"]
    c, s = found["short_context"], found["short_targets"]
    lines = []
    if gain["num_tokens"]:
        lines.append(
            f"context gain over a {c:,}-token context: {gain['gain_per_token']:.4f} nats/token "
            f"over the {gain['num_tokens']:,} tokens with more context (each scored again with "
            f"{c:,}..{c + s - 1:,} tokens)"
        )
    else:
        lines.append(f"context gain: no token has more than {c:,} tokens of context")
    shown = "n/a (no key tokens)" if lp["longppl"] is None else f"{lp['longppl']:.4f}"
    lines.append(
        f"LongPPL {shown} over {lp['num_key_tokens']:,} key tokens (alpha {lp['alpha']:g}, "
        f"beta {lp['beta']:g}, evaluator: {lp['evaluator']}); perplexity {lp['perplexity']:.4f}"
    )
    return lines
