"""`ppl-jax inspect DIR`: what a checkpoint stores, and how a mapping reads it. Wiring only.

    ppl-jax inspect /runs/llama/checkpoints
    ppl-jax inspect /runs/llama --architecture="maxtext:llama2-7b base_num_decoder_layers=2"

Prints the layout (where the steps, the item and the params are), the finalized steps, the items
of the latest step, and the stored params tree (name, shape, dtype; nothing of the arrays is
read). With an architecture (`--architecture`, or one the checkpoint carries) it also prints each
model weight with the stored tensor it comes from, or the one sentence naming the first unmatched
names. The first thing to run on a foreign checkpoint; the same options as `checkpoint.*`.
A user's mistake prints `ppl-jax: error: ...` and exits with status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from absl import logging


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, as for every other mistake
        self.exit(2, f"ppl-jax: error: bad flag: {message} (see ppl-jax inspect --help)\n")


def _ops(src) -> str:
    rule = src.rule
    parts = []
    if src.layer is not None:
        parts.append(f"layer {src.layer} of axis {rule['layers']['axis']}")
    if src.part is not None:
        parts.append(f"part {src.part} of axis {rule['split']['axis']}")
    for key in ("transpose", "reshape", "cut"):
        if key in rule:
            parts.append(f"{key} {rule[key]}")
    if "rope" in rule:
        parts.append("rope interleaved->half")
    if src.scale != 1.0:
        parts.append(f"x{src.scale:.6g}")
    if rule.get("plus_one"):
        parts.append("1+w")
    return ", ".join(parts)


def inspect(directory: str, args: argparse.Namespace, out=sys.stdout) -> None:
    """Prints the report (see the module docstring).

    Raises:
      PplJaxError: an unreadable checkpoint or a faulty setting.
    """
    from ppl_jax.checkpoints import foreign, open_checkpoint, orbax
    from ppl_jax.errors import PplJaxError
    from ppl_jax.runtime import paths

    options = {k: getattr(args, k) or "" for k in ("architecture", "mapping", "item", "params")}
    ckpt = open_checkpoint(directory, args.format, **options)
    kind = ckpt.kind()
    print(f"checkpoint {directory} ({kind})", file=out)
    steps = ckpt.steps()
    print(
        f"steps: {', '.join(map(str, steps)) if steps else '(none: one set of weights)'}", file=out
    )
    step = ckpt.resolve_step(args.step)
    if kind in ("hf", "hub"):
        print(f"description: {ckpt.description(step)}", file=out)
        return
    if kind == "own":
        layout = foreign.Layout(directory, False, orbax.STATE, "params")
    else:
        layout = ckpt.layout()
    if not layout.bare:
        folder = paths.join(layout.root, str(step))
        print(f"step {step} items: {', '.join(sorted(paths.listdir(folder)))}", file=out)
    shapes, names, prefix = foreign.stored_params(layout, directory, step)
    item = layout.item or "(the step folder)" if not layout.bare else "(bare directory)"
    print(f"item: {item}   params: {prefix or '(the whole item)'}   {len(shapes)} arrays", file=out)
    width = max((len(n) for n in shapes), default=0)
    for name, (shape, dtype) in shapes.items():
        print(f"  {name:<{width}}  {str(list(shape)):<20} {dtype}", file=out)
    if kind == "own":
        return
    if not args.architecture:
        print("mapping: give --architecture (and --mapping) to see the mapped weights", file=out)
        return
    model = ckpt.model(step=step)
    try:
        sources = ckpt.mapped(step, model.abstract_params)
    except PplJaxError as e:
        print(f"mapping: {e}", file=out)
        return
    print(f"mapped weights ({len(sources)}, every stored array used):", file=out)
    width = max(len(n) for n in sources)
    for target, src in sources.items():
        ops = _ops(src)
        print(f"  {target:<{width}} <- {src.stored}" + (f"  [{ops}]" if ops else ""), file=out)


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
    parser.add_argument("--format", default="auto", choices=["auto", "orbax", "hf"])
    parser.add_argument("--step", type=int, default=None, help="a step (default: the latest)")
    args = parser.parse_args(argv)
    logging.set_verbosity(logging.ERROR)  # Orbax's informational logs are not for users
    try:
        inspect(os.path.expanduser(args.dir), args)
    except PplJaxError as e:
        print(f"ppl-jax: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
