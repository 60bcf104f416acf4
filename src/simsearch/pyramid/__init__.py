"""Pyramid: meta-HNSW partitioning and sharded search (design §4.4, §6)."""
