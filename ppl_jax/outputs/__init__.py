"""A run's files: its output folder (`OutputDir`: a lock, complete-or-absent files), the
results store (`ResultsStore`, `results.jsonl`, and its sink `StoreSink`), `results.json`
(`ResultsJsonSink`), the sinks a run writes its records to (`Sink`), and figures (`FigureSpec`).
"""

from etils import epy as _epy

with _epy.lazy_api_imports(globals()):
    from ppl_jax.outputs.figures import FigureSpec
    from ppl_jax.outputs.folder import OutputDir
    from ppl_jax.outputs.results_json import ResultsJsonSink
    from ppl_jax.outputs.sinks import Sink, StoreSink
    from ppl_jax.outputs.store import ResultsStore

__all__ = [
    "FigureSpec",
    "OutputDir",
    "ResultsJsonSink",
    "ResultsStore",
    "Sink",
    "StoreSink",
]
