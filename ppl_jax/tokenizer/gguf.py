"""The tokenizer a GGUF file carries in its metadata (`tokenizer.ggml.*`), as a `tokenizers`
tokenizer (`HFTokenizer`) giving the ids transformers' GGUF tokenizer gives
(`AutoTokenizer.from_pretrained(folder, gguf_file=...)`, transformers 5.24).

A GGUF stores no `tokenizer.json`: the vocabulary (`tokenizer.ggml.tokens`, each token's
`token_type`: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte), and by
`tokenizer.ggml.model`:

- `gpt2`: byte-level BPE with its `merges`; the text is split by the regex of its
  `tokenizer.ggml.pre` (`llama-bpe`, `qwen2`, ... : `SPLITS`) or GPT-2's own.
- `llama`: SentencePiece BPE with `scores` and no merges; the merges are rebuilt from the
  vocabulary as transformers does (every split of a token into two tokens, best score first);
  `<0xNN>` byte fallback; a space marked "▁" before the text (`Metaspace`). Gemma's files
  (architectures `gemma*`) spell all-space tokens with spaces and order merges by position;
  Phi-3's prepend "▁" by a normalizer.

Control tokens (and the BOS, EOS, unknown and padding tokens the metadata names) are special
added tokens, matched whole in the text; user-defined tokens plain added ones. BOS is added when
`tokenizer.ggml.add_bos_token` says so (absent: for a `llama` vocabulary, as llama.cpp does).
"""

from __future__ import annotations

import functools
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, processors
from tokenizers import pre_tokenizers as pre

from ppl_jax.errors import CheckpointError
from ppl_jax.tokenizer.core import META
from ppl_jax.tokenizer.hf import HFTokenizer

CONTROL, USER_DEFINED = 3, 4
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip
_CASED = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
_GPT4O = (rf"[^\r\n\p{{L}}\p{{N}}]?{_CASED}*{_LOWER}+{_CONTRACTION}"
          rf"|[^\r\n\p{{L}}\p{{N}}]?{_CASED}+{_LOWER}*{_CONTRACTION}"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip
_TEKKEN = (rf"[^\r\n\p{{L}}\p{{N}}]?{_CASED}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_CASED}+{_LOWER}*"
           r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip
# `tokenizer.ggml.pre` -> the split regex before byte-level BPE (llama.cpp's pre-tokenizer
# names; transformers 5.24 knows the same ones). Others split as GPT-2 does.
SPLITS = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                     "midm-2.0", "lfm2", "jina-v5-nano", "dbrx", "smaug-bpe"), _LLAMA3),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"), _QWEN2),
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O),
    "tekken": _TEKKEN,
}  # fmt: skip
TOKENIZER_MODELS = ("gpt2", "llama")


@functools.cache
def byte_alphabet() -> dict[int, str]:
    """GPT-2's printable spelling of each byte (byte-level BPE's alphabet)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]  # fmt: skip
    spelling = {b: chr(b) for b in kept}
    extra = 0
    for b in range(256):
        if b not in spelling:
            spelling[b] = chr(256 + extra)
            extra += 1
    return spelling


def _rebuilt_merges(tokens: list[str], scores: dict[str, float]) -> list[tuple[str, str]]:
    """The merges of a SentencePiece BPE vocabulary: each way to cut a token into two tokens
    of the vocabulary, ordered by the token's score (highest first), then by the pieces'
    lengths (longest first); the cuts of one token by their pieces' ids. transformers'
    `generate_merges` with scores."""
    ids = {t: i for i, t in enumerate(tokens)}
    found = []
    for token, score in scores.items():
        cuts = [(token[:k], token[k:]) for k in range(1, len(token))]
        cuts = sorted((c for c in cuts if c[0] in ids and c[1] in ids),
                      key=lambda c: (ids[c[0]], ids[c[1]]))  # fmt: skip
        found.extend((left, right, score) for left, right in cuts)
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in found]


def _list(metadata: dict[str, Any], key: str, n: int, where: str) -> list[Any]:
    value = metadata.get(key)
    if not isinstance(value, list) or len(value) != n:
        raise CheckpointError(
            f"{where}: {key} is not a list of one entry per token ({n}); re-convert the model."
        )
    return value


def build(metadata: dict[str, Any], name: str, where: str) -> HFTokenizer:
    """The tokenizer of a GGUF file's metadata (see the module docstring).

    Args:
      metadata: the file's metadata, key -> value (`tokenizer.ggml.tokens` a list of strings).
      name: the tokenizer's name for reports.
      where: the file, for the sentences.

    Raises:
      CheckpointError: no vocabulary, a tokenizer model other than `gpt2` and `llama`, lists of
        the wrong length, special ids outside the vocabulary.
    """
    kind = metadata.get("tokenizer.ggml.model")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise CheckpointError(f"{where} has no tokenizer.ggml.tokens; set data.tokenizer.")
    if kind not in TOKENIZER_MODELS:
        raise CheckpointError(
            f"{where} has the tokenizer model {str(kind)[:20]!r}, which ppl_jax does not build "
            f"(it builds {', '.join(TOKENIZER_MODELS)}); set data.tokenizer to its tokenizer.json."
        )
    n = len(tokens)
    types = metadata.get("tokenizer.ggml.token_type")
    types = _list(metadata, "tokenizer.ggml.token_type", n, where) if types is not None else [1] * n
    specials = {}
    for role in ("bos", "eos", "unknown", "padding"):
        i = metadata.get(f"tokenizer.ggml.{role}_token_id")
        if i is not None:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
                raise CheckpointError(
                    f"{where}: tokenizer.ggml.{role}_token_id {str(i)[:20]} is not a token id "
                    f"of its {n} tokens."
                )
            specials[role] = i
    arch = str(metadata.get("general.architecture", ""))
    if kind == "gpt2":
        tok = _byte_level(metadata, tokens, where)
    else:
        tok = _sentencepiece(metadata, tokens, arch, where)
    vocab = tok.get_vocab()
    named = {tokens[i] for i in specials.values()}
    if kind == "gpt2":
        alphabet = set(byte_alphabet().values())
        control = [
            t for t, k in zip(tokens, types, strict=True) if k == CONTROL and set(t) <= alphabet
        ]
    else:
        control = [t for t, k in zip(tokens, types, strict=True) if k == CONTROL]
    added = [AddedToken(t, normalized=False, special=True) for t in dict.fromkeys([*control,
             *sorted(named, key=tokens.index)])]  # fmt: skip
    tok.add_special_tokens(added)
    user = [t for t, k in zip(tokens, types, strict=True) if k == USER_DEFINED and t in vocab]
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])
    add_bos = metadata.get("tokenizer.ggml.add_bos_token", kind == "llama")
    if add_bos and "bos" in specials:
        bos = tokens[specials["bos"]]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
            special_tokens=[(bos, specials["bos"])],
        )  # fmt: skip
    out = HFTokenizer(tok.to_str(), name=name)
    out.bos_id = specials.get("bos")
    out.eos_id = specials.get("eos")
    out.add_bos_default = bool(add_bos and "bos" in specials)
    return out


def _byte_level(metadata: dict[str, Any], tokens: list[str], where: str) -> Tokenizer:
    """Byte-level BPE (`tokenizer.ggml.model` `gpt2`)."""
    spelling = byte_alphabet()
    alphabet = set(spelling.values())
    vocab = {}
    for i, t in enumerate(tokens):
        key = t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8"))
        vocab[key] = i
    merges = metadata.get("tokenizer.ggml.merges")
    if not isinstance(merges, list) or not all(isinstance(m, str) for m in merges):
        raise CheckpointError(f"{where} has a byte-level vocabulary without tokenizer.ggml.merges.")
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    if any(len(p) != 2 for p in pairs):
        raise CheckpointError(f"{where}: a tokenizer.ggml.merges entry is not two tokens.")
    # A merge whose pieces or result the vocabulary lacks can never give a token (llama.cpp
    # spells such a result out again); the `tokenizers` library would panic on it.
    pairs = [(a, b) for a, b in pairs if a in vocab and b in vocab and a + b in vocab]
    tok = Tokenizer(models.BPE(vocab, pairs, dropout=None, continuing_subword_prefix="",
                               end_of_word_suffix="", fuse_unk=False, byte_fallback=False))  # fmt: skip
    split = SPLITS.get(metadata.get("tokenizer.ggml.pre"))
    if split is None:
        tok.pre_tokenizer = pre.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre.Sequence([
            pre.Split(Regex(split), behavior="isolated"),
            pre.ByteLevel(add_prefix_space=False, use_regex=False),
        ])  # fmt: skip
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece(metadata: dict[str, Any], tokens: list[str], arch: str, where: str) -> Tokenizer:
    """SentencePiece BPE (`tokenizer.ggml.model` `llama`): Gemma's, Phi-3's or the others'."""
    gemma = arch.startswith("gemma")
    if gemma:
        tokens = [META * len(t) if " " in t and not t.strip() else t for t in tokens]
        scores = {t: -i for i, t in enumerate(tokens)}
    else:
        values = _list(metadata, "tokenizer.ggml.scores", len(tokens), where)
        scores = dict(zip(tokens, (float(s) for s in values), strict=True))
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = _rebuilt_merges(tokens, scores)
    unk = "<unk>" if gemma and "<unk>" in vocab else None
    tok = Tokenizer(models.BPE(vocab, merges, dropout=None, unk_token=unk, fuse_unk=True,
                               byte_fallback=True))  # fmt: skip
    steps = [decoders.Replace(META, " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:
        tok.normalizer = normalizers.Replace(" ", META)
        tok.pre_tokenizer = pre.Split(" ", behavior="merged_with_previous")
    elif arch == "phi3":
        tok.normalizer = normalizers.Sequence(
            [normalizers.Prepend(META), normalizers.Replace(" ", META)]
        )
    else:
        tok.pre_tokenizer = pre.Metaspace(replacement=META, prepend_scheme="first", split=False)
    if not gemma:
        steps.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(steps)
    return tok
