"""Simple-LSH and Norm-Ranging LSH for maximum inner product search (docs/bench-lsh.md)."""

from .nr_lsh import LSHSearchResult, NormRangingLSH, SimpleLSH, pair_order, pair_scores

__all__ = ["LSHSearchResult", "NormRangingLSH", "SimpleLSH", "pair_order", "pair_scores"]
