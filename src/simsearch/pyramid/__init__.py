"""Pyramid: meta-HNSW partitioning and sharded search (design §4.4, §6)."""

from .index import CoveredSearchResult, PartUnavailableError, PyramidIndex

__all__ = ["CoveredSearchResult", "PartUnavailableError", "PyramidIndex"]
