"""`ppl-jax inspect DIR`: what a checkpoint stores, and how a mapping reads it. Wiring only.

    ppl-jax inspect /runs/llama/checkpoints
    ppl-jax inspect /runs/llama --architecture="maxtext:llama2-7b base_num_decoder_layers=2"

Prints which reader reads the checkpoint and why (the markers it found:
`ppl_jax.checkpoints.opener.choose`), its finalized steps, the reader's layout (where the steps,
items, params, shards and tokenizer are), the stored params tree (name, shape, dtype; nothing of
the arrays is read; in natural order, `blk.2` before `blk.10`), the architecture, whether the
output head is tied to the embedding, and the tokenizer with its BOS policy. With an architecture (`--architecture`, or
one the checkpoint carries) it also prints each model weight with the stored tensor it comes from,
or the one sentence naming the first unmatched names. The first thing to run on a foreign
checkpoint; the same options as `checkpoint.*`. A user's mistake prints `ppl-jax: error: ...` and
exits with status 2, and so does any other failure (in one line, never a traceback).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import NoReturn

from absl import logging


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, as for every other mistake
        self.exit(2, f"ppl-jax: error: bad flag: {message} (see ppl-jax inspect --help)\n")


def inspect(directory: str, args: argparse.Namespace, out=None) -> None:
    """Prints the report (see the module docstring) to `out` (None: stdout).

    Raises:
      PplJaxError: an unreadable checkpoint or a faulty setting.
    """
    out = out or sys.stdout
    from ppl_jax.checkpoints import architecture
    from ppl_jax.checkpoints.checkpoint import Options
    from ppl_jax.checkpoints.opener import choose
    from ppl_jax.errors import PplJaxError

    options = Options(*(getattr(args, k) or "" for k in ("architecture", "mapping", "item",
                                                         "params")))  # fmt: skip
    reader, why = choose(directory, args.format, options)
    ckpt = reader(directory, options, why)
    print(f"checkpoint {directory}", file=out)
    print(f"reader: {reader.__name__} ({reader.layout_name}), chosen for {why}", file=out)
    steps = ckpt.steps()
    print(
        f"steps: {', '.join(map(str, steps)) if steps else '(none: one set of weights)'}", file=out
    )
    step = ckpt.resolve_step(args.step)
    for line in ckpt.layout_lines(step):
        print(line, file=out)
    stored = ckpt.stored(step)
    print(f"stored params: {len(stored)} arrays", file=out)
    width = max((len(n) for n in stored), default=0)
    for name in sorted(stored, key=natural_key):
        shape, dtype = stored[name]
        print(f"  {name:<{width}}  {str(list(shape)):<20} {dtype}", file=out)
    try:
        model = architecture.resolve(ckpt, step).model()
    except PplJaxError as e:
        if args.architecture:
            raise  # the user's setting is faulty: one sentence, status 2
        print(f"architecture: {e}", file=out)
        print("mapping: give --architecture (and --mapping) to see the mapped weights", file=out)
        return
    desc = model.description
    print(
        f"architecture: {desc.get('family', '?')}, {desc.get('num_layers', '?')} layers, "
        f"vocabulary {model.vocab_size}, {model.max_positions} positions"
        + (" (checkpoint.architecture)" if args.architecture else " (carried)"),
        file=out,
    )
    tied = "lm_head" not in model.abstract_params
    print(f"output head: {'tied to the embedding' if tied else 'its own (lm_head)'}", file=out)
    try:
        tok = ckpt.tokenizer(step)
        print(
            f"tokenizer: {tok.name + bos_policy(tok) if tok is not None else 'none carried'}",
            file=out,
        )
    except PplJaxError as e:
        print(f"tokenizer: {e}", file=out)
    for line in ckpt.mapping_report(step, model.abstract_params):
        print(line, file=out)


def natural_key(name: str) -> list[tuple[int, int | str]]:
    """A sort key that orders the numbers in a name as numbers: `blk.2.x` before `blk.10.x`."""
    return [(1, int(t)) if t.isdigit() else (0, t) for t in re.split(r"(\d+)", name) if t]


def bos_policy(tok) -> str:
    """`, BOS 1 added (eval.add_bos=auto)`, `, BOS 1 not added ...` or `, no BOS token`."""
    if tok.bos_id is None:
        return ", no BOS token (eval.add_bos=auto adds none)"
    added = "added" if tok.add_bos_default else "not added"
    return f", BOS {tok.bos_id} {added} by default (eval.add_bos=auto)"


def main(argv: list[str] | None = None) -> int:
    """`ppl-jax inspect DIR [--architecture=...] [--mapping=...] [--item] [--params] [--step]`."""
    from ppl_jax.errors import PplJaxError

    parser = _Parser(
        prog="ppl-jax inspect",
        description="What a checkpoint stores (steps, items, params tree), and with an "
        "architecture how a mapping reads it.",
    )
    parser.add_argument("dir", metavar="DIR", help="the checkpoint (as checkpoint.dir)")
    parser.add_argument("--architecture", help="as checkpoint.architecture")
    parser.add_argument("--mapping", help="as checkpoint.mapping")
    parser.add_argument("--item", help="as checkpoint.item")
    parser.add_argument("--params", help="as checkpoint.params")
    parser.add_argument(
        "--format",
        default="auto",
        help="as checkpoint.format (auto, orbax, hf, levanter, easydel, t5x, gguf)",
    )
    parser.add_argument("--step", type=int, default=None, help="a step (default: the latest)")
    args = parser.parse_args(argv)
    logging.set_verbosity(logging.ERROR)  # Orbax's informational logs are not for users
    try:
        inspect(os.path.expanduser(args.dir), args)
    except PplJaxError as e:
        print(f"ppl-jax: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # a reader's own failure: one line, never a traceback
        text = " ".join(str(e).split())[:300]
        print(
            f"ppl-jax: error: {args.dir!r} cannot be inspected ({type(e).__name__}: {text}); "
            f"this is a bug of ppl_jax or of the checkpoint's library: please report it.",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
