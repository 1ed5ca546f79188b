"""The `ppl-jax` tools by name (`SUBCOMMANDS`): a module of its own, importing nothing, so that
`ppl-jax TOOL ...` reaches its tool without importing the config and the layers below it
(`ppl_jax.cli.help` does: 2.5 s on a quiet CPU, 10 s on a loaded one)."""

SUBCOMMANDS = {
    "report": "a run's results store as a table, a CSV and a plot",
    "compare": "B minus A, with paired 95% bootstrap intervals",
    "view": "one offline HTML page of a run's per-token surprisal",
    "convert": "a Hugging Face checkpoint directory into a ppl_jax Orbax checkpoint",
    "inspect": "what a checkpoint stores (steps, items, params tree) and how a mapping reads it",
}
