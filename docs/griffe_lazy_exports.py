"""A Griffe extension: the names `ppl_jax` exports lazily, made visible to mkdocstrings.

`ppl_jax/__init__.py` imports its public names on first use (a module-level `__getattr__`), so
`import ppl_jax` stays light; Griffe reads the source without running it and cannot see them, and
`::: ppl_jax.Evaluator` would fail. This extension imports `ppl_jax`, asks it for each exported
name (`ppl_jax.__all__`, or the `names` option while there is no `__all__`), and adds to the
package an alias to the object's defining path (`ppl_jax.evaluator.Evaluator` today). The aliases
follow the code wherever the restructuring moves a module, so `docs/reference/api.md` names only
the public paths. A name Griffe already sees (a plain or `TYPE_CHECKING` import) is left alone.

Used by `mkdocs.yml` (`plugins: mkdocstrings: handlers: python: options: extensions`).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import griffe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class LazyExports(griffe.Extension):
    """Adds an alias for each lazily exported name of `package`.

    Args:
      package: the package whose exports to expose (`ppl_jax`).
      names: the names to expose when the package has no `__all__`.
    """

    def __init__(self, package: str = "ppl_jax", names: list[str] | None = None):
        super().__init__()
        self.package = package
        self.names = list(names or [])

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name != self.package:
            return
        if ROOT not in sys.path:
            sys.path.insert(0, ROOT)
        module = importlib.import_module(self.package)
        for name in getattr(module, "__all__", None) or self.names:
            if name in pkg.members:
                continue
            obj = getattr(module, name)  # raises for a name the package does not export
            where = getattr(obj, "__module__", None)
            qualname = getattr(obj, "__qualname__", None)
            if not where or not qualname or not where.startswith(self.package + "."):
                continue  # a value such as __version__: nothing to document by path
            pkg.set_member(name, griffe.Alias(name, f"{where}.{qualname}", parent=pkg))
