"""What the golden generators share: the tiny transformers configs, the 1-D weight perturbation,
`save_hf`, the reference loops' windows over the byte documents, transformers' log-probabilities
of a row (`row_log_probs`) and of every protocol (`numbers`), and `main`, their command line.

A generator (`make_<what>_golden.py`) is a list of cases, a name each and what builds it, and a
`write(name, folder, numbers_only)` that writes one case under `folder`; `main` runs it on each.
The generators run transformers 5 on PyTorch (CPU) in an environment of their own, never ppl_jax's:
nothing here imports ppl_jax (its tiny configs, `ppl_jax.testing.TINY`, are ppl_jax's own and need
JAX), and torch, transformers and lm-evaluation-harness are imported where they are used, so that
the tests import a generator's cases without them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from collections.abc import Callable, Iterable

HERE = os.path.dirname(os.path.abspath(__file__))
FAMILY_DIR = os.path.join(HERE, "families")

# The documents' token ids are their UTF-8 bytes; 256 is their prefix token (lm_eval_rolling),
# and the vocabularies are padded past it with rows the text never uses.
PREFIX, VOCAB = 256, 320
SEQ_LEN, STRIDE = 24, 16
DOCUMENTS = [
    "The committee met on Tuesday to review the budget for the new library, which had grown "
    "by nearly a third since the spring. Several members argued that the reading rooms should "
    "open earlier, while others wanted the money spent on the roof.",
    "Rain fell over the valley for six days.",
    "In 1887 the railway reached the town; within a decade its population had doubled, and "
    "the old market square was paved with stone brought from the quarry at Hill End.",
]

# The tiny configs, in transformers' field names: every family model's width and initialisation,
# its grouped-query attention (4 query heads over 2 key/value heads), and a 2-layer decoder.
TINY = dict(vocab_size=VOCAB, hidden_size=32, max_position_embeddings=64, initializer_range=0.2)
GQA = dict(num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5)
DECODER = dict(**TINY, **GQA, intermediate_size=64, num_hidden_layers=2)
# Rotary scalings past an original length of 16 (the scored windows are 24 long).
YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 16,
}
LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
# The state-carrying layers: Gated DeltaNet (2 key heads serving 4 value heads), Mamba2 (2 groups,
# chunks of 8 < 24) and Falcon-H1's Mamba2 mixer (8 heads of 4 in 2 groups).
GDN = dict(
    linear_num_key_heads=2,
    linear_key_head_dim=8,
    linear_num_value_heads=4,
    linear_value_head_dim=8,
    linear_conv_kernel_dim=4,
)
MAMBA = dict(n_groups=2, conv_kernel=4, chunk_size=8)
FALCON_MAMBA = dict(
    mamba_d_ssm=32, mamba_n_heads=8, mamba_n_groups=2, mamba_d_conv=4, mamba_chunk_size=8
)
SSM_MULTIPLIERS = [0.5, 1.5, 0.8, 1.25, 2.0]


def perturbed(model):
    """`model` (a torch module) in eval mode, each 1-D weight (norms, biases) moved by
    N(0, 0.2^2) from the global torch generator, so that a wrongly loaded one shows."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.2 * torch.randn_like(p))
    return model.eval()


def save_hf(model, path: str) -> None:
    """`model.save_pretrained` into `path`, emptied first, less `generation_config.json`."""
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    model.save_pretrained(path)
    extra = os.path.join(path, "generation_config.json")
    if os.path.exists(extra):
        os.remove(extra)


def save_family(build: Callable, path: str):
    """A family's tiny random model: `build()` under torch seed 0, `perturbed`, saved at `path`
    by `save_hf`. Returns the model."""
    import torch

    torch.manual_seed(0)
    model = perturbed(build())
    save_hf(model, path)
    return model


def load(path: str, dtype=None, **options):
    """The model saved at `path`, in eval mode, float32 unless `dtype` (a torch dtype); Gemma 3's
    multimodal checkpoints as `Gemma3ForConditionalGeneration`. `options` go to `from_pretrained`."""
    import torch
    import transformers as tf

    config = tf.AutoConfig.from_pretrained(path)
    cls = (
        tf.Gemma3ForConditionalGeneration
        if config.model_type == "gemma3"
        else tf.AutoModelForCausalLM
    )
    return cls.from_pretrained(path, dtype=dtype or torch.float32, **options).eval()


def row_log_probs(model, row, first: int = 1):
    """transformers' log-probabilities (nats, float32 `[len(row) - first]` NumPy) of the token ids
    `row[first:]`, each given the row before it, in one forward pass of `row[:-1]`."""
    import numpy as np
    import torch

    row = torch.as_tensor(np.asarray(row))
    with torch.no_grad():
        logits = model(input_ids=row[None, :-1]).logits.float()
    log_probs = torch.log_softmax(logits, dim=-1)[0]
    return log_probs[torch.arange(first - 1, len(row) - 1), row[first:]].numpy()


def documents() -> list[list[int]]:
    return [list(d.encode("utf-8")) for d in DOCUMENTS]


def stream() -> list[int]:
    return list("\n\n".join(DOCUMENTS).encode("utf-8"))


def sliding_windows(ids: list[int], seq_len: int, stride: int) -> list[tuple[list[int], int]]:
    """Every token after the first scored once, by windows of `seq_len` inputs every `stride`."""
    out, scored_upto, begin = [], 0, 0
    while scored_upto < len(ids) - 1:
        row = ids[begin : begin + seq_len + 1]
        first = max(1, scored_upto - begin + 1)
        out.append((row, first))
        scored_upto = begin + len(row) - 1
        begin += stride
    return out


def hf_strided_windows(ids: list[int], max_length: int, stride: int) -> list[tuple[list[int], int]]:
    """The Hugging Face guide's loop: labels of the first `len - trg_len` tokens are -100."""
    out, prev_end = [], 0
    for begin in range(0, len(ids), stride):
        end = min(begin + max_length, len(ids))
        trg_len = end - prev_end
        row = ids[begin:end]
        first = max(1, len(row) - trg_len)
        if first < len(row):
            out.append((row, first))
        prev_end = end
        if end == len(ids):
            break
    return out


def rolling_windows(doc: list[int], prefix: int, seq_len: int) -> list[tuple[list[int], int]]:
    """lm-evaluation-harness's rolling windows of one document as HFLM scores them."""
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    out = []
    for context, continuation in map(
        make_disjoint_window,
        get_rolling_token_windows(doc, prefix, max_seq_len=seq_len, context_len=1),
    ):
        row = (context + continuation)[-(seq_len + 1) :]
        out.append((row, len(row) - len(continuation)))
    return out


def protocol_windows() -> dict[str, list[tuple[list[int], int]]]:
    """Each protocol's windows (a row of ids, the row position of its first scored target)."""
    rolling = [w for d in documents() for w in rolling_windows(d, PREFIX, SEQ_LEN)]
    return {
        "sliding": sliding_windows(stream(), SEQ_LEN, STRIDE),
        "hf_strided": hf_strided_windows(stream(), SEQ_LEN, STRIDE),
        "lm_eval_rolling": rolling,
    }


def numbers(model) -> dict:
    """A family's `golden.json`: the versions, the token ids, and for each protocol its windows
    with `model`'s log-probabilities of every scored target (`row_log_probs`)."""
    import lm_eval
    import torch
    import transformers as tf

    out = {
        "generated_with": {
            "torch": torch.__version__,
            "transformers": tf.__version__,
            "lm_eval": getattr(lm_eval, "__version__", "?"),
        },
        "seq_len": SEQ_LEN,
        "stride": STRIDE,
        "prefix": PREFIX,
        "documents": documents(),
        "stream": stream(),
        "protocols": {},
    }
    for protocol, windows in protocol_windows().items():
        out["protocols"][protocol] = [
            {"row": row, "first": first, "log_probs": row_log_probs(model, row, first).tolist()}
            for row, first in windows
        ]
    return out


def family_writer(save: Callable[[str, str], object], golden: Callable[[str], dict]) -> Callable:
    """`write` of a generator of families: `save(name, path)` the model at `<folder>/<name>`
    (unless `numbers_only`), then its `golden.json`, `golden(path)`."""

    def write(name: str, folder: str, numbers_only: bool) -> str:
        path = os.path.join(folder, name)
        if not numbers_only:
            save(name, path)
        with open(os.path.join(path, "golden.json"), "w", encoding="utf-8") as f:
            json.dump(golden(path), f)
        return path

    return write


def arrays_writer(run_case: Callable[[str], dict], compressed: bool = False) -> Callable:
    """`write` of a generator of arrays: `run_case(name)` as `<folder>/<name>.npz`."""

    def write(name: str, folder: str, numbers_only: bool) -> str:
        import numpy as np

        path = os.path.join(folder, f"{name}.npz")
        (np.savez_compressed if compressed else np.savez)(path, **run_case(name))
        return path

    return write


def main(
    cases: Iterable[str], write: Callable[[str, str, bool], str], out: str, models: bool = False
) -> None:
    """A generator's command line: `write(name, folder, numbers_only)` for every case (or those of
    `--only`) into `--out` (default `out`, the committed goldens), torch on one thread; prints
    each file or folder written with its size. `models`: the cases save models, and
    `--numbers-only` keeps those already saved."""
    import torch

    cases = list(cases)
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", nargs="*", choices=cases, default=None)
    parser.add_argument("--out", default=out, help="the folder to write in (default: %(default)s)")
    if models:
        parser.add_argument(
            "--numbers-only", action="store_true", help="keep the saved models, rewrite the numbers"
        )
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    for name in args.only or cases:
        path = write(name, args.out, getattr(args, "numbers_only", False))
        files = [os.path.join(path, n) for n in os.listdir(path)] if os.path.isdir(path) else [path]
        print(f"{path}: {sum(map(os.path.getsize, files)) / 1024:.0f} KB")
