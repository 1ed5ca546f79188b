"""The scoring step: a pure function `(params, batch) -> StepSums`, traced and compiled by
`ppl_jax.scoring.scorer.Scorer` (which re-exports these names).

The step shifts each row by one token (position `j` reads token `j` and predicts `j + 1`), runs
the model, and reduces per-window sums of negative log-likelihood (nats) and counts, never means;
under a context axis it lays each row out in the load-balanced order first
(`ppl_jax.models.layers.context`) and puts per-token outputs back in row order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from ppl_jax.errors import ConfigError
from ppl_jax.models.interface import HiddenStates, LanguageModel, Logits
from ppl_jax.models.layers import context as context_lib
from ppl_jax.scoring.nll import VOCAB_BLOCK, token_stats, vocab_size

BATCH_KEYS = ("tokens", "target_mask", "segment_ids", "positions")

# Bytes of the float32 logits of one vocabulary block over the tokens the NLL takes at once
# (`[rows, tokens, min(VOCAB_BLOCK, vocab)]`), in one memory: a device's, or on the CPU the
# host's, which every local device shares (`logits_budget`).
LOGITS_BUDGET = 128 * 2**20


def logits_chunk(rows: int, tokens: int, vocab: int, budget: int = LOGITS_BUDGET) -> int:
    """Tokens per row the NLL takes at once so that one block of logits stays within `budget`.

    Args:
      rows: rows of the batch on one device.
      tokens: tokens of each row on one device.
      vocab: the vocabulary's size (ids); a block has `min(VOCAB_BLOCK, vocab)` columns.
      budget: bytes of one float32 `[rows, chunk, block]` block of logits.

    Returns:
      0 where all `tokens` fit (the NLL takes them at once), else the largest power of two
      whose block fits (at least 1).
    """
    per_token = rows * min(VOCAB_BLOCK, vocab) * 4
    if tokens * per_token <= budget:
        return 0
    return 1 << (max(1, budget // per_token).bit_length() - 1)


@dataclasses.dataclass(frozen=True)
class StepOptions:
    """The optional statistics of the step, chosen when it is built (extra outputs of the same
    compiled step; see `StepSums.extras`).

    Attributes:
      positions: > 0: sums of NLL and counts of scored targets per position in the window (the
        target's context length), over `positions` slots (`seq_len + 1`).
      per_token: per-token arrays (`ppl_jax.outputs.tokens`); the window sums are then reduced on the
        host in float64 from them, so the per-token NLLs add up to the run's NLL exactly.
      top_k: with per_token, the k most probable tokens and their log-probabilities (at most
        `nll.MAX_TOP_K`).
      reference: the params are `(model params, reference params)`; the step also scores the
        reference model and returns per-token KL(reference || model) (`ppl_jax.metrics.divergence`).
      copies: > 0: a study (`ppl_jax.metrics.study`): the params are `(model params, (copy
        params, ...))` of this many copies, each scored against the model on the same batch (the
        model's output computed once); the NLL's chunk shrinks with them, so that every copy's
        blocks of logits and the model's fit the one `logits_budget`.
      both_directions: with copies, also KL(copy || model) per token.
      context_attention: how attention crosses the context axis, `all_gather` or `ring`
        (`ppl_jax.models.layers.context.Settings`).
      token_chunk: tokens per chunk of the per-token layers on each device (the MLP, the NLL;
        `ppl_jax.models.layers.context.per_token`); 0: the MLP takes all at once and the NLL
        the chunk of `nll_chunk` (a bounded block of logits).
      matmul_precision: the precision of the step's matrix products (`model.matmul_precision`,
        `ppl_jax.scoring.precision.SETTINGS`); `auto`: `highest` where the model or the
        reference computes in float32, else the backend's default.
    """

    positions: int = 0
    per_token: bool = False
    top_k: int = 0
    reference: bool = False
    copies: int = 0
    both_directions: bool = False
    context_attention: str = "all_gather"
    token_chunk: int = 0
    matmul_precision: str = "auto"

    @property
    def token_arrays(self) -> bool:
        """Whether the step returns per-token arrays (for the token file or the divergence)."""
        return self.per_token or self.reference or self.copies > 0


class StepSums(NamedTuple):
    """Per-window sums from one step; each `[batch, slots]`, replicated on every device.

    nll_sum: float32, nats, over the window's scored targets.
    entropy_sum: float32, nats, the predictive entropy summed over the same targets.
    num_correct: int32, scored targets that are the model's top-1 prediction.
    num_tokens: int32, scored targets.
    num_nonfinite: int32, scored targets whose log-probability is NaN or infinite.
    extras: the outputs `StepOptions` asked for, by name:
      `nll_by_position`, `tokens_by_position`: `[positions]` float32 nats / int32 counts of the
        scored targets by their position in the window (summed over the batch);
      per-token `[batch, seq]` arrays (`seq` = the row width - 1; index `[r, p - 1]` is the
        target at row position `p`): `scored` (bool), `slot` (int32, the target's segment id,
        0 for padding), `nll`, `entropy` (float32 nats), `correct` (bool); with top_k
        `top_ids` `[batch, seq, k]` int32 and `top_logprobs` float32; with a reference `kl`,
        `reference_nll` (float32 nats) and `same_top1` (bool); with copies, for copy `i`
        `copy<i>/nll` (float32 nats, the copy's), `copy<i>/kl` (KL(model || copy), float32
        nats), `copy<i>/same_top1` (bool) and with both directions `copy<i>/kl_reverse`.
    """

    nll_sum: jax.Array
    entropy_sum: jax.Array
    num_correct: jax.Array
    num_tokens: jax.Array
    num_nonfinite: jax.Array
    extras: dict[str, jax.Array]


def score_step(
    apply: Callable[..., Any],
    params: Any,
    batch: dict[str, jax.Array],
    num_slots: int = 1,
    options: StepOptions = StepOptions(),
    reference_apply: Callable[..., Any] | None = None,
    context: int = 1,
    logits_budget: int = LOGITS_BUDGET,
    copy_applies: tuple[Callable[..., Any], ...] = (),
) -> StepSums:
    """Scores one batch of rows, each holding up to `num_slots` windows (segments).

    Args:
      apply: `LanguageModel.apply`.
      params: the model's params.
      batch: `tokens`, `target_mask` (bool), `segment_ids` (0 = padding, `s + 1` = the row's
        `s`-th window), `positions` (restarting in each segment), each `[batch, width]`.
        Position `j + 1` is the target of position `j` (the shift is made here); a target is
        counted only where `target_mask` holds, which is never a segment's first position.
      num_slots: segment slots per row.
      options: the optional statistics; with `options.reference`, `params` is the pair
        `(params, reference params)` and `reference_apply` the reference's apply.
      context: devices along the mesh's `context` axis. Above 1, the rows (after the shift) are
        padded to a multiple of `2 * context` and laid out in the load-balanced order split
        over `data` and `context` (`ppl_jax.models.layers.context`); per-token outputs are put back
        in row order before they leave the step, and the sums do not depend on the order.
      logits_budget: bytes of one block of logits on a device (`logits_budget`), which sets the
        NLL's chunk where `options.token_chunk` is 0 (`nll_chunk`).
      copy_applies: with `options.copies`, each copy's `LanguageModel.apply`.

    Returns:
      `StepSums`, each `[batch, num_slots]`: sums per window. The `[batch, seq, vocab]` logits are
      never materialised for a model that returns `HiddenStates` (see `ppl_jax.scoring.nll`).
    """
    tokens = batch["tokens"]
    # The next-token shift: position j reads token j and predicts token j + 1.
    row = {
        "inputs": tokens[:, :-1],
        "targets": tokens[:, 1:],
        "mask": batch["target_mask"][:, 1:],
        "read_positions": batch["positions"][:, :-1],
        "read_segments": batch["segment_ids"][:, :-1],
        "positions": batch["positions"][:, 1:],
        "segments": batch["segment_ids"][:, 1:],
    }
    width = tokens.shape[1] - 1
    if context > 1:  # the load-balanced order, split over `context`
        row, order = _context_order(row, context)
    model_params, other_params = params if options.reference or options.copies else (params, None)
    read = (row["inputs"], row["read_positions"], row["read_segments"])
    output = apply(model_params, *read)
    reference = reference_apply(other_params, *read) if options.reference else None
    copy_params = other_params if options.copies else ()
    copies = [f(p, *read) for f, p in zip(copy_applies, copy_params, strict=True)]
    top_k = options.top_k if options.per_token else 0
    data = int(dict(jax.sharding.get_abstract_mesh().shape).get("data", 1) or 1)
    chunk = nll_chunk(
        tokens.shape[0],
        tokens.shape[1],
        vocab_size(output),
        data=data,
        context=context,
        token_chunk=options.token_chunk,
        # A study's copies each hold their own and the model's blocks (XLA does not reuse one
        # copy's for the next): the chunk shrinks so that all of them fit the one budget.
        budget=logits_budget // (1 + options.copies),
    )

    def stats_of(x):
        own = _rebuilt(output, x["output"])
        stats = token_stats(
            own, x["targets"], top_k=top_k, reference=_rebuilt(reference, x["reference"])
        )
        return stats, tuple(
            _copy_stats(own, _rebuilt(c, rows), x["targets"], options.both_directions)
            for c, rows in zip(copies, x["copies"], strict=True)
        )

    stats, copy_stats = context_lib.per_token(
        stats_of,
        {
            "output": _per_token(output),
            "targets": row["targets"],
            "reference": _per_token(reference),
            "copies": tuple(_per_token(c) for c in copies),
        },
        chunk,
    )
    mask = row["mask"]
    finite_BxT = jnp.isfinite(stats.nll) & jnp.isfinite(stats.entropy)
    # slot_BxTxS: which slot each target belongs to (none for padding).
    slot_BxTxS = row["segments"][..., None] == jnp.arange(1, num_slots + 1)
    ok_BxTxS = slot_BxTxS & (mask & finite_BxT)[..., None]

    def per_slot(values_BxT):
        return jnp.sum(jnp.where(ok_BxTxS, values_BxT[..., None], 0.0), axis=1)

    def count(flags_BxTxS):
        return jnp.sum(flags_BxTxS, axis=1, dtype=jnp.int32)

    extras: dict[str, jax.Array] = {}
    if options.positions:
        # A target's position in its window is the number of tokens before it there.
        ok_BxT = (row["segments"] > 0) & mask & finite_BxT
        where_BxT = row["positions"].ravel()
        extras["nll_by_position"] = jax.ops.segment_sum(
            jnp.where(ok_BxT, stats.nll, 0.0).ravel(), where_BxT, options.positions
        )
        extras["tokens_by_position"] = jax.ops.segment_sum(
            ok_BxT.astype(jnp.int32).ravel(), where_BxT, options.positions
        )
    if options.token_arrays:
        extras["scored"] = (row["segments"] > 0) & mask
        extras["slot"] = row["segments"]
        extras["nll"], extras["entropy"], extras["correct"] = (
            stats.nll,
            stats.entropy,
            stats.correct,
        )
        for name in ("top_ids", "top_logprobs", "kl", "reference_nll", "same_top1"):
            if getattr(stats, name, None) is not None:
                extras[name] = getattr(stats, name)
        for i, found in enumerate(copy_stats):
            extras.update({f"copy{i}/{k}": v for k, v in found.items()})
        if context > 1:  # per-token outputs leave the step in row order (all are [B, T, ...])
            back = jnp.asarray(np.argsort(order)[:width])
            for name in list(extras):
                if name not in ("nll_by_position", "tokens_by_position"):
                    extras[name] = jnp.take(extras[name], back, axis=1)
    return StepSums(
        nll_sum=per_slot(stats.nll),
        entropy_sum=per_slot(stats.entropy),
        num_correct=count(ok_BxTxS & stats.correct[..., None]),
        num_tokens=count(slot_BxTxS & mask[..., None]),
        num_nonfinite=count(slot_BxTxS & (mask & ~finite_BxT)[..., None]),
        extras=extras,
    )


def nll_chunk(
    batch_size: int,
    width: int,
    vocab: int,
    *,
    data: int = 1,
    context: int = 1,
    token_chunk: int = 0,
    budget: int = LOGITS_BUDGET,
) -> int:
    """Tokens of each row the NLL takes at once on a device, for `[batch_size, width]` batches
    of a model of `vocab` ids on a mesh of `data` x `context` devices: `token_chunk` where set
    (`model.token_chunk`), else `logits_chunk` of the device's rows and
    tokens (the `width - 1` targets, padded to a multiple of `2 * context`), so that one float32
    block of logits stays within `budget` bytes. 0: all at once."""
    if token_chunk:
        return token_chunk
    targets = width - 1
    if context > 1:
        targets = -(-targets // (2 * context)) * 2 * context
    return logits_chunk(-(-batch_size // data), targets // context, vocab, budget)


def logits_budget(mesh: Mesh) -> int:
    """Bytes one device's NLL may hold in one block of logits: `LOGITS_BUDGET`, shared on the
    CPU by the mesh's devices of this process (they use the host's one memory)."""
    local = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
    shared = sum(d.platform == "cpu" for d in local)
    return LOGITS_BUDGET // max(1, shared)


def _copy_stats(model, copy, targets, both_directions: bool) -> dict[str, jax.Array]:
    """A copy's per-token statistics against the model (`[B, T]` each): its `nll`, `kl` =
    KL(model || copy) and `same_top1` (`nll.token_stats` with the model as the reference), and
    with `both_directions` `kl_reverse` = KL(copy || model)."""
    s = token_stats(copy, targets, reference=model)
    found = {"nll": s.nll, "kl": s.kl, "same_top1": s.same_top1}
    if both_directions:
        found["kl_reverse"] = token_stats(model, targets, reference=copy).kl
    return found


def _context_order(row: dict[str, jax.Array], n: int) -> tuple[dict[str, jax.Array], np.ndarray]:
    """The step's `[B, T]` row arrays padded to a multiple of `2n` (segment 0, not scored) and
    laid out in the load-balanced order (`ppl_jax.models.layers.context.load_balanced_order`), split
    over `data` and `context`; and the order."""
    width = row["inputs"].shape[1]
    padded = -(-width // (2 * n)) * 2 * n
    order = context_lib.load_balanced_order(padded, n)
    spec = jax.sharding.PartitionSpec("data", context_lib.AXIS)

    def lay_out(x):
        x = jnp.pad(x, ((0, 0), (0, padded - width)))
        return jax.lax.with_sharding_constraint(jnp.take(x, jnp.asarray(order), axis=1), spec)

    return {k: lay_out(x) for k, x in row.items()}, order


def _per_token(output: HiddenStates | Logits | None) -> jax.Array | None:
    """The per-token part of a model's output (`[B, T, ...]`)."""
    if output is None:
        return None
    return output.logits if isinstance(output, Logits) else output.hidden


def _rebuilt(output, rows):
    """`output` with its per-token part replaced by `rows` (a chunk of its tokens)."""
    if output is None:
        return None
    return Logits(rows) if isinstance(output, Logits) else output._replace(hidden=rows)


def check_context(model: LanguageModel, mesh: Mesh, what: str = "the model") -> None:
    """Refuses a context axis for a model that cannot run under it (before any weight is read).

    Raises:
      ConfigError: `mesh.context > 1` for a model whose `context_parallel` is False.
    """
    n = int(dict(mesh.shape).get(context_lib.AXIS, 1))
    if n > 1 and not model.context_parallel:
        family = model.description.get("family") if isinstance(model.description, dict) else None
        name = f"{what} (family {family!r})" if family else what
        raise ConfigError(
            f"mesh.context={n} splits each window's tokens over devices in another order, which "
            f"{name} is not built for (only ppl_jax's own families, whose attention is "
            f"ppl_jax.models.layers.attention.attend, set LanguageModel.context_parallel); set "
            f"mesh.context=1."
        )
