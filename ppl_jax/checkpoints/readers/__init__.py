"""Readers: one `Checkpoint` subclass per checkpoint layout, each answering the protocol of
`ppl_jax.checkpoints.checkpoint` from its own files, and what only readers use.

ppl_jax's own Orbax saves (`OwnOrbax`), other trainers' Orbax trees (`ForeignOrbax`) and Orbax v1
trees (`OrbaxV1`), levanter's and marin's runs (`LevanterRun`), EasyDeL's (`EasyDeLCheckpoint`)
and T5X's (`T5XCheckpoint`) TensorStore trees, a Hugging Face directory or hub repository
(`HFDirectory`, `HubRepo`), a GGUF file (`GGUFCheckpoint`, its architecture in `gguf_arch`); the
step lookup of runs that save one folder per step (`StepFolders`).
`ppl_jax.checkpoints.opener` picks the reader by its markers.
"""

from etils import epy as _epy

with _epy.lazy_api_imports(globals()):
    from ppl_jax.checkpoints.readers.easydel import EasyDeLCheckpoint
    from ppl_jax.checkpoints.readers.foreign import ForeignOrbax
    from ppl_jax.checkpoints.readers.gguf import GGUFCheckpoint
    from ppl_jax.checkpoints.readers.huggingface import HFDirectory, HubRepo
    from ppl_jax.checkpoints.readers.levanter import LevanterRun
    from ppl_jax.checkpoints.readers.orbax_v1 import OrbaxV1
    from ppl_jax.checkpoints.readers.own import OwnOrbax
    from ppl_jax.checkpoints.readers.step_folders import StepFolders
    from ppl_jax.checkpoints.readers.t5x import T5XCheckpoint

__all__ = [
    "EasyDeLCheckpoint",
    "ForeignOrbax",
    "GGUFCheckpoint",
    "HFDirectory",
    "HubRepo",
    "LevanterRun",
    "OrbaxV1",
    "OwnOrbax",
    "StepFolders",
    "T5XCheckpoint",
]
