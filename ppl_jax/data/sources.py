"""Where each document came from, in compact arrays rather than one string per document.

A corpus of ten million one-line documents would hold ten million `path:line` strings (about 100
bytes each); `Sources` holds the file paths once and, per document, the index of its file (the
smallest unsigned integer that indexes the files: `uint8` for up to 256 files) and its line
(`uint32`, 0 for a document that is a whole file): 5 bytes a document for up to 256 files.
It is a read-only sequence of the same strings (`sources[i]` is `"path:line"`, or `"path"`), so
every message that names a document reads as before.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np


class Sources(Sequence[str]):
    """The documents' sources: `files` (paths), and per document `file` (an index into `files`)
    and `line` (1-based; 0: the whole file).

    Attributes:
      files: tuple of paths; file: `[d]` of `index_dtype(len(files))`; line: `[d] uint32`.

    Raises:
      ValueError: `file` and `line` of other shapes, or a file index outside `files`.
    """

    def __init__(self, files: Sequence[str], file: Any, line: Any):
        self.files = tuple(files)
        file = np.asarray(file)
        self.line = np.asarray(line, np.uint32)
        if file.shape != self.line.shape or file.ndim != 1:
            raise ValueError(f"file {file.shape} and line {self.line.shape} differ")
        if file.size and (int(file.max()) >= len(self.files) or int(file.min()) < 0):
            raise ValueError(f"a file index outside the {len(self.files)} files")
        self.file = file.astype(index_dtype(len(self.files)), copy=False)

    def __len__(self) -> int:
        return int(self.file.size)

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> Sources: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Sources(self.files, self.file[i], self.line[i])
        path = self.files[int(self.file[i])]
        line = int(self.line[i])
        return f"{path}:{line}" if line else path

    def __iter__(self) -> Iterator[str]:
        for i in range(len(self)):
            yield self[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sources):
            return (
                len(self) == len(other)
                and np.array_equal(self.line, other.line)
                and [self.files[i] for i in self.file] == [other.files[i] for i in other.file]
            )
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  (mutable arrays inside)

    def __repr__(self) -> str:
        return f"Sources({len(self)} documents in {len(self.files)} files)"

    @property
    def nbytes(self) -> int:
        return int(self.file.nbytes + self.line.nbytes)


def index_dtype(num_files: int) -> np.dtype:
    """The smallest unsigned integer dtype that holds an index of `num_files` files."""
    for dtype in (np.uint8, np.uint16):
        if num_files <= np.iinfo(dtype).max + 1:
            return np.dtype(dtype)
    return np.dtype(np.uint32)
