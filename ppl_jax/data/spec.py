"""`DatasetSpec`: one corpus to score, as the data layer reads it (files, format, budgets, tags).

The command line builds it from `data.*` or a `suite` entry (`ppl_jax.config.settings`); a
training loop builds it directly. Every value is checked when the spec is made: a bad value is a
`ConfigError` that names the setting (`data.format`, `suite[2].tags`, or the dataset's name).
"""

from __future__ import annotations

import dataclasses
import glob
import os
from typing import Any

from ppl_jax.data.documents import FORMATS, resolve_paths, uncompressed_name
from ppl_jax.errors import ConfigError
from ppl_jax.runtime import fingerprint, paths

# The corpus name of the demo's default data.path (see `ppl_jax.config.defaults`).
DEMO_CORPUS_NAME = "cpython-stdlib-held-out"


def parse_tags(text: str, where: str) -> dict[str, str]:
    """The tags of a dataset: `"domain=web,split=val"` -> `{"domain": "web", "split": "val"}`.

    Args:
      text: comma-separated `key=value` pairs; "" for none. Spaces around names are dropped.
      where: the setting, for the message (`suite[2].tags`).

    Raises:
      ConfigError: a pair without `=`, an empty key or value, a key given twice, or a `/` or `=`
        inside a key or value (they would make the average's name `macro/<key>=<value>` ambiguous).
    """
    tags: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = (s.strip() for s in pair.partition("="))
        if not sep or not key or not value or "=" in value or "/" in key + value:
            raise ConfigError(
                f"{where}={text!r}: {pair!r} is not key=value; write tags as "
                f"'domain=web,split=val' (no '/' and one '=' in each)."
            )
        if key in tags:
            raise ConfigError(f"{where}={text!r} gives the tag {key!r} twice; keep one.")
        tags[key] = value
    return tags


def corpus_name(path: str, demo_paths: str = "") -> str:
    """The corpus's name derived from `path` (a file, a glob, or a comma-separated list).

    `demo_paths` (the demo's default path) is `DEMO_CORPUS_NAME`; one file is its name without
    the extension (`/data/wiki.test.raw` -> `wiki.test`); one glob is its folder's name and the
    pattern (`/data/val/*.jsonl` -> `val/*.jsonl`); several entries are their common folder's
    name (`/data/c4/a.json,/data/c4/b.json` -> `c4`), or the files' names joined by `+` where
    they share no folder but the root.
    """
    if demo_paths and path == demo_paths:
        return DEMO_CORPUS_NAME
    entries = [os.path.expanduser(e.strip()) for e in path.split(",") if e.strip()]
    if not entries:
        return ""
    if len(entries) == 1:
        entry = entries[0].rstrip(os.sep)
        if not glob.has_magic(entry):
            return os.path.splitext(os.path.basename(entry))[0]
        folder = os.path.basename(os.path.dirname(os.path.abspath(entry)))
        return f"{folder}/{os.path.basename(entry)}" if folder else os.path.basename(entry)
    folders = [os.path.dirname(os.path.abspath(e)) for e in entries]
    common = os.path.basename(os.path.commonpath(folders))
    if common:
        return common
    return "+".join(os.path.splitext(os.path.basename(e))[0] for e in entries)


# What a file's extension (after .gz/.zst) says of how to read it with data.format=auto.
_BY_EXTENSION = {".jsonl": "jsonl", ".ndjson": "jsonl"}
_NOT_READ = {
    ".json": "a JSON document (ppl_jax reads JSON Lines: one object per line)",
    ".parquet": "a Parquet table (ppl_jax does not read Parquet; write it as JSON Lines)",
}


def infer_format(path: str, where: str = "data") -> str:
    """`data.format=auto`: the format that `path`'s file extensions name (after `.gz`/`.zst`):
    `jsonl` for `.jsonl`/`.ndjson`, else `text` (a file is a document).

    Raises:
      ConfigError: a `.json` or `.parquet` entry (scored as text, braces and all, otherwise), or
        entries of JSON Lines mixed with others; the message names the fix.
    """
    entries = [e.strip() for e in path.split(",") if e.strip()]
    found = set()
    for entry in entries:
        ext = os.path.splitext(uncompressed_name(entry))[1].lower()
        if ext in _NOT_READ:
            raise ConfigError(
                f"{where}.path={entry!r} looks like {_NOT_READ[ext]}; set {where}.format=jsonl "
                f"if it holds one JSON object per line, or {where}.format=text to score its "
                f"characters as they are."
            )
        found.add(_BY_EXTENSION.get(ext, "text"))
    if len(found) > 1:
        raise ConfigError(
            f"{where}.path={path!r} mixes JSON Lines with other files; set {where}.format to "
            f"jsonl or text (or make them datasets of a suite)."
        )
    return found.pop() if found else "text"


def choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    """Raises ConfigError naming `name` unless `value` is one of `allowed`."""
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not one of {', '.join(allowed)}.")


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """One corpus: where its text is, how it is read, cut and tagged.

    Attributes:
      name: its name in the results; "" derives it from `path` (`corpus_name`).
      path: a file, a glob, or a comma-separated list of either (local or remote, etils.epath).
      format: 'auto' (by the files' extensions: `infer_format`; resolved when the spec is
        made), 'text' (a file is a document), 'lines', 'jsonl' or 'wikitext'.
      tokenizer: 'auto' (the checkpoint's own), 'byte', or a tokenizer path.
      errors: 'strict' (bad UTF-8 fails naming file and offset) or 'replace'.
      separator: text placed between documents in the `sliding` stream.
      jsonl_field: the field of a jsonl record that holds the text.
      allow_tokenizer_mismatch: score with a tokenizer whose vocabulary does not fit the model.
      preparation: a standard preparation of the text (`ppl_jax.data.preparations`), or "".
      tags: (key, value) pairs grouping the macro averages; a 'k=v,...' string is parsed.
      max_documents: the most documents scored (0: all).
      max_tokens: the documents' first this many tokens: documents are taken in order and the one
        that crosses it is cut at a token boundary (`ppl_jax.plans.planner.budget`; 0: all).
      sample_seed: -1 takes the first documents; else a sample drawn with this seed.
      cache_dir: a folder of the filesystem for the token and plan caches ("": none).
      fingerprint: how the files are identified in the cache keys and the journal's fingerprint:
        'stat' (path, size, modification time and 16 sampled 4 KiB blocks) or 'content' (path,
        size, SHA-256 of the bytes; `ppl_jax.runtime.fingerprint`).
      where: the setting's name in error messages ('data', 'suite[2]'); not compared.

    Raises:
      ConfigError: a value out of range, naming the setting.
    """

    path: str
    name: str = ""
    format: str = "auto"
    tokenizer: str = "auto"
    errors: str = "strict"
    separator: str = "\n\n"
    jsonl_field: str = "text"
    allow_tokenizer_mismatch: bool = False
    preparation: str = ""
    tags: tuple[tuple[str, str], ...] = ()
    max_documents: int = 0
    max_tokens: int = 0
    sample_seed: int = -1
    cache_dir: str = ""
    fingerprint: str = "stat"
    where: str = dataclasses.field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        key = self.where or f"dataset {self.name or self.path!r}:"
        sep = "." if self.where else " "
        choice(f"{key}{sep}format", self.format, ("auto", *FORMATS))
        if self.format == "auto":
            where = self.where or f"dataset {self.name or self.path!r}: data"
            object.__setattr__(self, "format", infer_format(self.path, where))
        choice(f"{key}{sep}errors", self.errors, ("strict", "replace"))
        choice("data.fingerprint", self.fingerprint, fingerprint.FINGERPRINTS)
        for budget in ("max_documents", "max_tokens"):
            value = int(getattr(self, budget))
            if value < 0:
                raise ConfigError(f"{key}{sep}{budget}={value} must be 0 (all) or more.")
            object.__setattr__(self, budget, value)
        if isinstance(self.tags, str):
            tags = parse_tags(self.tags, f"{key}{sep}tags")
        else:
            tags = dict(self.tags)
        object.__setattr__(self, "tags", tuple(sorted(tags.items())))
        if self.cache_dir and not paths.is_local(self.cache_dir):
            raise ConfigError(
                f"data.cache_dir={self.cache_dir!r}: the cache is memory-mapped, so it must be a "
                f"folder of the filesystem (on several hosts, one every process sees: NFS, "
                f"Lustre, or a bucket mounted with gcsfuse), not a "
                f"{self.cache_dir.split(':', 1)[0]}:// path."
            )
        object.__setattr__(self, "cache_dir", os.path.expanduser(self.cache_dir))
        if not self.name:
            object.__setattr__(self, "name", corpus_name(self.path))

    @property
    def has_budget(self) -> bool:
        return bool(self.max_documents or self.max_tokens)

    def fingerprint_part(self) -> dict[str, Any]:
        """What of this dataset decides a run's numbers (its part of the run's fingerprint,
        `ppl_jax.runtime.fingerprint.run_fingerprint`): how its files are read (format, field,
        errors), joined (separator), prepared and cut to a budget (the seed only with one), and
        the files themselves, digested: path, size and modification time of each, or with
        `fingerprint='content'` its SHA-256 (`fingerprint.file_identity`). Not its name, tags or
        cache folder (they do not change a number).

        Raises:
          DataError, ConfigError: as `resolve_paths` (a path that matches no file).
        """
        content = self.fingerprint == "content"
        files = [fingerprint.file_identity(p, content) for p in resolve_paths(self.path)]
        return {
            "format": self.format,
            "jsonl_field": self.jsonl_field,
            "errors": self.errors,
            "separator": self.separator,
            **({"preparation": self.preparation} if self.preparation else {}),
            **({"fingerprint": "content"} if content else {}),
            **(
                {
                    "max_documents": self.max_documents,
                    "max_tokens": self.max_tokens,
                    "sample_seed": self.sample_seed,
                }
                if self.has_budget
                else {}
            ),
            "files": fingerprint.text_digest(files),
        }
