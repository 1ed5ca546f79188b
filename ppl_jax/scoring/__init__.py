"""Scoring: the jitted step that turns a batch of rows into sums (`Scorer`, with
`StepOptions` for what it gathers beyond them and `ScoreTotals` for what a dataset's steps add up
to), the NLL of each token from logits or hidden states (`token_nll`, `token_stats`), and the
observers a scoring loop reports to (`ScoreObserver`, `NonFiniteScores`).
"""

from etils import epy as _epy

with _epy.lazy_api_imports(globals()):
    from ppl_jax.scoring.nll import token_nll, token_stats
    from ppl_jax.scoring.observers import NonFiniteScores, ScoreObserver
    from ppl_jax.scoring.scorer import Scorer, ScoreTotals, StepOptions

__all__ = [
    "NonFiniteScores",
    "ScoreObserver",
    "ScoreTotals",
    "Scorer",
    "StepOptions",
    "token_nll",
    "token_stats",
]
