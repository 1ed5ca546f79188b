"""Temporary files and folders that name their writer, so that a later run removes those of dead
writers.

Every cache entry and output file is written under a temporary name and renamed into place
(complete or absent). A writer killed before the rename (`kill -9`, a lost host, SIGTERM without a
handler) leaves its temporary behind. The temporaries named here carry the writer's host and
process id, `.<stem>.tmp-<host>-<pid>-<random>`; `remove_stale` removes those whose writer is a
process of this host that no longer exists (`os.kill(pid, 0)`). A temporary of another host, or of
a live process, is kept: on a shared filesystem another host's writer may still be at work.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import uuid

_HOST = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"
_NAME = re.compile(r"^\..*\.tmp-(?P<host>[A-Za-z0-9._]+)-(?P<pid>\d+)-[0-9a-f]{8}$")


def name(stem: str) -> str:
    """A temporary name for `stem` (a file or folder name) owned by this process."""
    return f".{stem}.tmp-{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def writer(entry: str) -> tuple[str, int] | None:
    """`(host, pid)` of a temporary name made by `name`, or None for any other name."""
    m = _NAME.match(entry)
    return (m["host"], int(m["pid"])) if m else None


def alive(pid: int) -> bool:
    """Whether process `pid` of this host exists (a process of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(folder: str) -> list[str]:
    """Removes the temporaries in `folder` (files or folders named by `name`) whose writer was a
    process of this host that has exited; returns their names. Errors are ignored (a
    temporary another process removes meanwhile, a folder that cannot be listed)."""
    try:
        entries = os.listdir(folder)
    except OSError:
        return []
    removed = []
    for entry in entries:
        owner = writer(entry)
        if owner is None or owner[0] != _HOST or owner[1] == os.getpid() or alive(owner[1]):
            continue
        path = os.path.join(folder, entry)
        with contextlib.suppress(OSError):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
            removed.append(entry)
    return removed
