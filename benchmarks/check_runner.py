"""What the device checks (`benchmarks.gpu_check`, `benchmarks.tpu_check`) share: each part in
its own process under its own time limit, the parts in order within the check's total, one JSON
rewritten after each part."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def env(big: bool = False) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
    if big:
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = "0.92"
    return env


def run(args: list[str], seconds: float, env: dict[str, str]) -> dict:
    """`args` in a subprocess under `seconds`: its exit code, wall time and the end of its
    output."""
    t0 = time.perf_counter()
    try:
        done = subprocess.run(
            args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=max(seconds, 1)
        )
        code, out = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as e:
        code = "timed out"
        out = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(
            errors="replace"
        )
    return {"exit": code, "seconds": round(time.perf_counter() - t0, 1), "log_tail": out[-3000:]}


def json_rows(path: str) -> list | dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def part_families(seconds: float, tiny: bool = False, families: str = "") -> dict:
    """`benchmarks.families_check` in its own process, its families (`families`: a comma list,
    else every golden family) within `seconds` less the process's start (`tiny`: its CPU
    mode)."""
    with tempfile.TemporaryDirectory() as work:
        path = os.path.join(work, "families.json")
        args = [sys.executable, "-m", "benchmarks.families_check", f"--out={path}",
                f"--seconds={max(seconds - 20, 1)}", *(["--tiny"] if tiny else []),
                *([f"--families={families}"] if families else [])]  # fmt: skip
        got = run(args, seconds, env(big=True))
        return {**got, "result": json_rows(path)}


def _write(path: str, report: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    os.replace(tmp, path)


def run_parts(
    check: str,
    parts: dict[str, Callable[[float], dict]],
    budgets: dict[str, int],
    names: list[str],
    total: float,
    out: str,
) -> dict:
    """The parts `names` in order, each within `min(budgets[name], what is left of total)`
    seconds (one not started with under 5 seconds left), the report written to `out` after each.

    Raises:
      SystemExit: an unknown part, named in one sentence."""
    unknown = [p for p in names if p not in parts]
    if unknown:
        raise SystemExit(f"{check}: unknown parts {unknown}; the parts are {list(parts)}.")
    start = time.perf_counter()
    report: dict = {"parts": {}, "budgets": {p: budgets[p] for p in names}}
    for name in names:
        left = total - (time.perf_counter() - start)
        if left < 5:
            report["parts"][name] = {"exit": "not run: the check's time was spent"}
        else:
            report["parts"][name] = parts[name](min(budgets[name], left))
        report["seconds"] = round(time.perf_counter() - start, 1)
        _write(out, report)
        print(json.dumps({name: report["parts"][name].get("exit")}), flush=True)
    return report
