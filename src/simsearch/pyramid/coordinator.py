"""Coordinators (docs/cluster.md, "Coordinators"): peers with an elected leader.

Every coordinator serves the node's gRPC API over the cluster's collections. Each keeps every
collection's router (a PyramidIndex whose parts are remote) in memory, rebuilt from the router
checkpoint on the shard servers and kept current by the router log in etcd, so any coordinator
answers searches. The elected leader is the only writer: it applies a write on the parts'
replicas, then appends the write's routing decisions to the log in one transaction fenced by
its election, and acknowledges only if that append landed. Followers forward writes to the
leader. The leader also re-copies stale replicas, moves replicas onto new shards and off
draining ones, and retires drained shards.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import json
import logging
import os
import threading
import time
import uuid
from functools import partial

import numpy as np

from .._kernels import merge_topk
from ..errors import InvalidParameterError
from ..service.attributes import check_schema
from ..service.auth import caller_token
from ..service.errors import (
    CollectionExistsError,
    CollectionNotFoundError,
    ServiceUnavailableError,
)
from ..service.limits import check_name
from ..service.shardclient import connect_shard
from . import metrics
from .batching import MAX_IN_FLIGHT as SEARCH_BATCHES
from .batching import SearchBatcher
from .checkpoints import checkpoint_blobs, model_blob
from .collection import ClusterCollection
from .control.election import Election
from .control.errors import CoordinationError, NotLeaderError
from .control.etcd import Compare, Etcd
from .control.state import ClusterState
from .index import PyramidIndex
from .rebalance import Rebalancer
from .shards import ShardPool

log = logging.getLogger(__name__)

#: seconds a drop waits for each part copy's deletion before leaving it to orphan clean-up
DROP_TIMEOUT = 2.0
#: and at most this many bytes of log records between two (etcd keeps the history of every
#: record until the checkpoint after it lets the leader compact; docs/cluster.md, "Long runs")
CHECKPOINT_LOG_BYTES = 32 << 20
#: a shard unregistered this long has its replicas re-made elsewhere (the replication factor)
REPLACE_AFTER = 30.0
#: how often the leader looks for replica moves
REBALANCE_INTERVAL = 0.5
#: the longest cluster collection name: its parts (``<name>.p<j>``) and router checkpoint
#: blobs (``<name>.router.<seq>.<i>``) are named after it within a shard's 128 characters
MAX_CLUSTER_NAME = 100


class Coordinator:
    """One coordinator: its etcd session, election, cluster state, shard pool and routers.
    Also the ``store`` the node's servicer serves (a CollectionStore, service.protocols: no
    blobs, metrics of its own)."""

    blobs = None

    def collectors(self) -> tuple:
        return (self,)

    def __init__(self, etcd: Etcd, lease_ttl: float = 3.0, replicas: int = 2,
                 pool_options: dict | None = None, replace_after: float = REPLACE_AFTER,
                 leader_tls_ca: str | None = None,
                 checkpoint_log_bytes: int = CHECKPOINT_LOG_BYTES,
                 min_insync_replicas: int | None = None,
                 search_batches: int = SEARCH_BATCHES):
        """Reads the cluster state at once; ``start(address)`` joins the election once the
        server is bound (its address is the candidate's name). ``leader_tls_ca``: the CA of the
        coordinators' certificates (a follower forwards writes to its leader over TLS).
        ``search_batches``: batches of a collection's concurrent searches in flight at once,
        searches arriving meanwhile merged into the next (batching.py; 0: every search alone)."""
        # the leader is forwarded to through collection handles of the shard client
        self._connect = partial(connect_shard, tls_ca=leader_tls_ca)
        self.etcd = etcd
        self.checkpoint_log_bytes = checkpoint_log_bytes
        self.log_bytes = 0  # router log bytes this coordinator appended as leader
        self.router_rebuilds = 0  # routers rebuilt from their parts (rebuild.py)
        self.compactions = 0
        self.lease_ttl = lease_ttl
        self.replace_after = replace_after
        self.address: str | None = None
        self.election: Election | None = None
        self.registration = None
        self.state = ClusterState(etcd)
        etcd.put_if_absent("config", json.dumps({"replicas": int(replicas)}))
        self.state.refresh("config")
        if min_insync_replicas is not None and not 1 <= min_insync_replicas <= \
                self.state.replicas:
            raise InvalidParameterError(
                f"--min-insync-replicas must be in [1, the replication factor "
                f"{self.state.replicas}]; got {min_insync_replicas}")
        self._min_insync = min_insync_replicas
        if not isinstance(search_batches, int) or not 0 <= search_batches <= 1024:
            raise InvalidParameterError(
                f"--search-batches must be in [0, 1024]; got {search_batches!r}")
        self.batcher = SearchBatcher(search_batches) if search_batches else None
        self._collections: dict[str, ClusterCollection] = {}
        self._lock = threading.Lock()
        self._leader_client = (None, None)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._cancel_log_watch = None
        self._forwarder = concurrent.futures.ThreadPoolExecutor(16, thread_name_prefix="forward")
        self.queries = 0  # searched through this coordinator (a metric)
        self._attempts = itertools.count(1)
        self.pool = ShardPool(self.state, is_leader=self.is_leader, fence=self.fence,
                              term=self.term, next_attempt=self.next_attempt,
                              **(pool_options or {}))
        self.rebalancer = Rebalancer(self.state, self.pool, self.fence, self.term, self.names,
                                     self.get, replace_after, self._wake)
        self.state.listeners.append(self._on_state)

    def start(self, address: str) -> Coordinator:
        """Register as ``address``, follow the router log, and campaign for leadership."""
        # load the merge kernel now: its first call (~0.25 s) would otherwise land in the
        # first search's answer margin (DEADLINE_MARGIN_MAX) and miss a partial deadline
        merge_topk(np.full((1, 1), -1, np.int64), np.zeros((1, 1), np.float32), 1, True)
        self.address = address
        self._cancel_log_watch = self.etcd.watch_prefix("log/", self._on_log)
        self.registration = self.etcd.register(f"coordinators/{address}", json.dumps(
            {"address": address, "pid": os.getpid()}), self.lease_ttl)
        self.election = Election(self.etcd, "leader", address, ttl=self.lease_ttl,
                                 on_elected=self._wake.set, on_lost=self._on_lost)
        threading.Thread(target=self._leader_loop, name="coordinator-leader", daemon=True).start()
        self.election.start()
        return self

    # -- roles ------------------------------------------------------------------------------

    def compact(self) -> None:
        """Compact etcd's history up to now (after a router checkpoint deleted the log records
        it covers), as kube-apiserver compacts its etcd: the database then stays the size of
        the live keys plus what is written between two checkpoints."""
        try:
            if self.etcd.compact(self.etcd.revision()):
                self.compactions += 1
        except CoordinationError as exc:  # auto-compaction is the safety net; try next time
            log.warning("etcd compaction failed: %s", exc)

    def min_insync_replicas(self) -> int:
        """Replicas that must hold a write durably (prepared) before it commits: the
        ``--min-insync-replicas`` setting, by default 2 when parts have two replicas or more
        (as Kafka's min.insync.replicas: one lost disk never loses an acknowledged write)."""
        return self._min_insync or min(2, self.state.replicas)

    def require_etcd(self) -> None:
        """Refuse to serve once this coordinator has not reached etcd for longer than its
        lease (its registration lapsed): its cluster map and router may then be stale without
        bound. Clients with several addresses move to another coordinator (UNAVAILABLE)."""
        reg = self.registration
        if reg is not None and not reg.alive():
            raise ServiceUnavailableError(
                "this coordinator has not reached etcd for longer than its lease, so its view "
                "of the cluster may be stale; ask another coordinator, or retry shortly")

    def is_leader(self) -> bool:
        return self.election is not None and self.election.is_leader()

    def fence(self) -> list[Compare]:
        """The election's fence for a state change (NotLeaderError, UNAVAILABLE, if we are not
        the leader)."""
        if self.election is None:
            raise NotLeaderError("this coordinator has not joined the election yet")
        return self.election.fence()

    def require_leader(self) -> None:
        self.fence()

    def term(self) -> int:
        """This leader's term (its election revision): the fencing token of its part writes."""
        term = self.election.term() if self.election is not None else None
        if term is None:
            raise NotLeaderError("this coordinator is not the elected leader")
        return int(term)

    def next_attempt(self) -> int:
        """A number that grows with every part write this process tries (the ballot's second
        half: a late prepare of an abandoned attempt is refused)."""
        return next(self._attempts)

    def _on_lost(self, reason: str) -> None:
        log.warning("coordinator %s: no longer the leader (%s)", self.address, reason)

    def forward(self, fn, local=None, idempotent: bool = False,
                deadline: float | None = None):
        """A write arriving here: run ``local()`` if this coordinator leads, else ``fn(client)``
        against the leader.

        An idempotent write that finds no leader, or whose leader goes away (dies, or is cut off
        and replaced while the call hangs), is sent again to whoever leads next (it may be this
        coordinator), for up to two lease TTLs and never past the caller's deadline."""
        end = time.monotonic() + 2 * self.lease_ttl + 1.0
        token = caller_token()  # the caller's credentials travel with the write
        if deadline is not None:  # answer UNAVAILABLE in time for the caller to go elsewhere
            end = min(end, deadline - 0.1)
        while True:
            try:
                if local is not None and self.is_leader():
                    return local()
                try:
                    leader, cli = self._leader()
                except ServiceUnavailableError:  # nothing was sent: any call may wait
                    if time.monotonic() >= end or self._stop.is_set():
                        raise
                    time.sleep(0.05)
                    continue
                if not idempotent:
                    return fn(cli.bound(deadline, token))
                fut = self._forwarder.submit(fn, cli.bound(end, token))
                while True:  # wait, unless the leader changes under the call
                    with contextlib.suppress(concurrent.futures.TimeoutError):
                        return fut.result(timeout=0.05)
                    if self.state.get("leader")[0] != leader or time.monotonic() >= end:
                        fut.add_done_callback(lambda f: f.exception())  # abandoned
                        raise ServiceUnavailableError(
                            f"the leader {leader} did not answer before it changed")
            except ServiceUnavailableError:
                if not idempotent or time.monotonic() >= end or self._stop.is_set():
                    raise
                time.sleep(0.05)

    def _leader(self):
        """``(address, client)`` of the leader (the watched leader key)."""
        leader = self.state.get("leader")[0] or self.state.refresh("leader")[0]
        if leader is None:
            raise ServiceUnavailableError("no coordinator is leader right now; retry shortly")
        if leader == self.address:
            raise ServiceUnavailableError("this coordinator is being elected; retry shortly")
        addr, cli = self._leader_client
        if addr != leader:
            if cli is not None:
                cli.close()
            # no retries inside: forward() retries, re-reading who leads
            cli = self._connect(leader, timeout=self.pool.timeout, retries=False)
            self._leader_client = (leader, cli)
        return leader, cli

    # -- the store surface ------------------------------------------------------------------

    def names(self) -> list[str]:
        return sorted(self.state.collections())

    def has(self, name: str) -> bool:
        return self.state.get(f"collections/{name}")[0] is not None

    def get(self, name: str) -> ClusterCollection:
        with self._lock:
            col = self._collections.get(name)
        if col is not None:
            return col
        config = self.state.collections().get(name) or \
            (self.state.refresh(f"collections/{name}")[0])
        if config is None:
            raise CollectionNotFoundError(f"no collection named {name!r}")
        with self._lock:
            return self._collections.setdefault(name, ClusterCollection(self, name, config))

    def create(self, name: str, dim: int, metric: str, kind: str, params: dict,
               schema: dict | None = None, part_replica: bool = False, incarnation: str = ""):
        if part_replica:
            raise InvalidParameterError("a coordinator holds no part replicas: create them on "
                                        "shard servers")
        schema = check_schema(schema)
        check_name(name)
        if len(name) > MAX_CLUSTER_NAME:
            raise InvalidParameterError(
                f"a cluster collection's name may be at most {MAX_CLUSTER_NAME} characters (its "
                f"parts and router checkpoints are named after it); got {len(name)}")
        if not self.is_leader():
            self.forward(lambda c: c.create_collection(name, dim, metric, kind, schema=schema,
                                                       **params))
            self.state.refresh(f"collections/{name}")
            return self.get(name)
        if kind != "pyramid":
            raise InvalidParameterError(
                f"a Pyramid coordinator creates kind 'pyramid' collections; got {kind!r}")
        PyramidIndex(dim, metric, **params)  # validates the parameters now
        # parts carry the incarnation: a re-created name never adopts a dropped one's parts
        config = {"dim": int(dim), "metric": metric, "kind": kind, "params": params,
                  "incarnation": uuid.uuid4().hex}
        if schema:
            config["schema"] = schema

        def create(existing):
            if existing is not None:
                raise CollectionExistsError(f"collection {name!r} already exists")
            return {f"collections/{name}": config}, []

        self.state.change(self.fence, [f"collections/{name}"], create)
        return self.get(name)

    def drop(self, name: str) -> None:
        if not self.is_leader():
            self.forward(lambda c: c.drop_collection(name))
            self._forget(name)
            return
        col = self.get(name)
        with col.write_lock:
            router_meta = self.state.refresh(f"router/{name}")[0]
            parts = self.state.part_map(name).get("parts", {})
            keys = [f"collections/{name}", f"map/{name}", f"router/{name}"]
            self.state.change(self.fence, keys,
                              lambda *vals: ({}, [k for k, v in zip(keys, vals, strict=True)
                                                  if v is not None]))
            self.etcd.delete_prefix(f"log/{name}/")
            self._forget(name)
        # best effort, briefly: a shard that is away keeps its copies until it returns, when
        # the leader deletes the parts no map lists (ShardPool._drop_orphans); a re-created
        # name never adopts them meanwhile (its parts carry a new incarnation)
        for part, e in parts.items():
            for sid in e["replicas"]:
                if not self.pool.up.get(sid):
                    continue
                try:
                    cli = self.pool.client(sid).bound(time.monotonic() + DROP_TIMEOUT)
                    cli.drop_collection(part)
                    with contextlib.suppress(CollectionNotFoundError):
                        cli.delete_blob(model_blob(name))
                except Exception as exc:
                    log.warning("could not drop %s on shard %d: %s", part, sid, exc)
            self.pool.parts.pop(part, None)
        for sid in (router_meta or {}).get("holders", []):
            for blob in checkpoint_blobs(router_meta):  # as briefly: a paused holder held a
                with contextlib.suppress(Exception):  # drop for its timeout
                    self.pool.client(sid).bound(time.monotonic() + DROP_TIMEOUT).delete_blob(blob)

    def collect(self):
        """Prometheus metrics of this coordinator (docs/service.md, "Metrics")."""
        return metrics.collect(self)

    def import_collection(self, name: str, config: dict, data: bytes):
        raise InvalidParameterError(
            "a Pyramid coordinator does not import collections; create one and add the vectors")

    def _forget(self, name: str) -> None:
        with self._lock:
            col = self._collections.pop(name, None)
        if col is not None:
            col.close()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self.election is not None:  # resigning first: a standby takes over at once
            self.election.close()
        if self._cancel_log_watch is not None:
            self._cancel_log_watch()
        if self.registration is not None:
            self.registration.close()
        self.state.close()
        self.pool.close()
        self.etcd.close()

    # -- keeping copies current -------------------------------------------------------------

    def _on_log(self, events) -> None:
        names = {ev.key.split("/")[1] for ev in events if ev.kind == "put"}
        for name in names:
            with self._lock:
                col = self._collections.get(name)
            if col is not None and col.index is not None:
                try:
                    col.catch_up()
                except Exception as exc:
                    log.warning("%s: could not follow the router log: %s", name, exc)
                    col.invalidate()

    def _on_state(self, key: str) -> None:
        if key.startswith("collections/") and self.state.get(key)[0] is None:
            self._forget(key.split("/", 1)[1])
        elif key.startswith("router/"):
            name = key.split("/", 1)[1]
            with self._lock:
                col = self._collections.get(name)
            meta = self.state.get(key)[0]
            if col is not None and meta and meta["seq"] > col.applied:
                threading.Thread(target=col.catch_up, daemon=True).start()
        if key.startswith(("shards/", "draining/")):
            self._wake.set()

    def _leader_loop(self) -> None:
        was = False
        while not self._stop.is_set():
            self._wake.wait(REBALANCE_INTERVAL)
            self._wake.clear()
            leading = self.is_leader()
            try:
                if leading and not was:
                    self._take_over()
                if leading:
                    self.rebalancer.step()
            except NotLeaderError:
                leading = False
            except Exception as exc:
                log.warning("coordinator %s: leader duty failed: %s", self.address, exc)
                leading = False  # retry the take-over steps next round
            was = leading

    def _take_over(self) -> None:
        """A new leader: every router current to the end of the log, every replica fenced at
        this term and brought to its part's committed sequence (``reconcile``)."""
        log.warning("coordinator %s: leading", self.address)
        term = self.term()
        for name in self.names():
            self.get(name).take_over(term)
        self.reconcile()

    def reconcile(self) -> None:
        """Check every shard's replicas in the background (RemotePart.catch_up): fence them at
        this leader's term, apply the commits they missed, re-copy the stale ones."""
        for sid in self.state.shards():
            self.pool.recover(sid)

