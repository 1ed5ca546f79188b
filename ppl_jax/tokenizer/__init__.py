"""Tokenizers: UTF-8 bytes, a Hugging Face `tokenizer.json` through the `tokenizers` library, or a
SentencePiece model (Kudo & Richardson 2018) through the `sentencepiece` library, behind one
interface (`Tokenizer`, `ppl_jax.tokenizer.core`), loaded by `load_tokenizer`
(`ppl_jax.tokenizer.loading`).

Long documents are tokenized in pieces of about `Tokenizer.piece_chars` characters, cut only where
the tokenizer provably gives the same tokens for the pieces as for the whole, so that host memory
stays a few times the text instead of the ~70x that one `tokenizers` encoding of a long text
holds; a tokenizer with no such rule encodes the whole document at once.
"""

from etils import epy as _epy

with _epy.lazy_api_imports(globals()):
    from ppl_jax.tokenizer.core import META, ByteTokenizer, Tokenizer, specials
    from ppl_jax.tokenizer.directory import apply_tokenizer_config
    from ppl_jax.tokenizer.hf import HFTokenizer
    from ppl_jax.tokenizer.loading import check_vocabulary, from_description, load_tokenizer
    from ppl_jax.tokenizer.spm import SentencePieceTokenizer

__all__ = [
    "META",
    "ByteTokenizer",
    "HFTokenizer",
    "SentencePieceTokenizer",
    "Tokenizer",
    "apply_tokenizer_config",
    "check_vocabulary",
    "from_description",
    "load_tokenizer",
    "specials",
]
