"""`python -m ppl_jax.view RESULTS_DIR`: one offline HTML page of a run's per-token surprisal.

    python -m ppl_jax.view results/base                      # writes results/base/view.html
    python -m ppl_jax.view results/base --compare results/bf16 --out diff.html

Reads `RESULTS_DIR/tokens.parquet` (written with `output.tokens=true`; the schema is in
`ppl_jax.outputs.tokens`) and writes one self-contained HTML file (default `RESULTS_DIR/view.html`, or
`view_compare.html` with `--compare`; written atomically): no script, style sheet, font or image is
loaded from anywhere (a Content-Security-Policy of `default-src 'none'` makes the browser refuse
any), and the data travels inside the page as JSON. The page lists the documents by mean
surprisal (bits per token, -log2 p, from the NLL in float64) and shows a document's tokens in
order, coloured on a fixed scale of bits; hovering a token shows its text, probability exp(-NLL),
surprisal, predictive entropy, whether it was the model's first choice, the top-k alternatives
and, from a reference model, KL(reference || model) and the change of log-probability.

With `--compare OTHER`, both runs must have scored the same tokens (the same dataset, documents,
offsets and token ids); the page colours each token by the change of surprisal B - A in bits
(blue: B is less surprised, red: more) on a scale fitted to the page's changes (its outer bin at
the 99th percentile of |B - A|, rounded up to 1, 2 or 5 times a power of ten, at most 4 bits;
`view_data.diff_scale`), printed with the decimals that scale needs, and lists each document's
mean change.

Size: the page holds at most `--max_documents` documents (default 200) and `--max_tokens`
tokens (default 100,000). It keeps the documents with the highest mean surprisal (with
`--compare`, the largest mean change |B - A|), then fills the token budget in that order, each
document from its first scored token; a document that does not fit whole is cut, and once the
budget is spent the rest are left out. The page says what it left out. Values are printed with
4 decimals (probabilities with 4 significant digits).

With `--copy NAME` (a run of `study.copies`), the reference values shown are those of the copy
NAME against the original: KL(original || copy), the change of log-probability copy - original
and whether both put the same token first.

The data (the file read and checked, the selection, the embedded JSON) is
`ppl_jax.analysis.view_data`; the page itself (HTML, CSS, script) is `ppl_jax.analysis.view_page`. A user's mistake prints one line,
`ppl-jax view: error: ...`, and exits with status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, NoReturn

from ppl_jax.analysis.view_data import (
    DEFAULT_MAX_DOCUMENTS,
    DEFAULT_MAX_TOKENS,
    Run,
    first_difference,
    page_data,
    select,
)
from ppl_jax.analysis.view_page import render
from ppl_jax.analysis.view_scale import DIFF_EDGES
from ppl_jax.errors import ConfigError, DataError, PplJaxError
from ppl_jax.outputs.folder import OutputDir

PROG = "ppl-jax view"
__all__ = [
    "DIFF_EDGES",
    "Run",
    "first_difference",
    "main",
    "page_data",
    "select",
    "view",
    "write",
]


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
    copy: str | None = None,
) -> tuple[str, dict[str, Any]]:
    """Writes the token view of the run at `path` (a results folder or its tokens.parquet),
    compared with the run at `compare` if given, to `out` (default: `view.html`, or
    `view_compare.html` with `compare`, beside the first run's tokens.parquet); `copy`: a
    study's copy whose KL against the original the page shows.

    Returns:
      `(the page's path, the embedded data)`.

    Raises:
      DataError: a tokens.parquet is missing or unreadable, or the two runs scored other tokens.
      ConfigError: pyarrow is missing, or `out` cannot be written.
    """
    runs = [Run(path)] + ([Run(compare)] if compare else [])
    for run in runs if copy is not None else []:
        _choose_copy(run, copy)
    data = page_data(runs, max_documents, max_tokens)
    if out is None:
        name = "view_compare.html" if compare else "view.html"
        out = os.path.join(os.path.dirname(os.path.abspath(runs[0].path)), name)
    return write(render(data), out), data


def _choose_copy(run: Run, copy: str) -> None:
    """Shows the reference values of a study's copy `copy` (`kl/<copy>`, ...) for `run`.

    Raises:
      DataError: the run's file holds no such copy.
    """
    if f"kl/{copy}" not in run.columns:
        have = [c[3:] for c in run.columns if c.startswith("kl/")]
        raise DataError(
            f"{run.path} holds no copy {copy!r} (its copies: "
            f"{', '.join(have) or 'none; score them with study.copies'})."
        )
    run.copy = copy
    run.meta["reference"] = True


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, as for every other mistake
        self.exit(2, f"{PROG}: error: {message} (see --help)\n")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(
        prog="ppl-jax view",
        description="One offline HTML page of a run's per-token surprisal (from tokens.parquet, "
        "written with output.tokens=true), or of the change between two runs on the same data.",
    )
    parser.add_argument(
        "results", metavar="RESULTS_DIR", help="the run's output.dir (or its tokens.parquet)"
    )
    parser.add_argument(
        "--compare",
        metavar="OTHER_RESULTS_DIR",
        help="a second run on the same data: colours B - A",
    )
    parser.add_argument(
        "--out",
        metavar="PATH",
        help="the page (default: RESULTS_DIR/view.html, or view_compare.html with --compare)",
    )
    parser.add_argument(
        "--max_documents",
        metavar="N",
        type=int,
        default=DEFAULT_MAX_DOCUMENTS,
        help="documents in the page, the most surprising first (default %(default)s)",
    )
    parser.add_argument(
        "--max_tokens",
        metavar="N",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        help="tokens in the page, over all its documents (default %(default)s)",
    )
    parser.add_argument(
        "--copy",
        metavar="NAME",
        help="a study's copy (study.copies): show its KL against the original per token",
    )
    args = parser.parse_args(argv)
    for flag in ("max_documents", "max_tokens"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag}={getattr(args, flag)} must be at least 1")
    try:
        out, data = view(
            args.results, args.compare, args.out, args.max_documents, args.max_tokens, args.copy
        )
    except PplJaxError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    s = data["selection"]
    print(
        f"view: {out} ({s['shown_documents']:,} of {s['documents']:,} documents, "
        f"{s['shown_tokens']:,} tokens)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
