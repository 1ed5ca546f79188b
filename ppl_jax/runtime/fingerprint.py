"""One fingerprint of everything that decides a run's numbers.

The journal (resume), the results and the cross-process checks all use the fingerprint joined
here (`run_fingerprint`), so that "the same run" means one thing everywhere. A fingerprint is a
JSON-able dict of named parts (`PARTS`), each given by the layer that owns what it names: the
checkpoint (its path, step, files and the settings that choose its weights: mapping, item,
params, architecture), the model (description, dtype, attention), the data
(`DatasetSpec.fingerprint_part()`: how the files are read and cut, and the files), the tokenizer,
the protocol (`ProtocolSpec.fingerprint_part()`, what its plan resolved, and the long-context
measures' settings and LongPPL evaluator where asked for), the layout
(`BatchSpec.fingerprint_part()`), the mesh (axes, processes, sharding rules) and the environment
(`environment()`: platform, device kind, the versions of ppl_jax, jax and jaxlib). Two runs
agree when every part agrees, and `differences` names the parts (and their fields) that do not,
for a message a user can act on. `digest` is the SHA-256 of its canonical JSON.

Corpus files are identified by path, size, modification time (nanoseconds) and the SHA-256 of
16 sampled blocks of 4 KiB (`ppl_jax.runtime.file_sample`: a file of at most 64 KiB whole), not
by all their content (the default rule, `data.fingerprint=stat`): a large file rewritten with the
same size and its modification time set back (`touch -d`, `os.utime`, a copy that keeps times)
is noticed only if the edit touches a sampled block. Corpus files may be
identified by their content instead (`data.fingerprint=content`: path, size and the SHA-256 of
their bytes, as stored, compressed or not), for the cache keys and the journal's fingerprint
alike; that reads every byte once per run and process (measured: 1.8 to 2.3 s per GB on one
shared core, the file in the page cache; SHA-256 is the cost), memoized within the process.
Checkpoint files are always identified by the `stat` rule (`tree_identity`: path, size,
modification time and the sampled blocks, at most 64 KiB read per file): hashing every weight
again would cost as much as the restore.

A remote file (`gs://`, `s3://`, ... see `ppl_jax.runtime.paths`) is identified by what its store says
of it (fsspec's `info`, the backend of `etils.epath` for these schemes): its size and, where
given, its object version (GCS `generation`, `etag`, `crc32c`, `md5Hash`; S3 `ETag`,
`VersionId`) and modification time (`mtime`, `updated`, `LastModified`). On GCS the generation
changes with every write, so a rewrite is always noticed there; a store that gives none of these
is identified by size alone.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
from collections.abc import Mapping
from typing import Any

from ppl_jax.runtime import file_sample, paths

# What fsspec's `info` may tell of an object's version, per store (gcsfs, s3fs, adlfs, local).
_VERSION_KEYS = (
    "generation",
    "etag",
    "ETag",
    "VersionId",
    "version_id",
    "crc32c",
    "md5Hash",
    "content_md5",
    "mtime",
    "updated",
    "LastModified",
    "last_modified",
)


FINGERPRINTS = ("stat", "content")  # data.fingerprint: how corpus files are identified
_CONTENT_CHUNK = 1 << 22
_content_memo: dict[tuple[Any, ...], str] = {}


def file_identity(path: str, content: bool = False, sample: bool = True) -> dict[str, Any]:
    """`{"path", "size", "mtime_ns", "sample"}` of a local file (absolute path; `sample`: the
    digest of its sampled blocks, `file_sample.sampled_digest`, left out with `sample=False`),
    or `{"path", "missing": True}`.

    A remote file gives `{"path", "size", "version": {...}}` instead (see the module docstring).
    With `content`: `{"path", "size", "sha256"}`, the SHA-256 of the file's bytes (`content_digest`).
    """
    if content:
        found = file_identity(path, sample=False)
        if found.get("missing"):
            return found
        return {"path": found["path"], "size": found["size"], "sha256": content_digest(path)}
    if not paths.is_local(path):
        return _remote_identities(path, tree=False).get(path, {"path": path, "missing": True})
    path = os.path.abspath(path)
    try:
        st = os.stat(path)
    except OSError:
        return {"path": path, "missing": True}
    found = {"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    if sample:
        try:
            found["sample"] = file_sample.sampled_digest(path)
        except OSError:  # unreadable (permissions): the reader of the data says so
            found["sample"] = None
    return found


def content_digest(path: str) -> str:
    """SHA-256 (hex) of a file's bytes (local or remote), read 4 MiB at a time. Memoized within
    the process by the file's identity, inode and change time (which no user call can set back):
    a run that computes a key for the cache and the journal of every step reads the file once."""
    memo = None
    if paths.is_local(path):
        st = os.stat(path)
        memo = (os.path.abspath(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
        if memo in _content_memo:
            return _content_memo[memo]
    h = hashlib.sha256()
    with paths.open_binary(path) as f:
        while chunk := f.read(_CONTENT_CHUNK):
            h.update(chunk)
    digest = h.hexdigest()
    if memo is not None:
        _content_memo[memo] = digest
    return digest


def tree_identity(directory: str) -> list[dict[str, Any]]:
    """`file_identity` of every file below `directory`, sorted by path (a checkpoint step), or
    of `directory` itself where it is a file (a GGUF or safetensors checkpoint): each local file
    with its sampled blocks (`file_sample`), so that an edit keeping the size and setting the
    time back is seen where it touches one (any edit of a file of at most 64 KiB).

    A remote directory is listed once (one listing gives every object's size and version; no
    byte is read: the store's version, GCS's generation, changes with every write).
    """
    if not paths.is_local(directory):
        return sorted(_remote_identities(directory, tree=True).values(), key=lambda f: f["path"])
    if os.path.isfile(directory):
        return [file_identity(directory)]
    found = []
    for root, _, files in os.walk(directory):
        found.extend(file_identity(os.path.join(root, name)) for name in files)
    return sorted(found, key=lambda f: f["path"])


def _remote_identities(path: str, tree: bool) -> dict[str, dict[str, Any]]:
    """`{url: identity}` of the remote file `path`, or of every file below it (`tree`)."""
    import fsspec

    try:
        fs, inner = fsspec.core.url_to_fs(path)
        found = fs.find(inner, detail=True) if tree else {inner: fs.info(inner)}
    except FileNotFoundError:
        return {}
    except ImportError as e:
        raise paths.missing_backend(path, e) from None
    scheme = paths.scheme(path)
    out = {}
    for name, info in found.items():
        if info.get("type", "file") != "file":
            continue
        if not tree:
            url = path
        else:
            url = name if paths.scheme(name) else f"{scheme}://{name.lstrip('/')}"
        version = {k: str(info[k]) for k in _VERSION_KEYS if info.get(k) is not None}
        out[url] = {"path": url, "size": info.get("size"), "version": version}
    return out


def text_digest(value: Any) -> str:
    """SHA-256 (hex) of `value`'s canonical JSON."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def digest(parts: dict[str, Any]) -> str:
    """The fingerprint's SHA-256 (hex)."""
    return text_digest(parts)


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What changed from `old` to `new`, one phrase per changed field, e.g.
    `"protocol.seq_len: 256 -> 128"` or `"data.files changed"` (long values, such as digests,
    are not spelled)."""
    out = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            for field in sorted(set(a) | set(b)):
                if a.get(field) != b.get(field):
                    out.append(_change(f"{name}.{field}", a.get(field), b.get(field)))
        else:
            out.append(_change(name, a, b))
    return out


def _change(where: str, old: Any, new: Any) -> str:
    a, b = json.dumps(old, sort_keys=True), json.dumps(new, sort_keys=True)
    return f"{where}: {a} -> {b}" if max(len(a), len(b)) <= 60 else f"{where} changed"


PARTS = ("checkpoint", "model", "data", "tokenizer", "protocol", "layout", "mesh", "environment")
ENVIRONMENT_PACKAGES = ("ppl_jax", "jax", "jaxlib")


def run_fingerprint(parts: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The fingerprint of a run: its named parts (`PARTS`, every one), each a JSON-able dict,
    as canonical JSON values (tuples are lists, keys strings), so that a fingerprint read back
    from a journal compares equal to the one computed.

    Raises:
      ValueError: a part missing or unknown, or a value that is not JSON (a bug of the caller).
    """
    if set(parts) != set(PARTS):
        raise ValueError(f"run_fingerprint takes the parts {PARTS}, got {sorted(parts)}")
    return {name: json.loads(json.dumps(dict(parts[name]), sort_keys=True)) for name in PARTS}


def environment() -> dict[str, Any]:
    """What of the machine and the software decides the numbers beside the settings: JAX's
    `platform` (cpu, gpu, tpu), the `device_kind`s (joined by `, `) and the `versions` of
    `ENVIRONMENT_PACKAGES` (None where not installed)."""
    import jax

    versions: dict[str, str | None] = {}
    for package in ENVIRONMENT_PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "platform": jax.default_backend(),
        "device_kind": ", ".join(sorted({d.device_kind for d in jax.devices()})),
        "versions": versions,
    }
