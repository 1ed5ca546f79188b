"""`ppl-jax compare A [B]`: B minus A, with paired 95% bootstrap intervals.

    ppl-jax compare results/base results/quantized
    ppl-jax compare results/sweep --step_a 1000 --step_b 2000      # two steps of one sweep
    ppl-jax compare results/suite results/suite_b --dataset web     # one dataset of a suite
    ppl-jax compare runs/a runs/b --samples 2000 --seed 1 --digits 8 --json

A and B are output folders of runs (or their `results.json` files; B defaults to A, for two
steps of one sweep); each holds the per-unit sums of every (step, dataset) it scored
(`units*.npz`, `ppl_jax.analysis.compare_units`). `--step_a`/`--step_b` (or `--step` for both;
default: each run's last step) and `--dataset` (repeatable; default: every dataset the two
share at those steps) choose what is compared. Each pair must have scored the same data with the
same protocol: the same protocol name, `seq_len` and stride, the same data settings, the same
resampling units with the same bytes each (and, for windows, the same tokens each), and, with
the same tokenizer, the same scored token ids (the SHA-256 of the token stream that `units.npz`
records: a corpus and its upper-cased copy have the same bytes per unit, not the same ids; with
other tokenizers only the byte counts are checked, and the output says so). Otherwise the
command prints one line naming what differs and exits with status 2; so does a `units.npz` that
cannot be read (truncated, damaged), a step or dataset the run does not hold, or a bad flag
(`ppl-jax compare: error: ...`, as every tool). It prints, per dataset, the difference in bits
per byte and in NLL per token (nats), B minus A, each with a paired 95% interval: every
bootstrap replicate draws the same documents (or blocks of windows) for both runs, so what the
two models share (hard passages, easy ones) cancels out of the difference. Values are printed
with enough decimals to show the difference and its interval to three significant digits (at
least 4; `--digits N` fixes them); `--json` prints the records with every float in full. The
replicates default to A's `metrics.bootstrap_samples` and `metrics.seed`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, NoReturn

import numpy as np

from ppl_jax.analysis.compare_units import LATEST, UnitsFile, choose, open_run
from ppl_jax.errors import DataError, PplJaxError
from ppl_jax.metrics import uncertainty
from ppl_jax.plans import protocols

PROG = "ppl-jax compare"
DEFAULT_SAMPLES = 1000
MAX_DIGITS = 15
_UNSET = object()
# Fingerprint fields that say what was scored, and so must agree (data files are compared by
# the bytes of every unit instead of their paths, so that copies of a corpus compare).
SAME = {"protocol": ("name", "seq_len", "stride"), "data": ("format", "jsonl_field", "errors")}


def differences(
    a: tuple[uncertainty.Units, dict[str, Any]], b: tuple[uncertainty.Units, dict[str, Any]]
) -> list[str]:
    """What differs between two runs' scored data, one phrase each (empty: they compare)."""
    (ua, ia), (ub, ib) = a, b
    out = []
    for part, fields in SAME.items():
        pa, pb = ia.get(part) or {}, ib.get(part) or {}
        out += [
            f"{part}.{k}: {json.dumps(pa.get(k))} -> {json.dumps(pb.get(k))}"
            for k in fields
            if pa.get(k) != pb.get(k)
        ]
    da, db = ia.get("data") or {}, ib.get("data") or {}
    rules = protocols.PROTOCOLS.get((ia.get("protocol") or {}).get("name"))
    if (
        rules is not None
        and da.get("separator") != db.get("separator")
        and rules.between(da.get("separator")) != rules.between(db.get("separator"))
    ):
        out.append("data.separator differs")
    if out:
        return out
    if ua.kind != ub.kind or ua.count != ub.count:
        return [f"{ua.count} {ua.kind}s -> {ub.count} {ub.kind}s"]
    if not np.array_equal(ua.bytes, ub.bytes):
        return [f"the bytes of {int(np.sum(ua.bytes != ub.bytes))} {ua.kind}s differ"]
    if ua.kind == "window" and not np.array_equal(ua.tokens, ub.tokens):
        return [f"the tokens of {int(np.sum(ua.tokens != ub.tokens))} windows differ"]
    if digests_comparable(ia, ib) and ia["tokens_digest"] != ib["tokens_digest"]:
        return [
            f"the scored token ids differ (digest {ia['tokens_digest'][:12]} -> "
            f"{ib['tokens_digest'][:12]}) with the same tokenizer, so the text differs though "
            f"every {ua.kind} has the same byte count"
        ]
    return []


def digests_comparable(ia: dict[str, Any], ib: dict[str, Any]) -> bool:
    """Whether the runs' scored-token digests must agree for the runs to share their text:
    both identities hold one (units.npz files written before them do not), and the runs used
    the same tokenizer and placed the same BOS and prefix tokens. Runs with other tokenizers
    (bits per byte compares across tokenizers) are checked by byte counts only."""
    if not (ia.get("tokens_digest") and ib.get("tokens_digest")):
        return False
    pa, pb = ia.get("protocol") or {}, ib.get("protocol") or {}
    same_tokens = all(pa.get(k) == pb.get(k) for k in ("add_bos", "prefix_id"))
    return same_tokens and ia.get("tokenizer") == ib.get("tokenizer")


def pairs(
    path_a: str, path_b: str, step_a: Any, step_b: Any, datasets: list[str] | None
) -> tuple[list[tuple[UnitsFile, UnitsFile]], tuple[int | None, int | None]]:
    """The (A, B) units files to compare, and A's own bootstrap samples and seed.

    Raises:
      DataError: a run cannot be read, holds no such step or dataset, or the two share no
        dataset.
    """
    a, b = open_run(path_a), open_run(path_b)
    chosen_a = choose(a, step_a, datasets, "A")
    chosen_b = choose(b, step_b, datasets, "B")
    by_name = {u.dataset: u for u in chosen_b}
    found = [(u, by_name[u.dataset]) for u in chosen_a if u.dataset in by_name]
    if not found and len(chosen_a) == len(chosen_b) == 1:  # two runs of one dataset each
        found = [(chosen_a[0], chosen_b[0])]
    if not found:
        raise DataError(
            f"runs A ({a.folder}) and B ({b.folder}) share no dataset at the steps chosen (A: "
            f"{', '.join(u.dataset for u in chosen_a)}; B: "
            f"{', '.join(u.dataset for u in chosen_b)}); name one with --dataset."
        )
    return found, a.bootstrap_defaults()


def compare(
    path_a: str,
    path_b: str,
    samples: int | None,
    seed: int | None,
    step_a: Any = LATEST,
    step_b: Any = LATEST,
    datasets: list[str] | None = None,
) -> list[dict]:
    """One record per dataset compared: `dataset`, `steps` (A's and B's), `protocol`,
    `seq_len`, `paths` (the units files), `tokens_match` (NLL per token compares only then),
    `text_checked`, and the keys of `uncertainty.paired_difference` (`a`, `b`: the runs'
    metrics; the differences, B - A).

    Args:
      path_a, path_b: output folders (or their results.json) of the runs A and B.
      samples, seed: the bootstrap's replicates and seed (None: A's own, else 1000 and 0).
      step_a, step_b: the checkpoint step of each (`LATEST`: its last; None: a checkpoint
        without steps).
      datasets: the datasets to compare (None: every dataset the two share at those steps).

    Raises:
      DataError: a run cannot be read or does not hold the step or dataset, or the two scored
        different data or protocols.
    """
    found, (own_samples, own_seed) = pairs(path_a, path_b, step_a, step_b, datasets)
    samples = samples if samples is not None else int(own_samples or DEFAULT_SAMPLES)
    seed = seed if seed is not None else int(own_seed or 0)
    records = []
    for fa, fb in found:
        ua, ia = uncertainty.read_npz(fa.path)
        ub, ib = uncertainty.read_npz(fb.path)
        changed = differences((ua, ia), (ub, ib))
        if changed:
            raise DataError(
                f"{fa.path} and {fb.path} were not scored on the same data and protocol "
                f"({'; '.join(changed)}); compare two runs of one corpus and protocol."
            )
        protocol = ia.get("protocol") or {}
        records.append(
            {
                "dataset": fa.dataset
                if fa.dataset == fb.dataset
                else f"{fa.dataset} | {fb.dataset}",
                "steps": {"a": fa.step, "b": fb.step},
                "protocol": protocol.get("name"),
                "seq_len": protocol.get("seq_len"),
                "paths": {"a": fa.path, "b": fb.path},
                "tokens_match": bool(np.array_equal(ua.tokens, ub.tokens)),
                "text_checked": digests_comparable(ia, ib),
                **uncertainty.paired_difference(ua, ub, samples, seed),
            }
        )
    return records


def decimals(records: list[dict]) -> int:
    """Decimals that show every difference and interval bound to three significant digits
    (at least 4, at most `MAX_DIGITS`)."""
    smallest = math.inf
    for r in records:
        for key in ("bits_per_byte", "nll_per_token"):
            values = [r[key]["difference"], *r[key]["interval"]]
            values += [r[key]["interval"][1] - r[key]["interval"][0]]
            smallest = min([smallest, *(abs(v) for v in values if v and math.isfinite(v))])
    if not math.isfinite(smallest):
        return 4
    return int(min(MAX_DIGITS, max(4, 2 - math.floor(math.log10(smallest)))))


def format_table(records: list[dict], digits: int | None = None) -> str:
    """The printed comparison: per dataset, A, B, B - A and the paired 95% interval, with
    `digits` decimals (None: `decimals(records)`)."""
    d = decimals(records) if digits is None else digits
    width = max(10, d + 6)
    lines = []
    for r in records:
        steps = r["steps"]
        lines += [
            f"A: {r['paths']['a']}" + (f" (step {steps['a']})" if steps["a"] is not None else ""),
            f"B: {r['paths']['b']}" + (f" (step {steps['b']})" if steps["b"] is not None else ""),
            f"data: {r['dataset']}, {r['protocol']} seq_len={r['seq_len']}; paired "
            f"{r['method'].split(' (')[0]} ({r['units']:,} {r['unit']}s"
            + (f" in blocks of {r['block_length']}" if r["block_length"] > 1 else "")
            + f", {r['samples']:,} samples, seed {r['seed']})",
            f"{'':<15}{'A':>{width}}{'B':>{width}}{'B - A':>{width + 1}}   95% interval",
        ]
        for key, label in (("bits_per_byte", "bits per byte"), ("nll_per_token", "NLL per token")):
            diff, (lo, hi) = r[key]["difference"], r[key]["interval"]
            lines.append(
                f"{label:<15}{r['a'][key]:>{width}.{d}f}{r['b'][key]:>{width}.{d}f}"
                f"{diff:>+{width + 1}.{d}f}   [{lo:+.{d}f}, {hi:+.{d}f}]"
            )
        if not r["tokens_match"]:
            lines.append("(the runs' token counts differ: NLL per token is not comparable)")
        if not r["text_checked"]:
            lines.append(
                "(the text is checked by byte counts only: other tokenizers, or a units.npz "
                "without the scored tokens' digest)"
            )
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, as for every other mistake
        self.exit(2, f"{PROG}: error: {message} (see --help)\n")


def _step(text: str) -> Any:
    """A step flag: an integer, `latest`, or `none` (a checkpoint without steps)."""
    if text in (LATEST, "none"):
        return None if text == "none" else LATEST
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a step: give an integer, 'latest' or 'none'"
        ) from None


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(
        prog=PROG,
        description="B minus A in bits per byte and NLL per token, with paired 95% bootstrap "
        "intervals, for two runs (or two steps of one run) on the same data.",
    )
    parser.add_argument("a", help="run A: its output.dir or results.json")
    parser.add_argument("b", nargs="?", help="run B (default: A, for two steps of one run)")
    parser.add_argument(
        "--step", type=_step, default=LATEST, help="the step of both runs (default: each's last)"
    )
    for which in ("a", "b"):
        parser.add_argument(
            f"--step_{which}",
            type=_step,
            default=_UNSET,
            help=f"{which.upper()}'s step: an integer, 'latest' or 'none' (default: --step)",
        )
    parser.add_argument(
        "--dataset",
        action="append",
        metavar="NAME",
        help="a dataset to compare, repeatable (default: every dataset both runs hold)",
    )
    parser.add_argument("--samples", type=int, default=None, help="replicates (default: A's)")
    parser.add_argument("--seed", type=int, default=None, help="seed (default: A's)")
    parser.add_argument(
        "--digits", type=int, default=None, help="decimals printed (default: enough to show B - A)"
    )
    parser.add_argument(
        "--json", action="store_true", help="print the records as JSON, every float in full"
    )
    args = parser.parse_args(argv)
    if args.samples is not None and args.samples < 1:
        parser.error(f"--samples={args.samples} must be at least 1")
    if args.digits is not None and not 0 <= args.digits <= MAX_DIGITS:
        parser.error(f"--digits={args.digits} must be 0 to {MAX_DIGITS}")
    step_a = args.step if args.step_a is _UNSET else args.step_a
    step_b = args.step if args.step_b is _UNSET else args.step_b
    try:
        records = compare(
            args.a, args.b or args.a, args.samples, args.seed, step_a, step_b, args.dataset
        )
    except PplJaxError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(records, indent=2, allow_nan=False))
    else:
        print(format_table(records, args.digits))
    return 0


if __name__ == "__main__":
    sys.exit(main())
