"""`PplJaxLM`: ppl_jax as the lm-evaluation-harness model `ppl_jax` (imports lm_eval).

    lm_eval --model ppl_jax --model_args checkpoint=DIR,step=1000,batch_size=16,seq_len=2048 ...

Requests are tokenized as the harness's HF backend (`lm_eval.models.huggingface.HFLM`) tokenizes
them: `TemplateLM.loglikelihood` splits each (context, continuation) pair (trailing spaces of the
context move to the continuation; the pair is encoded whole and the context's tokens cut off;
an empty context becomes the prefix token), and `tok_encode` adds the tokenizer's own BOS as
`transformers` does with `add_special_tokens` (not when the text already starts with the prefix
token's text). The context is left-truncated to `seq_len` inside `ppl_jax.plans.requests`; a
continuation longer than `seq_len` is refused, as HFLM asserts. Scoring is
`ppl_jax.harness.backend.RequestScorer` on the mesh, every process taking part.

`generate_until` is refused. The harness sees one process (`rank == 0`, `world_size == 1`), so it
never imports torch to distribute; ppl_jax spreads the work over its own mesh.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import Any

import jax
import lm_eval
import numpy as np
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from ppl_jax import tokenizer as tokenizer_lib
from ppl_jax.checkpoints.opener import Checkpoint
from ppl_jax.errors import ConfigError
from ppl_jax.harness import arguments, backend
from ppl_jax.harness.backend import LoglikelihoodResult, RequestScorer
from ppl_jax.models.interface import LanguageModel

REFUSE_GENERATION = (
    "the ppl_jax model serves loglikelihood requests (log-likelihood and multiple-choice tasks) "
    "and loglikelihood_rolling requests (perplexity tasks), not generate_until: choose tasks "
    "whose output_type is loglikelihood, multiple_choice or loglikelihood_rolling."
)


COMMAND_LINE_MODELS: list[PplJaxLM] = []  # built by the harness's command line (closed on errors)


def checkpoint_of(model_args: Any) -> str | None:
    """The `checkpoint` of `--model_args` (a `k=v,...` string or a dict), or None."""
    if isinstance(model_args, dict):
        value = model_args.get("checkpoint")
        return None if value is None or isinstance(value, Checkpoint) else str(value)
    if isinstance(model_args, str):
        for part in model_args.split(","):
            key, _, value = part.partition("=")
            if key.strip() == "checkpoint" and value.strip():
                return value.strip()
    return None


def _name_runs_by_checkpoint() -> None:
    """Names the harness's output subfolder (`--output_path`) after the checkpoint, as it names an
    HF model's after `pretrained=`: lm-eval's `GeneralConfigTracker` looks for `pretrained=`,
    `model=`, `path=`, ... in `--model_args` (so `mesh_model=1` read as the model `1`) and else
    names it with a random id. Only runs of the model `ppl_jax` are renamed."""
    from lm_eval.loggers import evaluation_tracker
    from lm_eval.utils import sanitize_model_name

    tracker = evaluation_tracker.GeneralConfigTracker
    original = tracker.log_experiment_args
    if getattr(original, "ppl_jax", False):
        return

    def log_experiment_args(self, model_source, model_args, *args, **kwargs):
        original(self, model_source, model_args, *args, **kwargs)
        checkpoint = checkpoint_of(model_args) if model_source == "ppl_jax" else None
        if checkpoint:
            self.model_name = checkpoint
            self.model_name_sanitized = sanitize_model_name(checkpoint)

    log_experiment_args.ppl_jax = True  # type: ignore[attr-defined]
    tracker.log_experiment_args = log_experiment_args


_name_runs_by_checkpoint()


@register_model("ppl_jax")
class PplJaxLM(TemplateLM):
    """ppl_jax as a harness model (see the module docstring).

    Args (the `--model_args` keys):
      checkpoint: a checkpoint ppl_jax opens (`ppl_jax.open_checkpoint`: Orbax steps, a Hugging
        Face directory, a hub id `hf://org/name[@revision]`, ...), or a `ppl_jax.Checkpoint`;
        step: a step (None or `latest`: the latest).
      format: `auto`, `orbax` or `hf`; dtype: `float32` or `bfloat16`; attention: `auto`, `xla`,
        `cudnn`, `tokamax`, `splash`.
      tokenizer: `auto` (the checkpoint's own), or a path (`ppl_jax.load_tokenizer`).
      seq_len: the model inputs per row, the harness's `max_length` (None: the model's
        positions); batch_size: rows per step (global; `--batch_size` when not given here;
        rounded up to a multiple of the mesh's data axis); packing: several requests per row.
      mesh_data, mesh_model: the mesh (`ppl_jax.make_mesh`; -1 takes the devices left).
      add_bos_token: as HFLM's: None follows the tokenizer, true/false forces BOS on or off.
      prefix_token_id: as HFLM's: the token an empty context becomes (None: BOS, else EOS).
      device, max_batch_size: accepted for the harness's command line, unused (JAX places work).

    Attributes:
      last_loglikelihood: the last `loglikelihood` call's `LoglikelihoodResult`, per request in
        the call's order: log-probability, greedy flag, continuation tokens and bytes, and
        `bits_per_byte` of the continuation (span bits per byte), which the harness's API has
        no place for.
      loglikelihood_history: every call's result, in order (`clear_history()` empties it).

    Raises:
      ConfigError, CheckpointError: as `ppl_jax.harness.arguments.open_model` (before any
        weight is read: a bad key or value, a tokenizer without BOS or EOS and no
        prefix_token_id), the checkpoint's `restore` and `RequestScorer`.
    """

    def __init__(
        self,
        checkpoint: str | None = None,
        step: int | None = None,
        format: str = "auto",
        dtype: str = "float32",
        attention: str = "auto",
        tokenizer: str = "auto",
        seq_len: int | None = None,
        batch_size: int | str = 8,
        packing: bool | str = True,
        mesh_data: int = -1,
        mesh_model: int = 1,
        add_bos_token: bool | str | None = None,
        prefix_token_id: int | None = None,
        device: str | None = None,
        max_batch_size: int | None = None,
        _from_command_line: bool = False,
        **kwargs: Any,
    ):
        super().__init__()
        opened = arguments.open_model(
            arguments.COMMAND_LINE if _from_command_line else arguments.LIBRARY,
            checkpoint=checkpoint, step=step, format=format, dtype=dtype, attention=attention,
            tokenizer=tokenizer, seq_len=seq_len, batch_size=batch_size, packing=packing,
            mesh_data=mesh_data, mesh_model=mesh_model, add_bos_token=add_bos_token,
            prefix_token_id=prefix_token_id, device=device, max_batch_size=max_batch_size,
            **kwargs,
        )  # fmt: skip
        o = opened
        params = backend.restore(o.ckpt, o.step, o.model, o.mesh, o.dtype)  # checked: read
        self._setup(
            RequestScorer(o.model, params, o.mesh, o.tokenizer, seq_len=o.seq_len,
                          batch_size=o.batch_size, packing=o.packing),
            o.add_bos_token,
            o.prefix_token_id,
        )  # fmt: skip

    def _setup(
        self, scorer: RequestScorer, add_bos_token: bool | None, prefix_token_id: int | None
    ) -> None:
        self.scorer = scorer
        # lm_eval's bootstrap of standard errors forks a multiprocessing pool, which deadlocks
        # at random in a process with JAX's threads; this makes it run the same draws in one
        # loop (lm_eval.api.metrics.bootstrap_stderr), unless the user set it.
        os.environ.setdefault("DISABLE_MULTIPROC", "1")
        self.ppl_tokenizer = scorer.tokenizer
        self.add_bos_token = add_bos_token
        self.custom_prefix_token_id = prefix_token_id
        prefix = self._prefix_or_none()
        self._prefix_text = (
            "" if prefix is None else self.ppl_tokenizer.token_texts(np.asarray([prefix]))[0]
        )
        self.last_loglikelihood: LoglikelihoodResult | None = None
        self.loglikelihood_history: list[LoglikelihoodResult] = []

    def set_params(self, params: Any) -> None:
        """Scores with new params from now on (a training loop's, placed as the first ones were:
        the same shapes, dtypes and shardings), keeping the compiled steps. Call it on every
        process."""
        self.scorer.params = params

    # ---------------------------------------------------------------- construction

    @classmethod
    def from_params(
        cls,
        model: LanguageModel,
        params: Any,
        mesh: Any,
        tokenizer: tokenizer_lib.Tokenizer,
        *,
        seq_len: int | None = None,
        batch_size: int = 8,
        packing: bool = True,
        param_shardings: Any = None,
        add_bos_token: bool | None = None,
        prefix_token_id: int | None = None,
    ) -> PplJaxLM:
        """The harness model on a model and params already on the mesh (a training loop's),
        without reading a checkpoint. Build it on every process (see `ppl_jax.harness.evaluate`).

        Args:
          model: the `ppl_jax.LanguageModel`; params: its params, placed with `param_shardings`
            (None: those of the default rules, `ppl_jax.runtime.mesh.param_targets`).
          mesh: the global mesh; tokenizer: the model's (`ppl_jax.load_tokenizer`).
          seq_len, batch_size, packing, add_bos_token, prefix_token_id: as the constructor's.
        """
        arguments.check_prefix(tokenizer, prefix_token_id, arguments.LIBRARY)
        lm = cls.__new__(cls)
        TemplateLM.__init__(lm)
        lm._setup(
            RequestScorer(
                model,
                params,
                mesh,
                tokenizer,
                seq_len=seq_len,
                batch_size=batch_size,
                packing=packing,
                param_shardings=param_shardings,
            ),
            add_bos_token,
            prefix_token_id,
        )
        return lm

    @classmethod
    def create_from_arg_string(
        cls, arg_string: str, additional_config: dict | None = None
    ) -> PplJaxLM:
        """The harness's constructor from `--model_args` (its keys win over the command line's
        `--batch_size`, whose default is 1). On a process other than 0 the model serves process
        0's calls until the run ends, and then the process exits (status 0): only process 0
        runs the harness."""
        from lm_eval import utils

        args = {k: v for k, v in (additional_config or {}).items() if v is not None}
        args.update(utils.simple_parse_args_string(arg_string))
        return cls(**args, _from_command_line=True)._for_the_command_line()

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
        """As `create_from_arg_string`, from a dict."""
        args = {k: v for k, v in (additional_config or {}).items() if v is not None}
        args.update(arg_dict)
        return cls(**args, _from_command_line=True)._for_the_command_line()

    def _for_the_command_line(self) -> PplJaxLM:
        """Process 0 ends the others' `serve` at exit; they serve, then exit (status 0)."""
        if jax.process_index() != 0:
            self.scorer.serve()
            sys.exit(0)
        atexit.register(self.close)
        COMMAND_LINE_MODELS.append(self)
        return self

    def close(self) -> None:
        """On process 0: ends the other processes' `serve` (idempotent; at exit for a model of
        the command line)."""
        self.scorer.stop()

    def serve(self) -> int:
        """On a process other than 0: takes part in process 0's calls until its `close`."""
        return self.scorer.serve()

    # ---------------------------------------------------------------- the harness's API

    @property
    def eot_token_id(self) -> int:
        return self.ppl_tokenizer.eos_id

    def _prefix_or_none(self) -> int | None:
        if self.custom_prefix_token_id is not None:
            return self.custom_prefix_token_id
        if self.ppl_tokenizer.bos_id is not None:
            return self.ppl_tokenizer.bos_id
        return self.ppl_tokenizer.eos_id

    @property
    def prefix_token_id(self) -> int:
        """As HFLM: the custom prefix, else BOS, else EOS (what an empty context becomes, and
        what predicts a rolling document's first token).

        Raises:
          ConfigError: the tokenizer has neither BOS nor EOS and no prefix_token_id was given.
        """
        prefix = self._prefix_or_none()
        if prefix is None:  # checked when the model was made; set to None since
            arguments.check_prefix(self.ppl_tokenizer, None, arguments.LIBRARY)
        return prefix

    @property
    def max_length(self) -> int:
        return self.scorer.seq_len

    @property
    def batch_size(self) -> int:
        return self.scorer.batch.batch_size

    @property
    def tokenizer_name(self) -> str:
        return self.ppl_tokenizer.name.replace("/", "__")

    def tok_encode(
        self,
        string: str,
        add_special_tokens: bool | None = None,
        left_truncate_len: int | None = None,
        **kwargs: Any,
    ) -> list[int]:
        """Token ids of `string` as HFLM's `tok_encode`: special tokens per `add_special_tokens`,
        else `add_bos_token`, else the tokenizer's own policy (its BOS, if it adds one), and none
        when `add_special_tokens` is None and the text starts with the prefix token's text."""
        special = add_special_tokens if add_special_tokens is not None else self.add_bos_token
        if (
            add_special_tokens is None
            and self._prefix_text
            and string.startswith(self._prefix_text)
        ):
            special = False
        tok = self.ppl_tokenizer
        # transformers' add_special_tokens (its default, True) adds what the post-processor adds.
        bos = special is not False and (tok.add_bos_default or self.add_bos_token is True)
        ids = tok.encode([string])[0].tolist()
        if bos and tok.bos_id is not None:
            ids = [int(tok.bos_id), *ids]
        if left_truncate_len:
            ids = ids[-left_truncate_len:]
        return ids

    def tok_decode(self, tokens: Any, **kwargs: Any) -> str:
        return "".join(self.ppl_tokenizer.token_texts(np.asarray(tokens)))

    def _loglikelihood_tokens(
        self, requests: list[tuple[tuple[str, str], list[int], list[int]]], **kwargs: Any
    ) -> list[tuple[float, bool]]:
        """(log-probability nats, greedy) per request, in order; also `last_loglikelihood`."""
        if not requests:
            return []
        result = self.scorer.loglikelihood_tokens(
            [r[1] for r in requests],
            [r[2] for r in requests],
            [len((r[0][1] if r[0] else "").encode("utf-8")) for r in requests],
            progress=not kwargs.get("disable_tqdm", False),
        )
        self.last_loglikelihood = result
        self.loglikelihood_history.append(result)
        answers = [
            (float(lp), bool(g)) for lp, g in zip(result.logprob, result.greedy, strict=True)
        ]
        for (strings, _, _), answer in zip(requests, answers, strict=True):
            if strings is not None:
                self.cache_hook.add_partial("loglikelihood", strings, answer)
        return answers

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Each document's log-likelihood (nats) under the `lm_eval_rolling` windows of
        `seq_len` (`get_rolling_token_windows` with `context_len=1`, `make_disjoint_window`)."""
        if not requests:
            return []
        texts = [req.args[0] for req in requests]
        values = self.scorer.rolling_tokens(
            [self.tok_encode(t) for t in texts],
            [len(t.encode("utf-8")) for t in texts],
            self.prefix_token_id,
            progress=not disable_tqdm,
        )
        out = [float(v) for v in values]
        for text, value in zip(texts, out, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), value)
        return out

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Refused (ConfigError): no generation in ppl_jax."""
        raise ConfigError(REFUSE_GENERATION)

    def clear_history(self) -> None:
        self.loglikelihood_history.clear()
        self.last_loglikelihood = None


def evaluate(lm: PplJaxLM, **simple_evaluate_args: Any) -> dict | None:
    """`lm_eval.simple_evaluate(model=lm, ...)` with every process taking part: call it on every
    process (a training loop every N steps); process 0 runs the harness and returns its results,
    the others score its requests and return None when it is done.

    Args:
      lm: the harness model, built on every process (`PplJaxLM.from_params`, or the
        constructor).
      simple_evaluate_args: `lm_eval.simple_evaluate`'s other arguments (`tasks`,
        `task_manager`, `limit`, `num_fewshot`, ...).
    """
    if jax.process_index() != 0:
        lm.serve()
        return None
    lm.scorer.restart()
    try:
        return lm_eval.simple_evaluate(model=lm, **simple_evaluate_args)
    finally:
        lm.close()
