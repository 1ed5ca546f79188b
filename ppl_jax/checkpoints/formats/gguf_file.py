"""A GGUF file (llama.cpp's format, `docs/gguf.md` of ggml): its metadata, its tensor table, and
regions of its tensors read and dequantized.

The header is read by a walk over its published layout (ggml's `docs/gguf.md`) that checks every
count and length it claims against the bytes the file holds, and gives the metadata as the `gguf`
package's reader gives it (`gguf.GGUFReader`, llama.cpp's gguf-py: the reference of the tests).
That reader is not used here: it memory-maps the file and trusts its counts (a metadata array
claiming 2^60 items keeps it looping, a truncated tensor comes out short), and it parses each
vocabulary string into NumPy arrays (23 s for a vocabulary of 150,000 tokens and as many merges on
2 cores, against 0.7 s here; `python -m benchmarks.bench_gguf`). Before anything is built, a file
is refused in one sentence when it is not GGUF (magic, version 2 or 3, little-endian), when a count
or length runs past the end of the file, when a tensor has a type the `gguf` package does not know
or cannot dequantize, a shape that is not whole blocks, an offset off the file's alignment, data
past the end of the file (a truncated download), or data over another tensor's.

Tensors are dequantized with `gguf.quants.dequantize`, region by region. GGML stores a tensor's
dimensions fastest first (`ne[0]` is a row's length); here shapes are NumPy's, the reverse, so a
tensor is `[..., rows, row]` and its quantized blocks run along the last axis. A region is read as
the byte ranges of its rows' blocks (one range for a run of whole rows: a device's block of a
projection sharded over its output rows), with `os.pread`, so that a process reads only the bytes
of its own shards, and is dequantized in pieces of about `PIECE_BYTES` straight into the requested
dtype.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import mmap
import os
import struct
from typing import Any

import gguf
import numpy as np

from ppl_jax.errors import CheckpointError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
PIECE_BYTES = 16 << 20  # float32 bytes dequantized at a time
# GGUF metadata value types: fixed sizes (8: string, 9: array).
_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}  # fmt: skip
_SIZES = {kind: struct.calcsize(fmt) for kind, fmt in _FORMATS.items()}
_FLOAT_TYPES = ("F32", "F16", "BF16")  # one value a block


@dataclasses.dataclass(frozen=True)
class Tensor:
    """One tensor of the file.

    Attributes:
      name: its GGUF name (`blk.0.attn_q.weight`).
      shape: NumPy's order (the reverse of GGML's `ne`): `[..., rows, row]`.
      type: the GGML type's name (`Q4_K`, `F32`).
      start: its data's offset from the file's start, in bytes.
      nbytes: its data's size in bytes.
      block: elements per quantized block (1 for F32, F16, BF16).
      block_bytes: bytes per block.
      path: the file holding its data (one part of a split model: `gguf_split`).
    """

    name: str
    shape: tuple[int, ...]
    type: str
    start: int
    nbytes: int
    block: int
    block_bytes: int
    path: str

    @property
    def row_bytes(self) -> int:
        """Bytes of one row (the last axis)."""
        return self.shape[-1] // self.block * self.block_bytes if self.shape else self.nbytes


@dataclasses.dataclass(frozen=True)
class GGUFFile:
    """A GGUF file's header, checked (`read`), or a split model's, its parts' joined
    (`gguf_split.read`).

    Attributes:
      path: the file (a split model's first part).
      size: its size in bytes (a split model's: all its parts').
      version: the GGUF version (2 or 3).
      metadata: key -> value (numbers, strings, lists of them), as the file stores them (a split
        model's: its first part's, where llama.cpp's `gguf-split` writes them).
      tensors: name -> `Tensor`, in the file's order (a split model's: part by part).
      parts: a split model's files, its first part first; empty for one file.
    """

    path: str
    size: int
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, Tensor]
    parts: tuple[str, ...] = ()

    def types(self) -> dict[str, int]:
        """GGML type name -> how many tensors have it, most common first."""
        counts: dict[str, int] = {}
        for t in self.tensors.values():
            counts[t.type] = counts.get(t.type, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _refuse(path: str, what: str) -> CheckpointError:
    return CheckpointError(
        f"{path!r} is not a GGUF file ppl_jax can read: {what}; re-download or re-convert it."
    )


class _Walk:
    """Steps over the header's bytes, each count and length checked against what is left."""

    def __init__(self, buf: Any, path: str):
        self.buf, self.path, self.at, self.end = buf, path, 0, len(buf)

    def take(self, n: int, what: str) -> int:
        if n < 0 or n > self.end - self.at:
            raise _refuse(self.path, f"{what} claims {n:,} bytes at offset {self.at:,}, past the "
                          f"end of the file ({self.end:,} bytes)")  # fmt: skip
        at, self.at = self.at, self.at + n
        return at

    def unpack(self, fmt: str, what: str) -> tuple:
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt), what))

    def string(self, what: str) -> str:
        (n,) = self.unpack("<Q", what)
        at = self.take(n, what)
        try:
            return bytes(self.buf[at : at + n]).decode("utf-8")
        except UnicodeDecodeError:
            raise _refuse(self.path, f"{what} is not UTF-8") from None

    def value(self, kind: int, what: str, depth: int = 0) -> Any:
        """A metadata value: a number, a string, or a list of them."""
        if kind in _SIZES:
            (value,) = struct.unpack_from(_FORMATS[kind], self.buf, self.take(_SIZES[kind], what))
            return value
        if kind == 8:
            return self.string(what)
        if kind == 9 and depth == 0:
            item, count = self.unpack("<IQ", what)
            least = _SIZES.get(item, 8 if item == 8 else 12)
            if count > (self.end - self.at) // least:
                raise _refuse(self.path, f"{what} claims {count:,} items, more than the file "
                              f"holds")  # fmt: skip
            if item in _SIZES:
                at = self.take(count * _SIZES[item], what)
                raw = bytes(self.buf[at : at + count * _SIZES[item]])
                return np.frombuffer(raw, np.dtype(_FORMATS[item])).tolist()
            return [self.value(item, what, depth + 1) for _ in range(count)]
        raise _refuse(self.path, f"{what} has the unknown value type {kind}")


def _walk(path: str, buf: Any) -> tuple[int, dict[str, Any], list[tuple], int, int]:
    """(version, metadata, [(name, ne, type, offset)], alignment, the tensor table's end) of a
    header, every count and length checked against the file's size."""
    w = _Walk(buf, path)
    if w.end < 24 or bytes(buf[:4]) != MAGIC:
        raise _refuse(path, "it does not start with the GGUF magic bytes")
    (version,) = w.unpack("<4xI", "the version")
    if version not in VERSIONS:
        swapped = struct.unpack(">I", struct.pack("<I", version))[0]
        why = "it is big-endian" if swapped in VERSIONS else f"its version is {version}"
        raise _refuse(path, f"{why} (ppl_jax reads little-endian GGUF versions 2 and 3)")
    tensors, kvs = w.unpack("<QQ", "the counts")
    if kvs > w.end // 13 or tensors > w.end // 29:
        raise _refuse(path, f"its header claims {kvs:,} metadata keys and {tensors:,} tensors, "
                      f"more than the file holds")  # fmt: skip
    metadata: dict[str, Any] = {}
    for _ in range(kvs):
        key = w.string("a metadata key")
        (kind,) = w.unpack("<I", f"metadata {key!r}")
        if key in metadata:
            raise _refuse(path, f"it holds the metadata key {key!r} twice")
        metadata[key] = w.value(kind, f"metadata {key!r}")
    alignment = metadata.get("general.alignment", 32)
    if not isinstance(alignment, int) or isinstance(alignment, bool):
        raise _refuse(path, f"general.alignment {str(alignment)[:20]} is not a number")
    if alignment < 1 or alignment & (alignment - 1):
        raise _refuse(path, f"general.alignment {alignment} is not a power of two")
    table = []
    for _ in range(tensors):
        name = w.string("a tensor name")
        (dims,) = w.unpack("<I", f"tensor {name!r}")
        if not 1 <= dims <= MAX_DIMS:
            raise _refuse(path, f"tensor {name!r} has {dims} dimensions (GGUF allows 1 to 4)")
        ne = w.unpack(f"<{dims}Q", f"tensor {name!r}")
        kind, offset = w.unpack("<IQ", f"tensor {name!r}")
        table.append((name, ne, kind, offset))
    return version, metadata, table, alignment, w.at


@functools.cache
def _dequantizes(kind: gguf.GGMLQuantizationType) -> bool:
    """Whether the installed `gguf` package dequantizes this type (tried on one zero block)."""
    block, size = gguf.GGML_QUANT_SIZES[kind]
    try:
        gguf.quants.dequantize(np.zeros((1, size), np.uint8), kind)
    except NotImplementedError:
        return False
    return kind.name in _FLOAT_TYPES or block > 1


def read(path: str) -> GGUFFile:
    """The header of a GGUF file, checked (see the module docstring).

    Raises:
      CheckpointError: an unreadable file, or one that is not GGUF, is truncated or claims more
        than it holds, or has a tensor the `gguf` package cannot dequantize (naming the file,
        the tensor and what is wrong).
    """
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            version, metadata, table, alignment, end = _walk(path, buf)
    except OSError as e:
        raise CheckpointError(f"cannot read the GGUF file {path!r} ({e}).") from None
    except ValueError as e:  # an empty file cannot be mapped
        raise _refuse(path, f"it cannot be read ({str(e)[:80]})") from None
    data_start = -(-end // alignment) * alignment
    tensors = _tensors(path, size, table, alignment, data_start)
    return GGUFFile(path, size, version, metadata, tensors)


def _tensors(
    path: str, size: int, table: list, alignment: int, data_start: int
) -> dict[str, Tensor]:
    """The tensor table's entries checked: known, dequantizable types, whole blocks, aligned
    offsets, data inside the file, one entry per name, no bytes shared (`_disjoint`)."""
    tensors: dict[str, Tensor] = {}
    for name, ne, kind, offset in table:
        try:
            qtype = gguf.GGMLQuantizationType(kind)
        except ValueError:
            raise _refuse(path, f"tensor {name!r} has the GGML type {kind}, which the gguf "
                          f"package {gguf_version()} does not know") from None  # fmt: skip
        if not _dequantizes(qtype):
            raise _refuse(path, f"tensor {name!r} is {qtype.name}, which the gguf package "
                          f"{gguf_version()} does not dequantize")  # fmt: skip
        block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        if min(ne) < 1 or ne[0] % block or math.prod(ne) > 1 << 48:
            raise _refuse(path, f"tensor {name!r} has the shape {list(reversed(ne))}, not whole "
                          f"{qtype.name} blocks of {block}")  # fmt: skip
        nbytes = math.prod(ne) // block * block_bytes
        start = data_start + offset
        if offset % alignment:
            raise _refuse(path, f"tensor {name!r} starts at {offset:,}, off the file's "
                          f"alignment of {alignment}")  # fmt: skip
        if start + nbytes > size:
            raise _refuse(path, f"tensor {name!r} claims {nbytes:,} bytes at {start:,}, past the "
                          f"end of the file ({size:,} bytes: truncated)")  # fmt: skip
        if name in tensors:
            raise _refuse(path, f"it holds two tensors named {name!r}")
        tensors[name] = Tensor(
            name, tuple(int(n) for n in reversed(ne)), qtype.name, start, nbytes, block,
            block_bytes, path,
        )  # fmt: skip
    _disjoint(path, tensors, data_start)
    return tensors


def _disjoint(path: str, tensors: dict[str, Tensor], data_start: int) -> None:
    """Refuses two tensors whose data share bytes (a tensor would be read from another's), naming
    both. llama.cpp asks more (`gguf_init_from_file_impl` in gguf.cpp: each tensor starts exactly
    where the previous one's data ends, padded to the alignment); a gap between tensors is left
    to the checks that follow, since every byte read is still its own tensor's (a shape smaller
    than the architecture's is refused by name when the weights are mapped)."""
    order = sorted(enumerate(tensors.values()), key=lambda it: (it[1].start, it[0]))
    widest: Tensor | None = None  # of those before, the one whose data ends last
    for _, t in order:
        if widest is not None and t.start < widest.start + widest.nbytes:
            a, b = widest.start - data_start, widest.start - data_start + widest.nbytes
            raise _refuse(path, f"tensor {t.name!r} starts at {t.start - data_start:,} in the "
                          f"data section, inside the data of tensor {widest.name!r} ({a:,} to "
                          f"{b:,}); each tensor needs bytes of its own (llama.cpp requires each "
                          f"to start where the previous one ends)")  # fmt: skip
        if widest is None or t.start + t.nbytes > widest.start + widest.nbytes:
            widest = t


def gguf_version() -> str:
    """The installed `gguf` package's version."""
    from importlib.metadata import version

    return version("gguf")


def _pread(path: str, ranges: list[tuple[int, int]]) -> bytes:
    """The bytes of `ranges` (`(offset, size)` pairs, in order), joined: one `os.pread` per run
    of adjacent ranges."""
    runs: list[list[int]] = []
    for at, n in ranges:
        if runs and runs[-1][0] + runs[-1][1] == at:
            runs[-1][1] += n
        else:
            runs.append([at, n])
    fd = os.open(path, os.O_RDONLY)
    try:
        parts = []
        for at, n in runs:
            got = os.pread(fd, n, at)
            if len(got) != n:
                raise CheckpointError(
                    f"{path!r} ended while reading {n:,} bytes at {at:,}: the file changed or was "
                    f"truncated after it was opened; re-download it."
                )
            parts.append(got)
    finally:
        os.close(fd)
    return b"".join(parts)


def _rows(
    index: tuple[slice, ...], shape: tuple[int, ...]
) -> tuple[tuple[int, int], list[np.ndarray], list[int]]:
    """For the region `index` of a tensor of `shape` (missing axes whole): the last axis's
    (start, stop), the leading axes' indices, and the flat numbers of the rows it takes."""
    index = tuple(index) + (slice(None),) * (len(shape) - len(index))
    spans = [s.indices(n)[:2] for s, n in zip(index, shape, strict=True)]
    lead = [np.arange(a, b) for a, b in spans[:-1]]
    if not lead:
        return spans[-1], lead, [0]
    grid = np.meshgrid(*lead, indexing="ij")
    return spans[-1], lead, np.ravel_multi_index([g.ravel() for g in grid], shape[:-1]).tolist()


def read_region(
    file: GGUFFile, name: str, index: tuple[slice, ...], dtype: Any = np.float32
) -> np.ndarray:
    """The region `index` (one `slice(start, stop)` per axis) of a tensor, dequantized by
    `gguf.quants.dequantize` into `dtype`, reading only the blocks that hold it.

    Whole rows are read as one byte range per run of rows; a column range as the range of its
    blocks in each row (a block that the range cuts is read whole and trimmed).

    Returns:
      `dtype` array of the region's shape.

    Raises:
      CheckpointError: the file ended early (changed since it was opened).
    """
    t = file.tensors[name]
    shape = t.shape
    (lo, hi), lead, rows = _rows(index, shape)
    first, last = lo // t.block, -(-hi // t.block)  # blocks of the row that hold the columns
    width = (last - first) * t.block
    out = np.empty((len(rows), hi - lo), dtype=dtype)
    qtype = gguf.GGMLQuantizationType[t.type]
    per_piece = max(1, PIECE_BYTES // max(1, 4 * width))
    for a in range(0, len(rows), per_piece):
        chunk = rows[a : a + per_piece]
        ranges = [
            (t.start + r * t.row_bytes + first * t.block_bytes, (last - first) * t.block_bytes)
            for r in chunk
        ]
        raw = np.frombuffer(_pread(t.path, ranges), np.uint8)
        values = _dequantize(raw.reshape(len(chunk), -1), qtype, t.type)
        out[a : a + len(chunk)] = values[:, lo - first * t.block : hi - first * t.block]
    return out.reshape([len(r) for r in lead] + [hi - lo])


def _dequantize(raw: np.ndarray, qtype: Any, type_name: str) -> np.ndarray:
    """`[rows, row bytes] uint8` -> `[rows, row] float32` (`gguf.quants.dequantize`)."""
    if type_name == "F32":
        return raw.view(np.float32)
    return gguf.quants.dequantize(raw, qtype)


def read_blocks(file: GGUFFile, name: str, index: tuple[slice, ...]) -> np.ndarray:
    """The region `index` of a tensor's blocks as they are stored: the tensor seen as
    `[..., rows, row // block]` blocks, each one element of `block_bytes` bytes (a NumPy void
    dtype, so that the mapping's operations move whole blocks); nothing is dequantized.

    Returns:
      `np.dtype((np.void, block_bytes))` array of the region's shape.

    Raises:
      CheckpointError: the file ended early (changed since it was opened).
    """
    t = file.tensors[name]
    shape = (*t.shape[:-1], t.shape[-1] // t.block)
    (first, last), lead, rows = _rows(index, shape)
    ranges = [
        (t.start + r * t.row_bytes + first * t.block_bytes, (last - first) * t.block_bytes)
        for r in rows
    ]
    raw = np.frombuffer(_pread(t.path, ranges), np.dtype((np.void, t.block_bytes)))
    return raw.reshape([len(r) for r in lead] + [last - first])
