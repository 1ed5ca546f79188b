"""Reading finished runs: the `ppl-jax compare`, `report` and `view` tools.

- `compare`: B minus A with paired bootstrap intervals, from the runs' per-unit sums
  (`differences` says why two runs' data cannot be paired, `pairs` finds the units files);
- `report`: a results store as a table, a CSV and a figure (`load`, `table`);
- `view`: one offline HTML page of a run's per-token surprisal.
"""

from etils import epy as _epy

with _epy.lazy_api_imports(globals()):
    from ppl_jax.analysis.compare import differences, pairs
    from ppl_jax.analysis.report import load, table

__all__ = [
    "differences",
    "load",
    "pairs",
    "table",
]
