"""Pyramid: meta-HNSW partitioning and sharded search (docs/cluster.md)."""

from .index import PartUnavailableError, PyramidIndex

__all__ = ["PartUnavailableError", "PyramidIndex"]
