"""Sparse vectors (docs/sparse.md): SPLADE and BM25 scores are inner products of non-negative
sparse vectors, so their search is MIPS in another shape. ``SparseBatch`` / ``sparse_batch``:
the sparse items every sparse kind takes; ``SparseFlatIndex``: the exact inverted-index scan;
``BM25Index``: BM25 exactly, over token counts (``count_tokens``); ``SeismicIndex``: Seismic's
blocked, summarised posting lists (approximate)."""

from .batch import SparseBatch, sparse_batch
from .bm25 import BM25Index, count_tokens
from .flat import SparseFlatIndex
from .seismic import SeismicIndex

__all__ = ["BM25Index", "SeismicIndex", "SparseBatch", "SparseFlatIndex", "count_tokens",
           "sparse_batch"]
