"""`python -m ppl_jax.compare A B`: B minus A, with paired 95% bootstrap intervals.

    python -m ppl_jax.compare results/base results/quantized
    python -m ppl_jax.compare runs/a/results.json runs/b/results.json --samples 2000 --seed 1

A and B are output folders of two runs (or their `results.json` files); each holds `units.npz`,
the run's per-unit sums (`ppl_jax.metrics.uncertainty`). The runs must have scored the same data with
the same protocol: the same protocol name, `seq_len` and stride, the same data settings, the same
resampling units with the same bytes each (and, for windows, the same tokens each), and, with
the same tokenizer, the same scored token ids (the SHA-256 of the token stream that `units.npz`
records: a corpus and its upper-cased copy have the same bytes per unit, not the same ids; with
other tokenizers only the byte counts are checked, and the output says so). Otherwise the
command prints one line naming what differs and exits with status 2; so does a `units.npz` that
cannot be read (truncated, damaged). It prints, per dataset, the
difference in bits per byte and in NLL per token (nats), B minus A, each with a paired 95%
interval: every bootstrap replicate draws the same documents (or blocks of windows) for both
runs, so what the two models share (hard passages, easy ones) cancels out of the difference.
The replicates default to A's `metrics.bootstrap_samples` and `metrics.seed`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import numpy as np

from ppl_jax.errors import DataError, PplJaxError
from ppl_jax.metrics import uncertainty
from ppl_jax.outputs import files

UNITS = files.UNITS
DEFAULT_SAMPLES = 1000
# Fingerprint fields that say what was scored, and so must agree (data files are compared by
# the bytes of every unit instead of their paths, so that copies of a corpus compare).
SAME = {"protocol": ("name", "seq_len", "stride"), "data": ("format", "jsonl_field", "errors")}


def load(path: str) -> tuple[dict[str, Any], uncertainty.Units, dict[str, Any], str]:
    """Reads a run: `(results.json, its units, their identity, the folder)`.

    Raises:
      DataError: no results.json or units.npz there, or one that cannot be read.
    """
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    results_path = os.path.join(folder, files.RESULTS_JSON) if os.path.isdir(path) else path
    try:
        with open(results_path, encoding="utf-8") as f:
            results = json.load(f)
    except FileNotFoundError:
        raise DataError(
            f"{results_path} does not exist; give a run's output.dir or its results.json."
        ) from None
    except (OSError, ValueError) as e:
        raise DataError(f"{results_path} is not a readable results.json ({e}).") from None
    units, identity = uncertainty.read_npz(os.path.join(folder, UNITS))
    return results, units, identity, folder


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
    if (
        da.get("separator") != db.get("separator")
        and (ia.get("protocol") or {}).get("name") == "sliding"
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


def compare(path_a: str, path_b: str, samples: int | None, seed: int | None) -> list[dict]:
    """One record per dataset (one today): `dataset`, `protocol`, `seq_len`, `paths` (the runs'
    folders), `tokens_match` (NLL per token compares only then), and the keys of
    `uncertainty.paired_difference` (`a`, `b`: the runs' metrics; the differences, B - A).

    Raises:
      DataError: a run cannot be read, or the two scored different data or protocols.
    """
    ra, ua, ia, fa = load(path_a)
    rb, ub, ib, fb = load(path_b)
    changed = differences((ua, ia), (ub, ib))
    if changed:
        raise DataError(
            f"{fa} and {fb} were not scored on the same data and protocol ({'; '.join(changed)}); "
            f"compare two runs of one corpus and protocol."
        )
    own = ra.get("intervals") or {}
    samples = samples if samples is not None else int(own.get("samples", DEFAULT_SAMPLES))
    seed = seed if seed is not None else int(own.get("seed", 0))
    diff = uncertainty.paired_difference(ua, ub, samples, seed)
    name = (ra.get("data") or {}).get("name") or "?"
    protocol = ra.get("protocol") or {}
    return [
        {
            "dataset": name,
            "protocol": protocol.get("name"),
            "seq_len": protocol.get("seq_len"),
            "paths": {"a": fa, "b": fb},
            "tokens_match": bool(np.array_equal(ua.tokens, ub.tokens)),
            "text_checked": digests_comparable(ia, ib),
            **diff,
        }
    ]


def format_table(records: list[dict]) -> str:
    """The printed comparison: per dataset, A, B, B - A and the paired 95% interval."""
    lines = []
    for r in records:
        lines += [
            f"A: {r['paths']['a']}",
            f"B: {r['paths']['b']}",
            f"data: {r['dataset']}, {r['protocol']} seq_len={r['seq_len']}; paired "
            f"{r['method'].split(' (')[0]} ({r['units']:,} {r['unit']}s"
            + (f" in blocks of {r['block_length']}" if r["block_length"] > 1 else "")
            + f", {r['samples']:,} samples, seed {r['seed']})",
            f"{'':<15}{'A':>10}{'B':>10}{'B - A':>11}   95% interval",
        ]
        for key, label in (("bits_per_byte", "bits per byte"), ("nll_per_token", "NLL per token")):
            d, (lo, hi) = r[key]["difference"], r[key]["interval"]
            lines.append(
                f"{label:<15}{r['a'][key]:>10.4f}{r['b'][key]:>10.4f}{d:>+11.4f}   "
                f"[{lo:+.4f}, {hi:+.4f}]"
            )
        if not r["tokens_match"]:
            lines.append("(the runs' token counts differ: NLL per token is not comparable)")
        if not r["text_checked"]:
            lines.append(
                "(the text is checked by byte counts only: other tokenizers, or a units.npz "
                "without the scored tokens' digest)"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ppl-jax compare",
        description="B minus A in bits per byte and NLL per token, with paired 95% bootstrap "
        "intervals, for two runs on the same data.",
    )
    parser.add_argument("a", help="run A: its output.dir or results.json")
    parser.add_argument("b", help="run B: its output.dir or results.json")
    parser.add_argument("--samples", type=int, default=None, help="replicates (default: A's)")
    parser.add_argument("--seed", type=int, default=None, help="seed (default: A's)")
    args = parser.parse_args(argv)
    if args.samples is not None and args.samples < 1:
        parser.error(f"--samples={args.samples} must be at least 1")
    try:
        records = compare(args.a, args.b, args.samples, args.seed)
    except PplJaxError as e:
        print(f"ppl_jax.analysis.compare: error: {e}", file=sys.stderr)
        return 2
    print(format_table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
