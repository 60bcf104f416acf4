"""Simple-LSH and Norm-Ranging LSH for maximum inner product search (docs/bench/lsh.md)."""

from .nr_lsh import NormRangingLSH, SimpleLSH, pair_order, pair_scores

__all__ = ["NormRangingLSH", "SimpleLSH", "pair_order", "pair_scores"]
