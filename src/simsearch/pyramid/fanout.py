"""A search's fan-out to remote parts (docs/cluster.md, "Failures and stragglers"): every
part's call started at once, a hedge to a second replica after the part's p95 latency, a
fail-over when a replica fails, and the caller's deadline.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import numpy as np

from ..errors import SimsearchError
from ..index import SearchResult
from .control.errors import PartUnavailableError

if TYPE_CHECKING:
    from .parts import RemotePart

#: a part call's deadline leaves the coordinator this share of the time left (at most
#: DEADLINE_MARGIN_MAX seconds) to merge the parts and answer
DEADLINE_MARGIN_SHARE = 0.1
DEADLINE_MARGIN_MAX = 0.2

_TRANSIENT = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "RESOURCE_EXHAUSTED", "UNKNOWN"}


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


class PartCall:
    """One part's search in flight: the primary replica's call, then a hedge to another replica
    after the part's p95 latency (within the hedge budget) or a fail-over when the primary's
    shard fails or is declared down."""

    def __init__(self, part: RemotePart, q: np.ndarray, k: int, params: dict,
                 done: threading.Event, deadline: float | None = None):
        from ..service import convert

        pool = self.pool = part.pool
        self.part = part
        cands = pool.serving(part)
        if not cands:
            raise PartUnavailableError(f"no in-sync replica of {part.name} is up")
        part._rr += 1
        cands = cands[part._rr % len(cands):] + cands[: part._rr % len(cands)]
        now = time.monotonic()  # replicas that just lost a hedge race go last for a while
        cands.sort(key=lambda s: pool.slow_until.get(s, 0.0) > now)
        self.cands = cands
        if deadline is not None:  # leave the coordinator time to merge and answer
            deadline -= min(DEADLINE_MARGIN_MAX,
                            DEADLINE_MARGIN_SHARE * max(0.0, deadline - time.monotonic()))
        self.deadline = deadline
        params = dict(params)
        lists = {name: params.pop(name) for name in ("allow", "deny") if name in params}
        where = params.pop("where", None)  # a filter the part's attributes answer
        self.request = (q, k, convert.dump_params(params), lists, where)
        pool.query_parts += q.shape[0]  # a metric: unlocked, an increment lost now and then
        self.done = done
        self.box: list = []
        self.lock = threading.Lock()
        self.started = [cands[0]]
        pool.executor.submit(self._call, cands[0], False)
        self.hedge_at = time.monotonic() + pool.hedge_delay(part.name)
        self.hedged = False

    def _call(self, sid: int, hedge: bool) -> None:
        pool, (q, k, pj, lists, where) = self.pool, self.request
        cli = pool.client(sid)
        timeout = cli.timeout if self.deadline is None else max(
            0.001, self.deadline - time.monotonic())
        t0 = time.monotonic()
        try:  # blocking, on the pool's thread (see ShardClient.search_once)
            out = cli.search_once(self.part.name, q, k, pj, timeout=timeout, where=where,
                                  **lists)
            if not hedge:
                pool.record(self.part.name, time.monotonic() - t0)
        except Exception as exc:  # typed ServiceError from the shard, or any local failure
            out = exc
        with self.lock:
            self.box.append((sid, out))
        self.done.set()

    def nap(self) -> float:
        """How long the waiter may sleep before calling poll again."""
        # wake often: a straggler's shard may be declared down, or a hedge become due
        nap = 0.02 if len(self.started) < len(self.cands) else 0.1
        if self.deadline is not None:
            nap = min(nap, max(0.0, self.deadline - time.monotonic()))
        return nap

    def poll(self) -> SearchResult | None:
        """The answer once a replica gave one; None while waiting (starting a hedge or a
        fail-over when due); raises PartUnavailableError when every replica failed or the
        deadline passed, and the replica's error when it is not transient."""

        pool, started, cands = self.pool, self.started, self.cands
        with self.lock:
            results = list(self.box)
        for sid, out in results:
            if isinstance(out, SearchResult):
                if sid != started[0]:  # the hedge won: avoid the straggler for a while
                    pool.slow_until[started[0]] = time.monotonic() + pool.slow_penalty
                return out
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise PartUnavailableError(f"{self.part.name}: the deadline passed")
        for sid, out in results:
            code = getattr(out, "code", None)
            if not isinstance(code, str):  # not a service fault: a grpc error the client could
                code = "UNKNOWN"  # not map, or a local one (the call never left)
                if isinstance(out, SimsearchError):
                    raise out
            if code not in _TRANSIENT and code != "NOT_FOUND":  # NOT_FOUND: a replica that
                raise out  # restarted empty and has not caught up yet; try another
            if code == "UNAVAILABLE":
                pool.mark_down(sid)
        failed = {sid for sid, _ in results}
        if failed >= set(started) and len(started) == len(cands):
            raise PartUnavailableError(f"every replica of {self.part.name} failed")
        if len(started) == len(cands):
            return None
        live = [s for s in started if s not in failed and pool.up.get(s)]
        if not live:  # failed, or its shard was declared down meanwhile: fail over now
            started.append(cands[len(started)])
            pool.executor.submit(self._call, started[-1], True)
        elif not self.hedged and time.monotonic() >= self.hedge_at and pool.take_hedge():
            self.hedged = True  # straggler: a second replica races the first
            started.append(cands[len(started)])
            pool.executor.submit(self._call, started[-1], True)
        return None


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
