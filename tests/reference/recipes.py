"""The reference implementations, run in PyTorch, transformers and lm-evaluation-harness: the tiny
models they score, and each protocol's reference loop. Shared by the live tests beside this file
and by `tests/golden/make_golden.py`, which stores their results for the default test suite.

Nothing here imports ppl_jax: these are the independent computations ppl_jax is checked against.
"""

from __future__ import annotations

import numpy as np
import torch
import transformers as tf

import helpers

# ----------------------------------------------------------- the Hugging Face families (test_hf)

HF_SEQ = 40  # scored targets of the log-probability comparison
HF_VOCAB = 300
# ppl_jax.testing.TINY's sizes in transformers' names.
TINY_SIZES = dict(
    hidden_size=helpers.TINY.embed_dim,
    intermediate_size=helpers.TINY.mlp_dim,
    num_hidden_layers=helpers.TINY.num_layers,
    num_attention_heads=helpers.TINY.num_heads,
    num_key_value_heads=helpers.TINY.num_kv_heads,
)
COMMON = dict(
    vocab_size=HF_VOCAB,
    **TINY_SIZES,
    max_position_embeddings=helpers.TINY.max_positions,
    initializer_range=0.2,
    rms_norm_eps=1e-5,
)
LLAMA3_ROPE = helpers.LLAMA3_ROPE


def _llama():
    return tf.LlamaForCausalLM(tf.LlamaConfig(**COMMON, rope_parameters=LLAMA3_ROPE))


def _mistral():
    return tf.MistralForCausalLM(tf.MistralConfig(**COMMON, sliding_window=8))


def _qwen2():
    return tf.Qwen2ForCausalLM(tf.Qwen2Config(**COMMON, tie_word_embeddings=True))


def _gpt2():
    return tf.GPT2LMHeadModel(
        tf.GPT2Config(
            vocab_size=HF_VOCAB,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=64,
            initializer_range=0.2,
            scale_attn_by_inverse_layer_idx=True,
            bos_token_id=0,
            eos_token_id=0,
        )
    )


HF_FAMILIES = {"llama": _llama, "mistral": _mistral, "qwen2": _qwen2, "gpt2": _gpt2}


def _perturbed(model):
    """The model with its vectors (norm scales, biases; transformers starts them at 1 and 0)
    perturbed, so that a wrongly loaded one shows."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.2 * torch.randn_like(p))
    return model.eval()


def save_hf_family(name: str, path: str):
    """A random tiny model of family `name` (seed 0), saved with `save_pretrained` (Llama in
    sharded safetensors); returns the PyTorch model."""
    torch.manual_seed(0)
    model = _perturbed(HF_FAMILIES[name]())
    kwargs = {"max_shard_size": "20KB"} if name == "llama" else {}
    model.save_pretrained(path, **kwargs)
    return model


def hf_tokens(seed: int = 0) -> np.ndarray:
    """`[HF_SEQ + 1]` int64 random token ids below HF_VOCAB."""
    return np.random.default_rng(seed).integers(0, HF_VOCAB, size=HF_SEQ + 1)


def torch_log_probs(model, tokens) -> np.ndarray:
    """`[len(tokens) - 1]` float32 log-probabilities (nats) of `tokens[1:]`, one forward pass."""
    with torch.no_grad():
        logits = model(torch.tensor(np.asarray(tokens)[None, :-1])).logits
    log_probs = torch.log_softmax(logits.float(), dim=-1)[0]
    n = len(tokens) - 1
    return log_probs[torch.arange(n), torch.tensor(np.asarray(tokens)[1:])].numpy()


def load_model(path: str):
    return tf.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


# ----------------------------------------------- the protocol families (test_references)

# Documents of the stream protocols: words, numbers, WikiText's " @-@ ", multibyte UTF-8 (CJK,
# accents, an emoji), a newline and a tab inside a document.
STREAM_TEXTS = [
    " = Valkyria Chronicles III = ",
    " Senjō no Valkyria 3 : Unrecorded Chronicles ( Japanese : 戦場のヴァルキュリア3 , lit . "
    "Valkyria of the Battlefield 3 ) , commonly referred to as Valkyria Chronicles III outside "
    "Japan , is a tactical role @-@ playing video game developed by Sega and Media.Vision .",
    "Café naïve — déjà vu 😀 costs €5 ; ok?",
    "def f(x):\n    return x ** 2  # a tab\there",
    "The end.",
]
# The source of lm_eval_rolling's documents, cut to exact token counts.
PARAGRAPH = (
    "The game began development in 2010 , carrying over a large portion of the work done on "
    "Valkyria Chronicles II . While it retained the standard features of the series , it also "
    "underwent multiple adjustments , such as making the game more forgiving for series "
    "newcomers . Character designer Raita Honjou and composer Hitoshi Sakimoto both returned "
    "from previous entries , along with Valkyria Chronicles II director Takeshi Ozawa . A large "
    "team of writers handled the script . The game 's opening theme was sung by May 'n . It met "
    "with positive sales in Japan , and was praised by both Japanese and western critics . After "
    "release , it received downloadable content , along with an expanded edition in November of "
    "that year . It was also adapted into manga and an original video animation series . Due to "
    "low sales of Valkyria Chronicles II , Valkyria Chronicles III was not localized , but a fan "
    "translation compatible with the game 's expanded edition was released in 2014 ."
)
L = 16  # eval.seq_len of most runs
# Token counts (before any BOS) of lm_eval_rolling's documents at L = 16: one token, short,
# L - 1, L, L + 1 (with the Llama BOS: L, L + 1, L + 2), several windows.
DOC_TOKENS = [1, 5, 15, 16, 17, 60, 100]
EXTRA_DOCS = ["  Leading spaces,\na newline and a\ttab, then trailing ones  ", "é"]
BOS = "<s>"  # the Llama family's BOS, added after the byte-level BPE's own ids

HF_STRIDED_CASES = [("gpt2", 16, 16), ("gpt2", 16, 5), ("gpt2", 9, 4), ("llama", 16, 8)]
GPTQ_CASES = [("gpt2", 16), ("gpt2", 24), ("llama", 16)]
# (family, data format, seq_len, stride, separator)
SLIDING_CASES = [
    ("gpt2", "jsonl", 16, 16, "\n\n"),
    ("gpt2", "lines", 16, 5, "\n\n"),
    ("llama", "jsonl", 16, 8, " | "),
]


def lines_texts() -> list[str]:
    """The stream documents that the `lines` format can hold (no line end inside)."""
    return [t for t in STREAM_TEXTS if "\n" not in t]


def reference_tokenizer(family: str, tokenizer_json: str):
    """The byte-level BPE as saved beside a GPT-2 model (EOT is BOS and EOS, no BOS added), or
    with a `<s>` appended to the vocabulary and prepended by the post-processor for Llama."""
    if family == "gpt2":
        return tf.PreTrainedTokenizerFast(
            tokenizer_file=tokenizer_json, bos_token=helpers.EOT, eos_token=helpers.EOT
        )
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_file(tokenizer_json)
    tok.add_special_tokens([BOS])
    bos = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos)]
    )
    return tf.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=helpers.EOT)


def _reference_model(family: str, vocab_size: int, eot: int):
    if family == "gpt2":
        return tf.GPT2LMHeadModel(
            tf.GPT2Config(
                vocab_size=vocab_size,
                n_embd=32,
                n_layer=2,
                n_head=4,
                n_positions=64,
                initializer_range=0.2,
                bos_token_id=eot,
                eos_token_id=eot,
            )
        )
    return tf.LlamaForCausalLM(
        tf.LlamaConfig(
            vocab_size=vocab_size,
            **TINY_SIZES,
            max_position_embeddings=64,
            initializer_range=0.2,
            bos_token_id=vocab_size - 1,
            eos_token_id=eot,
        )
    )


def save_reference_family(family: str, path: str, tokenizer_json: str) -> None:
    """A random tiny model (seed 0) with the vocabulary of its tokenizer, both saved in `path`."""
    tok = reference_tokenizer(family, tokenizer_json)
    torch.manual_seed(0)
    model = _perturbed(_reference_model(family, len(tok), tok.convert_tokens_to_ids(helpers.EOT)))
    model.save_pretrained(path)
    tok.save_pretrained(path)


class Family:
    """A saved tiny model: its directory, and the model and tokenizer read back from it."""

    def __init__(self, name: str, path: str):
        self.name, self.path = name, path
        self.model = load_model(path)
        self.tokenizer = tf.AutoTokenizer.from_pretrained(path)
        self.bos = [self.tokenizer.bos_token_id] if name == "llama" else []

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False).input_ids


def cut(encode, source: str, n: int) -> str:
    """The shortest prefix of `source` that encodes to exactly `n` tokens."""
    for end in range(1, len(source) + 1):
        if len(encode(source[:end])) == n:
            return source[:end]
    raise AssertionError(f"no prefix of the source has {n} tokens")


def rolling_texts(encode) -> list[str]:
    """lm_eval_rolling's documents: PARAGRAPH cut to DOC_TOKENS tokens of `encode`, then the
    extra documents."""
    words = PARAGRAPH.split(" ")
    texts = [cut(encode, " ".join(words[7 * i :]), n) for i, n in enumerate(DOC_TOKENS)]
    assert [len(encode(t)) for t in texts] == DOC_TOKENS
    return texts + EXTRA_DOCS


# ------------------------------------------------------------------------- the reference loops


def _logits(model, ids) -> torch.Tensor:
    """`[1, T, vocab]` float32 logits of a `[1, T]` id tensor."""
    with torch.no_grad():
        return model(ids).logits.float()


class Reference:
    """A reference run: per window that scores something, its NLL sum (nats, float64) and count
    of scored targets, in window order; and the token ids it read."""

    def __init__(self, ids: list[int]):
        self.ids, self.window_nll, self.window_tokens = ids, [], []

    def add(self, nll: float, count: int) -> None:
        if count:
            self.window_nll.append(nll)
            self.window_tokens.append(count)

    @property
    def nll_sum(self) -> float:
        return float(np.sum(self.window_nll))

    @property
    def num_tokens(self) -> int:
        return int(np.sum(self.window_tokens))

    def to_json(self) -> dict:
        return {"ids": self.ids, "window_nll": self.window_nll, "window_tokens": self.window_tokens}


def hf_guide(family: Family, texts: list[str], max_length: int, stride: int) -> Reference:
    """The Hugging Face guide "Perplexity of fixed-length models", with the exact NLL sum and
    count of the labels that are not -100 in place of `outputs.loss` (their mean)."""
    encodings = family.tokenizer("\n\n".join(texts), return_tensors="pt")
    ref = Reference(encodings.input_ids[0].tolist())
    seq_len = encodings.input_ids.size(1)
    prev_end_loc = 0
    for begin_loc in range(0, seq_len, stride):
        end_loc = min(begin_loc + max_length, seq_len)
        trg_len = end_loc - prev_end_loc  # may be different from stride on last loop
        input_ids = encodings.input_ids[:, begin_loc:end_loc]
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        log_probs = torch.log_softmax(_logits(family.model, input_ids), dim=-1)
        labels = target_ids[:, 1:]  # the model shifts the labels by one
        keep = labels != -100
        picked = log_probs[:, :-1].gather(-1, labels.clamp(min=0)[..., None])[..., 0]
        ref.add(-float(picked[keep].double().sum()), int(keep.sum()))
        prev_end_loc = end_loc
        if end_loc == seq_len:
            break
    return ref


def hf_guide_as_published(family: Family, texts: list[str], max_length: int, stride: int) -> float:
    """The Hugging Face guide's loop exactly as published (transformers docs, perplexity.md):
    `outputs.loss` weighted by `num_valid_tokens - batch_size`, accumulated in torch, `exp` of
    the ratio."""
    encodings = family.tokenizer("\n\n".join(texts), return_tensors="pt")
    seq_len = encodings.input_ids.size(1)
    nll_sum, n_tokens, prev_end_loc = 0.0, 0, 0
    for begin_loc in range(0, seq_len, stride):
        end_loc = min(begin_loc + max_length, seq_len)
        trg_len = end_loc - prev_end_loc  # may be different from stride on last loop
        input_ids = encodings.input_ids[:, begin_loc:end_loc]
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        with torch.no_grad():
            outputs = family.model(input_ids, labels=target_ids)
            # loss is calculated using CrossEntropyLoss which averages over valid labels
            neg_log_likelihood = outputs.loss
        num_valid_tokens = (target_ids != -100).sum().item()  # number of valid tokens in target_ids
        batch_size = target_ids.size(0)
        num_loss_tokens = (
            num_valid_tokens - batch_size
        )  # subtract batch_size due to internal label shift
        nll_sum += neg_log_likelihood * num_loss_tokens
        n_tokens += num_loss_tokens
        prev_end_loc = end_loc
        if end_loc == seq_len:
            break
    return float(torch.exp(nll_sum / n_tokens))


def gptq_recipe(family: Family, texts: list[str], seqlen: int) -> Reference:
    """GPTQ/AWQ's evaluation loop, summing (not averaging) the NLL of each chunk's
    `seqlen - 1` targets."""
    testenc = family.tokenizer("\n\n".join(texts), return_tensors="pt").input_ids
    ref = Reference(testenc[0].tolist())
    nsamples = testenc.numel() // seqlen
    for i in range(nsamples):
        batch = testenc[:, (i * seqlen) : ((i + 1) * seqlen)]
        shift_logits = _logits(family.model, batch)[:, :-1, :]
        shift_labels = batch[:, 1:]
        loss = torch.nn.functional.cross_entropy(
            shift_logits.reshape(-1, shift_logits.size(-1)),
            shift_labels.reshape(-1),
            reduction="sum",
        )
        ref.add(float(loss), shift_labels.numel())
    return ref


def sliding_reference(
    family: Family, texts: list[str], separator: str, seq_len: int, stride: int
) -> Reference:
    """Every token after the first scored once, by windows of `seq_len` inputs every `stride`
    tokens, each token by the first window that predicts it."""
    ids = list(family.bos)
    for i, text in enumerate(texts):
        if i and separator:
            ids += family.encode(separator)
        ids += family.encode(text)
    ref = Reference(ids)
    scored_upto, begin = 0, 0  # ids[0] is never a target
    while scored_upto < len(ids) - 1:
        window = torch.tensor([ids[begin : begin + seq_len + 1]])
        log_probs = torch.log_softmax(_logits(family.model, window[:, :-1]), dim=-1)[0]
        nll, count = 0.0, 0
        for j in range(1, window.size(1)):
            if begin + j > scored_upto:
                nll -= float(log_probs[j - 1, window[0, j]])
                count += 1
        ref.add(nll, count)
        scored_upto = begin + window.size(1) - 1
        begin += stride
    return ref


def harness(family: Family, texts: list[str], max_length: int) -> dict:
    """lm-evaluation-harness's own `loglikelihood_rolling` (HFLM on the directory, CPU, float32)
    and the wikitext task's `process_results` and aggregations fed its log-likelihoods.

    Returns a dict: `loglikelihoods` (per document, nats), `num_tokens` (per document, the
    harness's `tok_encode`), `prefix_token_id`, `num_words` and `num_bytes` (per document, as the
    task counts them), and the task's `word_perplexity`, `byte_perplexity`, `bits_per_byte`.
    """
    from lm_eval.api.instance import Instance
    from lm_eval.api.metrics import bits_per_byte, weighted_perplexity
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks.wikitext.preprocess_wikitext import process_results

    lm = HFLM(
        pretrained=family.path,
        tokenizer=family.path,
        max_length=max_length,
        batch_size=3,
        device="cpu",
        dtype="float32",
    )
    requests = [
        Instance(request_type="loglikelihood_rolling", doc={}, arguments=(t,), idx=i)
        for i, t in enumerate(texts)
    ]
    lls = [float(x) for x in lm.loglikelihood_rolling(requests, disable_tqdm=True)]
    per_doc = [process_results({"page": t}, (x,)) for t, x in zip(texts, lls, strict=True)]
    return {
        "loglikelihoods": lls,
        "num_tokens": [len(lm.tok_encode(t)) for t in texts],
        "prefix_token_id": int(lm.prefix_token_id),
        "num_words": [int(r["word_perplexity"][1]) for r in per_doc],
        "num_bytes": [int(r["byte_perplexity"][1]) for r in per_doc],
        "word_perplexity": float(weighted_perplexity([r["word_perplexity"] for r in per_doc])),
        "byte_perplexity": float(weighted_perplexity([r["byte_perplexity"] for r in per_doc])),
        "bits_per_byte": float(bits_per_byte([r["bits_per_byte"] for r in per_doc])),
    }


def rolling_windows(token_list: list[int], prefix: int, seq_len: int) -> list[list[list[int]]]:
    """lm-evaluation-harness's rolling windows of one document, as HFLM scores them: per window,
    (context + continuation, continuation)."""
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    return [
        [context + continuation, continuation]
        for context, continuation in map(
            make_disjoint_window,
            get_rolling_token_windows(token_list, prefix, max_seq_len=seq_len, context_len=1),
        )
    ]


def versions() -> dict[str, str]:
    import lm_eval
    import tokenizers

    return {
        "torch": torch.__version__,
        "transformers": tf.__version__,
        "lm_eval": getattr(lm_eval, "__version__", "?"),
        "tokenizers": tokenizers.__version__,
    }
