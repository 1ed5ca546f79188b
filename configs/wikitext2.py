"""WikiText-2 test (word-level form, `<unk>` kept) as one document; its path is the config argument:

    ppl-jax --config=configs/wikitext2.py:/path/to/wikitext-2/test.txt

ppl_jax does not ship WikiText-2 (Merity et al. 2016, CC BY-SA 3.0).
"""

import os

from ppl_jax.config.defaults import get_config as _default

WHERE = (
    "WikiText-2 (Merity et al. 2016) is not shipped with ppl_jax: download its test split "
    "(wiki.test.tokens of the Hugging Face dataset Salesforce/wikitext, config wikitext-2-v1) "
    "and pass its path as --config=configs/wikitext2.py:/path/to/wiki.test.tokens"
)


def get_config(path: str | None = None):
    """The default config on the WikiText-2 test file at `path` (format `text`).

    Raises FileNotFoundError (an OSError, which the command line prints as one paragraph) when
    `path` is not given or names no file, saying where WikiText-2 comes from.
    """
    if not path or not os.path.isfile(path):
        given = f"no such file '{path}'" if path else "no WikiText-2 test file given"
        raise FileNotFoundError(f"configs/wikitext2.py: {given}; {WHERE}")
    c = _default()
    c.data.name = "wikitext-2-test"
    c.data.path = path
    c.data.format = "text"
    return c
