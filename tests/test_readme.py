"""The README's config-key table is the one `ppl-jax --help` prints (generated from the config)."""

import os

from ppl_jax.config.defaults import describe_keys

import helpers


def test_the_readme_lists_every_config_key_as_the_help_does():
    with open(os.path.join(helpers.REPO, "README.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    start = lines.index("| key | default | meaning |")
    end = lines.index("", start)
    assert lines[start + 2 : end] == [f"| `{k}` | {d} | {m} |" for k, d, m in describe_keys()]
