"""Safetensors files read by byte ranges: each process fetches only the bytes of the blocks its
devices hold, from a local file or a bucket (`gs://`, `s3://`, `az://`, through `fsspec`).

The layout is the published one (huggingface/safetensors, "Format"): 8 bytes, a little-endian
unsigned 64-bit header size N; N bytes of UTF-8 JSON `{name: {"dtype", "shape", "data_offsets":
[begin, end]}, "__metadata__": {...}}`; then the data, each tensor row-major and little-endian
at `[begin, end)` counted from the byte after the header. So a block of a tensor (a slice on each
axis) is a set of contiguous byte runs: one run per index of the axes before the last sliced one.

Nothing in a header is trusted: its size is bounded (`MAX_HEADER_BYTES`, safetensors' own limit)
and checked against the file's, each entry's dtype, shape and offsets must agree with each other
and lie inside the data, and a misfit is one `CheckpointError` naming the file and the tensor,
before any tensor byte is read.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ml_dtypes
import numpy as np

from ppl_jax.errors import CheckpointError
from ppl_jax.runtime import paths

MAX_HEADER_BYTES = 100 << 20  # safetensors refuses larger headers too
DTYPES = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U64": np.dtype(np.uint64),
    "U32": np.dtype(np.uint32),
    "U16": np.dtype(np.uint16),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
HEADER_WORKERS = 16  # shards whose headers are fetched at once
BATCH_BYTES = 4 << 20  # bytes of ranges asked of a remote file in one `cat_ranges` call


@dataclasses.dataclass(frozen=True)
class TensorRange:
    """One stored tensor: its file (a name inside the folder), dtype name (`F32`, `BF16`, ...),
    shape, and the absolute byte range `[begin, end)` of its data in the file."""

    file: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def _opener(path: str) -> tuple[Any, str] | None:
    """`(fsspec filesystem, path)` of a remote file; None for a local one."""
    return None if paths.is_local(path) else paths.filesystem(path)


def _size(path: str) -> int:
    remote = _opener(path)
    return os.path.getsize(path) if remote is None else int(remote[0].size(remote[1]))


def _read_range(path: str, start: int, end: int) -> bytes:
    remote = _opener(path)
    if remote is None:
        with open(path, "rb") as f:
            return os.pread(f.fileno(), end - start, start)
    return remote[0].cat_file(remote[1], start=start, end=end)


def read_header(folder: str, file: str) -> dict[str, TensorRange]:
    """The tensors of one safetensors file, from its header alone (two small reads).

    Raises:
      CheckpointError: a file too short or whose header is not a safetensors header (too large
        for the file or for `MAX_HEADER_BYTES`, not JSON, an entry whose dtype, shape or offsets
        do not fit), naming the file and the first faulty tensor.
    """
    path = paths.join(folder, file)
    where = repr(path)
    try:
        size = _size(path)
        if size < 8:
            raise CheckpointError(f"{where} is not a safetensors file ({size} bytes).")
        (n,) = struct.unpack("<Q", _read_range(path, 0, 8))
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise CheckpointError(
                f"{where} is not a readable safetensors file: its header claims {n} bytes "
                f"({size} in the file, at most {MAX_HEADER_BYTES})."
            )
        raw = _read_range(path, 8, 8 + n)
    except FileNotFoundError:
        raise CheckpointError(
            f"{where} is missing; download every shard of the checkpoint."
        ) from None
    except OSError as e:
        raise CheckpointError(f"{where} cannot be read ({e}).") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{where}: its safetensors header is not JSON ({e}).") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{where}: its safetensors header is not a JSON object.")
    data, out = 8 + n, {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        out[name] = _entry(file, name, spec, data, size, where)
    return out


def _entry(file: str, name: str, spec: Any, data: int, size: int, where: str) -> TensorRange:
    bad = f"{where}: the stored tensor {name[:200]!r} has"
    if not isinstance(spec, dict):
        raise CheckpointError(f"{bad} no dtype, shape and offsets.")
    dtype, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
    if dtype not in DTYPES:
        raise CheckpointError(f"{bad} the dtype {str(dtype)[:40]!r} (known: {', '.join(DTYPES)}).")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise CheckpointError(f"{bad} a shape {str(shape)[:60]} that is not a list of sizes.")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        and 0 <= offsets[0] <= offsets[1]
        and data + offsets[1] <= size
    ):
        raise CheckpointError(f"{bad} data offsets {str(offsets)[:60]} outside the file.")
    if offsets[1] - offsets[0] != math.prod(shape) * DTYPES[dtype].itemsize:
        raise CheckpointError(
            f"{bad} {offsets[1] - offsets[0]} bytes of data for {dtype}{shape}; the file is "
            f"damaged."
        )
    return TensorRange(file, dtype, tuple(shape), data + offsets[0], data + offsets[1])


def read_headers(folder: str, files: list[str]) -> dict[str, TensorRange]:
    """The tensors of several files of `folder` (headers fetched in parallel).

    Raises:
      CheckpointError: as `read_header`; a tensor stored in two files.
    """
    with ThreadPoolExecutor(min(HEADER_WORKERS, max(1, len(files)))) as pool:
        headers = list(pool.map(lambda f: read_header(folder, f), files))
    out: dict[str, TensorRange] = {}
    for header in headers:
        for name, entry in header.items():
            if name in out:
                raise CheckpointError(
                    f"{folder!r}: the tensor {name!r} is stored in both {out[name].file!r} and "
                    f"{entry.file!r}; keep one copy."
                )
            out[name] = entry
    return out


def byte_runs(
    entry: TensorRange, index: tuple[slice, ...]
) -> tuple[tuple[int, ...], list[tuple[int, int]]]:
    """The block `index` (one slice of step 1 per axis) of a stored tensor: its shape, and the
    absolute byte ranges that hold it in row-major order (adjacent ranges merged)."""
    shape = entry.shape
    itemsize = DTYPES[entry.dtype].itemsize
    bounds = []
    for s, n in zip(index, shape, strict=True):
        start, stop, step = s.indices(n)
        if step != 1:
            raise ValueError("byte_runs reads slices of step 1")
        bounds.append((start, max(start, stop)))
    out_shape = tuple(b - a for a, b in bounds)
    if math.prod(out_shape) == 0:
        return out_shape, []
    k = len(shape) - 1  # the last axis not read whole: the axes after it are contiguous
    while k >= 0 and bounds[k] == (0, shape[k]):
        k -= 1
    if k < 0:
        return out_shape, [(entry.begin, entry.end)]
    strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
    run = (bounds[k][1] - bounds[k][0]) * strides[k] * itemsize
    runs: list[tuple[int, int]] = []
    for outer in itertools.product(*(range(a, b) for a, b in bounds[:k])):
        start = (
            entry.begin
            + (sum(i * s for i, s in zip(outer, strides, strict=False)) + bounds[k][0] * strides[k])
            * itemsize
        )
        if runs and runs[-1][1] == start:
            runs[-1] = (runs[-1][0], start + run)
        else:
            runs.append((start, start + run))
    return out_shape, runs


def _batches(runs: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """`runs` in batches of about `BATCH_BYTES` each, a run longer than that cut in pieces of
    `BATCH_BYTES` (each its own request, so that a large block is fetched concurrently too)."""
    pieces = [
        (a, min(a + BATCH_BYTES, end))
        for start, end in runs
        for a in range(start, end, BATCH_BYTES)
    ]
    batches: list[list[tuple[int, int]]] = [[]]
    size = 0
    for a, b in pieces:
        if batches[-1] and size + b - a > BATCH_BYTES:
            batches.append([])
            size = 0
        batches[-1].append((a, b))
        size += b - a
    return batches


def read_block(folder: str, entry: TensorRange, index: tuple[slice, ...]) -> np.ndarray:
    """The block `index` of a stored tensor, fetching only its byte ranges (a remote file's in
    `cat_ranges` calls of about `BATCH_BYTES`, whose requests asynchronous filesystems such as
    gcsfs run concurrently; so the block, plus one batch, is what it holds on the host).

    Raises:
      CheckpointError: the file ends early or cannot be read (naming it).
    """
    shape, runs = byte_runs(entry, index)
    dtype = DTYPES[entry.dtype]
    out = np.empty(math.prod(shape) * dtype.itemsize, np.uint8)
    path = paths.join(folder, entry.file)
    try:
        remote = _opener(path)
        if remote is None:
            with open(path, "rb") as f:
                at = 0
                for start, end in runs:
                    got = os.preadv(f.fileno(), [memoryview(out)[at : at + end - start]], start)
                    if got != end - start:
                        raise OSError(f"the file ends at byte {start + got}")
                    at += end - start
        else:
            fs, inner = remote
            at = 0
            for batch in _batches(runs):  # the bytes held at once beyond `out`: one batch
                pieces = fs.cat_ranges([inner] * len(batch), [a for a, _ in batch],
                                       [b for _, b in batch])  # fmt: skip
                for (start, end), piece in zip(batch, pieces, strict=True):
                    if isinstance(piece, Exception) or len(piece) != end - start:
                        raise OSError(f"a read of bytes {start}-{end} failed ({piece!r:.100})")
                    out[at : at + end - start] = np.frombuffer(piece, np.uint8)
                    at += end - start
                del pieces
    except OSError as e:
        raise CheckpointError(
            f"{path!r} cannot be read ({e}); the file is damaged or was replaced while read."
        ) from None
    return out.view(dtype).reshape(shape)  # little-endian, as every JAX host is


class RangedSlice:
    """A stored tensor as `safetensors.safe_open(...).get_slice(name)` gives it (`get_shape`,
    `get_dtype`, `[index]`), each `[index]` fetched by byte ranges (`read_block`)."""

    def __init__(self, folder: str, entry: TensorRange):
        self.folder, self.entry = folder, entry

    def get_shape(self) -> list[int]:
        return list(self.entry.shape)

    def get_dtype(self) -> str:
        return self.entry.dtype

    def __getitem__(self, index: Any) -> np.ndarray:
        if not isinstance(index, tuple):
            index = (index,)
        index = tuple(index) + (slice(None),) * (len(self.entry.shape) - len(index))
        return read_block(self.folder, self.entry, index)
