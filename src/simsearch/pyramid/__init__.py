"""Pyramid: meta-HNSW partitioning and sharded search (docs/cluster.md)."""

from .index import CoveredSearchResult, PartUnavailableError, PyramidIndex

__all__ = ["CoveredSearchResult", "PartUnavailableError", "PyramidIndex"]
