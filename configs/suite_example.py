"""A suite of three held-out datasets from the shared data folder (not shipped with ppl_jax):
WikiText-2 test (encyclopedia), Tiny Shakespeare (plays) and Botchan (a novel), each reported
alone and averaged (micro, macro, and macro per `domain` tag). Its folder is the argument:

    ppl-jax --config=configs/suite_example.py:../shared/data --config.checkpoint.step=all

Each dataset is capped at 64 documents (the first ones) so that the demo model scores the suite
in about a minute on a CPU; set `max_documents=0` for the whole of each.
"""

import os

from ml_collections import config_dict

from ppl_jax.config.defaults import get_config as _default

FILES = {
    "wikitext-2": "wikitext-2/test.txt",
    "tinyshakespeare": "tinyshakespeare/input.txt",
    "botchan": "botchan/botchan.txt",
}


def get_config(folder: str | None = None):
    """The default config with `suite` set to the three datasets under `folder`.

    Raises FileNotFoundError (printed as one paragraph) when a file is missing.
    """
    if not folder:
        raise FileNotFoundError(
            "configs/suite_example.py needs the shared data folder: "
            "--config=configs/suite_example.py:/path/to/shared/data"
        )
    for name, rel in FILES.items():
        if not os.path.isfile(os.path.join(folder, rel)):
            raise FileNotFoundError(
                f"configs/suite_example.py: no {name} at {os.path.join(folder, rel)!r}; give the "
                f"folder that holds {', '.join(FILES.values())}."
            )
    c = _default()
    c.suite = (
        config_dict.ConfigDict(
            {
                "name": "wikitext-2",
                "path": os.path.join(folder, FILES["wikitext-2"]),
                "format": "wikitext",
                "tags": "domain=encyclopedia",
                "max_documents": 16,
            }
        ),
        config_dict.ConfigDict(
            {
                "name": "tinyshakespeare",
                "path": os.path.join(folder, FILES["tinyshakespeare"]),
                "format": "lines",
                "tags": "domain=fiction",
                "max_documents": 64,
            }
        ),
        config_dict.ConfigDict(
            {
                "name": "botchan",
                "path": os.path.join(folder, FILES["botchan"]),
                "format": "lines",
                "tags": "domain=fiction",
                "max_documents": 64,
            }
        ),
    )
    return c
