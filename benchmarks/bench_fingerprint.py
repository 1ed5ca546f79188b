"""Benchmark: what `data.fingerprint=stat` costs with its sampled blocks, against `content`.

    python -m benchmarks.bench_fingerprint [--size_gib 2] [--dir /tmp]

Writes a file of random bytes of `--size_gib` GiB in `--dir`, then times, median of 5: `os.stat`
alone; `file_sample.sampled_digest` (16 blocks of 4 KiB) with the file in the page cache and
evicted from it (`posix_fadvise(POSIX_FADV_DONTNEED)`, which drops this file's pages only); and
`fingerprint.content_digest` (SHA-256 of every byte) evicted and cached. Removes the file.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from ppl_jax.runtime import file_sample, fingerprint


def _evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _median(fn, repeats: int = 5, before=None) -> float:
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size_gib", type=float, default=2.0)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    args = parser.parse_args()
    fd, path = tempfile.mkstemp(prefix="bench_fingerprint.", dir=args.dir)
    try:
        chunk = os.urandom(1 << 24)
        with os.fdopen(fd, "wb") as f:
            for _ in range(int(args.size_gib * (1 << 30)) // len(chunk)):
                f.write(chunk)
        size = os.path.getsize(path)

        def content() -> None:
            fingerprint._content_memo.clear()
            fingerprint.content_digest(path)

        rows = [
            ("os.stat", _median(lambda: os.stat(path))),
            ("sampled, cached", _median(lambda: file_sample.sampled_digest(path))),
            (
                "sampled, evicted",
                _median(lambda: file_sample.sampled_digest(path), before=lambda: _evict(path)),
            ),
            ("content, evicted", _median(content, 1, before=lambda: _evict(path))),
            ("content, cached", _median(content, 1)),
        ]
        print(f"file: {size / (1 << 30):.2f} GiB")
        for name, seconds in rows:
            print(f"{name:<18} {seconds * 1e3:12.3f} ms")
    finally:
        os.remove(path)


if __name__ == "__main__":
    main()
