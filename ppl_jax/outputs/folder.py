"""The output folder of a run: proven usable before any work, held by one run, written atomically.

`OutputDir.open` runs first, before the corpus or the checkpoint is read: it creates `output.dir`,
proves that a file can be written there (a probe file, removed at once), checks that the names a
run writes are not taken by folders, and takes an advisory lock (`fcntl.flock` on `.lock`) so
that a second run on the same folder stops at once with a message naming the holder. The lock is
released when the process exits, however it exits (the kernel drops `flock` locks of a dead
process), so a crashed run never leaves the folder locked.

Every file is written through a temporary file of its own in the same folder
(`tempfile.mkstemp`), flushed to disk and renamed over the target with `os.replace`: a reader (or
a crash) sees the old file or the new one, never a mix, and two writers never share a temporary
name. Only process 0 opens the output folder; the other processes of a run write nothing.

A remote `output.dir` (`gs://bucket/run`, see `ppl_jax.runtime.paths`) takes no lock: object stores
have no `flock`, so two runs on one remote folder are not stopped (give each run its own folder).
Each file is uploaded through `etils.epath` under a temporary name of its own, then renamed over
the target. On GCS and S3 an object appears whole or not at all (an interrupted upload leaves
no object), and a rename is a server-side copy then a delete: a reader sees the old file or the
new one, never a mix, but a crash between the copy and the delete can leave the temporary
`.<name>.<random>.tmp` behind.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import io
import json
import os
import re
import socket
import sys
import tempfile
import uuid
from typing import Any

from ppl_jax.errors import ConfigError
from ppl_jax.outputs import files
from ppl_jax.runtime import paths

LOCK = ".lock"
_TEMPORARY = re.compile(
    r"^\..+\.[A-Za-z0-9_]{8}\.tmp$"
)  # mkstemp(prefix=".<name>.", suffix=".tmp")
_UMASK = os.umask(0)
os.umask(_UMASK)
# Files a run may write; each must be a file (or absent) for the run to start.
NAMES = (
    files.RESULTS_JSON,
    files.RESULTS_JSONL,
    files.DOCUMENTS,
    files.JOURNAL,
    files.UNITS,
    files.TOKENS,
    f"{files.POSITION_CURVE}.json",
    f"{files.POSITION_CURVE}.png",
    f"{files.CONTEXT_CURVE}.json",
    f"{files.CONTEXT_CURVE}.png",
)


class OutputDir:
    """A locked, writable output folder. Use `OutputDir.open`; `close` releases the lock.

    Attributes:
      path: the folder.
    """

    def __init__(self, path: str, lock_fd: int | None):
        self.path = path
        self._lock_fd = lock_fd

    @staticmethod
    def open(path: str, lock: bool = True) -> OutputDir:
        """Creates `path` if needed, proves it writable and takes its lock.

        Args:
          path: `output.dir`, local or remote (`gs://...`).
          lock: take the advisory lock (one run per folder). Remote folders are never locked
            (object stores have no `flock`; see the module docstring).

        Raises:
          ConfigError: the folder cannot be created or written (a file in the way, no
            permission), a name the run writes is a folder, or another run holds the lock
            (naming its process, host and command).
        """
        where = f"output.dir={path!r}"
        if not paths.is_local(path):
            return _open_remote(path.rstrip("/"), where)
        try:
            os.makedirs(path, exist_ok=True)
        except FileExistsError:
            raise ConfigError(
                f"{where} is a file, not a folder; remove it or choose another output.dir."
            ) from None
        except OSError as e:
            raise ConfigError(
                f"{where} cannot be created ({e.strerror}); choose a folder you can write to."
            ) from None
        if not os.path.isdir(path):
            raise ConfigError(f"{where} is not a folder; choose another output.dir.")
        for name in NAMES:
            if os.path.isdir(os.path.join(path, name)):
                raise ConfigError(
                    f"{os.path.join(path, name)!r} is a folder, but the run writes a file of "
                    f"that name there; move it away or choose another output.dir."
                )
        try:
            fd, probe = tempfile.mkstemp(prefix=".probe.", dir=path)
            os.close(fd)
            os.remove(probe)
        except OSError as e:
            raise ConfigError(
                f"{where} is not writable ({e.strerror}); choose a folder you can write to."
            ) from None
        out = OutputDir(path, _lock(path) if lock else None)
        if lock:
            remove_stale(path)
        return out

    def close(self) -> None:
        """Releases the lock (the lock file stays; an unlocked file is free)."""
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> OutputDir:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def file(self, name: str) -> str:
        """The path of `name` inside the folder (a URL for a remote folder)."""
        return paths.join(self.path, name)

    def read_bytes(self, name: str) -> bytes | None:
        """The bytes of `name` in the folder, or None if there is no such file."""
        try:
            return paths.read_bytes(self.file(name))
        except FileNotFoundError:
            return None

    def write_bytes(self, name: str, data: bytes) -> str:
        """Writes `data` to `name` atomically (own temporary file, fsync, `os.replace`; for a
        remote folder an upload under a temporary name, then a rename)."""
        target = self.file(name)
        if not paths.is_local(self.path):
            tmp = paths.epath(self.file(f".{name}.{uuid.uuid4().hex}.tmp"))
            try:
                tmp.write_bytes(data)
                tmp.replace(paths.epath(target))
            except BaseException:
                with contextlib.suppress(OSError):
                    tmp.unlink(missing_ok=True)
                raise
            return target
        try:
            try:
                self._write_local(name, data, target)
            except FileNotFoundError:
                if os.path.isdir(self.path):
                    raise
                self._recreate()
                self._write_local(name, data, target)
        except OSError as e:
            raise write_error(self.path, name, e) from None
        return target

    def _write_local(self, name: str, data: bytes, target: str) -> None:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=self.path)
        try:
            os.fchmod(fd, 0o666 & ~_UMASK)  # as open() would create it (mkstemp gives 0600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise

    def _recreate(self) -> None:
        """`output.dir` was removed while the run went on: it is made again (and locked again),
        with a line on stderr, so that the files the run still writes (its journal, its records)
        are not lost; the files removed with it are gone."""
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as e:
            raise write_error(self.path, "the folder", e) from None
        print(
            f"ppl-jax: output.dir={self.path!r} was removed during the run; made it again "
            f"(the files removed with it are gone; the run's next files are written there).",
            file=sys.stderr,
            flush=True,
        )
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = _lock(self.path)

    def write_json(self, name: str, value: Any) -> str:
        """Writes `value` as strict JSON (no NaN or infinity: `allow_nan=False`), atomically."""
        text = json.dumps(value, indent=2, sort_keys=True, allow_nan=False) + "\n"
        return self.write_bytes(name, text.encode("utf-8"))

    def write_jsonl(self, name: str, records: list[dict[str, Any]]) -> str:
        """Writes one strict JSON object per line, atomically."""
        buf = io.StringIO()
        for record in records:
            buf.write(json.dumps(record, allow_nan=False) + "\n")
        return self.write_bytes(name, buf.getvalue().encode("utf-8"))

    def remove(self, name: str) -> None:
        """Removes `name` if it exists."""
        if not paths.is_local(self.path):
            paths.epath(self.file(name)).unlink(missing_ok=True)
            return
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.file(name))


def write_error(folder: str, name: str, e: OSError) -> ConfigError:
    """The error of a file of `output.dir` that could not be written (no space, no permission);
    the file's earlier version, if any, is kept (every write is a rename of a complete file)."""
    return ConfigError(
        f"output.dir={folder!r}: {name} could not be written ({e.strerror or e}); its earlier "
        f"version is kept. Free space there (or choose another output.dir) and run the same "
        f"command again: finished work is kept in the journal and results.jsonl."
    )


def remove_stale(folder: str) -> list[str]:
    """Removes the temporaries (`.<name>.<random>.tmp`, `tempfile.mkstemp`'s names) of the files
    a run writes in `folder`; call it holding the folder's lock: no other run writes there, so
    they are a dead writer's (a run killed before its rename). Returns their names."""
    removed = []
    for entry in os.listdir(folder):
        if _TEMPORARY.match(entry):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(folder, entry))
                removed.append(entry)
    return removed


def _open_remote(path: str, where: str) -> OutputDir:
    """`OutputDir.open` for a remote folder: no lock; a probe object is written and removed."""
    try:
        folder = paths.epath(path)
        if folder.is_file():
            raise ConfigError(
                f"{where} is a file, not a folder; remove it or choose another output.dir."
            )
        folder.mkdir(parents=True, exist_ok=True)  # object stores: no folder objects needed
        for name in NAMES:
            if paths.isdir(paths.join(path, name)):
                raise ConfigError(
                    f"{paths.join(path, name)!r} is a folder, but the run writes a file of "
                    f"that name there; move it away or choose another output.dir."
                )
        probe = folder / f".probe.{uuid.uuid4().hex}"
        probe.write_bytes(b"")
        probe.unlink()
    except ImportError as e:
        raise paths.missing_backend(path, e) from None
    except OSError as e:
        raise ConfigError(
            f"{where} is not writable ({e}); check the bucket, the path and your access."
        ) from None
    return OutputDir(path, None)


def _lock(path: str) -> int:
    lock_path = os.path.join(path, LOCK)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise ConfigError(
            f"output.dir={path!r}: its lock file cannot be opened ({e.strerror}); choose a "
            f"folder you can write to."
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        holder = _read_holder(fd)
        os.close(fd)
        if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            raise ConfigError(
                f"output.dir={path!r} cannot be locked ({e.strerror}); choose a local folder."
            ) from None
        raise ConfigError(
            f"output.dir={path!r} is in use by another run ({holder}); wait for it to finish, "
            f"or choose another output.dir."
        ) from None
    holder = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(holder).encode("utf-8"), 0)
    return fd


def _read_holder(fd: int) -> str:
    try:
        holder = json.loads(os.pread(fd, 65536, 0).decode("utf-8"))
        return (
            f"process {holder['pid']} on {holder['host']} since {holder['since']}: "
            f"{holder['command']}"
        )
    except (OSError, ValueError, KeyError, TypeError):
        return "its process is not recorded"
