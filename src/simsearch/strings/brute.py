"""Brute-force edit-distance search with rapidfuzz: the exact reference of the string index."""

from __future__ import annotations

import numpy as np

from ..index import check_int, check_k
from ._alphabet import check_strings


def edit_distance_matrix(queries: list[str], base: list[str], workers: int = 1) -> np.ndarray:
    """Levenshtein distances int32 (nq, n) (rapidfuzz, ``workers`` threads; -1 for all cores)."""
    from rapidfuzz.distance import Levenshtein
    from rapidfuzz.process import cdist

    return cdist(queries, base, scorer=Levenshtein.distance, dtype=np.int32, workers=workers)


def brute_force_search(
    queries: list[str], base: list[str], k: int, workers: int = 1, block: int = 64
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k of ``base`` by edit distance for each query, ties by smaller position.
    Returns (ids int64 (nq, k), distances int32 (nq, k)), padded with -1 / int32 max when
    ``len(base) < k``."""
    from .cgk import _topk_small

    queries = check_strings(queries, "queries")
    base = check_strings(base, "base")
    k = check_k(k)
    workers = check_int("workers", workers, -1, 1024)
    nq, kk = len(queries), min(k, len(base))
    ids = np.full((nq, k), -1, np.int64)
    dists = np.full((nq, k), np.iinfo(np.int32).max, np.int32)
    for s in range(0, nq, block):
        d = edit_distance_matrix(queries[s : s + block], base, workers)
        ids[s : s + block, :kk], dists[s : s + block, :kk] = _topk_small(d, kk)
    return ids, dists
