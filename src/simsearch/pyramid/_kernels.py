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


@njit(cache=True)
def parse_level0(blob, offset_level0, n_elements, size_per_element, label_offset, max_m0):
    """The level-0 link lists of a saved hnswlib index (uint8 blob) as (n, max_m0) int64 labels
    of neighbours, -1 padded; row r belongs to the element whose label is labels[r].
    Returns (labels int64 (n,), neighbours int64 (n, max_m0))."""
    labels = np.empty(n_elements, np.int64)
    internal = np.full((n_elements, max_m0), -1, np.int64)
    for e in range(n_elements):
        base = offset_level0 + e * size_per_element
        cnt = np.int64(blob[base]) | (np.int64(blob[base + 1]) << 8)
        lab = np.int64(0)
        for b in range(8):
            lab |= np.int64(blob[base + label_offset + b]) << (8 * b)
        labels[e] = lab
        for j in range(min(cnt, max_m0)):
            p = base + 4 + 4 * j
            v = (np.int64(blob[p]) | (np.int64(blob[p + 1]) << 8)
                 | (np.int64(blob[p + 2]) << 16) | (np.int64(blob[p + 3]) << 24))
            internal[e, j] = v
    out = np.full((n_elements, max_m0), -1, np.int64)
    for e in range(n_elements):
        for j in range(max_m0):
            v = internal[e, j]
            if 0 <= v < n_elements:
                out[e, j] = labels[v]
    return labels, out
