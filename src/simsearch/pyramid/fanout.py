"""A cluster router's fan-out (docs/cluster.md, "Failures and stragglers"): every part's call
started at once (``RemotePart.begin``: hedged, failed over, by the caller's deadline) and
waited for in one thread; and reads of items across the parts.
"""

from __future__ import annotations

import threading

import numpy as np

from .control.errors import PartUnavailableError


def search_parts(calls: list, k: int, deadline: float | None = None) -> list:
    """Search ``[(part, queries, params)]`` at once, by ``deadline`` (time.monotonic()): start
    every part's call, then wait for all of them in this thread (no thread hop per part). Per
    call: its SearchResult, or the PartUnavailableError of a part that could not answer.
    ``params`` may hold per-query values (``Index.search``)."""

    done = threading.Event()
    results: list = [None] * len(calls)
    pending = []
    for i, (part, qs, params) in enumerate(calls):
        try:
            pending.append((i, part.begin(qs, k, params, done, deadline)))
        except PartUnavailableError as exc:
            results[i] = exc
    while pending:
        done.clear()
        left = []
        for i, call in pending:
            try:
                out = call.poll()
            except PartUnavailableError as exc:
                out = exc
            if out is None:
                left.append((i, call))
            else:
                results[i] = out
        pending = left
        if pending:
            done.wait(min(call.nap() for _, call in pending))
    return results


def get_items(index, ids: np.ndarray | None, vectors: bool, where: dict | None) -> dict:
    """``Collection.get`` over a router whose parts are remote: each held id read from its
    home part, in the order asked (an id removed meanwhile is skipped); with ``ids=None``,
    every item of every part that ``where`` selects, MIPS copies skipped (sorted). Each part's
    node answers in pages; the caller pages the whole answer (service.paging)."""
    router = index.router
    if ids is None:
        got = {p: part.get(None, vectors, where) for p, part in enumerate(index.parts)}
        rows = sorted((i, p, r) for p, g in got.items() for r, i in enumerate(g["ids"].tolist())
                      if router.home.get(i) == p)
        rows = [(p, r) for _, p, r in rows]
    else:
        at = np.fromiter((router.home.get(i, -1) for i in ids.tolist()), np.int64, ids.size)
        got = {p: index.parts[p].get(ids[at == p], vectors, where)
               for p in np.unique(at[at >= 0]).tolist()}
        pos = {p: {i: r for r, i in enumerate(g["ids"].tolist())} for p, g in got.items()}
        rows = [(p, pos[p][i]) for i, p in zip(ids.tolist(), at.tolist(), strict=True)
                if p >= 0 and i in pos[p]]
    names = sorted({n for g in got.values() for n in g["attributes"]})
    x = None
    if vectors:
        x = np.empty((len(rows), index.dim), np.float32)
        for j, (p, r) in enumerate(rows):
            x[j] = got[p]["vectors"][r]
    return {"ids": np.array([got[p]["ids"][r] for p, r in rows], np.int64),
            "attributes": {n: [got[p]["attributes"][n][r] if n in got[p]["attributes"] else None
                               for p, r in rows] for n in names},
            "vectors": x}
