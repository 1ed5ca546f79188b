"""A split GGUF model (llama.cpp's `llama-gguf-split`, gguf-py's `GGUFWriter(split_max_tensors=
...)`) read in place as one model: its parts found from any one of them, each part's header
checked as one file's (`gguf_file.read`), and their tensor tables joined, each tensor read from
its own part by byte range.

llama.cpp's convention (its `llama_split_path` and `llama_split_prefix`, gguf-py's
`gguf.constants.Keys.Split` and `SHARD_NAME_FORMAT`): the parts of a model of N parts are named
`<prefix>-00001-of-0000N.gguf` to `<prefix>-0000N-of-0000N.gguf` (numbers from 1, 5 digits) in
one folder; each part's metadata holds `split.no` (its number from 0), `split.count` (N) and
`split.tensors.count` (the model's tensors, all parts together); the first part holds the rest of
the metadata (architecture, tokenizer), the others only the `split.*` keys. llama.cpp's loader
opens the first part and the others from its name, checks each part's `split.no`, refuses a
tensor named in two parts and a total other than `split.tensors.count`; here any part opens the
model, and each part's `split.count` and `split.tensors.count` must also be the first's (a part of
another model split the same way is refused), all before any weight is read.
"""

from __future__ import annotations

import os
import re

import gguf

from ppl_jax.checkpoints.formats import gguf_file
from ppl_jax.errors import CheckpointError

NO, COUNT, TENSORS = (gguf.Keys.Split.LLM_KV_SPLIT_NO, gguf.Keys.Split.LLM_KV_SPLIT_COUNT,
                      gguf.Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT)  # fmt: skip
PART = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def part_name(prefix: str, no: int, count: int) -> str:
    """The file name of part `no` (from 0) of `count` (`llama_split_path`: numbers from 1)."""
    return f"{prefix}-{no + 1:05d}-of-{count:05d}.gguf"


def one_model(names: list[str]) -> str | None:
    """Of a folder's `.gguf` file names, the one that opens them all: the only one, or the first
    (by name) of the parts of one split model; None when they are several models."""
    if len(names) == 1:
        return names[0]
    found = {(m["prefix"], m["count"]) if (m := PART.match(n)) else None for n in names}
    return sorted(names)[0] if len(found) == 1 and None not in found else None


def _count(path: str, metadata: dict, key: str, least: int, most: int) -> int:
    value = metadata.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        shown = "absent" if value is None else repr(value)[:20]
        raise CheckpointError(
            f"{path!r} is a part of a split GGUF model whose {key} is {shown}, not a number from "
            f"{least} to {most}; re-download the model's parts."
        )
    return value


def read(path: str) -> gguf_file.GGUFFile:
    """The checked header of the GGUF file `path`, or, where `path` is a part of a split model
    (its `split.count` above 1), of the whole model: every part's header read and checked
    (`gguf_file.read`) and their tensor tables joined (see the module docstring).

    Returns:
      `gguf_file.GGUFFile`: for a split model, the first part's path, version and metadata, all
      parts' tensors (each `Tensor.path` its part) and sizes, and `parts`.

    Raises:
      CheckpointError: as `gguf_file.read` for any part; a part whose name is not llama.cpp's
        (the others cannot be found), a missing part (naming it), a part whose `split.no`,
        `split.count` or `split.tensors.count` disagree with its name or the first part's, a
        tensor in two parts, a total of tensors other than `split.tensors.count`.
    """
    given = gguf_file.read(path)
    if given.metadata.get(COUNT) in (None, 0, 1):
        return given
    count = _count(path, given.metadata, COUNT, 2, 65535)
    no = _count(path, given.metadata, NO, 0, count - 1)
    folder, name = os.path.split(path)
    match = PART.match(name)
    if not match or name != part_name(match["prefix"], no, count):
        raise CheckpointError(
            f"{path!r} is part {no + 1} of {count} of a split GGUF model, but its name does not "
            f"end in -{no + 1:05d}-of-{count:05d}.gguf, so its other parts cannot be found; name "
            f"the parts as llama-gguf-split does (model-00001-of-{count:05d}.gguf, ...)."
        )
    names = [os.path.join(folder, part_name(match["prefix"], i, count)) for i in range(count)]
    missing = [os.path.basename(n) for n in names if not os.path.isfile(n)]
    if missing:
        raise CheckpointError(
            f"{path!r} is part {no + 1} of a GGUF model split into {count} parts, and "
            f"{', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''} "
            f"{'is' if len(missing) == 1 else f'({len(missing)} parts) are'} missing from "
            f"{folder or '.'!r}; download every part into that folder."
        )
    headers = [given if n == path else gguf_file.read(n) for n in names]
    first = headers[0]  # the reference: the part llama.cpp opens, holding the metadata
    return _joined(headers, count, _count(first.path, first.metadata, TENSORS, 1, 1 << 31))


def _joined(headers: list[gguf_file.GGUFFile], count: int, total: int) -> gguf_file.GGUFFile:
    """The parts' headers as one model's, each part's `split.*` keys checked against its place
    and the total."""
    tensors: dict[str, gguf_file.Tensor] = {}
    for i, h in enumerate(headers):
        said = {key: h.metadata.get(key) for key in (NO, COUNT, TENSORS)}
        if said != {NO: i, COUNT: count, TENSORS: total}:
            raise CheckpointError(
                f"{h.path!r} says it is {NO} {said[NO]} of {COUNT} {said[COUNT]} with "
                f"{TENSORS} {said[TENSORS]}, where its name and the first part make it {i} of "
                f"{count} with {total}: a part of another model or a renamed file; re-download "
                f"the model's parts into one folder."
            )
        for tensor_name, t in h.tensors.items():
            if tensor_name in tensors:
                raise CheckpointError(
                    f"the tensor {tensor_name!r} is in two parts of a split GGUF model, "
                    f"{tensors[tensor_name].path!r} and {h.path!r}: parts of different models "
                    f"mixed; re-download the model's parts."
                )
            tensors[tensor_name] = t
    if len(tensors) != total:
        raise CheckpointError(
            f"the {count} parts of the split GGUF model {headers[0].path!r} hold {len(tensors)} "
            f"tensors, where its {TENSORS} says {total}: parts of different models mixed; "
            f"re-download the model's parts."
        )
    first = headers[0]
    return gguf_file.GGUFFile(
        first.path, sum(h.size for h in headers), first.version, first.metadata, tensors,
        tuple(h.path for h in headers),
    )  # fmt: skip
