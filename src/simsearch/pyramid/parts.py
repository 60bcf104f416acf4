"""A cluster collection's parts on their shard replicas (docs/cluster.md, "Writes"): searched
(``PartCall``: hedged, failed over, by a deadline); written by the leader in fenced phases
(prepare, sync); and brought up to date (prepared ops, ops shipped from a peer's log, or a
whole copy).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

import numpy as np

from ..errors import SimsearchError
from ..index import SearchResult, check_deadline
from ..service import convert
from ..service.errors import (
    CollectionExistsError,
    CollectionNotFoundError,
    DataLossError,
    DeadlineExceededError,
    OpsGoneError,
    ServiceUnavailableError,
)
from .checkpoints import copy_model
from .control.errors import PartUnavailableError

log = logging.getLogger(__name__)

#: a part call's deadline leaves the coordinator this share of the time left (at most
#: DEADLINE_MARGIN_MAX seconds) to merge the parts and answer
DEADLINE_MARGIN_SHARE = 0.1
DEADLINE_MARGIN_MAX = 0.2

_TRANSIENT = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "RESOURCE_EXHAUSTED", "UNKNOWN"}


class PartPool(Protocol):
    """What a part reaches its replicas through: the cluster's ShardPool (shards.py)."""

    timeout: float
    up: dict[int, bool]
    parts: dict[str, RemotePart]
    part_locks: Any
    slow_until: dict[int, float]
    slow_penalty: float
    query_parts: int
    executor: Any
    term: Any
    next_attempt: Any

    def client(self, sid: int) -> Any: ...
    def replicas_of(self, name: str) -> list[int]: ...
    def serving(self, part: RemotePart) -> list[int]: ...
    def mark_down(self, sid: int) -> None: ...
    def mark_in_sync(self, name: str, sid: int) -> None: ...
    def mark_out_of_sync(self, name: str, sid: int) -> None: ...
    def hedge_delay(self, name: str) -> float: ...
    def take_hedge(self) -> bool: ...
    def record(self, name: str, seconds: float) -> None: ...


class RouterBehindError(SimsearchError, RuntimeError):
    """A replica has applied writes past this coordinator's router copy (it is reloading):
    retry the catch-up later; the replica is not stale."""


class RemotePart:
    """One part on its replicas: searched through ``begin`` / ``search_parts`` (hedging,
    deadlines, fail-over), and the leader's fenced two-phase writes and replica catch-up
    (docs/cluster.md, "Writes")."""

    def __init__(self, pool: PartPool, name: str, config: dict, index: int = 0):
        self.pool, self.name, self.config = pool, name, config
        self.index = index  # its number among its router's parts
        self.owner = None  # holds the committed sequences once registered (ShardPool.register)
        self.write_lock = pool.part_locks[name]
        self.turn = 0  # round robin over the replicas a search may ask first

    @property
    def shards(self) -> list[int]:
        """The replicas the cluster map assigns now (rebalancing changes them)."""
        return self.pool.replicas_of(self.name)

    def ensure(self, fresh: bool = False) -> None:
        """Create the part's collection on every replica that lacks it. A copy of another
        incarnation (a dropped collection's, on a shard that was away when it was dropped) is
        never adopted: for a ``fresh`` part (no write committed yet: its router is being
        trained) it is replaced by an empty copy at once; otherwise it is marked out of sync,
        and the leader's catch-up replaces it."""
        for sid in self.shards:
            try:
                self._create(sid)
            except CollectionExistsError:
                try:
                    if fresh:
                        self._replace_foreign(sid)
                    elif not self._ours(sid):
                        self.pool.mark_out_of_sync(self.name, sid)
                except Exception as exc:
                    log.warning("could not check %s on shard %d: %s", self.name, sid, exc)
            except Exception as exc:  # catch_up re-copies a replica that lacks its collection
                log.warning("could not create %s on shard %d: %s", self.name, sid, exc)

    def _create(self, sid: int) -> None:
        c = self.config
        self.pool.client(sid).create_collection(
            self.name, c["dim"], c["metric"], c["kind"], schema=c.get("schema"),
            part_replica=True, incarnation=c.get("incarnation", ""), **c["params"])

    def _ours(self, sid: int) -> bool:
        """Whether the copy on ``sid`` belongs to this incarnation of the collection."""
        info = self.pool.client(sid).collection(self.name).describe()
        return info.get("incarnation", "") == self.config.get("incarnation", "")

    def _replace_foreign(self, sid: int) -> None:
        """Delete a copy of another incarnation on ``sid`` and make an empty one of this
        (catch-up then fills it)."""
        try:
            if self._ours(sid):
                return
            log.warning("%s on shard %d belongs to a dropped collection of that name: "
                        "deleting it", self.name, sid)
            self.pool.client(sid).drop_collection(self.name)
        except CollectionNotFoundError:
            pass
        self._create(sid)

    def _col(self, sid: int):
        c = self.config
        return self.pool.client(sid).collection_handle(self.name, c["dim"], c["metric"],
                                                        c["kind"])

    # -- the leader's writes (called with ``write_lock`` held) ------------------------------

    def prepare(self, sid: int, term: int, attempt: int, ops: list, timeout: float) -> dict:
        return self.pool.client(sid).part_prepare(self.name, term, attempt, ops, timeout)

    def sync(self, sid: int, term: int, ballot=(0, 0), first: int = 0, through: int = 0,
             timeout: float | None = None) -> dict:
        return self.pool.client(sid).part_sync(self.name, term, ballot, first, through,
                                               timeout or self.pool.timeout)

    def _current(self) -> RemotePart:
        """The RemotePart of the router copy current to the log (a reloaded router makes new
        ones); RouterBehindError while none is loaded: a dropped copy's sequences may hold a
        write the log never committed."""
        cur = self.pool.parts.get(self.name)
        if cur is None or cur.owner is None:
            raise RouterBehindError(f"{self.name}: no router copy current to the log is loaded "
                                    "here yet; retry later")
        return cur

    def _committed(self):
        """(the committed PartSequences, this part's number in them)."""
        cur = self._current()
        seqs = cur.owner.seqs
        if seqs is None:  # dropped meanwhile
            raise RouterBehindError(f"{self.name}: the router copy was dropped; retry later")
        return seqs, cur.index

    def bring_up_to_date(self, sid: int, term: int) -> int:
        """Fence the replica on ``sid`` at ``term`` and apply the committed writes it holds
        prepared but missed the commit of (the router remembers the last PART_HISTORY); returns
        the sequence it has applied. The last committed write it has applied is synced again
        under its ballot: a replica that applied another write there refuses
        (DataLossError), and the caller re-copies it. Call with ``write_lock`` held."""
        seqs, j = self._committed()
        st = self.sync(sid, term)
        history = seqs.committed_writes(j)
        for first, through, ballot in history:
            if through > st["applied"]:
                st = self.sync(sid, term, ballot, first, through)
        done = [w for w in history if w[1] <= st["applied"]]
        if done:  # a replay of an applied range: a no-op unless it holds another write there
            first, through, ballot = done[-1]
            self.sync(sid, term, ballot, first, through)
        return st["applied"]

    def committed(self) -> int:
        seqs, j = self._committed()
        return int(seqs.seq[j])

    def __len__(self) -> int:
        for s in self.pool.serving(self):
            return len(self._col(s))
        return 0

    # -- reads ------------------------------------------------------------------------------

    def search(self, q: np.ndarray, k: int, *, allow: Any = None, deny: Any = None,
               where: dict | None = None, deadline: float | None = None,
               **params: Any) -> SearchResult:
        """``Index.search`` on a replica (hedged, failed over; ``PartCall``)."""
        check_deadline(deadline)
        params.update({n: v for n, v in (("allow", allow), ("deny", deny), ("where", where))
                       if v is not None})
        done = threading.Event()
        call = self.begin(q, k, params, done, deadline)
        while True:
            done.clear()
            out = call.poll()
            if out is not None:
                return out
            done.wait(call.nap())

    def get(self, ids: np.ndarray | None, vectors: bool = False,
            where: dict | None = None) -> dict:
        """``RemoteCollection.get`` on the first in-sync replica that answers."""
        last: Exception | None = None
        for s in self.pool.serving(self):
            try:
                return self._col(s).get(ids, vectors=vectors, where=where)
            except (ServiceUnavailableError, DeadlineExceededError) as exc:  # the next one
                last = exc
        raise PartUnavailableError(f"no in-sync replica of {self.name} answered: {last}")

    def get_vectors(self, ids: np.ndarray) -> np.ndarray:
        """The vectors of ``ids`` (all held) from an in-sync replica."""
        got = self.get(np.asarray(ids, np.int64), vectors=True)
        if got["ids"].size != len(ids):
            raise PartUnavailableError(f"{self.name}: a replica lacks some of the ids asked")
        return got["vectors"]

    def begin(self, q: np.ndarray, k: int, params: dict, done: threading.Event,
              deadline: float | None = None) -> PartCall:
        """Start a search on a replica; ``done`` is set whenever a replica answers (several
        parts' calls may share it, so one thread waits for all of them)."""
        return PartCall(self, q, k, params, done, deadline)

    # -- recovery ---------------------------------------------------------------------------

    def catch_up(self, sid: int) -> None:
        """Bring the replica on ``sid`` to the part's committed sequence and mark it in sync
        (the leader; under the part's write lock, so no write slips in between): apply what it
        holds prepared, else copy a replica that is current (``ExportCollection`` /
        ``ImportCollection``, carrying the fencing state). Works when every replica missed the
        last commits: they hold the ops prepared. Raises if no replica is current yet."""
        term = self.pool.term()
        with self.write_lock:
            through = self.committed()
            self._replace_foreign(sid)
            try:
                applied = self.bring_up_to_date(sid, term)
            except (CollectionNotFoundError, DataLossError):  # a lost disk, a damaged replica
                applied = -1
            if applied > through:
                raise RouterBehindError(f"{self.name} on shard {sid} applied {applied}, past the "
                                        f"committed {through}: this router copy is behind the "
                                        "log")
            if applied < through and not (applied >= 0 and self._ship_ops(sid, term, through,
                                                                            applied)):
                self._copy_to(sid, term, through, applied)
            self.pool.mark_in_sync(self.name, sid)

    def _ship_ops(self, sid: int, term: int, through: int, applied: int) -> bool:
        """Repair incrementally: the ops the replica lacks, read from a current peer's log,
        prepared on it under a fresh ballot and applied. False if no peer's log reaches back
        that far (then the caller copies a whole replica)."""
        for peer in [s for s in self.shards if s != sid]:
            try:
                if self.bring_up_to_date(peer, term) != through:
                    continue
                shipped = applied
                while applied < through:
                    ops, _ = self.pool.client(peer).part_ops(self.name, applied)
                    if not ops:
                        break
                    ballot = (term, self.pool.next_attempt())
                    self.prepare(sid, term, ballot[1], ops, self.pool.timeout)
                    applied = self.sync(sid, term, ballot, ops[0].pseq,
                                        ops[-1].pseq)["applied"]
                    if applied != ops[-1].pseq:
                        break
            except OpsGoneError:
                continue
            except Exception as exc:  # try the next peer, or a copy
                log.warning("%s: ops from shard %d to %d failed: %s", self.name, peer, sid, exc)
                continue
            if applied == through:
                log.warning("part %s on shard %d caught up from shard %d's log: %d writes",
                            self.name, sid, peer, through - shipped)
                return True
        return False

    def _copy_to(self, sid: int, term: int, through: int, applied: int) -> None:
        peers = sorted((s for s in self.shards if s != sid), key=lambda s: not self.pool.up.get(s))
        for peer in peers:
            try:
                if self.bring_up_to_date(peer, term) != through:
                    continue
                config, data = self.pool.client(peer).export_collection(self.name)
                config["fence_term"] = term
                self.pool.client(sid).import_collection(self.name, config, data)
                copy_model(self.pool, self.name.rsplit(".p", 1)[0], peer, sid)
            except Exception as exc:  # try the next peer
                log.warning("%s: copy from shard %d to %d failed: %s", self.name, peer, sid, exc)
                continue
            self.pool.mark_in_sync(self.name, peer)
            log.warning("part %s on shard %d (applied %d) re-copied from shard %d at %d "
                        "(%d bytes)", self.name, sid, applied, peer, through, len(data))
            return
        raise SimsearchError(f"{self.name}: no replica has applied the committed sequence "
                             f"{through} yet; will retry")


class PartCall:
    """One part's search in flight: the primary replica's call, then a hedge to another replica
    after the part's p95 latency (within the hedge budget) or a fail-over when the primary's
    shard fails or is declared down."""

    def __init__(self, part: RemotePart, q: np.ndarray, k: int, params: dict,
                 done: threading.Event, deadline: float | None = None):
        pool = self.pool = part.pool
        self.part = part
        cands = pool.serving(part)
        if not cands:
            raise PartUnavailableError(f"no in-sync replica of {part.name} is up")
        part.turn += 1
        cands = cands[part.turn % len(cands):] + cands[: part.turn % len(cands)]
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
