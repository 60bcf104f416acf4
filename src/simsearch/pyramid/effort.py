"""How hard each routed part searches, and the part calls of a batch (docs/bench/pyramid.md,
"part_effort")."""

from __future__ import annotations

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
              min_ef: int | None) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """The part calls of a batch, ``(part, query rows, beam per row)``: with ``part_effort``
    "share" and an ``ef``, a part's beam shrinks with its share of the query's routed centres
    (``effort_levels``, at least ``min_ef``, default k); else every asked part gets ``ef``
    (None: the sub-index's own). One call per part: a part's index takes the beams per query
    (``Index.search``)."""
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
        jobs.append((p, rows, ef_table[col[rows]]))
    return jobs


def params_of(efs: np.ndarray, sub_params: dict) -> dict:
    """A part call's search parameters for its rows' beams (a list, one per row, when they
    differ: ``Index.search`` takes per-query values)."""
    if efs[0] is None:
        return sub_params
    if (efs == efs[0]).all():
        return {**sub_params, "ef": int(efs[0])}
    return {**sub_params, "ef": [int(e) for e in efs]}
