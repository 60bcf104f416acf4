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


def distances_with_cutoff(query: str, texts: list[str], k: int, block: int) -> np.ndarray:
    """Edit distances int32 from ``query`` to ``texts``, exact wherever they can be among the k
    smallest: scored ``block`` by block with rapidfuzz's score cutoff set to the k-th best
    distance so far, so a text past it stops early and gets cutoff + 1. Cheapest when the
    likely nearest come first (re-ranking embedding candidates)."""
    from rapidfuzz.distance import Levenshtein
    from rapidfuzz.process import cdist

    d = np.empty(len(texts), np.int32)
    cutoff, best = None, d[:0]
    for s in range(0, len(texts), block):
        e = min(len(texts), s + block)
        d[s:e] = cdist([query], texts[s:e], scorer=Levenshtein.distance, dtype=np.int32,
                       workers=1, score_cutoff=cutoff)[0]
        best = np.concatenate([best, d[s:e]])
        if best.size >= k:  # the k smallest so far; the k-th is the next cutoff
            best = np.partition(best, k - 1)[:k]
            cutoff = int(best.max())
    return d


def brute_force_search(
    queries: list[str], base: list[str], k: int, workers: int = 1, block: int = 64
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k of ``base`` by edit distance for each query, ties by smaller position.
    Returns (ids int64 (nq, k), distances int32 (nq, k)), padded with -1 / int32 max when
    ``len(base) < k``."""
    from .cgk import smallest_k

    queries = check_strings(queries, "queries")
    base = check_strings(base, "base")
    k = check_k(k)
    workers = check_int("workers", workers, -1, 1024)
    nq, kk = len(queries), min(k, len(base))
    ids = np.full((nq, k), -1, np.int64)
    dists = np.full((nq, k), np.iinfo(np.int32).max, np.int32)
    for s in range(0, nq, block):
        d = edit_distance_matrix(queries[s : s + block], base, workers)
        ids[s : s + block, :kk], dists[s : s + block, :kk] = smallest_k(d, kk)
    return ids, dists
