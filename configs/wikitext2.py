"""WikiText-2 test (word-level form, `<unk>` kept) from the shared data folder, as one document."""

import os

from ppl_jax.config import get_config as _default


def get_config():
    c = _default()
    c.data.name = "wikitext-2-test"
    here = os.path.dirname(os.path.abspath(__file__))
    c.data.path = os.path.join(here, "..", "..", "shared", "data", "wikitext-2", "test.txt")
    c.data.format = "text"
    return c
