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
import contextvars
import hashlib
import itertools
import json
import logging
import threading
import time
import uuid
from typing import Any

import numpy as np

from .. import _faults
from ..errors import InvalidParameterError, SimsearchError
from ..index import SearchResult, as_id_array, as_matrix
from ..service.errors import (
    CollectionExistsError,
    CollectionNotFoundError,
    ServiceUnavailableError,
)
from . import routerlog
from .control.election import Election
from .control.errors import CoordinationError, NotLeaderError
from .control.etcd import Compare, Etcd, tls_from_args
from .control.placement import next_move, place
from .control.state import ClusterState
from .datapath import DEADLINE, ShardPool, load_router

log = logging.getLogger(__name__)

#: router log records between two router checkpoints (a checkpoint bounds replay at take-over)
CHECKPOINT_EVERY = 200
#: seconds a write waits at most for a running checkpoint (see _wait_for_checkpoint)
CHECKPOINT_WAIT = 30.0
#: seconds a drop waits for each part copy's deletion before leaving it to orphan clean-up
DROP_TIMEOUT = 2.0
#: and at most this many bytes of log records between two (etcd keeps the history of every
#: record until the checkpoint after it lets the leader compact; docs/cluster.md, "Long runs")
CHECKPOINT_LOG_BYTES = 32 << 20
#: a shard unregistered this long has its replicas re-made elsewhere (the replication factor)
REPLACE_AFTER = 30.0
#: how often the leader looks for replica moves
REBALANCE_INTERVAL = 0.5


def _log_key(name: str, seq: int) -> str:
    return f"log/{name}/{seq:012d}"


def _attributes_by_id(attributes: dict | None, ids: Any):
    """For a write's attributes ({name: one value per row}) and the ids its rows got: a
    function from a part op's ids to their attributes (None without attributes)."""
    if not attributes or ids is None:
        return None
    row = {int(i): r for r, i in enumerate(np.asarray(ids).tolist())}

    def of(part_ids: np.ndarray) -> dict:
        rows = [row.get(int(i)) for i in part_ids.tolist()]
        return {name: [None if r is None else vals[r] for r in rows]
                for name, vals in attributes.items()}

    return of


class ClusterCollection:
    """One collection as a coordinator serves it: a router copy, current to log record
    ``applied`` (a ServedCollection, service.protocols; part writes go to shard servers)."""

    part_replica = False

    def __init__(self, coord: Coordinator, name: str, config: dict):
        self.coord, self.name, self.config = coord, name, config
        self.router = None
        self.applied = 0
        self.checkpoint_seq = 0
        self.log_bytes = 0  # log record bytes appended since the last checkpoint
        self.write_lock = threading.RLock()  # the leader's writes, and log replay, one at a time
        #: the leader term whose take-over this collection finished (see ``take_over``)
        self.ready_term: int | None = None
        self._checkpointing = False
        self._checkpoint_idle = threading.Event()
        self._checkpoint_idle.set()

    # -- the router copy --------------------------------------------------------------------

    def _new_router(self):
        from .index import PyramidIndex

        c = self.config
        r = PyramidIndex(c["dim"], c["metric"], **c["params"])
        r.part_prefix = self.name
        r.part_schema = c.get("schema")
        r.part_incarnation = c.get("incarnation", "")
        r.parts_factory = self.coord.pool.make_parts
        return r

    def _load_checkpoint(self, meta: dict) -> None:
        data = None
        for sid in meta["holders"]:
            try:
                data = self.coord.pool.client(sid).get_blob(meta["blob"])
                break
            except Exception as exc:  # try the next holder
                log.warning("%s: router checkpoint %s not read from shard %d: %s", self.name,
                            meta["blob"], sid, exc)
        if data is None:
            raise ServiceUnavailableError(
                f"{self.name}: no shard holding router checkpoint {meta['blob']} answered; retry")
        if hashlib.sha256(data).hexdigest() != meta["sha256"]:
            raise ServiceUnavailableError(f"{self.name}: router checkpoint checksum mismatch")
        router = load_router(data, self.coord.pool, part_schema=self.config.get("schema"),
                             part_incarnation=self.config.get("incarnation", ""))
        router.part_prefix = self.name
        self.router, self.applied = router, int(meta["seq"])
        self.checkpoint_seq = self.applied

    def catch_up(self) -> None:
        """Apply the log records this copy has not seen (loading the checkpoint when the log
        was compacted past them, or on first use)."""
        with self.write_lock:
            meta = self.coord.etcd.get(f"router/{self.name}")[0]
            meta = json.loads(meta) if meta else None
            if self.router is None or (meta and meta["seq"] > self.applied):
                if meta is None:
                    self.router, self.applied = self._new_router(), 0
                else:
                    self._load_checkpoint(meta)
                if self.coord.is_leader():  # replicas may hold commits this copy logged but
                    self.coord.reconcile()  # never applied (a write whose append was unknown)
            recs = self.coord.etcd.get_from(f"log/{self.name}/",
                                            _log_key(self.name, self.applied + 1))
            for key, value, _ in recs:
                seq = int(key.rsplit("/", 1)[1])
                if seq != self.applied + 1:  # compacted under us: start from the checkpoint
                    self._drop_router()
                    return self.catch_up()
                self.router.apply_journal(routerlog.decode(value))
                self.applied = seq
            # the leader's catch-ups read the committed sequences of the parts registered here:
            # only a copy current to the log's end may serve them
            self.coord.pool.register(self.router)

    def current(self):
        if self.router is None:
            self.catch_up()
        return self.router

    def invalidate(self) -> None:
        """Drop the copy (it may be ahead of the log after a failed append); reload on use."""
        with self.write_lock:
            self._drop_router()

    def _drop_router(self) -> None:
        """Forget the router copy, and take its parts out of recovery's hands: recovery brings
        replicas to the sequences the log committed, which a dropped copy may be ahead of."""
        if self.router is not None:
            self.coord.pool.unregister(self.router)
        self.router = None
        self.ready_term = None  # a leader takes over again before its next write

    def take_over(self, term: int) -> None:
        """The barrier before a new leader's first write to this collection: its router read
        to the log's tail (its predecessor's last records included: their appends were fenced by
        an election that has ended, so none can land after this read), then every replica that
        is up fenced at ``term`` and brought to its part's committed sequence; one that cannot
        be is marked out of sync. Without it a stale copy numbers its part ops from a stale
        sequence and replaces committed ops the replicas hold prepared."""
        from .datapath import RouterBehindError

        with self.write_lock:
            if self.ready_term == term:
                return
            self.catch_up()
            pool = self.coord.pool
            for part in self.router.parts if self.router.is_trained else ():
                for sid in part.shards:
                    if not pool.up.get(sid):
                        continue  # recovered when it returns
                    try:
                        part.catch_up(sid)
                    except RouterBehindError:
                        raise
                    except Exception as exc:
                        log.warning("%s on shard %d not current at take-over: %s", part.name,
                                    sid, exc)
                        pool.mark_out_of_sync(part.name, sid)
            self.ready_term = term

    def leader_router(self):
        """The router a leader writes through: current to the log's tail (``take_over``)."""
        coord = self.coord
        term = coord.term()
        if self.ready_term != term:
            self.take_over(term)
        return self.current()

    # -- the leader's writes ----------------------------------------------------------------

    def _append(self, records: list[dict]) -> None:
        """Make a write's decisions durable: one log record, fenced by the election. Raises
        (and drops this copy, which is now ahead of the log) if it did not land."""
        coord = self.coord
        # the part sequences advance only once committed: a catch-up meanwhile must never apply
        # ops the log may not hold
        seqs = [r for r in records if r["op"] == "seq"]
        try:
            data = routerlog.encode(records)
            seq = self.applied + 1
            if data is None:  # too big for etcd: a checkpoint carries this write instead
                self.router.apply_journal(seqs)
                self._checkpoint_locked(seq)
            elif not coord.etcd.cas([*coord.fence(),
                                     Compare.absent(_log_key(self.name, seq))],
                                    {_log_key(self.name, seq): data}):
                raise NotLeaderError("the write's log record was refused: this coordinator is "
                                     "no longer the leader; retry")
            else:
                self.router.apply_journal(seqs)
                self.log_bytes += len(data)
                coord.log_bytes += len(data)
            self.applied = seq
        except (CoordinationError, SimsearchError):
            self._drop_router()
            raise
        due = self.applied - self.checkpoint_seq >= CHECKPOINT_EVERY or \
            self.log_bytes >= coord.checkpoint_log_bytes
        if due and not self._checkpointing:
            self._checkpointing = True
            self._checkpoint_idle.clear()
            threading.Thread(target=self._background_checkpoint, daemon=True).start()

    def _background_checkpoint(self) -> None:
        try:
            with self.write_lock:
                seq, data = self.applied, self._router_bytes()
            self._put_checkpoint(seq, data)
        except Exception as exc:
            log.warning("%s: router checkpoint failed: %s", self.name, exc)
        finally:
            self._checkpointing = False
            self._checkpoint_idle.set()

    def _wait_for_checkpoint(self) -> None:
        """Backpressure: while a checkpoint runs and the log has grown to twice
        ``--checkpoint-log-bytes`` since the last one, a new write waits for it to end, so
        etcd's history between two compactions stays bounded however fast writes come."""
        if self._checkpointing and self.log_bytes >= 2 * self.coord.checkpoint_log_bytes:
            self._checkpoint_idle.wait(CHECKPOINT_WAIT)

    def _router_bytes(self) -> bytes:
        return self.router.to_bytes()

    def _checkpoint_locked(self, seq: int) -> None:
        self._put_checkpoint(seq, self._router_bytes())

    def _put_checkpoint(self, seq: int, data: bytes) -> None:
        """Store the router as of log record ``seq`` on its holders, then point etcd at it
        (fenced) and drop the log records it covers and the older blob."""
        coord = self.coord
        blob = f"{self.name}.router.{seq}"
        holders = []
        for sid in coord.checkpoint_holders():
            try:
                coord.pool.client(sid).put_blob(blob, data)
                holders.append(sid)
            except Exception as exc:
                log.warning("%s: checkpoint not stored on shard %d: %s", self.name, sid, exc)
        if not holders:
            raise ServiceUnavailableError(f"{self.name}: no shard took the router checkpoint")
        key = f"router/{self.name}"
        old, rev = coord.etcd.get(key)
        old = json.loads(old) if old else None
        meta = {"seq": seq, "blob": blob, "sha256": hashlib.sha256(data).hexdigest(),
                "size": len(data), "holders": holders}
        if not coord.etcd.cas([*coord.fence(), Compare.mod(key, rev)],
                              {key: json.dumps(meta)}):
            raise NotLeaderError("router checkpoint refused: no longer the leader")
        self.checkpoint_seq = max(self.checkpoint_seq, seq)
        self.log_bytes = 0
        coord.etcd.delete_range(f"log/{self.name}/", _log_key(self.name, seq + 1))
        coord.compact()
        if old:
            for sid in old["holders"]:
                if old["blob"] == blob and sid in holders:
                    continue  # the same checkpoint written again (moved off a leaving shard)
                with contextlib.suppress(Exception):
                    coord.pool.client(sid).delete_blob(old["blob"])
        log.info("%s: router checkpoint at log record %d (%d bytes on shards %s)", self.name,
                 seq, len(data), holders)

    def _write(self, fn, deadline: float | None = None, attributes: dict | None = None):
        """One write on the leader: ``fn(router)`` plans it on the router copy (in memory,
        briefly under the router's own lock, so searches go on), then the parts take it in two
        fenced phases around the log append (``_replicate``). A write that fails anywhere
        drops the copy, which reloads from the checkpoint and the log."""
        coord = self.coord
        coord.require_leader()
        self._wait_for_checkpoint()  # before the lock: the checkpoint needs it briefly
        with self.write_lock:
            router = self.leader_router()
            router.journal, router.defer_writes = [], []
            try:
                out = fn(router)
            except BaseException:
                if router.journal:  # planning changed the copy before it failed
                    self._drop_router()
                raise
            finally:
                records, jobs = router.journal, router.defer_writes
                router.journal = router.defer_writes = None
            if records:
                try:
                    self._replicate(router, records, jobs, deadline,
                                    _attributes_by_id(attributes, out))
                except BaseException:
                    self._drop_router()
                    raise
            return out

    def _replicate(self, router, records: list[dict], jobs: list, deadline: float | None,
                   attributes_of=None) -> None:
        """Phase one: every in-sync replica of each part concerned prepares the part's ops
        (numbered by part sequence, under this leader's ballot); a part that no replica
        prepared aborts the write (nothing applied anywhere). Commit: the routing decisions and
        the sequences go to the router log (fenced by the election). Phase two: the replicas
        that prepared apply the ops; one that missed either phase is marked out of sync and
        caught up in the background (docs/cluster.md, "Writes")."""
        from ..service.fenced import PartOp

        coord = self.coord
        term, attempt = coord.term(), coord.next_attempt()
        by_part: dict[int, list] = {}
        for p, op, args in jobs:
            ops = by_part.setdefault(p, [])
            seq = int(router.part_seq[p]) + len(ops) + 1
            ops.append(PartOp(seq, True, args[0]) if op == "remove" else PartOp(
                seq, False, args[1], args[0],
                attributes_of(args[1]) if attributes_of is not None else None))
        parts = {p: router.parts[p] for p in sorted(by_part)}
        timeout = coord.pool.timeout if deadline is None else max(
            0.05, min(coord.pool.timeout, deadline - time.monotonic()))
        with contextlib.ExitStack() as locks:
            for part in parts.values():  # in part order: no two writers wait on each other
                locks.enter_context(part.write_lock)
            targets = {p: [s for s in part.shards if coord.pool.in_sync(part.name, s)]
                       for p, part in parts.items()}
            prepared = self._on_replicas(
                parts, targets, lambda p, part, sid: part.prepare(sid, term, attempt,
                                                                  by_part[p], timeout))
            need = coord.min_insync_replicas()
            for p, part in parts.items():
                if len(prepared[p]) < need:  # nothing committed: the prepares never apply
                    raise ServiceUnavailableError(
                        f"{len(prepared[p])} replica(s) of part {part.name} took the write "
                        f"(shards {sorted(prepared[p])} of the in-sync {targets[p]}), fewer "
                        f"than --min-insync-replicas {need}; nothing was applied; retry")
            seq_rec = {"op": "seq", "parts": np.asarray(list(parts), np.int64),
                       "first": np.asarray([by_part[p][0].pseq for p in parts], np.int64),
                       "through": np.asarray([by_part[p][-1].pseq for p in parts], np.int64),
                       "ballot": np.asarray([term, attempt], np.int64)}
            self._append([*records, seq_rec])  # the commit point
            _faults.point("write:committed")
            ballot = (term, attempt)
            synced = self._on_replicas(
                parts, prepared, lambda p, part, sid: part.sync(
                    sid, term, ballot, by_part[p][0].pseq, by_part[p][-1].pseq, timeout))
            for p, part in parts.items():
                through = by_part[p][-1].pseq
                current = [s for s, st in synced[p].items() if st["applied"] == through]
                for sid in targets[p]:
                    if sid not in current:  # missed a phase: no reads until it caught up
                        if sid in synced[p]:
                            log.warning("%s on shard %d applied %d after the sync of [%d, %d]",
                                        part.name, sid, synced[p][sid]["applied"],
                                        by_part[p][0].pseq, through)
                        # recorded before the answer, or no answer: a leader deposed
                        # meanwhile cannot record it and must not acknowledge (the write is
                        # committed; the new leader's take-over repairs the replica)
                        coord.pool.mark_out_of_sync(part.name, sid, strict=True)
                        coord.pool.mark_down(sid)

    def _on_replicas(self, parts: dict, targets: dict, call) -> dict[int, dict[int, dict]]:
        """``call(p, part, sid)`` on every target replica at once; ``{p: {sid: answer}}`` of
        those that answered. A replica that refuses the leader's term means a newer leader
        exists: NotLeaderError."""
        from ..service.errors import StaleTermError

        pool = self.coord.pool
        futs = {(p, sid): pool.executor.submit(contextvars.copy_context().run, call, p, part, sid)
                for p, part in parts.items() for sid in targets[p]}
        pending = set(futs.values())
        while pending:  # a leader that loses its lease meanwhile abandons the write at once
            _, pending = concurrent.futures.wait(pending, timeout=0.1)
            if pending and not self.coord.is_leader():
                for f in pending:
                    f.cancel()
                raise NotLeaderError("this coordinator lost its lease with part writes in "
                                     "flight; they were abandoned (none can commit); retry")
        out: dict[int, dict[int, dict]] = {p: {} for p in parts}
        stale = None
        for (p, sid), f in futs.items():
            try:
                out[p][sid] = f.result()
            except StaleTermError as exc:
                stale = exc
            except Exception as exc:  # a replica that did not answer: judged by the caller
                log.warning("part write to %s on shard %d failed: %r", parts[p].name, sid, exc)
        if stale is not None:
            raise NotLeaderError(f"a shard refused this leader's term: {stale}")
        return out

    # -- the store collection surface (what the servicer calls) -----------------------------

    def _on(self, client):
        """This collection on another coordinator (no describe round trip)."""
        c = self.config
        return client.collection_handle(self.name, c["dim"], c["metric"], c["kind"])

    def describe(self) -> dict[str, Any]:
        r = self.current()
        c = self.config
        return {"name": self.name, "dim": c["dim"], "metric": c["metric"], "kind": c["kind"],
                "params": c["params"], "count": len(r), "trained": r.is_trained,
                "needs_training": True, "supports_remove": True,
                "search_params": sorted(r.search_params), "schema": c.get("schema") or {}}

    def stats(self) -> dict[str, Any]:
        r = self.router
        return {"damaged": False, "items": len(r) if r is not None else 0, "wal_bytes": 0,
                "snapshot_time": time.time()}

    def search(self, q: Any, k: int, params: dict, deadline: float | None = None
               ) -> SearchResult:
        """``where`` goes to every asked part, which answers it from its attributes."""
        self.coord.require_etcd()
        token = DEADLINE.set(deadline)
        try:
            out = self.current().search(q, k, **params)
            self.coord.queries += len(out.ids)
            return out
        finally:
            DEADLINE.reset(token)

    def _route(self, write, remote, idempotent: bool, deadline: float | None,
               attributes: dict | None = None):
        """Run ``write(router)`` here if this coordinator leads, else forward ``remote`` to the
        leader and then catch up with the log (so this coordinator reads its own writes)."""
        def forwarded(client):
            out = remote(self._on(client))
            self.catch_up()
            return out

        return self.coord.forward(forwarded,
                                  local=lambda: self._write(write, deadline, attributes),
                                  idempotent=idempotent, deadline=deadline)

    def add(self, x, ids=None, upsert: bool = False, deadline: float | None = None,
            attributes: dict | None = None):
        def write(router):
            xs = as_matrix(x, router.dim, router.metric)
            if upsert and ids is not None:
                arr = as_id_array(ids)
                present = arr[router.contains(arr)]
                if present.size:
                    router.remove(present)
                return router.add(xs, arr)
            return router.add(xs, ids)

        return self._route(write, lambda col: col.add(x, ids, upsert=upsert,
                                                      attributes=attributes),
                           upsert and ids is not None, deadline, attributes)

    def remove(self, ids, deadline: float | None = None, missing_ok: bool = False) -> int:
        def write(router):
            arr = as_id_array(ids)
            if missing_ok:
                arr = arr[router.contains(arr)]
            return router.remove(arr)

        return self._route(write, lambda col: col.remove(ids, missing_ok=missing_ok),
                           missing_ok, deadline)

    def train(self, x, deadline: float | None = None, **options: Any) -> None:
        if options:  # fit options belong to string collections, which clusters do not hold
            raise InvalidParameterError(
                f"a cluster collection trains on vectors alone; got options {sorted(options)}")
        coord = self.coord
        if not coord.is_leader():
            coord.forward(lambda c: self._on(c).train(x))
            self.catch_up()
            return
        coord.require_leader()
        with self.write_lock:
            router = self.leader_router()
            coord.place_collection(self.name, router.n_parts)
            router.train(x)  # RetrainNonEmptyError if it holds items
            seq = self.applied + 1
            try:
                self._checkpoint_locked(seq)  # the trained model is durable before we answer
            except Exception:
                self._drop_router()
                raise
            self.applied = seq
            coord.pool.register(router)

    def snapshot(self, deadline: float | None = None) -> int:
        """A router checkpoint now (on the leader)."""
        if not self.coord.is_leader():
            return self.coord.forward(lambda c: self._on(c).snapshot())
        self.coord.require_leader()
        with self.write_lock:
            r = self.leader_router()
            if r.is_trained and self.applied > self.checkpoint_seq:
                self._checkpoint_locked(self.applied)
            return len(r)

    def move_checkpoint(self) -> None:
        """Write the router's checkpoint again, onto the shards that take checkpoints now (the
        leader, before it retires a drained shard that holds one)."""
        with self.write_lock:
            r = self.leader_router()
            if r.is_trained:
                self._checkpoint_locked(self.applied)

    def export(self, deadline: float | None = None) -> tuple[dict, bytes]:
        """The collection's config and its router's file (``open_router``)."""
        with self.write_lock:
            self.current()
            return self.config, self._router_bytes()

    def close(self) -> None:
        self._drop_router()


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
                 min_insync_replicas: int | None = None):
        """Reads the cluster state at once; ``start(address)`` joins the election once the
        server is bound (its address is the candidate's name). ``leader_tls_ca``: the CA of the
        coordinators' certificates (a follower forwards writes to its leader over TLS)."""
        from functools import partial

        from ..service.client import connect

        self._connect = partial(connect, tls_ca=leader_tls_ca)
        self.etcd = etcd
        self.checkpoint_log_bytes = checkpoint_log_bytes
        self.log_bytes = 0  # router log bytes this coordinator appended as leader
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
        self._collections: dict[str, ClusterCollection] = {}
        self._lock = threading.Lock()
        self._leader_client = (None, None)
        self._since_unregistered: dict[int, float] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._cancel_log_watch = None
        self._forwarder = concurrent.futures.ThreadPoolExecutor(16, thread_name_prefix="forward")
        self.queries = 0  # searched through this coordinator (a metric)
        self._attempts = itertools.count(1)
        self.pool = ShardPool(self.state, is_leader=self.is_leader, fence=self.fence,
                              term=self.term, next_attempt=self.next_attempt,
                              **(pool_options or {}))
        self.state.listeners.append(self._on_state)

    def start(self, address: str) -> Coordinator:
        """Register as ``address``, follow the router log, and campaign for leadership."""
        import os

        from .._kernels import merge_topk

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
        from ..service.auth import caller_token
        from ..service.client import call_as, call_deadline

        end = time.monotonic() + 2 * self.lease_ttl + 1.0
        token = caller_token()  # the caller's credentials travel with the write
        if deadline is not None:  # answer UNAVAILABLE in time for the caller to go elsewhere
            end = min(end, deadline - 0.1)
        while True:
            try:
                if local is not None and self.is_leader():
                    return local()
                leader, cli = self._leader()
                if not idempotent:
                    with call_deadline(deadline), call_as(token):
                        return fn(cli)
                ctx = contextvars.copy_context()

                def call(cli=cli):
                    with call_deadline(end), call_as(token):
                        return fn(cli)

                fut = self._forwarder.submit(ctx.run, call)
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
        from ..service.attributes import check_schema
        from ..service.limits import check_name
        from .index import PyramidIndex

        if part_replica:
            raise InvalidParameterError("a coordinator holds no part replicas: create them on "
                                        "shard servers")
        schema = check_schema(schema)
        if not self.is_leader():
            self.forward(lambda c: c.create_collection(name, dim, metric, kind, schema=schema,
                                                       **params))
            self.state.refresh(f"collections/{name}")
            return self.get(name)
        check_name(name)
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
        from ..service.client import call_deadline

        # best effort, briefly: a shard that is away keeps its copies until it returns, when
        # the leader deletes the parts no map lists (ShardPool._drop_orphans); a re-created
        # name never adopts them meanwhile (its parts carry a new incarnation)
        for part, e in parts.items():
            for sid in e["replicas"]:
                if not self.pool.up.get(sid):
                    continue
                try:
                    with call_deadline(time.monotonic() + DROP_TIMEOUT):
                        self.pool.client(sid).drop_collection(part)
                except Exception as exc:
                    log.warning("could not drop %s on shard %d: %s", part, sid, exc)
            self.pool.parts.pop(part, None)
        for sid in (router_meta or {}).get("holders", []):
            with contextlib.suppress(Exception):
                self.pool.client(sid).delete_blob(router_meta["blob"])

    def collect(self):
        """Prometheus metrics of this coordinator (docs/service.md, "Metrics"): its role,
        shards up, the fan-out, hedges, out-of-sync replicas and part latency."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        pool = self.pool
        leader = GaugeMetricFamily("simsearch_pyramid_leader", "1 while this coordinator leads")
        leader.add_metric([], 1.0 if self.is_leader() else 0.0)
        up = GaugeMetricFamily("simsearch_pyramid_shards_up", "shards answering health checks")
        up.add_metric([], float(sum(bool(v) for v in pool.up.values())))
        queries = CounterMetricFamily("simsearch_pyramid_queries", "queries searched here")
        queries.add_metric([], float(self.queries))
        fanout = CounterMetricFamily(
            "simsearch_pyramid_query_parts",
            "(query, part) pairs asked; divided by simsearch_pyramid_queries: the fan-out")
        fanout.add_metric([], float(pool.query_parts))
        hedges = CounterMetricFamily("simsearch_pyramid_hedges", "hedged part calls sent")
        hedges.add_metric([], float(pool.hedges))
        log_bytes = CounterMetricFamily("simsearch_pyramid_router_log_bytes",
                                        "router log bytes this coordinator wrote to etcd as leader")
        log_bytes.add_metric([], float(self.log_bytes))
        compactions = CounterMetricFamily("simsearch_pyramid_etcd_compactions",
                                          "etcd compactions after router checkpoints")
        compactions.add_metric([], float(self.compactions))
        stale = GaugeMetricFamily("simsearch_pyramid_replicas_out_of_sync",
                                  "part replicas not in sync (no reads until re-copied)",
                                  labels=["collection"])
        for name in self.names():
            parts = self.state.part_map(name).get("parts", {})
            stale.add_metric([name], float(sum(len(set(e["replicas"]) - set(e["in_sync"]))
                                               for e in parts.values())))
        p95 = GaugeMetricFamily("simsearch_pyramid_part_latency_p95_seconds",
                                "p95 of a part's recent calls (its hedge delay)", labels=["part"])
        for part in sorted(pool.parts):
            p95.add_metric([part], pool.hedge_delay(part))
        yield from (leader, up, queries, fanout, hedges, log_bytes, compactions, stale, p95)

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
            if col is not None and col.router is not None:
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

    # -- placement (the leader) -------------------------------------------------------------

    def active_shards(self) -> list[int]:
        draining, retired = self.state.draining(), self.state.retired()
        return sorted(s for s in self.state.shards() if s not in draining | retired)

    def checkpoint_holders(self) -> list[int]:
        """Where router checkpoints go: up to three live shards (replication beyond one)."""
        live = [s for s in self.active_shards() if self.pool.up.get(s)] or self.active_shards()
        return live[: max(3, self.state.replicas)]

    def place_collection(self, name: str, n_parts: int) -> None:
        """Give a collection's parts their replicas (once, before training)."""
        parts = [f"{name}.p{j}" for j in range(n_parts)]

        def edit(m):
            if m and set(m.get("parts", {})) == set(parts):
                return None
            others = {p: r for p, r in self.state.all_parts().items()
                      if not p.startswith(f"{name}.p")}
            cmap = place(parts, self.state.replicas, self.active_shards(), others)
            entry = {p: {"replicas": r, "in_sync": list(r)} for p, r in cmap.items()}
            return {f"map/{name}": {"epoch": int((m or {}).get("epoch", 0)) + 1,
                                    "parts": entry}}, []

        self.state.change(self.fence, [f"map/{name}"], edit)

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
                    self._rebalance_step()
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

    def _rebalance_step(self) -> None:
        now = time.monotonic()
        registered = self.state.shards()
        cmap = self.state.all_parts()
        for sids in cmap.values():
            for s in sids:
                if s not in registered:
                    self._since_unregistered.setdefault(s, now)
        for s in list(self._since_unregistered):
            if s in registered:
                del self._since_unregistered[s]
        gone = {s for s, t in self._since_unregistered.items() if now - t > self.replace_after}
        draining = self.state.draining() | gone
        active = [s for s in self.active_shards() if self.pool.up.get(s)]
        for sid in self.pool.stale_replicas() & set(active):  # retry catch-ups that failed
            self.pool.recover(sid)
        move = next_move(cmap, active, draining)
        if move is not None:
            self._move(move)
            self._wake.set()  # the next move at once
            return
        for s in self.state.draining():  # drained: tell it to stop
            if any(s in r for r in cmap.values()) or s in self.state.retired():
                continue
            if self._checkpoints_moved_off(s):  # never retire the last copy of a router
                self.state.change(self.fence, [f"retired/{s}"],
                                  lambda v, s=s: None if v else ({f"retired/{s}": "1"}, []))
                log.warning("shard %d drained and retired", s)

    def _checkpoints_moved_off(self, sid: int) -> bool:
        """Checkpoint again every router whose checkpoint shard ``sid`` holds (onto the shards
        that take checkpoints now, which a draining shard is not); True once none is left on
        it."""
        moved = True
        for name in self.names():
            meta = self.state.refresh(f"router/{name}")[0]
            if meta and sid in meta.get("holders", []):
                try:
                    self.get(name).move_checkpoint()
                    log.warning("%s: router checkpoint moved off draining shard %d", name, sid)
                except Exception as exc:
                    log.warning("%s: could not move the router checkpoint off shard %d: %s",
                                name, sid, exc)
                    moved = False
        return moved

    def _move(self, move) -> None:
        """Copy a current part replica to its new shard under the part's write lock (writes
        to that part wait; searches go on), switch the map (reads and writes go to the new
        copy), then drop the old copy."""
        name = move.part.rsplit(".p", 1)[0]
        self.get(name).current()  # the part objects exist once the router is loaded
        part = self.pool.parts.get(move.part)
        if part is None:
            log.warning("cannot move %s: its collection is not trained", move.part)
            return
        t0 = time.monotonic()
        with part.write_lock:
            e = self.state.part_entry(move.part)
            sources = [s for s in e["in_sync"] if self.pool.up.get(s)]
            sources.sort(key=lambda s: s != move.source)
            if not sources:
                log.warning("cannot move %s: no in-sync replica is up", move.part)
                return
            term = self.term()
            if part.bring_up_to_date(sources[0], term) != part.committed():
                log.warning("cannot move %s yet: shard %d has not applied every write",
                            move.part, sources[0])
                return
            config, data = self.pool.client(sources[0]).export_collection(move.part)
            config["fence_term"] = term
            self.pool.client(move.target).import_collection(move.part, config, data)

            def switch(e):
                if move.source not in e["replicas"] or move.target in e["replicas"]:
                    return None
                e["replicas"] = sorted([s for s in e["replicas"] if s != move.source]
                                       + [move.target])
                e["in_sync"] = sorted([s for s in e["in_sync"] if s != move.source]
                                      + [move.target])
                return e

            self.state.update_part(self.fence, move.part, switch)
        self.pool.up.setdefault(move.target, True)
        with contextlib.suppress(Exception):
            self.pool.client(move.source).drop_collection(move.part)
        log.warning("moved %s from shard %d to shard %d (%d bytes, %.2f s)", move.part,
                    move.source, move.target, len(data), time.monotonic() - t0)


def run_coordinator(args) -> int:
    """``simsearch cluster coordinator``: serve the cluster's collections and join the
    election (docs/cluster.md)."""
    from ..service.server import run_serve

    token = open(args.shard_token_file).read().strip() if args.shard_token_file else None
    etcd = Etcd(args.etcd, f"simsearch/{args.cluster}", timeout=max(1.0, args.lease_ttl),
                tls=tls_from_args(args))
    etcd.check_server_version(args.allow_unsafe_etcd)
    coord = Coordinator(etcd, lease_ttl=args.lease_ttl, replicas=args.replicas,
                        replace_after=args.replace_after,
                        leader_tls_ca=getattr(args, "cluster_tls_ca", None) or args.shard_tls_ca
                        or args.tls_cert,
                        checkpoint_log_bytes=args.checkpoint_log_bytes,
                        min_insync_replicas=args.min_insync_replicas,
                        pool_options={"health_interval": args.health_interval, "token": token,
                                      "tls_ca": args.shard_tls_ca})

    def attach(running, stop):
        coord.start(args.advertise or f"{args.host}:{running.port}")

        def cleanup():
            if coord.election is not None:
                coord.election.close()  # resign now: a standby leads within one watch event

        return cleanup, {"address": coord.address, "role": "coordinator"}

    return run_serve(args, store=coord, attach=attach)
