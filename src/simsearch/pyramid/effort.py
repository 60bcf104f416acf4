"""How hard each routed part searches, and the part calls of a batch (docs/bench-pyramid.md,
"part_effort")."""

from __future__ import annotations

from typing import Any

import numpy as np


def effort_levels(shares: np.ndarray, hit: np.ndarray, max_level: int = 3) -> np.ndarray:
    """(nq, n_parts) int8 effort level per asked part: 0 for the query's primary part (the
    largest share of its routed centres) and for parts with more than half of that share;
    level j for a share ratio in (2^-(j+1), 2^-j] (a part expected to hold 2^-j times the
    primary's neighbours gets 2^-j of its beam), capped at ``max_level``. -1: not asked."""
    top = shares.max(1, keepdims=True)
    ratio = np.where(hit, shares / np.maximum(top, 1e-9), 1.0)
    with np.errstate(divide="ignore"):
        lev = np.floor(-np.log2(np.maximum(ratio, 1e-9))).astype(np.int64)
    lev = np.clip(lev, 0, max_level).astype(np.int8)
    lev[~hit] = -1
    return lev


def part_jobs(shares: np.ndarray, hit: np.ndarray, k: int, ef: int | None, part_effort: str,
              min_ef: int | None, per_query: bool) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """The part calls of a batch, ``(part, query rows, beam per row)``: with ``part_effort``
    "share" and an ``ef``, a part's beam shrinks with its share of the query's routed centres
    (``effort_levels``, at least ``min_ef``, default k); else every asked part gets ``ef``
    (None: the sub-index's own). One call per part when the parts take per-query parameters
    (``per_query``: remote parts, one RPC each), else one per (part, beam)."""
    if part_effort == "share" and ef is not None:
        levels = effort_levels(shares, hit)
        floor = k if min_ef is None else min_ef
        ef_of = {j: max(floor, -(-ef // (1 << j))) for j in range(4)}
    else:
        levels = np.where(hit, 0, -1).astype(np.int8)
        ef_of = {0: ef}
    ef_table = np.array([ef_of.get(j, ef) for j in range(4)], dtype=object)
    jobs = []
    for p in range(hit.shape[1]):
        col = levels[:, p]
        rows = np.flatnonzero(col >= 0)
        if not rows.size:
            continue
        lev = col[rows]
        if per_query or lev.min() == lev.max():
            jobs.append((p, rows, ef_table[lev]))
            continue
        by_ef: dict[Any, list[np.ndarray]] = {}
        for j in np.unique(lev).tolist():
            by_ef.setdefault(ef_of[j], []).append(rows[lev == j])
        for e, rs in by_ef.items():
            r_ = np.sort(np.concatenate(rs))
            jobs.append((p, r_, np.full(r_.size, e, dtype=object)))
    return jobs


def params_of(efs: np.ndarray, sub_params: dict) -> dict:
    """A part call's search parameters for its rows' beams (``per_query`` when they differ)."""
    if efs[0] is None:
        return sub_params
    if (efs == efs[0]).all():
        return {**sub_params, "ef": int(efs[0])}
    out = {**sub_params, "per_query": {"ef": [int(e) for e in efs]}}
    out.pop("ef", None)
    return out
