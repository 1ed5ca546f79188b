"""The README and the docs' generated page stay true to the code.

- `docs/reference/config.md` is what `docs/gen_config_keys.py` writes from
  `ppl_jax.config.describe_keys()` (the table `ppl-jax --help` prints): a key added, removed or
  re-described without rerunning the generator fails here.
- `README.md` stays short (under 200 lines) and its "Two commands" are exactly the two commands.
- Every `docs/...` file the README links to exists.
"""

import importlib.util
import os
import re

from ppl_jax.config.defaults import describe_keys

import helpers

TWO_COMMANDS = [
    "pip install . && ppl-jax                    # evaluate the demo checkpoint (built-in default)",
    "pip install '.[test]' && python -m pytest   # run the test suite (CPU, 8 fake devices)",
]


def _read(*parts: str) -> str:
    with open(os.path.join(helpers.REPO, *parts), encoding="utf-8") as f:
        return f.read()


def _generator():
    path = os.path.join(helpers.REPO, "docs", "gen_config_keys.py")
    spec = importlib.util.spec_from_file_location("gen_config_keys", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_config_page_is_the_generators_output():
    assert _read("docs", "reference", "config.md") == _generator().render()


def test_the_config_page_has_a_row_per_key_in_the_configs_order():
    lines = _generator().render().splitlines()
    start = lines.index("| key | default | meaning |")
    rows = lines[start + 2 :]
    keys = [k for k, _, _ in describe_keys()]
    assert [re.match(r"\| `([^`]+)` \|", row).group(1) for row in rows] == keys
    row = dict(zip(keys, rows, strict=True))
    # Cells that would break the table or vanish as HTML are escaped.
    assert "KL(reference \\|\\| model)" in row["reference.checkpoint.dir"]
    assert "eval/&lt;dataset&gt;/&lt;metric&gt;" in row["output.tensorboard"]
    assert all(line.count(" | ") == 2 for line in rows)


def test_the_readme_is_short_and_has_the_two_commands():
    lines = _read("README.md").splitlines()
    assert len(lines) < 200
    section = lines[lines.index("## Two commands") + 1 :]
    section = section[: next(i for i, line in enumerate(section) if line.startswith("## "))]
    start = section.index("```bash")
    block = section[start + 1 : section.index("```", start + 1)]
    assert block == TWO_COMMANDS
    assert any(
        "The test command runs the default tiers; see" in line for line in section
    ) and "docs/development.md" in "\n".join(section)


def test_the_readmes_links_into_docs_exist():
    links = re.findall(r"\]\((docs/[^)#]+)", _read("README.md"))
    assert len(links) >= 10
    missing = [link for link in links if not os.path.isfile(os.path.join(helpers.REPO, link))]
    assert missing == []
