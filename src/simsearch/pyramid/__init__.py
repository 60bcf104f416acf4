"""Pyramid: meta-HNSW partitioning and sharded search (docs/cluster.md)."""

from .control.errors import PartUnavailableError
from .index import PyramidIndex

__all__ = ["PartUnavailableError", "PyramidIndex"]
