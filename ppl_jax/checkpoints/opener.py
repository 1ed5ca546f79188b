"""The one checkpoint opener: which reader reads a checkpoint, found by its markers.

`open_checkpoint(path)` asks each reader of `READERS` in turn whether it reads `path`
(`Checkpoint.claims`: the markers it found) and returns an instance of the first that does; that
object answers every question the evaluation asks (`ppl_jax.checkpoints.checkpoint.Checkpoint`).
Nothing outside `ppl_jax.checkpoints` asks which reader it is. The readers, in the order asked:

| reader | layout | markers |
| --- | --- | --- |
| `HubRepo` | a hub id by revision, or a hub cache's repository folder | `hf://org/name[@rev]`; `models--org--name/refs`, `snapshots` |
| `OrbaxV1` | a checkpoint (or run of steps) of the Orbax v1 API | the empty file `orbax.checkpoint`; v1 handlers in `_CHECKPOINT_METADATA` |
| `LevanterRun` | a levanter (marin) run of `step-<N>/` folders, or one step | `step-<N>/metadata.json` |
| `EasyDeLCheckpoint` | an EasyDeL checkpoint, or a run of `run-<step>/` milestones | `tensorstore_index.json` (+ `config.json`) |
| `T5XCheckpoint` | a T5X model directory of `checkpoint_<step>/` steps, or one step | the msgpack file `checkpoint` in `checkpoint_<step>` |
| `GGUFCheckpoint` | a GGUF file (llama.cpp), or a folder holding one | a `.gguf` file (GGUF magic); a folder of `.gguf` files without safetensors weights |
| `HFDirectory` | a Hugging Face directory, local or on a bucket | `config.json` (+ `model.safetensors` or `model.safetensors.index.json`) |
| `OwnOrbax` | ppl_jax's own Orbax steps | numbered steps whose latest has a `metadata` item |
| `ForeignOrbax` | MaxText, gemma, Linen and NNX loops' Orbax trees | an item folder (`_METADATA`, `manifest.ocdbt`); steps without `metadata`; `checkpoints/` |

A new layout is a new reader class in its own module, added to `READERS` before the readers
whose markers it shares (a folder with `config.json` and `tensorstore_index.json` is EasyDeL's,
not a Hugging Face directory). A folder no reader claims (an Orbax directory before its first
step, watched) is read as ppl_jax's own, or as another trainer's when an architecture, mapping,
item or params path is given.
"""

from __future__ import annotations

from ppl_jax.checkpoints.checkpoint import DTYPES, Checkpoint, Options, dtype_of
from ppl_jax.checkpoints.formats import safetensors
from ppl_jax.checkpoints.readers.easydel import EasyDeLCheckpoint
from ppl_jax.checkpoints.readers.foreign import ForeignOrbax
from ppl_jax.checkpoints.readers.gguf import GGUFCheckpoint
from ppl_jax.checkpoints.readers.huggingface import HFDirectory, HubRepo
from ppl_jax.checkpoints.readers.levanter import LevanterRun
from ppl_jax.checkpoints.readers.orbax_v1 import OrbaxV1
from ppl_jax.checkpoints.readers.own import OwnOrbax
from ppl_jax.checkpoints.readers.t5x import T5XCheckpoint
from ppl_jax.errors import CheckpointError, ConfigError
from ppl_jax.runtime import paths

READERS: tuple[type[Checkpoint], ...] = (
    HubRepo,
    OrbaxV1,
    LevanterRun,
    EasyDeLCheckpoint,
    T5XCheckpoint,
    GGUFCheckpoint,
    HFDirectory,
    OwnOrbax,
    ForeignOrbax,
)
FORMATS = ("auto", *dict.fromkeys(f for r in READERS for f in r.formats))

__all__ = ["DTYPES", "FORMATS", "READERS", "Checkpoint", "choose", "dtype_of", "open_checkpoint"]


def choose(
    path: str, format: str = "auto", options: Options | None = None
) -> tuple[type[Checkpoint], str]:
    """The reader of `path` and why (the markers it found); nothing of the weights is read.

    Args:
      path, format, options: as `open_checkpoint`'s.

    Raises:
      ConfigError: an unknown format; a remote path whose filesystem package is missing.
      CheckpointError: no such directory, naming the layouts of the readers asked.
    """
    if format not in FORMATS:
        raise ConfigError(f"checkpoint.format={format!r} is not one of {', '.join(FORMATS)}.")
    options = options or Options()
    try:
        for reader in READERS:
            if format != "auto" and reader.formats and format not in reader.formats:
                continue
            why = reader.claims(path, options)
            if why:
                return reader, why
        found = paths.isdir(path)
    except ImportError as e:
        raise paths.missing_backend(path, e) from None
    if format == "hf":
        if not found:
            safetensors.read_description(path)  # its sentence for a missing directory
        return HFDirectory, "checkpoint.format=hf"
    if not found:
        layouts = dict.fromkeys(
            r.layout_name.split(" (")[0]
            for r in READERS
            if format == "auto" or not r.formats or format in r.formats
        )
        raise CheckpointError(
            f"checkpoint.dir: no such directory {path!r}. Give a checkpoint of a layout ppl_jax "
            f"reads: {', '.join(layouts)} (docs/checkpoints.md)."
        )
    if options.architecture or options.names_a_tree:
        return ForeignOrbax, "no step yet; an architecture or mapping is given"
    return OwnOrbax, "no step yet (read as ppl_jax's own when one is finalized)"


def open_checkpoint(
    path: str,
    format: str = "auto",
    *,
    architecture: str = "",
    mapping: str = "",
    item: str = "",
    params: str = "",
    allow_download: bool = False,
    dequantize: str = "auto",
) -> Checkpoint:
    """Opens the checkpoint `path` (local, or remote: see `ppl_jax.runtime.paths`) with the reader
    of its layout (`READERS`, chosen by `choose`).

    Args:
      path: the directory, or a hub id (`hf://org/name[@revision]`, or a bare `org/name` that is
        not a path; `ppl_jax.checkpoints.formats.hub`).
      format: `auto` (the markers decide), or one of `FORMATS` (only its readers are asked:
        `orbax`, `hf`).
      architecture: `checkpoint.architecture` (`ppl_jax.checkpoints.given.parse`): wins
        over the architecture a checkpoint carries.
      mapping: `checkpoint.mapping`: a preset (`maxtext`, `gemma`, `identity`), a YAML/JSON
        mapping file, or '' (the layout's own names, else detected from the stored names).
      item: `checkpoint.item` ('': found).
      params: `checkpoint.params` ('': found).
      allow_download: a hub id may be downloaded (default: the local hub cache only).
      dequantize: `checkpoint.dequantize`, where quantized weights are dequantized (`auto`,
        `device`, `host`: `ppl_jax.checkpoints.architecture.packed`).

    Returns:
      A `Checkpoint`; only the markers were read (nothing of the weights).

    Raises:
      ConfigError: an unknown format; a remote path whose filesystem package is missing.
      CheckpointError: no such directory ("checkpoint.dir: no such directory ...", naming every
        layout the readers read; with `format="hf"`: its config.json is missing); a malformed
        hub id.
    """
    options = Options(architecture, mapping, item, params, bool(allow_download), dequantize)
    reader, why = choose(path, format, options)
    return reader(path, options, why)
