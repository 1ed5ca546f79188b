"""Corpora: what a dataset is (`DatasetSpec`), its files (`Sources`), their documents
(`Document`, `read_documents`; JSONL, Parquet, text, compressed), the named preparations of their
text (`apply_preparation`, e.g. WikiText's), and whitespace word counts (`count_words`).
"""

from etils import epy as _epy

with _epy.lazy_api_imports(globals()):
    from ppl_jax.data.documents import Document, read_documents
    from ppl_jax.data.preparations import apply_preparation
    from ppl_jax.data.sources import Sources
    from ppl_jax.data.spec import DatasetSpec
    from ppl_jax.data.words import count_words

__all__ = [
    "DatasetSpec",
    "Document",
    "Sources",
    "apply_preparation",
    "count_words",
    "read_documents",
]
