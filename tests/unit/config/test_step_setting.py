"""`checkpoint.step`: every part of a list, range or single step is a step number (or a hub step
revision `step1000`); anything else is one sentence naming it (issue 26: `100,abc` scored step
100 alone, and `-5` was read as step 5)."""

from __future__ import annotations

import pytest

from ppl_jax.config import defaults, settings
from ppl_jax.errors import ConfigError


def _spec(step):
    c = defaults.get_config()
    c.checkpoint.step = step
    return settings.from_config(c).steps


@pytest.mark.parametrize(
    "step, kind, steps",
    [
        ("latest", "latest", ()),
        ("all", "all", ()),
        ("100", "one", (100,)),
        ("0", "one", (0,)),
        ("300,100,200", "list", (100, 200, 300)),
        ("step1000,step2000", "list", (1000, 2000)),
        ("10:30:10", "range", (10, 30, 10)),
        ("10:30", "range", (10, 30, 1)),
    ],
)
def test_steps_that_are_steps(step, kind, steps):
    got = _spec(step)
    assert (got.kind, got.steps) == (kind, steps)


@pytest.mark.parametrize(
    "step, named",
    [
        ("100,abc", "'abc' is not a step number"),
        ("-5", "'-5' is not a step number"),
        ("100,-5", "'-5' is not a step number"),
        ("abc", "'abc' is not a step number"),
        ("1000,", "'' is not a step number"),
        ("1.5", "'1.5' is not a step number"),
        ("10:x", "'x' is not a step number"),
        ("30:10", "a range needs first <= last"),
        ("1:2:3:4", "is not a range"),
    ],
)
def test_anything_else_is_one_sentence(step, named):
    with pytest.raises(ConfigError) as e:
        _spec(step)
    assert str(e.value).startswith(f"checkpoint.step={step!r}")
    assert named in str(e.value)
