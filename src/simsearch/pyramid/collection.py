"""One cluster collection as a coordinator serves it (docs/cluster.md, "Coordinators"): a copy
of its router (a PyramidIndex whose parts are remote) kept current by the router checkpoint on
the shards and the router log in etcd; on the leader, its writes.

A leader's write plans on the router without changing it (``PyramidIndex.draft``), has the
parts take it in two fenced phases around the log append (replication.py), and installs the
planned router only once the log holds the write. A search reads whichever router is
installed, from its start to its end.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import numpy as np

from ..errors import InvalidParameterError, SimsearchError
from ..index import SearchResult, as_id_array, as_matrix
from ..service.paging import page
from . import rebuild, routerlog
from .batching import rows_for
from .checkpoints import (
    CheckpointLostError,
    read_checkpoint,
    read_model,
    store_checkpoint,
    store_model,
)
from .control.errors import CoordinationError, NotLeaderError
from .control.etcd import Compare
from .fanout import get_items
from .parts import RouterBehindError
from .replication import PartSequences, replicate, sequence_record
from .routerlog import log_key

log = logging.getLogger(__name__)

#: router log records between two router checkpoints (a checkpoint bounds replay at take-over)
CHECKPOINT_EVERY = 200
#: seconds a write waits at most for a running checkpoint (see _wait_for_checkpoint)
CHECKPOINT_WAIT = 30.0


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
    """One collection as a coordinator serves it: ``index``, a router copy current to log
    record ``applied``, and ``seqs``, the parts' committed sequences beside it (a
    ServedCollection, service.protocols; part writes go to shard servers)."""

    def __init__(self, coord, name: str, config: dict):
        self.coord, self.name, self.config = coord, name, config
        self.index = None
        self.seqs: PartSequences | None = None
        self.applied = 0
        self.checkpoint_seq = 0
        self.log_bytes = 0  # log record bytes appended since the last checkpoint
        self.write_lock = threading.RLock()  # the leader's writes, and log replay, one at a time
        #: the leader term whose take-over this collection finished (see ``take_over``)
        self.ready_term: int | None = None
        self._checkpointing = False
        self._rebuilding = False
        self._checkpoint_idle = threading.Event()
        self._checkpoint_idle.set()

    # -- the router copy --------------------------------------------------------------------

    def _loaded(self, index, applied: int) -> None:
        self.index, self.applied = index, applied
        self.seqs = PartSequences.from_annex(index.annex, index.n_parts)

    def _new_index(self):
        return self.coord.pool.router(self.name, self.config)

    def _load_checkpoint(self, meta: dict) -> None:
        try:
            data = read_checkpoint(self.coord.pool, self.name, meta,
                                   self.coord.rebalancer.shard_lost)
        except CheckpointLostError:
            if not self.coord.is_leader():
                raise
            return self._rebuild(meta)
        self._loaded(self._load_router(data), int(meta["seq"]))
        self.checkpoint_seq = self.applied

    def _load_router(self, data: bytes):
        return self.coord.pool.router(self.name, self.config, data)

    def _rebuild(self, meta: dict) -> None:
        """Every copy of the router's checkpoint is lost: rebuild it from its parts
        (rebuild.py) as one write committed by a new checkpoint."""
        coord, name = self.coord, self.name
        log.error("%s: every copy of router checkpoint %s is lost; rebuilding the router from "
                  "its parts", name, meta["blob"])
        model = read_model(coord.pool, name, self.config.get("incarnation", ""),
                           rebuild.part_shards(coord, name))
        index = self._load_router(model)
        seqs, last = rebuild.committed_sequences(coord, name, index.parts, int(meta["seq"]))
        self._rebuilding = True  # readers wait (``current``): this router is still empty
        try:
            self.index, self.seqs, self.applied = index, seqs, last
            coord.pool.register(index, self)
            self.take_over(coord.term())  # every replica up brought to its committed sequence
            held, ids, x, attributes = rebuild.read_items(coord, index.parts)
            draft = index.draft()
            if ids.size:
                draft.take(rebuild.plan(draft.router, held, ids, x))
            by_part = self.seqs.number(draft.jobs, _attributes_by_id(attributes, ids))
            commit = lambda seq_rec: self._commit(draft, seq_rec, checkpoint=True)  # noqa: E731
            if by_part:
                replicate(coord, {p: index.parts[p] for p in by_part}, by_part, None, commit)
            else:
                commit(sequence_record({}, (coord.term(), 0)))
        except BaseException:
            self._drop_router()
            raise
        finally:
            self._rebuilding = False
        coord.router_rebuilds += 1
        log.error("%s: router rebuilt from its parts: %d items, %d part jobs, checkpoint at "
                  "log record %d", name, ids.size, len(draft.jobs), self.applied)

    def catch_up(self) -> None:
        """Apply the log records this copy has not seen (loading the checkpoint when the log
        was compacted past them, or on first use)."""
        with self.write_lock:
            meta = self.coord.etcd.get(f"router/{self.name}")[0]
            meta = json.loads(meta) if meta else None
            if self.index is None or (meta and meta["seq"] > self.applied):
                if meta is None:
                    self._loaded(self._new_index(), 0)
                else:
                    self._load_checkpoint(meta)
                if self.coord.is_leader():  # replicas may hold commits this copy logged but
                    self.coord.reconcile()  # never applied (a write whose append was unknown)
            recs = self.coord.etcd.get_from(f"log/{self.name}/",
                                            log_key(self.name, self.applied + 1))
            for key, value, _ in recs:
                seq = int(key.rsplit("/", 1)[1])
                if seq != self.applied + 1:  # compacted under us: start from the checkpoint
                    self._drop_router()
                    return self.catch_up()
                self._apply(routerlog.decode(value))
                self.applied = seq
            # the leader's catch-ups read the committed sequences of the parts registered here:
            # only a copy current to the log's end may serve them
            self.coord.pool.register(self.index, self)

    def _apply(self, records: list[dict]) -> None:
        self.index.apply_records([r for r in records if r["op"] != "seq"])
        for r in records:
            if r["op"] == "seq":
                self.seqs = self.seqs.committed(r)

    def current(self):
        if self.index is None or self._rebuilding:
            self.catch_up()  # waits for the write lock a load or a rebuild holds
        return self.index

    def invalidate(self) -> None:
        """Drop the copy (its log position is unknown after a failed append); reload on use."""
        with self.write_lock:
            self._drop_router()

    def _drop_router(self) -> None:
        """Forget the router copy, and take its parts out of recovery's hands: recovery brings
        replicas to the sequences the log committed, which a dropped copy may be ahead of."""
        if self.index is not None:
            self.coord.pool.unregister(self.index)
        self.index = self.seqs = None
        self.ready_term = None  # a leader takes over again before its next write

    def take_over(self, term: int) -> None:
        """The barrier before a new leader's first write to this collection: its router read
        to the log's tail (its predecessor's last records included: their appends were fenced by
        an election that has ended, so none can land after this read), then every replica that
        is up fenced at ``term`` and brought to its part's committed sequence; one that cannot
        be is marked out of sync. Without it a stale copy numbers its part ops from a stale
        sequence and replaces committed ops the replicas hold prepared."""
        with self.write_lock:
            if self.ready_term == term:
                return
            self.catch_up()
            pool = self.coord.pool
            for part in self.index.parts if self.index.is_trained else ():
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

    def leader_index(self):
        """The router a leader writes through: current to the log's tail (``take_over``)."""
        term = self.coord.term()
        if self.ready_term != term:
            self.take_over(term)
        return self.current()

    # -- the leader's writes ----------------------------------------------------------------

    def _write(self, fn, deadline: float | None = None, attributes: dict | None = None):
        """One write on the leader: ``fn(draft)`` plans it on the router (changing nothing),
        the parts take it in two fenced phases around the log append (replication.py), and
        the planned router is installed once the log holds it."""
        coord = self.coord
        coord.require_leader()
        self._wait_for_checkpoint()  # before the lock: the checkpoint needs it briefly
        with self.write_lock:
            index = self.leader_index()
            draft = index.draft()
            out = fn(draft)
            if draft.decisions:
                by_part = self.seqs.number(draft.jobs, _attributes_by_id(attributes, out))
                replicate(coord, {p: index.parts[p] for p in by_part}, by_part, deadline,
                          lambda seq_rec: self._commit(draft, seq_rec))
            return out

    def _commit(self, draft, seq_rec: dict, checkpoint: bool = False) -> None:
        """The commit point: a write's decisions and sequences as one log record, appended in a
        transaction fenced by the election (or a checkpoint of the router it makes, when
        ``checkpoint`` or too big for etcd); then its router installed. Raises, dropping this
        copy, when the append did not land or its outcome is unknown."""
        coord = self.coord
        records = [*draft.records, seq_rec]
        seq = self.applied + 1
        try:
            data = None if checkpoint else routerlog.encode(records)
            if data is None:  # a checkpoint carries this write instead
                self.index.install(draft)
                self.seqs = self.seqs.committed(seq_rec)
                self._checkpoint_locked(seq)
            elif not coord.etcd.cas([*coord.fence(), Compare.absent(log_key(self.name, seq))],
                                    {log_key(self.name, seq): data}):
                raise NotLeaderError("the write's log record was refused: this coordinator is "
                                     "no longer the leader; retry")
            else:
                self.index.install(draft)
                self.seqs = self.seqs.committed(seq_rec)
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

    # -- checkpoints ------------------------------------------------------------------------

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
        self.index.annex = self.seqs.to_annex()
        return self.index.to_bytes()

    def _checkpoint_locked(self, seq: int) -> None:
        self._put_checkpoint(seq, self._router_bytes())

    def _put_checkpoint(self, seq: int, data: bytes) -> None:
        store_checkpoint(self.coord, self.name, seq, data)
        self.checkpoint_seq = max(self.checkpoint_seq, seq)
        self.log_bytes = 0

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
                "needs_training": r.capabilities.needs_training,
                "supports_remove": r.capabilities.supports_remove,
                "search_params": sorted(r.capabilities.search_params),
                "schema": c.get("schema") or {}}

    def stats(self) -> dict[str, Any]:
        r = self.index
        return {"damaged": False, "items": len(r) if r is not None else 0, "wal_bytes": 0,
                "snapshot_time": time.time()}

    def get(self, ids: Any = None, vectors: bool = False, where: dict | None = None,
            deadline: float | None = None, offset: int = 0,
            max_bytes: int | None = None) -> dict:
        """``Collection.get``: each item read from its home part (``fanout.get_items``), the
        answer then cut into pages here."""
        got = get_items(self.current(), None if ids is None else as_id_array(ids), vectors,
                        where)
        return page(got, offset, (self.config["dim"] * 4 if vectors else 0) + 8, max_bytes)

    def search(self, q: Any, k: int, *, allow: Any = None, deny: Any = None,
               where: dict | None = None, deadline: float | None = None,
               **params: Any) -> SearchResult:
        """``Index.search``; ``where`` goes to every asked part, which answers it from its
        attributes. Unfiltered searches with the same k and parameters that meet here while
        others run go out as one batch (batching.py)."""
        self.coord.require_etcd()
        batcher = self.coord.batcher
        # alone: filtered searches, per-query parameters, and partial answers (whose coverage
        # is their own, not a batch's)
        if batcher is not None and allow is None and deny is None and where is None \
                and params.get("require_complete") is not False \
                and all(isinstance(v, (str, int, float, bool, type(None)))
                        for v in params.values()):
            c = self.config
            xs = as_matrix(q, c["dim"], c["metric"], "queries")  # its own errors, not a batch's
            out = batcher.search(
                (self, k, tuple(sorted(params.items()))), xs, deadline,
                lambda qs, dl: self.current().search(qs, k, deadline=dl, **params),
                rows_for(c["dim"], k if isinstance(k, int) else 1))
        else:
            out = self.current().search(q, k, allow=allow, deny=deny, where=where,
                                        deadline=deadline, **params)
        self.coord.queries += len(out.ids)
        return out

    def _route(self, write, remote, idempotent: bool, deadline: float | None,
               attributes: dict | None = None):
        """Run ``write(draft)`` here if this coordinator leads, else forward ``remote`` to the
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
        def write(draft):
            xs = as_matrix(x, draft.index.dim, draft.index.metric)
            if upsert and ids is not None:
                arr = as_id_array(ids)
                present = arr[draft.contains(arr)]
                if present.size:
                    draft.remove(present)
                return draft.add(xs, arr)
            return draft.add(xs, ids)

        return self._route(write, lambda col: col.add(x, ids, upsert=upsert,
                                                      attributes=attributes),
                           upsert and ids is not None, deadline, attributes)

    def remove(self, ids, deadline: float | None = None, missing_ok: bool = False) -> int:
        def write(draft):
            arr = as_id_array(ids)
            if missing_ok:
                arr = arr[draft.contains(arr)]
            return draft.remove(arr)

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
            index = self.leader_index()
            coord.rebalancer.place_collection(self.name, index.n_parts)
            for part in index.parts:  # on the replicas just placed
                part.ensure(fresh=not index.is_trained)
            index.train(x)  # RetrainNonEmptyError if it holds items
            self.seqs = PartSequences.empty(index.n_parts)
            seq = self.applied + 1
            try:
                store_model(coord.pool, self.name, self.config.get("incarnation", ""),
                            index.to_bytes(), rebuild.part_shards(coord, self.name))
                self._checkpoint_locked(seq)  # the trained model is durable before we answer
            except Exception:
                self._drop_router()
                raise
            self.applied = seq
            coord.pool.register(index, self)

    def snapshot(self, deadline: float | None = None) -> int:
        """A router checkpoint now (on the leader)."""
        if not self.coord.is_leader():
            return self.coord.forward(lambda c: self._on(c).snapshot())
        self.coord.require_leader()
        with self.write_lock:
            r = self.leader_index()
            if r.is_trained and self.applied > self.checkpoint_seq:
                self._checkpoint_locked(self.applied)
            return len(r)

    def move_checkpoint(self) -> None:
        """Write the router's checkpoint again, onto the shards that take checkpoints now (the
        leader, before it retires a drained shard that holds one)."""
        with self.write_lock:
            if self.leader_index().is_trained:
                self._checkpoint_locked(self.applied)

    def export(self, deadline: float | None = None) -> tuple[dict, bytes]:
        """The collection's config and its router's file (``open_router``)."""
        with self.write_lock:
            self.current()
            return self.config, self._router_bytes()

    def close(self) -> None:
        self._drop_router()
