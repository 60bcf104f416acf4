"""The Pyramid cluster's shard pool (docs/cluster.md, "Failures and stragglers"): connections
to the shard servers, their health, the replica map as the cluster state in etcd has it
(control/state.py), part latencies and the hedge budget.
"""

from __future__ import annotations

import collections
import logging
import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import numpy as np

from ..index import loads
from ..service.errors import (
    AuthenticationError,
    PermissionDeniedError,
    ServiceUnavailableError,
)
from ..service.shardclient import connect_shard
from .fanout import search_parts
from .index import PyramidIndex, part_spec
from .parts import RemotePart, RouterBehindError

log = logging.getLogger(__name__)
#: a collection's blobs: its router model and its router checkpoints (checkpoints.py)
_BLOB_OWNER = re.compile(r"(.+)\.(?:model|router\.\d+(?:\.\d+)?)")

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
        # shards behind auth / TLS. No gRPC-level retries: a call to a dead shard would be sent
        # again for 1.5 s before its replica's fail-over could begin; the pool's callers fail
        # over, hedge and retry themselves
        self._connect = partial(connect_shard, token=token, tls_ca=tls_ca, retries=False)
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
            self._check_token(sid)

    def _check_token(self, sid: int) -> None:
        """Say at once, not at the first write, when a shard refuses this coordinator's shard
        token: a token of another role than ``cluster`` fails every part call later, opaquely
        (a cluster-internal read, ListBlobs, asks the shard)."""
        try:
            self._probes[sid].list_blobs()
        except (AuthenticationError, PermissionDeniedError) as exc:
            log.error("shard %d refuses this coordinator's shard token (%s): it needs a token "
                      "of the cluster role on every shard (--shard-token-file; "
                      "docs/service.md, \"Security model\")", sid, exc)
        except Exception as exc:  # noqa: BLE001 - down or slow: the health watch handles it
            log.debug("token check of shard %d: %r", sid, exc)

    def client(self, sid: int):
        """The client of shard ``sid`` (ServiceUnavailableError if it never registered)."""
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
        """Delete the part replicas on ``sid`` that no collection's map lists any more, and the
        router models and checkpoints of collections that have no map (dropped while the shard
        was away; a collection is placed before either is written): they would otherwise stay
        for good."""
        cli = self.client(sid)
        for blob in cli.list_blobs():
            owner = _BLOB_OWNER.fullmatch(blob["name"])
            if owner is None or self.state.refresh(f"map/{owner[1]}")[0]:
                continue  # not a collection's, or its collection is placed: kept
            try:
                log.warning("deleting %s on shard %d: no collection of that name", blob["name"],
                            sid)
                cli.delete_blob(blob["name"])
            except Exception as exc:  # the shard went away: next time
                log.warning("could not delete %s on shard %d: %s", blob["name"], sid, exc)
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

    def router(self, name: str, config: dict, data: bytes | None = None) -> PyramidIndex:
        """Cluster collection ``name``'s router (``config``: its dim, metric, params, schema,
        incarnation) over its parts on this pool's shards, searched by ``search_parts``: new
        (``data`` None), or loaded from its file (then, on the leader, a part's collection
        missing on a replica is made again, and one of another incarnation marked out of
        sync)."""
        n_parts, kind, sub_params = part_spec(config["params"])
        parts = [RemotePart(self, f"{name}.p{j}", {
            "dim": config["dim"], "metric": config["metric"], "kind": kind,
            "params": sub_params, "schema": config.get("schema"),
            "incarnation": config.get("incarnation", "")}, j) for j in range(n_parts)]
        if data is None:
            return PyramidIndex(config["dim"], config["metric"], **config["params"],
                                parts=parts, fanout=search_parts)
        index = loads(data, parts=parts, fanout=search_parts)
        if self.is_leader():
            for part in parts:
                part.ensure()
        return index

    def register(self, index, owner) -> None:
        """Make ``index``'s parts the ones recovery and moves act through (a router copy
        current to the end of the log; a client-side router never registers); ``owner.seqs``
        are the parts' committed sequences (replication.PartSequences)."""
        for part in index.parts:
            if isinstance(part, RemotePart):
                part.owner = owner
                self.parts[part.name] = part

    def unregister(self, router) -> None:
        """Take ``router``'s parts out of recovery and moves (a copy that was dropped)."""
        for part in router.parts:
            if isinstance(part, RemotePart) and self.parts.get(part.name) is part:
                del self.parts[part.name]
