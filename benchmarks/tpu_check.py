"""The TPU check, for the first session with a TPU: in one command of at most 8 minutes on one
chip, each part bounded in time and written into one JSON as it finishes (`gpu_check`'s runner,
`benchmarks.check_runner`).

    python -m benchmarks.tpu_check                     # all parts, into tpu_check.json
    python -m benchmarks.tpu_check --tiny --out=/tmp/t.json   # on a CPU: golden widths, 64 tokens

Run from the repository root with the project's source importable (`PYTHONPATH=.`), on a
machine whose JAX sees a TPU. The parts, each in its own process under its own time limit
(`BUDGETS`, in seconds, cut to what is left of `--total`):

- `families`: each golden family's layers at its released model's widths, one row of 8,192
  tokens in bfloat16 under `model.attention=auto` (`benchmarks.families_check`): tokens/s, MFU
  against the chip's bfloat16 peak (v5e 197e12, v5p 459e12, v6e 918e12 FLOP/s, from
  `device_kind`), the kernel each kind of layer ran (splash, or xla where splash cannot) and the
  attention note; the families its budget does not reach are listed as skipped;
- `llama_8b`: the Llama 3.1 8B shape (32 layers, `benchmarks.shapes.LLAMA_8B`) the same way.
"""

from __future__ import annotations

from absl import app, flags

from benchmarks import check_runner

# Seconds each part may take (the whole check: at most `--total`).
BUDGETS = {"families": 270, "llama_8b": 180}
_PARTS = flags.DEFINE_list("parts", list(BUDGETS), "The parts to run, in order.")
_OUT = flags.DEFINE_string("out", "tpu_check.json", "The JSON written after each part.")
_TOTAL = flags.DEFINE_integer("total", 480, "Seconds for the whole check.")
_TINY = flags.DEFINE_bool("tiny", False, "Golden widths and 64 tokens: to try on a CPU.")

PARTS = {
    "families": lambda seconds: check_runner.part_families(seconds, _TINY.value),
    "llama_8b": lambda seconds: check_runner.part_families(seconds, _TINY.value, "llama_8b"),
}


def main(argv: list[str]) -> None:
    del argv
    check_runner.run_parts("tpu_check", PARTS, BUDGETS, _PARTS.value, _TOTAL.value, _OUT.value)


if __name__ == "__main__":
    app.run(main)
