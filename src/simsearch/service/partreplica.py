"""A cluster part's replica on a shard server (docs/cluster.md, "Writes"): a collection that
takes the cluster leader's fenced part writes (prepare, sync; fenced.py is their state) and
nothing else. Its log holds the prepared ops; a snapshot keeps the fencing state beside the
index (part-<g>.json) and logs the prepared ops not yet applied again.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np

from .._durable import atomic_write
from ..errors import InvalidAttributeError, InvalidIdError, NotTrainedError
from ..index import Index
from . import wal as walmod
from .attributes import AttributeTable
from .collection import PART_OPS, Collection, check_unique, upsert_items
from .errors import FencedPartError, OpsGoneError, ResourceExhaustedError
from .fenced import FencedState, PartOp
from .wal import WriteAheadLog

log = logging.getLogger(__name__)


def _apply_part_op(index: Index, op: PartOp, attrs: AttributeTable) -> None:
    if op.remove:
        ids = op.ids[index.contains(op.ids)]
        if ids.size:
            index.remove(ids)
            attrs.remove(ids)
        return
    try:
        checked = attrs.check(op.attributes, op.ids.size)
    except (InvalidAttributeError, ResourceExhaustedError) as exc:  # a type or a column an op
        # prepared before this one fixed: the op's vectors are committed, so they are applied
        log.warning("part op %d: attributes dropped (%s); declare a schema", op.pseq, exc)
        checked = {}
    upsert_items(index, op.x, op.ids, attrs, checked)


def _replay_part(index: Index | None, state: FencedState, rec: walmod.Record,
                 shape_of: Index | None = None,
                 attrs: AttributeTable | None = None) -> list[PartOp]:
    """Replay one fenced part record (Collection.part_prepare / part_sync) on ``state`` and
    ``index`` (None: the state only, to list the applied ops; ``shape_of`` then gives the
    vectors' shape). Returns the ops a sync record applied."""
    m = rec.meta
    if rec.op == walmod.OP_PART_PREPARE:
        ops, blobs = [], iter(rec.blobs)
        for o in m["ops"]:
            x = None if o["remove"] else (
                index if index is not None else shape_of).items_from_bytes(next(blobs))
            ops.append(PartOp(o["pseq"], o["remove"], np.frombuffer(next(blobs), np.int64), x,
                              o.get("attributes")))
        state.prepare(m["term"], m["attempt"], ops)
        return []
    ops = state.ops_to_apply(tuple(m["ballot"]), m["first"], m["through"]) if m["through"] \
        else []
    if ops is None:
        raise ValueError(f"part sync record {m} does not follow the prepared ops")
    if index is not None:
        for op in ops:
            _apply_part_op(index, op, attrs)
    state.raise_term(m["term"])
    if ops:
        state.mark_applied(m["through"], m["first"], tuple(m["ballot"]))
    return ops


class PartReplica(Collection):
    """A Pyramid part's replica (module docstring); a PartReplica of service.protocols."""

    def _check_writer(self, part: bool | str) -> None:
        if not part:
            raise FencedPartError(
                f"collection {self.name!r} is a Pyramid part replica: it takes writes only "
                "from the cluster's leader (PartPrepare / PartSync); write through a "
                "coordinator")

    def __init__(self, *args: Any, **kwargs: Any):
        #: the fencing state, once a Pyramid leader has written this replica (fenced.py)
        self.fenced: FencedState | None = None
        self._wal_base_applied = 0  # the part sequence applied when the current log began
        self._loaded_applied = 0
        super().__init__(*args, **kwargs)

    # -- recovery, snapshots and copies (Collection's hooks) --------------------------------

    def _load_state(self, g: int) -> FencedState | None:
        part = self.path / f"part-{g}.json"
        state = FencedState.from_json(json.loads(part.read_text())) if g and part.exists() \
            else None
        self._loaded_applied = state.applied if state is not None else 0
        return state

    def _replay(self, index: Index, rec: walmod.Record, attrs: AttributeTable,
                state: FencedState | None) -> FencedState | None:
        if rec.op not in PART_OPS:
            return super()._replay(index, rec, attrs, state)
        state = state or FencedState()
        _replay_part(index, state, rec, attrs=attrs)
        return state

    def _keep_state(self, state: FencedState | None) -> None:
        self.fenced = state
        self._wal_base_applied = self._loaded_applied

    def _snapshot_state(self, g: int, new_wal: WriteAheadLog) -> None:
        if self.fenced is None:
            return
        state = json.dumps(self.fenced.to_json()).encode()
        atomic_write(self.path / f"part-{g}.json", lambda f: f.write(state))
        for (term, attempt), ops in self.fenced.pending().items():
            new_wal.append(walmod.OP_PART_PREPARE, *self._prepare_record(
                self.index, term, attempt, ops, check=False))

    def _snapshot_done(self) -> None:
        self._wal_base_applied = self.fenced.applied if self.fenced is not None else 0

    def _export_config(self) -> dict:
        """With the fencing state: the copy holds what this replica applied (its prepared ops
        stay in its own log)."""
        config = dict(self.config)
        if self.fenced is not None:
            config["part_state"] = self.fenced.to_json()
        return config

    # -- fenced part writes (fenced.py, docs/cluster.md "Writes") ---------------------------

    def _prepare_record(self, index: Index, term: int, attempt: int, ops: list[PartOp],
                        check: bool = True) -> tuple[dict, tuple[bytes, ...]]:
        """A prepare's log record, its ops checked (``check=False``: ops checked when they
        were prepared, logged again by a snapshot)."""
        meta, blobs = [], []
        for op in ops:
            entry = {"pseq": int(op.pseq), "remove": bool(op.remove)}
            if check:
                check_unique(op.ids, "ids of a part op must be unique")
            if not op.remove:
                x = index.check_items(op.x) if check else op.x
                if len(x) != op.ids.size:
                    raise InvalidIdError(f"a part op has {op.ids.size} ids for {len(x)} items")
                blobs.append(index.item_bytes(x))
                if op.attributes:
                    if check:
                        self.attrs.check(op.attributes, op.ids.size)
                    entry["attributes"] = op.attributes
            meta.append(entry)
            blobs.append(np.ascontiguousarray(op.ids, np.int64).tobytes())
        return {"term": term, "attempt": attempt, "ops": meta}, tuple(blobs)

    def part_prepare(self, term: int, attempt: int, ops: list[PartOp],
                     deadline: float | None = None) -> dict:
        """Phase one: check the ballot and the ops, store them durably, apply nothing."""
        with self._write(deadline, part="only") as index:
            state = self.fenced or FencedState()
            state.check_prepare(term, attempt)
            meta, blobs = self._prepare_record(index, term, attempt, ops)
            if not index.is_trained:
                raise NotTrainedError(f"{type(index).__name__} must be trained before add()")

            def apply():
                state.prepare(term, attempt, ops)
                self.fenced = state

            self._commit(walmod.OP_PART_PREPARE, meta, blobs, apply)
            return self._part_state(index)

    def part_sync(self, term: int, ballot: tuple[int, int] = (0, 0), first: int = 0,
                  through: int = 0, deadline: float | None = None) -> dict:
        """Phase two: fence at ``term``, then apply the prepared ops [first, through] of
        ``ballot`` if this replica can (see FencedState.ops_to_apply); report what it holds."""
        with self._write(deadline, part="only") as index:
            state = self.fenced or FencedState()
            state.check_term(term)
            # None (this replica cannot apply them: the leader repairs it) applies nothing too
            ops = (state.ops_to_apply(ballot, first, through) if through else None) or []
            raised = term > state.term
            if ops or raised:
                def apply():
                    for op in ops:
                        _apply_part_op(index, op, self.attrs)
                    if ops:
                        state.mark_applied(through, first, tuple(ballot))
                    state.raise_term(term)
                    self.fenced = state

                # a lost sync record is repaired by the leader's next sync; a raised term must
                # survive a crash, so that record is fsynced
                self._commit(walmod.OP_PART_SYNC,
                             {"term": term, "ballot": list(ballot), "first": first,
                              "through": through if ops else 0}, (), apply, sync=raised)
            self.fenced = self.fenced or state
            return self._part_state(index)

    def part_ops(self, after: int, max_bytes: int, deadline: float | None = None
                 ) -> tuple[list[PartOp], int]:
        """The ops this replica applied after sequence ``after``, in order, as many as fit
        ``max_bytes`` (at least one), and its applied sequence; OpsGoneError if its log no
        longer reaches back to ``after`` (a snapshot compacted it)."""
        with self._write(deadline, part="only") as index:
            st = self.fenced
            if st is None or after >= st.applied:
                return [], st.applied if st else 0
            if after < self._wal_base_applied:
                raise OpsGoneError(f"{self.name}: the log starts after sequence "
                                   f"{self._wal_base_applied}; asked for ops after {after}")
            records, _, _ = walmod.scan(self._wal.path.read_bytes())
            scratch = FencedState(applied=self._wal_base_applied)  # replays the log's part
            out, size = [], 0  # records without touching the index
            for rec in records:
                if rec.op not in PART_OPS:
                    continue
                for op in _replay_part(None, scratch, rec, index):
                    if op.pseq > after and (not out or size < max_bytes):
                        out.append(op)
                        size += op.ids.nbytes + (op.x.nbytes if op.x is not None else 0)
            return out, st.applied

    def _part_state(self, index: Index) -> dict:
        st = self.fenced
        return {"term": st.term, "applied": st.applied, "count": len(index)}
