"""Numba kernels for Pyramid: merging the parts' top-k lists with id de-duplication."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def merge_topk_dedup(cand_ids, cand_scores, k, higher_is_better):
    """Per row, the k best of (nq, L) int64 ids / float32 scores, each id at most once (MIPS
    copies put one item in several parts). -1 ids are padding. Ties keep column order.
    Returns ids int64 (nq, k) and scores float32 (nq, k); unfilled slots are -1 / padding."""
    nq, width = cand_ids.shape
    out_ids = np.full((nq, k), -1, np.int64)
    pad = -np.inf if higher_is_better else np.inf
    out_scores = np.full((nq, k), pad, np.float32)
    key = np.empty(width, np.float64)
    for i in range(nq):
        for j in range(width):
            s = cand_scores[i, j]
            if cand_ids[i, j] < 0:
                key[j] = np.inf
            else:
                key[j] = -s if higher_is_better else s
        order = np.argsort(key, kind="mergesort")
        filled = 0
        for t in range(width):
            j = order[t]
            cid = cand_ids[i, j]
            if cid < 0:
                break
            seen = False
            for u in range(filled):
                if out_ids[i, u] == cid:
                    seen = True
                    break
            if seen:
                continue
            out_ids[i, filled] = cid
            out_scores[i, filled] = cand_scores[i, j]
            filled += 1
            if filled == k:
                break
    return out_ids, out_scores
