"""Paths beyond the local disk: `gs://`, `s3://`, `az://` and `hf://`, through `etils.epath`.

`etils.epath` is the file library of the Orbax stack (Orbax itself takes `epath.Path`s); for these
schemes it goes through `fsspec` (`gcsfs` for `gs://`, `s3fs` for `s3://`, `adlfs` for `az://`,
`huggingface_hub` for `hf://`), or through TensorFlow's `gfile` when TensorFlow is installed.
A path without a scheme is local and keeps going through `os` exactly as before, so that local
behaviour (messages, symlinks, modification times in nanoseconds) does not change.

A remote path is kept as a string (`gs://bucket/dir/file`): it is never made absolute against
the working directory (`os.path.abspath('gs://b/x')` would give `/cwd/gs:/b/x`).
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import stat
from typing import Any, BinaryIO

from ppl_jax.errors import CheckpointError, ConfigError

# The largest JSON file read (a config, an index, a description): an index of 10^5 weights is
# about 10 MB.
MAX_JSON_BYTES = 1 << 26
SCHEMES = ("gs", "s3", "az", "hf")  # those `etils.epath` reads (etils.epath.gpath._URI_SCHEMES)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# The fsspec implementation each scheme needs, for the message when it is not installed.
_PACKAGE = {"gs": "gcsfs", "s3": "s3fs", "az": "adlfs", "hf": "huggingface_hub"}


def scheme(path: Any) -> str | None:
    """The URL scheme of `path` (`"gs"` for `gs://b/x`), or None for a local path."""
    m = _SCHEME.match(os.fspath(path))
    return m.group(1).lower() if m else None


def is_local(path: Any) -> bool:
    """Whether `path` is on the local disk (no `scheme://`; `file://` is not accepted)."""
    return scheme(path) is None


def epath(path: str):
    """`path` as an `etils.epath.Path`.

    Raises:
      ConfigError: a scheme that `etils.epath` does not read (it would otherwise take
        `memory://x` for the local folder `memory:/x`).
    """
    s = scheme(path)
    if s is not None and s not in SCHEMES:
        raise ConfigError(
            f"{path!r}: the scheme {s}:// is not supported; ppl_jax reads local paths and "
            f"{', '.join(f'{x}://' for x in SCHEMES)} (through etils.epath)."
        )
    from etils import epath as epath_lib

    return epath_lib.Path(path)


def filesystem(path: str) -> tuple[Any, str]:
    """`(fsspec filesystem, its path)` of a remote `path`, for byte-range reads (`cat_file`,
    `cat_ranges`): the same `fsspec` implementation `etils.epath` reaches (`gcsfs` for `gs://`,
    `s3fs` for `s3://`, `adlfs` for `az://`).

    Raises:
      ConfigError: a local path, an unsupported scheme, or its fsspec implementation is not
        installed.
    """
    epath(path)  # the sentence for a scheme that is not read
    if is_local(path):
        raise ConfigError(f"{path!r} is a local path; read it with os, not fsspec.")
    import fsspec

    try:
        return fsspec.core.url_to_fs(path)
    except ImportError as e:
        raise missing_backend(path, e) from None


def missing_backend(path: str, e: ImportError) -> ConfigError:
    """The error for a remote path whose fsspec implementation is not installed."""
    package = _PACKAGE.get(scheme(path) or "", "the fsspec implementation of its scheme")
    return ConfigError(f"{path!r} cannot be read without {package} ({e}); pip install {package}.")


def absolute(path: str) -> str:
    """`os.path.abspath` of a local path; a remote path as given, less any trailing `/`."""
    if is_local(path):
        return os.path.abspath(path)
    return path.rstrip("/") if not path.endswith("://") else path


def join(base: str, *names: str) -> str:
    """`os.path.join` for a local `base`; `/`-joined (never `\\`) for a remote one."""
    if is_local(base):
        return os.path.join(base, *names)
    return posixpath.join(base, *names)


def isdir(path: str) -> bool:
    """Whether `path` is a directory (on object stores: a prefix holding objects)."""
    return os.path.isdir(path) if is_local(path) else epath(path).is_dir()


def isfile(path: str) -> bool:
    """Whether `path` is a file (an object)."""
    return os.path.isfile(path) if is_local(path) else epath(path).is_file()


def listdir(path: str) -> list[str]:
    """The names in directory `path` (not their paths)."""
    if is_local(path):
        return os.listdir(path)
    return [p.name for p in epath(path).iterdir()]


def read_bytes(path: str) -> bytes:
    """The bytes of file `path`.

    Raises:
      OSError: as `open` does (FileNotFoundError for a missing file), for either kind of path.
      ConfigError: the fsspec implementation of a remote scheme is not installed.
    """
    if is_local(path):
        with open(path, "rb") as f:
            return f.read()
    try:
        return epath(path).read_bytes()
    except ImportError as e:
        raise missing_backend(path, e) from None


def read_small(path: str, limit: int) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them: a file named by a user
    (a mapping, an architecture) read without trusting what it is. A FIFO, a device
    (`/dev/zero`), a socket or a folder is refused before it is read (opened without blocking,
    then checked by `fstat`), so that nothing waits on a writer or reads without end.

    Raises:
      OSError: as `open` does (FileNotFoundError for a missing file).
      ValueError: not a regular file, or larger than `limit` bytes (the message says which).
      ConfigError: the fsspec implementation of a remote scheme is not installed.
    """
    if is_local(path):
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        found = os.fstat(fd)
        why = "not a regular file" if not stat.S_ISREG(found.st_mode) else None
        if why is None and found.st_size > limit:
            why = f"larger than {limit:,} bytes"
        if why is not None:
            os.close(fd)
            raise ValueError(why)
        f = os.fdopen(fd, "rb")
    else:
        f = open_binary(path)
    with f:
        parts, size = [], 0
        while size <= limit and (part := f.read(min(1 << 20, limit + 1 - size))):
            parts.append(part)
            size += len(part)
    if size > limit:
        raise ValueError(f"larger than {limit:,} bytes")
    return b"".join(parts)


def open_binary(path: str) -> BinaryIO:
    """File `path` opened for reading bytes, as a stream (`open(path, "rb")` for a local path,
    `etils.epath.Path(path).open("rb")` for a remote one); the caller closes it.

    Raises:
      OSError: as `open` does (FileNotFoundError for a missing file), for either kind of path.
      ConfigError: the fsspec implementation of a remote scheme is not installed.
    """
    if is_local(path):
        return open(path, "rb")
    try:
        return epath(path).open("rb")
    except ImportError as e:
        raise missing_backend(path, e) from None


def read_json_object(path: str, what: str) -> dict[str, Any]:
    """The JSON object in the file `path` (a regular file of at most `MAX_JSON_BYTES`:
    `read_small`).

    Raises:
      CheckpointError: the file is missing (`what` says why it is needed), is no regular file or
        too large, is not UTF-8 JSON, or holds something other than an object; each naming the
        file.
    """
    try:
        data = read_small(path, MAX_JSON_BYTES)
    except FileNotFoundError:
        raise CheckpointError(f"{path!r} is missing; {what}") from None
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path!r} cannot be read ({e}).") from None
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path!r} is not valid JSON ({e}).") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path!r} holds a JSON {type(value).__name__}, not an object.")
    return value


def allowed_roots(folder: str) -> list[str]:
    """Where the files of a local `folder` may really lie: the folder itself (symlinks resolved),
    and for a snapshot of the Hugging Face hub cache (`models--org--name/snapshots/<revision>`,
    whose files are symlinks into `models--org--name/blobs`), that repository's `blobs`."""
    real = os.path.realpath(folder)
    roots = [real]
    parent = os.path.dirname(real)
    if os.path.basename(parent) == "snapshots":
        roots.append(os.path.join(os.path.dirname(parent), "blobs"))
    return roots


def resolves_inside(folder: str, file: str) -> tuple[str, bool]:
    """`(real path, whether it lies inside `allowed_roots(folder)`)` of the local `file` of
    `folder`, every symlink followed."""
    real = os.path.realpath(os.path.join(folder, file))
    return real, _inside(real, allowed_roots(folder))


def _inside(real: str, roots: list[str]) -> bool:
    return any(os.path.commonpath([real, root]) == root for root in roots)


def refuse_links_out(folder: str, checkpoint: str) -> None:
    """The one check of links in a checkpoint, which every checkpoint reader makes on every file
    and folder it opens: `folder` (a step's folder, an item, or the whole checkpoint) and
    everything below it resolve, every symlink followed, inside the checkpoint folder
    `checkpoint` (or, for a snapshot of the Hugging Face hub cache, its repository's `blobs`:
    `allowed_roots`).

    The checkpoint folder itself may be a link, and links that stay inside are followed (a
    folder reached twice is walked once); a link leading out (to another model's arrays, to
    any file of the machine) is refused before anything reads through it: Orbax, TensorStore
    and safetensors would. Remote folders hold no links: nothing to check. Readers call it
    through `Checkpoint.check_links`, which the protocol runs before each reader's `stored`,
    `read`, `restore`, `carried_description`, `stored_tokenizer` and `layout_lines`.

    Cost: one `scandir` per folder below `folder`, a `realpath` per link; nothing is read.

    Raises:
      CheckpointError: naming the first link that leads out, where it leads, and the repair.
    """
    if not is_local(folder) or not is_local(checkpoint) or not os.path.lexists(folder):
        return
    roots = allowed_roots(checkpoint)
    real = os.path.realpath(folder)
    if not _inside(real, roots):
        raise _link_out(folder, real, checkpoint)
    seen = {real}
    stack = [folder]
    while stack:
        here = stack.pop()
        try:
            entries = list(os.scandir(here))
        except NotADirectoryError:
            continue
        except OSError:  # unreadable: the reader's own sentence says so when it opens it
            continue
        for entry in entries:
            if entry.is_symlink():
                target = os.path.realpath(entry.path)
                if not _inside(target, roots):
                    raise _link_out(entry.path, target, checkpoint)
                if os.path.isdir(target) and target not in seen:
                    seen.add(target)
                    stack.append(entry.path)
            elif entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)


def _link_out(link: str, real: str, checkpoint: str) -> CheckpointError:
    return CheckpointError(
        f"{link!r} in the checkpoint {checkpoint!r} is a link to {real!r}, outside the checkpoint "
        f"folder; ppl_jax reads no file outside it. Copy the file into the checkpoint instead."
    )
