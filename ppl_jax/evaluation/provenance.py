"""What an evaluator's records and fingerprints say of where its numbers come from, beyond its
datasets' sums (`Provenance`): the checkpoint, the model's dtype and attention, the tokenizer, the
batch layout, mesh and sharding rules, the step's options, the intervals' settings. The
`Evaluator` makes one from its arguments; each (step, dataset) pair gets its fingerprint
(`fingerprint`: the one the journal, the results store and the cross-process checks compare)
and the `Evaluation` its record is made of (`evaluation`).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from ppl_jax.checkpoints import Checkpoint, architecture
from ppl_jax.evaluation.result import Evaluation
from ppl_jax.metrics import sums as metrics
from ppl_jax.models.interface import LanguageModel, weight_paths
from ppl_jax.models.layers import attention as attention_lib
from ppl_jax.models.layers import packed
from ppl_jax.outputs.model_record import FAMILY, model_record, packed_record
from ppl_jax.plans.layout import Layout
from ppl_jax.plans.planner import Dataset
from ppl_jax.plans.spec import BatchSpec
from ppl_jax.runtime import fingerprint as fingerprint_lib
from ppl_jax.scoring.scorer import ScoreTotals, StepOptions, logits_budget, nll_chunk
from ppl_jax.tokenizer import Tokenizer


@dataclasses.dataclass(frozen=True)
class Provenance:
    """See the module docstring; the arguments of `ppl_jax.Evaluator` of the same names.

    Attributes:
      dtype: the params' dtype as the records name it.
      attention: the attention implementation the model runs, as the records name it.
      matmul_precision: the precision of the step's matrix products (`Scorer.matmul_precision`:
        `StepOptions.matmul_precision`, `auto` resolved by the params' dtypes).
    """

    model: LanguageModel
    mesh: Mesh
    checkpoint: Checkpoint | None
    tokenizer: Tokenizer | None
    batch: BatchSpec
    rules: tuple[tuple[str, str | None], ...]
    options: StepOptions
    dtype: str
    attention: str
    matmul_precision: str
    bootstrap_samples: int = 1000
    seed: int = 0
    # step -> its `quantization` record, found once (a layout may read a GPTQ `g_idx`)
    _quantization: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(
        cls,
        model: LanguageModel,
        mesh: Mesh,
        checkpoint: Checkpoint | None,
        tokenizer: Tokenizer | None,
        batch: BatchSpec,
        rules: Sequence[tuple[str, str | None]],
        options: StepOptions,
        matmul_precision: str,
        dtype: str | None = None,
        attention: str | None = None,
        bootstrap_samples: int = 1000,
        seed: int = 0,
    ) -> Provenance:
        """With the defaults of `dtype` (the float dtype of the model's params) and `attention`
        (what `auto` resolves to for a family's model on `mesh`, `xla` for one's own)."""
        dtype = dtype or params_dtype(model.abstract_params)
        attention = attention or default_attention(model, dtype, mesh, options)
        return cls(
            model, mesh, checkpoint, tokenizer, batch, tuple(rules), options, dtype, attention,
            matmul_precision, int(bootstrap_samples), int(seed),
        )  # fmt: skip

    def attention_layers(self) -> dict[str, str]:
        """The kernel each kind of attention layer runs (`attention.layer_kernels` of the model's
        description for `attention` on the mesh's devices); empty for a model of one's own."""
        if not self.model.origin.startswith(FAMILY) or "," in self.dtype:
            return {}
        return attention_lib.layer_kernels(self.attention, *self._attention_args(), **self._mesh())

    def quantization(self, step: int | None) -> dict[str, Any] | None:
        """The checkpoint's stored quantization (`Checkpoint.quantization`), with where its
        weights were dequantized (`dequantized`: `setting` (`checkpoint.dequantize`),
        `on_device` (the weights kept packed), `on_host` and `host_reasons` (a few of them, by
        weight)); None for float weights or no checkpoint."""
        if step in self._quantization:
            return copy.deepcopy(self._quantization[step])
        ckpt = self.checkpoint
        found = None if ckpt is None else ckpt.quantization(step)
        if found is None:
            return None
        on_device = packed_record(self.model.abstract_params)
        layouts, host = ckpt.device_layouts(step, weight_paths(self.model.abstract_params))
        if ckpt.options.dequantize == "host":
            host = {**{k: "checkpoint.dequantize=host" for k in layouts}, **host}
        self._quantization[step] = {
            **found,
            "dequantized": {
                "setting": ckpt.options.dequantize,
                "on_device": 0 if on_device is None else on_device["weights"],
                "on_host": len(host),
                "host_reasons": dict(sorted(host.items())[:4]),
            },
        }
        return copy.deepcopy(self._quantization[step])

    def attention_note(self) -> str | None:
        """Which kinds of attention layer run the flash kernel on a GPU or TPU and why
        (`attention.flash_note`), one line; None where none do, on CPU, or for a model of one's
        own."""
        if not self.model.origin.startswith(FAMILY) or "," in self.dtype:
            return None
        return attention_lib.flash_note(self.attention, *self._attention_args(), **self._mesh())

    def _attention_args(self) -> tuple[Any, dict[str, Any]]:
        return jnp.dtype(self.dtype), self.model.description

    def _mesh(self) -> dict[str, Any]:
        return dict(
            context=int(self.mesh.shape.get("context", 1)),
            context_attention=self.options.context_attention,
            platform=self.mesh.devices.flat[0].platform,
        )

    def step_part(self, step: int | None) -> dict[str, Any]:
        """What the fingerprints of every dataset at `step` share and take I/O to find: the
        checkpoint's identity (its files listed) and the environment (packages, devices), found
        once for a step's datasets."""
        return {
            "checkpoint": {} if self.checkpoint is None else self.checkpoint.identity(step),
            "environment": fingerprint_lib.environment(),
        }

    def fingerprint(
        self,
        d: Dataset,
        step: int | None,
        protocol_part: Mapping[str, Any] | None = None,
        shared: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """What decides the numbers of dataset `d` scored at `step`
        (`ppl_jax.runtime.fingerprint.run_fingerprint`): the checkpoint's identity, the model
        (description, dtype, attention), the data, tokenizer, protocol (with `protocol_part`:
        the command line's long-context measures), layout, mesh and environment; so that a
        journal or a stored record of another is never taken for this pair's. `shared`: the
        step's `step_part`, when the caller found it for several datasets."""
        model, plan = self.model, d.plan
        shared = self.step_part(step) if shared is None else shared
        tok = None if self.tokenizer is None else self.tokenizer.describe()
        return fingerprint_lib.run_fingerprint(
            {
                "checkpoint": shared["checkpoint"],
                "model": {
                    "description": fingerprint_lib.text_digest(model.description),
                    "dtype": self.dtype,
                    "matmul_precision": self.matmul_precision,
                    "attention": self.attention,
                    "honours_segments": model.honours_segments,
                    # weights packed on the device (checkpoint.dequantize), where any are
                    **(
                        {"packed": on_device}
                        if (on_device := packed_record(model.abstract_params))
                        else {}
                    ),
                },
                "data": d.data.fingerprint_part(),
                "tokenizer": {
                    "description": None if tok is None else fingerprint_lib.text_digest(tok)
                },
                "protocol": {
                    **d.protocol.fingerprint_part(),
                    "add_bos": plan.add_bos,
                    "prefix_id": plan.prefix_id,
                    "num_windows": plan.windows.num_windows,
                    **(protocol_part or {}),
                },
                "layout": {
                    **self.batch.fingerprint_part(),
                    "num_batches": d.layout.num_batches,
                    # rows per batch where the layout shares them out below eval.batch_size
                    # (`planner.batches`); a plan of one batch as before (its windows the same)
                    **(
                        {"rows": d.layout.batch_size}
                        if d.layout.num_batches > 1 and d.layout.batch_size < self.batch.batch_size
                        else {}
                    ),
                },
                "mesh": {
                    **{k: int(v) for k, v in self.mesh.shape.items() if k != "context"},
                    "processes": jax.process_count(),
                    "rules": [list(rule) for rule in self.rules],
                    **self._context_part(d.layout),
                },
                "environment": shared["environment"],
            }
        )

    def _context_part(self, layout: Layout) -> dict[str, Any]:
        """The context axis's settings and the per-token chunks (they change the order of
        float32 additions), where a run sets them: `token_chunk`, or the NLL's own chunks of the
        layout's batch shapes (`Scorer.nll_chunk`) where any is not 0; empty otherwise (the
        fingerprints of other runs as before)."""
        part: dict[str, Any] = {}
        context = int(self.mesh.shape.get("context", 1))
        if context > 1:
            part.update(context=context, context_attention=self.options.context_attention)
        if self.options.token_chunk:
            part["token_chunk"] = self.options.token_chunk
            return part
        chunks = {
            nll_chunk(
                layout.batch_size,
                width,
                self.model.vocab_size,
                data=int(self.mesh.shape.get("data", 1)),
                context=context,
                budget=logits_budget(self.mesh),
            )
            for width in set(layout.widths)
        }
        if chunks != {0}:
            part["nll_chunk"] = sorted(chunks)
        return part

    def evaluation(
        self,
        d: Dataset,
        step: int | None,
        parts: dict[str, Any],
        sums: metrics.Sums,
        totals: ScoreTotals,
    ) -> Evaluation:
        """The `Evaluation` of dataset `d` scored at `step` (its fingerprint `parts`), of what
        the evaluator knows: the hooks add the rest (`PairHooks.finish`)."""
        ckpt = self.checkpoint
        return Evaluation(
            sums=sums,
            metrics=metrics.derive(sums),
            totals=totals,
            plan=d.plan,
            step=step,
            documents=None,
            # `context` only where it splits windows: other runs' records as before.
            mesh_shape={k: v for k, v in self.mesh.shape.items() if k != "context" or v > 1},
            model_description=model_record(self.model),
            tokenizer_name="" if self.tokenizer is None else self.tokenizer.name,
            checkpoint_format="" if ckpt is None else ckpt.format,
            quantization=self.quantization(step),
            layout=d.layout,
            attention=self.attention,
            attention_layers=self.attention_layers(),
            attention_note=self.attention_note(),
            matmul_precision=self.matmul_precision,
            gzip_bits_per_byte=None,
            wall_seconds=totals.scoring_seconds,
            dataset=d.data,
            protocol_spec=d.protocol,
            fingerprint=parts,
            tokenizer_is_checkpoints=d.data.tokenizer == "auto",
            checkpoint_path=None if ckpt is None else ckpt.path,
            checkpoint_commit=parts["checkpoint"].get("commit"),
            dtype=self.dtype,
            packing=self.batch.packing,
            bootstrap_samples=self.bootstrap_samples,
            seed=self.seed,
        )


def params_dtype(abstract_params: Any) -> str:
    """The float dtype of a params tree (`float32`), or its float dtypes joined by `,`."""
    found = {
        jnp.dtype(leaf.dtype).name
        for leaf in packed.leaves(abstract_params)
        if jnp.issubdtype(leaf.dtype, jnp.floating)
    }
    return ",".join(sorted(found)) or "float32"


def default_attention(model: LanguageModel, dtype: str, mesh: Mesh, options: StepOptions) -> str:
    """What `model.attention=auto` resolves to for a family's model (its description) on
    `mesh`; `xla` for a model of one's own, which attends its own way."""
    if not model.origin.startswith(FAMILY) or "," in dtype:
        return "xla"
    arch = architecture.Architecture(model.description)
    return arch.attention("auto", dtype, mesh, options.context_attention)
