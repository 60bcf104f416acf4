"""The Pyramid cluster's data path (docs/cluster.md): shard connections and health, replica
sync state, remote parts (fan-out, hedging, deadlines, coverage, replica catch-up).

Imported by the coordinator (coordinator.py) and by client-side routers; the replica map comes
from the cluster state in etcd (control/state.py).
"""

from __future__ import annotations

import collections
import contextvars
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..errors import SimsearchError
from ..index import SearchResult

log = logging.getLogger(__name__)

#: the calling request's absolute deadline (time.monotonic()), read by remote parts
DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("deadline", default=None)

# -- hedging and deadline settings (docs/cluster.md, "Failures and stragglers"), named here so
# they are tuned in one place; ShardPool's hedge_fraction (extra calls per primary call) is the
# constructor's knob.
#: hedge budget: tokens at start-up and the most that can be saved up (one token = one hedge)
HEDGE_TOKENS_START = 10.0
HEDGE_TOKENS_MAX = 20.0
#: a part's hedge delay is the p95 of its last LATENCY_WINDOW primary calls, recomputed every
#: P95_EVERY calls once P95_MIN_SAMPLES are known (a percentile per call cost 15 % of the CPU),
#: never below P95_FLOOR seconds, and HEDGE_DELAY_UNKNOWN seconds before that
LATENCY_WINDOW = 256
P95_EVERY = 16
P95_MIN_SAMPLES = 20
P95_FLOOR = 0.002
HEDGE_DELAY_UNKNOWN = 0.05
#: a part call's deadline leaves the coordinator this share of the time left (at most
#: DEADLINE_MARGIN_MAX seconds) to merge the parts and answer
DEADLINE_MARGIN_SHARE = 0.1
DEADLINE_MARGIN_MAX = 0.2

_TRANSIENT = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "RESOURCE_EXHAUSTED", "UNKNOWN"}


class RouterBehindError(SimsearchError, RuntimeError):
    """A replica has applied writes past this coordinator's router copy (it is reloading):
    retry the catch-up later; the replica is not stale."""


# ---------------------------------------------------------------------------------------------
# the shard pool: clients, health, sync state, latency


class ShardPool:
    """Connections to a cluster's shard servers, their health, and the replica map as the
    cluster state in etcd has it (control/state.py).

    ``is_leader`` / ``fence``: when this process is the elected leader it also writes the map
    (out-of-sync marks, re-copies); otherwise it only reads it (a follower coordinator, or a
    client-side router)."""

    def __init__(self, state, *, is_leader: Callable[[], bool] = lambda: False,
                 fence: Callable[[], list] | None = None,
                 term: Callable[[], int] | None = None,
                 next_attempt: Callable[[], int] | None = None, timeout: float = 30.0,
                 health_interval: float = 0.2, hedge_fraction: float = 0.1,
                 token: str | None = None, tls_ca: str | None = None):
        from functools import partial

        from ..service.client import connect as _connect

        self._connect = partial(_connect, token=token, tls_ca=tls_ca)  # shards behind auth / TLS
        self.state = state
        self.is_leader = is_leader
        self.fence = fence
        self.term = term  # the leader's term (its fencing token for part writes)
        self.next_attempt = next_attempt  # the leader's write attempts (its ballots' 2nd half)
        self.timeout = timeout
        self.clients: dict[int, Any] = {}
        self._probes: dict[int, Any] = {}
        self._addresses: dict[int, str] = {}
        self.up: dict[int, bool] = {}
        self.parts: dict[str, RemotePart] = {}
        #: one write lock per part name, shared by every router copy's RemotePart of it
        self.part_locks: dict[str, threading.Lock] = collections.defaultdict(threading.Lock)
        self._lock = threading.RLock()
        self._lat: dict[str, collections.deque] = collections.defaultdict(
            lambda: collections.deque(maxlen=LATENCY_WINDOW))
        self._n_rec: collections.Counter = collections.Counter()
        self._p95: dict[str, float] = {}
        self._hedge_tokens = HEDGE_TOKENS_START
        self.hedge_fraction = hedge_fraction
        self.hedges = 0
        self.query_parts = 0  # (query, part) pairs asked: with the queries, the fan-out
        self.executor = ThreadPoolExecutor(64, thread_name_prefix="pyramid-rpc")
        self.health_interval = health_interval
        self._stop = threading.Event()
        self._recovering: set[int] = set()
        self.slow_until: dict[int, float] = {}  # shard -> until when reads prefer its peers
        self.slow_penalty = 1.0
        self.closers: list[Callable[[], None]] = []  # what close() also closes
        self.sync_shards()
        for sid in list(self.clients):  # first look: serve from whoever is up now
            self.up[sid] = self._probe(sid)
        self._watcher = threading.Thread(target=self._watch, name="pyramid-health", daemon=True)
        self._watcher.start()

    # -- membership -------------------------------------------------------------------------

    def sync_shards(self) -> None:
        """Connect to shards that registered (or moved) since the last look."""
        for sid, info in self.state.shards().items():
            addr = info["address"]
            with self._lock:
                if self._addresses.get(sid) == addr:
                    continue
                old = [c for c in (self.clients.get(sid), self._probes.get(sid)) if c]
                self._addresses[sid] = addr
                self.clients[sid] = self._connect(addr, timeout=self.timeout)
                self._probes[sid] = self._connect(addr, timeout=max(0.2, self.health_interval * 2))
                self.up.setdefault(sid, False)
            for c in old:
                c.close()
            log.info("shard %d at %s", sid, addr)

    def client(self, sid: int):
        """The client of shard ``sid`` (ServiceUnavailableError if it never registered)."""
        from ..service.errors import ServiceUnavailableError

        cli = self.clients.get(sid)
        if cli is None:
            raise ServiceUnavailableError(f"shard {sid} is not registered in the cluster")
        return cli

    # -- replica map ------------------------------------------------------------------------

    def replicas_of(self, name: str) -> list[int]:
        return list(self.state.part_entry(name)["replicas"])

    def in_sync(self, name: str, sid: int) -> bool:
        return sid in self.state.part_entry(name)["in_sync"]

    def mark_out_of_sync(self, name: str, sid: int, strict: bool = False) -> None:
        """The leader records that a replica missed a write (it gets no reads until it caught
        up); elsewhere this only routes around the shard, or with ``strict`` raises
        NotLeaderError (a write must not be acknowledged while the mark is unrecorded)."""
        if not strict and not self.is_leader():
            self.mark_down(sid)
            return

        def drop(e):
            if sid not in e["in_sync"]:
                return None
            e["in_sync"] = [s for s in e["in_sync"] if s != sid]
            return e

        if self.state.update_part(self.fence, name, drop):
            log.warning("replica of %s on shard %d is out of sync", name, sid)

    def mark_in_sync(self, name: str, sid: int) -> None:
        def add(e):
            if sid in e["in_sync"] or sid not in e["replicas"]:
                return None
            e["in_sync"] = sorted([*e["in_sync"], sid])
            return e

        self.state.update_part(self.fence, name, add)

    # -- health -----------------------------------------------------------------------------

    def _probe(self, sid: int) -> bool:
        """True if the shard answers its health check with SERVING; a failed probe is logged
        (the shard is then routed around, and re-checked every health interval)."""
        try:
            status = self._probes[sid].health()
        except Exception as exc:  # any failure to answer means "not serving"; say which
            log.debug("health probe of shard %d failed: %r", sid, exc)
            return False
        if status != "SERVING":
            log.debug("shard %d reports %s", sid, status)
        return status == "SERVING"

    def _watch(self) -> None:
        while not self._stop.wait(self.health_interval):
            self.sync_shards()
            registered = self.state.shards()
            for sid in list(self.clients):
                # a shard whose lease is gone is down whatever its port says
                alive = sid in registered and self._probe(sid)
                if not alive and self.up.get(sid):
                    log.warning("shard %d is down", sid)
                    self.up[sid] = False
                elif alive and not self.up.get(sid):
                    if not self.is_leader():
                        self.up[sid] = True  # the leader re-copies it; the map says when
                    elif sid not in self._recovering:
                        self.recover(sid)

    def recover(self, sid: int) -> None:
        """Check (and re-copy where stale) every part replica on ``sid``, in the background."""
        with self._lock:
            if sid in self._recovering:
                return
            self._recovering.add(sid)
        threading.Thread(target=self._recover, args=(sid,), daemon=True).start()

    def mark_down(self, sid: int) -> None:
        if self.up.get(sid):
            log.warning("shard %d failed a call; routing around it", sid)
            self.up[sid] = False

    def _recover(self, sid: int) -> None:
        """A shard is back (or a new leader checks it): bring each of its part replicas up to
        date; one that cannot be yet is marked out of sync (the leader retries it); then the
        shard serves the rest."""
        try:
            stale = []
            for part in list(self.parts.values()):
                if sid in part.shards:
                    try:
                        part.catch_up(sid)
                    except RouterBehindError as exc:
                        log.info("%s", exc)
                    except Exception as exc:
                        stale.append(part.name)
                        log.warning("%s on shard %d could not catch up yet: %s", part.name, sid,
                                    exc)
                        self.mark_out_of_sync(part.name, sid)
            self._drop_orphans(sid)
            self.up[sid] = self._probe(sid)
            log.warning("shard %d is %s%s", sid, "serving" if self.up[sid] else "down",
                        f" (stale: {', '.join(stale)})" if stale else "")
        except Exception as exc:
            log.warning("shard %d could not be checked yet (%s); will retry", sid, exc)
        finally:
            self._recovering.discard(sid)

    def _drop_orphans(self, sid: int) -> None:
        """Delete the part replicas on ``sid`` that no collection's map lists any more (a
        collection dropped while the shard was away): they would otherwise stay for good."""
        cli = self.client(sid)
        for name in cli.list_collections():
            collection, dot, j = name.rpartition(".p")
            if not (dot and j.isdigit()):
                continue
            m, _ = self.state.refresh(f"map/{collection}")  # fresh: never a part being made
            if name in (m or {}).get("parts", {}):
                continue
            try:
                if cli.collection(name).describe().get("part_replica"):
                    log.warning("deleting %s on shard %d: no collection lists it", name, sid)
                    cli.drop_collection(name)
            except Exception as exc:  # gone meanwhile, or the shard went away: next time
                log.warning("could not delete orphan %s on shard %d: %s", name, sid, exc)

    def stale_replicas(self) -> set[int]:
        """Shards holding a replica marked out of sync (the leader retries them)."""
        return {s for name in self.parts for s in self.replicas_of(name)
                if not self.in_sync(name, s)}

    def serving(self, part: RemotePart) -> list[int]:
        """In-sync replicas of ``part`` to read from: those up, or when none is up, all in-sync
        ones (a missed health probe under load is a hint, not proof; a dead one fails fast)."""
        e = self.state.part_entry(part.name)
        synced = [s for s in e["replicas"] if s in e["in_sync"] and s in self.clients]
        return [s for s in synced if self.up.get(s)] or synced

    # -- latency and hedging ----------------------------------------------------------------

    def record(self, name: str, seconds: float) -> None:
        lat = self._lat[name]
        lat.append(seconds)
        with self._lock:  # every primary call earns a fraction of a hedge
            self._hedge_tokens = min(HEDGE_TOKENS_MAX, self._hedge_tokens + self.hedge_fraction)
            self._n_rec[name] += 1
            due = self._n_rec[name] % P95_EVERY == 0 and len(lat) >= P95_MIN_SAMPLES
        if due:
            self._p95[name] = max(P95_FLOOR, float(np.percentile(np.fromiter(lat, float), 95)))

    def hedge_delay(self, name: str) -> float:
        """When to hedge a call to part ``name``: its recent p95 latency."""
        return self._p95.get(name, HEDGE_DELAY_UNKNOWN)

    def take_hedge(self) -> bool:
        with self._lock:
            if self._hedge_tokens >= 1.0:
                self._hedge_tokens -= 1.0
                self.hedges += 1
                return True
            return False

    def close(self) -> None:
        self._stop.set()
        for c in (*self.clients.values(), *self._probes.values()):
            c.close()
        self.executor.shutdown(wait=False, cancel_futures=True)
        for fn in self.closers:
            fn()

    # -- parts ------------------------------------------------------------------------------

    def make_parts(self, index, n_parts: int) -> tuple[list[RemotePart], Callable]:
        """The parts factory handed to PyramidIndex (its ``parts_factory``): the parts of the
        collection ``index.part_prefix``, on the replicas the cluster map assigns, and
        ``search_parts`` to search them."""
        if index.part_prefix is None:
            raise SimsearchError("a clustered PyramidIndex needs part_prefix (its collection name)")
        out = [RemotePart(self, f"{index.part_prefix}.p{j}", {
            "dim": index.dim, "metric": index.metric, "kind": index.sub_index,
            "params": index.sub_params, "schema": index.part_schema,
            "incarnation": index.part_incarnation}, index, j)
            for j in range(n_parts)]
        if self.is_leader():
            for part in out:
                part.ensure()
        return out, search_parts

    def register(self, router) -> None:
        """Make ``router``'s parts the ones recovery and moves act through (a router copy
        current to the end of the log; a client-side router never registers)."""
        for part in router.parts:
            if isinstance(part, RemotePart):
                self.parts[part.name] = part

    def unregister(self, router) -> None:
        """Take ``router``'s parts out of recovery and moves (a copy that was dropped)."""
        for part in router.parts:
            if isinstance(part, RemotePart) and self.parts.get(part.name) is part:
                del self.parts[part.name]


def search_parts(calls: list, k: int) -> list:
    """Search ``[(part, queries, params)]`` at once: start every part's call, then wait for all
    of them in this thread (no thread hop per part). Per call: its SearchResult, or the
    PartUnavailableError of a part that could not answer. ``params`` may carry ``per_query``
    values (the shard's store splits the batch by them)."""
    from .index import PartUnavailableError

    done = threading.Event()
    results: list = [None] * len(calls)
    pending = []
    for i, (part, qs, params) in enumerate(calls):
        try:
            pending.append((i, part.begin(qs, k, params, done)))
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


class RemotePart:
    """One part on its replicas: searched through ``begin`` / ``search_parts`` (hedging,
    deadlines, fail-over), and the leader's fenced two-phase writes and replica catch-up
    (docs/cluster.md, "Writes")."""

    def __init__(self, pool: ShardPool, name: str, config: dict, router=None, index: int = 0):
        self.pool, self.name, self.config = pool, name, config
        self.router, self.index = router, index  # the router whose part ``index`` this is
        self.write_lock = pool.part_locks[name]
        self._rr = 0

    @property
    def shards(self) -> list[int]:
        """The replicas the cluster map assigns now (rebalancing changes them)."""
        return self.pool.replicas_of(self.name)

    def ensure(self) -> None:
        """Create the part's collection on every replica that lacks it. A copy of another
        incarnation (a dropped collection's, on a shard that was away when it was dropped) is
        never adopted: it is marked out of sync, and the leader's catch-up replaces it."""
        from ..service.errors import CollectionExistsError

        for sid in self.shards:
            try:
                self._create(sid)
            except CollectionExistsError:
                try:
                    if not self._ours(sid):
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
        from ..service.errors import CollectionNotFoundError

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
        if cur is None:
            raise RouterBehindError(f"{self.name}: no router copy current to the log is loaded "
                                    "here yet; retry later")
        return cur

    def bring_up_to_date(self, sid: int, term: int) -> int:
        """Fence the replica on ``sid`` at ``term`` and apply the committed writes it holds
        prepared but missed the commit of (the router remembers the last PART_HISTORY); returns
        the sequence it has applied. Call with ``write_lock`` held."""
        cur = self._current()
        st = self.sync(sid, term)
        for first, through, ballot in cur.router.committed_writes(cur.index):
            if through > st["applied"]:
                st = self.sync(sid, term, ballot, first, through)
        return st["applied"]

    def committed(self) -> int:
        cur = self._current()
        return int(cur.router.part_seq[cur.index])

    def __len__(self) -> int:
        for s in self.pool.serving(self):
            return len(self._col(s))
        return 0

    # -- reads ------------------------------------------------------------------------------

    def search(self, q: np.ndarray, k: int, **params: Any) -> SearchResult:
        done = threading.Event()
        call = self.begin(q, k, params, done)
        while True:
            done.clear()
            out = call.poll()
            if out is not None:
                return out
            done.wait(call.nap())

    def begin(self, q: np.ndarray, k: int, params: dict, done: threading.Event) -> _PartCall:
        """Start a search on a replica; ``done`` is set whenever a replica answers (several
        parts' calls may share it, so one thread waits for all of them)."""
        return _PartCall(self, q, k, params, done)

    # -- recovery ---------------------------------------------------------------------------

    def catch_up(self, sid: int) -> None:
        """Bring the replica on ``sid`` to the part's committed sequence and mark it in sync
        (the leader; under the part's write lock, so no write slips in between): apply what it
        holds prepared, else copy a replica that is current (``ExportCollection`` /
        ``ImportCollection``, carrying the fencing state). Works when every replica missed the
        last commits: they hold the ops prepared. Raises if no replica is current yet."""
        from ..service.errors import CollectionNotFoundError, DataLossError

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
        from ..service.errors import OpsGoneError

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
            except Exception as exc:  # try the next peer
                log.warning("%s: copy from shard %d to %d failed: %s", self.name, peer, sid, exc)
                continue
            self.pool.mark_in_sync(self.name, peer)
            log.warning("part %s on shard %d (applied %d) re-copied from shard %d at %d "
                        "(%d bytes)", self.name, sid, applied, peer, through, len(data))
            return
        raise SimsearchError(f"{self.name}: no replica has applied the committed sequence "
                             f"{through} yet; will retry")


class _PartCall:
    """One part's search in flight: the primary replica's call, then a hedge to another replica
    after the part's p95 latency (within the hedge budget) or a fail-over when the primary's
    shard fails or is declared down."""

    def __init__(self, part: RemotePart, q: np.ndarray, k: int, params: dict,
                 done: threading.Event):
        from ..service import convert
        from .index import PartUnavailableError

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
        deadline = DEADLINE.get()
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
        try:  # blocking, on the pool's thread (see Client.search_once)
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
        from .index import PartUnavailableError

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


def load_router(data: bytes, pool: ShardPool, **attributes: Any):
    """An exported PyramidIndex (centres, meta-HNSW, partition, MIPS lists) loaded here with its
    parts on ``pool``'s shard servers; ``attributes`` (``part_schema``, ``part_incarnation``)
    are set on it before its parts are made."""
    from ..index import loads

    def setup(idx):
        idx.parts_factory = pool.make_parts
        for k, v in attributes.items():
            setattr(idx, k, v)

    return loads(data, setup=setup)


def open_router(coordinator: str, name: str, etcd: str, cluster: str, **pool_options: Any):
    """A read-only copy of a collection's router in this process, searching the shard servers
    directly: a query skips the coordinator hop. It does not follow later writes' routing
    (send writes through a coordinator, and re-open to see them). ``router.parts[0].pool``
    holds the connections; close it when done."""
    from ..service.client import connect
    from .control.etcd import Etcd
    from .control.state import ClusterState

    client = Etcd(etcd, f"simsearch/{cluster}")
    state = ClusterState(client)
    pool = ShardPool(state, **pool_options)
    pool.closers += [state.close, client.close]
    with connect(coordinator, timeout=600) as c:
        _config, data = c.export_collection(name)
    return load_router(data, pool)
