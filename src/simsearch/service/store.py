"""Durable named collections on disk: an index per collection, a write-ahead log, snapshots.

Layout under the data directory::

    collections/<name>/collection.json     dim, metric, kind, build params (written once)
    collections/<name>/snapshot-<g>.idx    the index as of generation g (Index.save: atomic)
    collections/<name>/wal-<g>.log         every write since snapshot g (see wal.py)
    collections/<name>/part-<g>.json       a Pyramid part replica's fencing state as of snapshot g
                                           (fenced.py; written before snapshot-<g>.idx)

State = the newest snapshot (or an empty index at g = 0) + replay of its log. A snapshot writes
wal-<g+1> (with a part's prepared, unapplied ops), the fencing state and attributes, then
snapshot-<g+1> (the commit point), then deletes generation g: a crash or a failure at any point
leaves either the old generation or the new one, both complete.

Every write is checked whole, appended to the log and fsynced, then applied to the in-memory
index and acknowledged: a search never sees a write the log does not hold, and a failed append
(a full disk) changes nothing. Writes on a collection are serialized; searches run concurrently
with each other and wait only while a write changes the index. An import swaps directories
through an intent file a restart finishes (docs/service.md, "Durability").
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from .. import _faults
from .._durable import atomic_write, fsync_dir
from .._rwlock import RWLock
from .._validate import check_batch_ids
from ..errors import (
    CorruptIndexError,
    DuplicateIdError,
    InvalidAttributeError,
    InvalidIdError,
    InvalidParameterError,
    NotTrainedError,
    RetrainNonEmptyError,
    UnknownIdError,
)
from ..filters import parse_filter
from ..index import (
    Index,
    SearchResult,
    as_id_array,
    as_matrix,
    create_index,
    load,
)
from . import wal as walmod
from .attributes import AttributeTable, check_schema
from .errors import (
    CollectionExistsError,
    CollectionNotFoundError,
    DataLossError,
    DeadlineExceededError,
    FencedPartError,
    NotPartReplicaError,
    OpsGoneError,
    ResourceExhaustedError,
    ServiceUnavailableError,
)
from .fenced import FencedState, PartOp
from .limits import DEFAULT_LIMITS, Limits, check_name
from .wal import WriteAheadLog

log = logging.getLogger(__name__)

_SNAP_RE = re.compile(r"^snapshot-(\d+)\.idx$")
_WAL_RE = re.compile(r"^wal-(\d+)\.log$")
_PART_RE = re.compile(r"^part-(\d+)\.json$")
_ATTR_RE = re.compile(r"^attrs-(\d+)\.bin$")
_INCARNATION_RE = re.compile(r"[0-9a-f]{1,64}")
_PART_OPS = (walmod.OP_PART_PREPARE, walmod.OP_PART_SYNC)
DEFAULT_SNAPSHOT_WAL_BYTES = 256 << 20
#: after an automatic snapshot failed (a full disk): seconds before the next try
SNAPSHOT_RETRY_SECONDS = 5
# A log is also snapshotted once it outgrows the snapshot it follows (and this floor): replaying it
# then costs about one rebuild of what the collection holds, however long the collection churns.
# The soak found restarts taking minutes under add/remove churn below the byte cap.
MIN_SNAPSHOT_WAL_BYTES = 16 << 20
#: blobs (the cluster's router checkpoints) are bounded: one is read whole into memory
MAX_BLOB_BYTES = 1 << 30
BLOB_MAGIC = "SSBLOB1"


def _disk_error(exc: OSError, name: str, what: str) -> Exception:
    """The typed error for a write the disk refused: nothing changed, and writes resume once
    the disk takes them again."""
    log.error("collection %s: %s: %s", name, what, exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return ResourceExhaustedError(
            f"collection {name!r}: the data directory's disk is full; {what} (nothing changed). "
            "Searches go on; writes resume once space is freed")
    return ServiceUnavailableError(
        f"collection {name!r}: a disk error; {what} (nothing changed); retry later")


def _timeout(deadline: float | None) -> float:
    if deadline is None:
        return -1
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeadlineExceededError("the call's deadline passed before it could start")
    return left


def _search_per_query(index: Index, q: Any, k: int, params: dict) -> SearchResult:
    """Search the rows sharing the same ``params["per_query"]`` values together."""
    params = dict(params)
    per = params.pop("per_query")
    q = as_matrix(q, index.dim, what="queries")
    if not isinstance(per, dict) or not all(
        isinstance(v, list) and len(v) == q.shape[0] for v in per.values()
    ):
        raise InvalidParameterError(
            "per_query must map parameter names to lists of one value per query "
            f"({q.shape[0]}); got {per!r:.200}"
        )
    if set(per) & set(params):
        raise InvalidParameterError(f"parameters {sorted(set(per) & set(params))} are given "
                                    "both per query and for all queries")
    keys = list(zip(*per.values(), strict=True)) if per else [()] * q.shape[0]
    groups: dict[tuple, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(tuple(map(json.dumps, key)), []).append(i)
    filt = {name: params.pop(name) for name in ("allow", "deny") if name in params}
    parsed = parse_filter(filt.get("allow"), filt.get("deny"), q.shape[0])
    ids = scores = None
    for rows in groups.values():
        if parsed is not None:
            params.update(parsed.take(np.asarray(rows)).kwargs())
        r = index.search(q[rows], k, **params, **dict(zip(per, keys[rows[0]], strict=True)))
        if ids is None:
            ids = np.empty((q.shape[0], r.ids.shape[1]), r.ids.dtype)
            scores = np.empty((q.shape[0], r.scores.shape[1]), r.scores.dtype)
        ids[rows], scores[rows] = r.ids, r.scores
    if ids is None:
        return index.search(q, k, **params, **filt)
    return SearchResult(ids, scores)


def _and_allow(allow: Any, matched: np.ndarray) -> Any:
    """An allow list (None, one array, or one per query) narrowed to the ids a where matched."""
    if allow is None:
        return matched
    if isinstance(allow, list):
        return [np.intersect1d(np.asarray(a, np.int64), matched) for a in allow]
    return np.intersect1d(np.asarray(allow, np.int64), matched)


def _check_unique(ids: np.ndarray, what: str) -> None:
    """A batch that repeats an id is a bad argument (INVALID_ARGUMENT), unlike an id that
    clashes with a stored one (ALREADY_EXISTS); both are DuplicateIdError, as in process."""
    uniq, counts = np.unique(ids, return_counts=True)
    if uniq.size != ids.size:
        exc = DuplicateIdError(f"{what}; id {int(uniq[counts > 1][0])} repeats")
        exc.grpc_code = "INVALID_ARGUMENT"
        raise exc


def _supports_remove(index: Index) -> bool:
    declared = getattr(type(index), "supports_remove", None)
    return declared if declared is not None else type(index)._remove is not Index._remove


class _Vectors:
    """How a vector collection's items are made, checked, logged and replayed."""

    train_replayable = True  # training is logged and replayed (it is deterministic and quick)

    def new_index(self, c: dict):
        return create_index(c["kind"], c["dim"], c["metric"], **c["params"])

    def load_index(self, path: Path, c: dict):
        return load(path)

    def check(self, index, x: Any, what: str = "vectors"):
        return as_matrix(x, index.dim, index.metric, what)

    def count(self, x) -> int:
        return int(x.shape[0])

    def to_bytes(self, x) -> bytes:
        return x.tobytes()

    def from_bytes(self, blob: bytes, index):
        return np.frombuffer(blob, np.float32).reshape(-1, index.dim)


class _Strings(_Vectors):
    """String collections (kind "strings", docs/service.md): items are str, logged as JSON; a
    trained encoder is snapshotted at once instead of being re-fit on replay."""

    train_replayable = False

    def new_index(self, c: dict):
        from ..strings.collection import StringCollectionIndex

        return StringCollectionIndex(c["dim"], c["metric"], **c["params"])

    def load_index(self, path: Path, c: dict):
        from ..strings.collection import StringCollectionIndex

        return StringCollectionIndex.load(path, c["params"])

    def check(self, index, x: Any, what: str = "strings"):
        from ..strings._alphabet import check_strings

        return check_strings(x, what)

    def count(self, x) -> int:
        return len(x)

    def to_bytes(self, x) -> bytes:
        return json.dumps(x).encode()

    def from_bytes(self, blob: bytes, index):
        return json.loads(blob)


def items_of(config: dict) -> _Vectors:
    """The item handling of a collection config: strings for kind "strings", else vectors."""
    return _Strings() if config.get("kind") == "strings" else _Vectors()


def _upsert(index: Index, x: Any, ids: np.ndarray, attrs: AttributeTable | None = None,
            checked: dict | None = None) -> None:
    """Replace the items of ids that exist and add the others, attributes too; checked before
    anything changes."""
    present = index.contains(ids)
    if present.any():
        index.remove(ids[present])
    index.add(x, ids)
    if attrs is not None:
        attrs.remove(ids[present])
        attrs.add(ids, checked or {})


def _attributes_blob(checked: dict) -> tuple[bytes, ...]:
    """A write's attributes as the log record's third blob (none: no blob)."""
    if not checked:
        return ()
    return (json.dumps({k: [t, v] for k, (t, v) in checked.items()}).encode(),)


def _attributes_of(rec: walmod.Record) -> dict:
    return {k: (t, v) for k, (t, v) in json.loads(rec.blobs[2]).items()} \
        if len(rec.blobs) > 2 else {}


def _apply(index: Index, rec: walmod.Record, items: _Vectors, attrs: AttributeTable) -> None:
    """Replay one log record."""
    if rec.op == walmod.OP_REMOVE:
        ids = np.frombuffer(rec.blobs[0], np.int64)
        index.remove(ids)
        attrs.remove(ids)
        return
    x = items.from_bytes(rec.blobs[0], index)
    if rec.op == walmod.OP_TRAIN:
        index.train(x)
    elif rec.op == walmod.OP_ADD:
        ids = np.frombuffer(rec.blobs[1], np.int64)
        index.add(x, ids)
        attrs.add(ids, _attributes_of(rec))
    elif rec.op == walmod.OP_UPSERT:
        _upsert(index, x, np.frombuffer(rec.blobs[1], np.int64), attrs, _attributes_of(rec))
    else:
        raise ValueError(f"unknown log op {rec.op}")


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
    _upsert(index, op.x, op.ids, attrs, checked)


def _replay_part(index: Index | None, state: FencedState, rec: walmod.Record, items: _Vectors,
                 shape_of: Index | None = None,
                 attrs: AttributeTable | None = None) -> list[PartOp]:
    """Replay one fenced part record (Collection.part_prepare / part_sync) on ``state`` and
    ``index`` (None: the state only, to list the applied ops; ``shape_of`` then gives the
    vectors' shape). Returns the ops a sync record applied."""
    m = rec.meta
    if rec.op == walmod.OP_PART_PREPARE:
        ops, blobs = [], iter(rec.blobs)
        for o in m["ops"]:
            x = None if o["remove"] else items.from_bytes(
                next(blobs), index if index is not None else shape_of)
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
        state.mark_applied(m["through"])
    return ops


def _read_config(path: Path) -> dict:
    """A collection's collection.json, checked: ValueError if it is not one."""
    config = json.loads(path.read_text())
    if not (
        isinstance(config, dict)
        and isinstance(config.get("dim"), int)
        and isinstance(config.get("metric"), str)
        and isinstance(config.get("kind"), str)
        and isinstance(config.get("params"), dict)
    ):
        raise ValueError(f"{path} is not a collection config (dim, metric, kind, params)")
    return config


class Collection:
    """One named index with its log. Thread-safe. Created as a part replica (``part_replica``
    in its config, on a shard server) it is a PartReplica (service.protocols): it takes a
    cluster part's fenced writes and nothing else; an ordinary collection refuses them."""

    def __init__(self, name: str, path: Path, snapshot_wal_bytes: int = DEFAULT_SNAPSHOT_WAL_BYTES,
                 limits: Limits = DEFAULT_LIMITS):
        self.name = name
        self.limits = limits
        self.path = path
        self.snapshot_wal_bytes = snapshot_wal_bytes
        self.index: Index | None = None
        self.damaged: str | None = None  # why the collection cannot be served (DATA_LOSS)
        self.generation = 0
        self._wal: WriteAheadLog | None = None
        self._writer = threading.Lock()  # one write at a time, including its fsync
        self._rw = RWLock(DeadlineExceededError)  # searches share; applying a write is exclusive
        self._snapshot_bytes = 0  # size of the snapshot the log follows
        self._snapshot_retry_at = 0.0  # after a failed automatic snapshot: not before then
        #: a part replica's fencing state, once a Pyramid leader has written it (fenced.py)
        self.fenced: FencedState | None = None
        self._wal_base_applied = 0  # the part sequence applied when the current log began
        self.part_replica = False
        try:
            self.config = _read_config(path / "collection.json")
        except (OSError, ValueError) as exc:  # this collection is lost, the node's others serve
            self.config = {}
            self._mark_damaged(f"collection {name!r} has an unreadable collection.json", exc)
            return
        self.items = items_of(self.config)
        self.part_replica = bool(self.config.get("part_replica"))
        self.recover()
        # a part written before part replicas were declared: its fencing state says what it is
        self.part_replica = self.part_replica or self.fenced is not None

    # -- recovery ---------------------------------------------------------------------------

    def _new_index(self) -> Index:
        return self.items.new_index(self.config)

    def _load_index(self, path: Path) -> Index:
        """Restore a snapshot."""
        return self.items.load_index(path, self.config)

    def recover(self) -> None:
        """Load the newest snapshot and replay its log (dropping a torn last record)."""
        if self._wal is not None:
            self._wal.close()
            self._wal = None
        files = os.listdir(self.path)
        gens = [int(m.group(1)) for f in files if (m := _SNAP_RE.match(f))]
        g = max(gens, default=0)
        try:
            index = self._load_index(self.path / f"snapshot-{g}.idx") if g \
                else self._new_index()
            part = self.path / f"part-{g}.json"
            fenced = FencedState.from_json(json.loads(part.read_text())) if g and part.exists() \
                else None
            base_applied = fenced.applied if fenced is not None else 0
            attrs_file = self.path / f"attrs-{g}.bin"
            if g and attrs_file.exists():
                attrs = AttributeTable.load(attrs_file)
            else:  # a snapshot from before attributes: its items get rows without values
                attrs = AttributeTable(self.config.get("schema"))
                attrs.add(index.ids(), {})
            records, torn = WriteAheadLog.recover(self.path / f"wal-{g}.log")
            if torn:
                log.warning("collection %s: dropped a torn last log record", self.name)
            for rec in records:
                if rec.op in _PART_OPS:
                    fenced = fenced or FencedState()
                    _replay_part(index, fenced, rec, self.items, attrs=attrs)
                else:
                    _apply(index, rec, self.items, attrs)
        except walmod.WalCorruptError as exc:  # its message names the file and offset only
            self._mark_damaged(f"collection {self.name!r} failed a checksum on recovery: {exc}",
                               exc)
            return
        except CorruptIndexError as exc:
            self._mark_damaged(f"collection {self.name!r} failed a checksum on recovery", exc)
            return
        except Exception as exc:  # a record that no longer applies: the log is inconsistent
            self._mark_damaged(f"collection {self.name!r} could not replay its log", exc)
            return
        for f in files:  # older generations and temporaries left by an interrupted snapshot
            m = _SNAP_RE.match(f) or _WAL_RE.match(f) or _PART_RE.match(f) or _ATTR_RE.match(f)
            if (m and int(m.group(1)) != g) or f.startswith("."):
                (self.path / f).unlink(missing_ok=True)
        self.index, self.generation, self.damaged = index, g, None
        attrs.max_columns = self.limits.max_attribute_columns
        self.attrs = attrs
        self.fenced = fenced
        self._wal_base_applied = base_applied
        self._snapshot_bytes = (self.path / f"snapshot-{g}.idx").stat().st_size if g else 0
        self._wal = WriteAheadLog(self.path / f"wal-{g}.log")
        log.info(
            "collection %s: %d items (generation %d, %d log records)",
            self.name,
            len(index),
            g,
            len(records),
        )

    def _mark_damaged(self, why: str, exc: BaseException) -> None:
        log.error("%s: %s", why, exc)
        self.index, self.damaged = None, why

    def _index(self) -> Index:
        if self.damaged or self.index is None:
            why = self.damaged or "collection is unavailable"
            raise DataLossError(f"{why}; restore it from a backup")
        return self.index

    # -- reads ------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """What the metrics report: items, log bytes, when the last snapshot was made."""
        if self.damaged or self.index is None:
            return {"damaged": True}
        snap = self.path / f"snapshot-{self.generation}.idx"
        when = snap if self.generation else self.path / "collection.json"
        try:
            t = when.stat().st_mtime
        except OSError:
            t = time.time()
        return {"damaged": False, "items": len(self.index),
                "wal_bytes": self._wal.size() if self._wal else 0, "snapshot_time": t}

    def describe(self) -> dict[str, Any]:
        index = self._index()  # DataLossError for a damaged collection
        c = self.config
        out = {
            "name": self.name,
            "dim": c["dim"],
            "metric": c["metric"],
            "kind": c["kind"],
            "params": c["params"],
        }
        out.update(
            count=len(index),
            trained=index.is_trained,
            needs_training=type(index).needs_training,
            supports_remove=_supports_remove(index),
            search_params=sorted(type(index).search_params),
            schema=dict(self.attrs.schema),
            incarnation=str(self.config.get("incarnation", "")),
        )
        return out

    def search(self, q: Any, k: int, params: dict, deadline: float | None = None) -> SearchResult:
        """``params["per_query"]``, if given, maps parameter names to one value per query (a
        coordinator asking one part with different beams per query in one call). ``allow`` /
        ``deny`` id lists and a ``where`` filter over the attributes (docs/filters.md) may be
        among the params."""
        with self._rw.read(deadline):
            index = self._index()
            if "where" in params:
                params = dict(params)
                params["allow"] = _and_allow(params.get("allow"),
                                             self.attrs.where(params.pop("where"), deadline))
            if "per_query" not in params:
                return index.search(q, k, **params)
            return _search_per_query(index, q, k, params)

    # -- writes -----------------------------------------------------------------------------

    @contextmanager
    def _write(self, deadline: float | None, part: bool | str = False):
        """One write at a time. A part replica takes only fenced part writes (``part`` true);
        ``part="only"``: a fenced part write, refused by an ordinary collection."""
        if not self._writer.acquire(timeout=_timeout(deadline)):
            raise DeadlineExceededError("the call's deadline passed while waiting for other writes")
        try:
            index = self._index()
            if part == "only" and not self.part_replica:
                raise NotPartReplicaError(
                    f"collection {self.name!r} is not a Pyramid part replica: part writes go "
                    "only to collections a cluster created as parts")
            if self.part_replica and not part:
                raise FencedPartError(
                    f"collection {self.name!r} is a Pyramid part replica: it takes writes only "
                    "from the cluster's leader (PartPrepare / PartSync); write through a "
                    "coordinator")
            yield index
        finally:
            self._writer.release()

    def _commit(self, op: int, meta: dict, blobs: tuple[bytes, ...], apply: Callable[[], Any],
                sync: bool = True) -> Any:
        """Log a checked write, then apply it (``apply()``, under the exclusive lock): searches
        never see a write that is not in the log. A failed append changes nothing (a full disk
        is ResourceExhaustedError, other I/O errors ServiceUnavailableError); an apply that
        fails takes its record out of the log again."""
        mark = self._wal.size()
        try:
            self._wal.append(op, meta, blobs, sync)
        except OSError as exc:
            raise _disk_error(exc, self.name, "the write was not made") from None
        try:
            with self._rw.write():
                result = apply()
        except BaseException:
            try:
                self._wal.cut_to(mark)
            except OSError:  # the record stays: the log and the index must agree again
                log.exception("collection %s: could not take a failed write out of its log; "
                              "reloading", self.name)
                with self._rw.write():
                    self.recover()
            raise
        self._maybe_snapshot()
        return result

    def _maybe_snapshot(self) -> None:
        """Snapshot once the log outgrows its bounds. The write before it is durable already:
        a snapshot that fails (a full disk) is logged and tried again later, never reported as
        the write's failure."""
        size = self._wal.size()
        if not (size > self.snapshot_wal_bytes
                or size > max(MIN_SNAPSHOT_WAL_BYTES, self._snapshot_bytes)):
            return
        if time.monotonic() < self._snapshot_retry_at:
            return
        try:
            self._snapshot_locked()
        except Exception as exc:  # noqa: BLE001 - the write it follows stands whatever happens
            self._snapshot_retry_at = time.monotonic() + SNAPSHOT_RETRY_SECONDS
            log.warning("collection %s: snapshot failed (%s); the log keeps every write, "
                        "retrying in %d s", self.name, exc, SNAPSHOT_RETRY_SECONDS)

    def add(
        self, x: Any, ids: Any = None, upsert: bool = False, deadline: float | None = None,
        attributes: dict | None = None,
    ) -> np.ndarray:
        """Add (or with ``upsert`` replace) items; ``attributes`` maps names to one value per
        item (docs/filters.md). Everything is checked before anything changes."""
        with self._write(deadline) as index:
            x = self.items.check(index, x)
            n = self.items.count(x)
            checked = self.attrs.check(attributes, n)
            if not index.is_trained:
                raise NotTrainedError(f"{type(index).__name__} must be trained before add()")
            if ids is None:
                ids = np.arange(index.next_id, index.next_id + n, dtype=np.int64)
            else:
                _check_unique(as_id_array(ids), "ids must be unique within a batch")
                ids = check_batch_ids(ids, n)
                if not upsert:
                    present = index.contains(ids)
                    if present.any():
                        raise DuplicateIdError(
                            f"ids must not already be in the collection; {int(present.sum())} "
                            f"are, e.g. id {int(ids[present][0])} (remove it first, or upsert)")
            if not n:
                return ids
            if upsert:
                def apply():
                    _upsert(index, x, ids, self.attrs, checked)
            else:
                def apply():
                    index.add(x, ids)
                    self.attrs.add(ids, checked)
            self._commit(walmod.OP_UPSERT if upsert else walmod.OP_ADD, {"n": n},
                         (self.items.to_bytes(x), ids.tobytes(), *_attributes_blob(checked)),
                         apply)
            return ids

    def remove(self, ids: Any, deadline: float | None = None, missing_ok: bool = False) -> int:
        with self._write(deadline) as index:
            ids = as_id_array(ids)
            _check_unique(ids, "ids to remove must be unique")
            present = index.contains(ids)
            if missing_ok:
                ids = ids[present]
            elif not present.all():
                raise UnknownIdError(
                    f"ids to remove must be in the collection; {int((~present).sum())} are not, "
                    f"e.g. id {int(ids[~present][0])}")
            if not ids.size:
                return 0

            def apply():
                n = index.remove(ids)
                self.attrs.remove(ids)
                return n

            return self._commit(walmod.OP_REMOVE, {"n": int(ids.size)}, (ids.tobytes(),), apply)

    def train(self, x: Any, deadline: float | None = None, **options: Any) -> None:
        """Train the index. ``options``: for string collections, ``encoder_file`` (a trained
        encoder's bytes, instead of fitting one on ``x``) and fit parameters."""
        with self._write(deadline) as index:
            if not self.items.train_replayable:  # slow and not replayable: snapshot it now
                with self._rw.write():
                    index.train(x, **options)
                try:
                    self._snapshot_locked()
                except OSError as exc:  # not durable: undo it, as if it had not happened
                    with self._rw.write():
                        self.recover()
                    raise _disk_error(exc, self.name, "the training was not kept") from None
                return
            if options:
                raise InvalidParameterError(
                    f"training options {sorted(options)} apply to string collections only")
            x = as_matrix(x, index.dim, index.metric, "training vectors")
            if not type(index).needs_training:
                return
            if x.shape[0] == 0:
                raise InvalidParameterError("training vectors must hold at least one row; got 0")
            if index.is_trained and len(index):
                raise RetrainNonEmptyError(
                    f"{type(index).__name__} holds {len(index)} items and is trained; "
                    "re-training would strand them. Remove them first, or create a new collection")
            self._commit(walmod.OP_TRAIN, {"n": int(x.shape[0])}, (x.tobytes(),),
                         lambda: index.train(x))

    # -- fenced part writes (fenced.py, docs/cluster.md "Writes") ------------------------------

    def _prepare_record(self, index: Index, term: int, attempt: int, ops: list[PartOp],
                        check: bool = True) -> tuple[dict, tuple[bytes, ...]]:
        """A prepare's log record, its ops checked (``check=False``: ops checked when they
        were prepared, logged again by a snapshot)."""
        meta, blobs = [], []
        for op in ops:
            entry = {"pseq": int(op.pseq), "remove": bool(op.remove)}
            if check:
                _check_unique(op.ids, "ids of a part op must be unique")
            if not op.remove:
                x = self.items.check(index, op.x) if check else op.x
                if self.items.count(x) != op.ids.size:
                    raise InvalidIdError(f"a part op has {op.ids.size} ids for "
                                         f"{self.items.count(x)} vectors")
                blobs.append(self.items.to_bytes(x))
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
                        state.mark_applied(through)
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
                if rec.op not in _PART_OPS:
                    continue
                for op in _replay_part(None, scratch, rec, self.items, index):
                    if op.pseq > after and (not out or size < max_bytes):
                        out.append(op)
                        size += op.ids.nbytes + (op.x.nbytes if op.x is not None else 0)
            return out, st.applied

    def _part_state(self, index: Index) -> dict:
        st = self.fenced
        return {"term": st.term, "applied": st.applied, "count": len(index)}

    def snapshot(self, deadline: float | None = None) -> int:
        """Save the index as a new generation and start an empty log. Returns the item count."""
        with self._write(deadline, part=True) as index:
            try:
                self._snapshot_locked()
            except OSError as exc:
                raise _disk_error(exc, self.name, "no snapshot was made") from None
            return len(index)

    def _snapshot_locked(self) -> None:
        """Generation g+1: its log (holding the ops a part has prepared and not yet applied),
        fencing state and attributes first, then the snapshot file, the commit point. A failure
        before the commit leaves generation g as it was."""
        g = self.generation + 1
        names = (f"wal-{g}.log", f"part-{g}.json", f"attrs-{g}.bin", f"snapshot-{g}.idx")
        for f in names:  # leftovers of an attempt that failed
            (self.path / f).unlink(missing_ok=True)
        new_wal = None
        try:
            new_wal = WriteAheadLog(self.path / f"wal-{g}.log")
            if self.fenced is not None:
                state = json.dumps(self.fenced.to_json()).encode()
                atomic_write(self.path / f"part-{g}.json", lambda f: f.write(state))
                for (term, attempt), ops in self.fenced.pending().items():
                    new_wal.append(walmod.OP_PART_PREPARE, *self._prepare_record(
                        self.index, term, attempt, ops, check=False))
            with self._rw.read():  # searches go on; writes are held by the writer lock
                self.attrs.save(self.path / f"attrs-{g}.bin")
                self.index.save(self.path / f"snapshot-{g}.idx")
        except BaseException:
            if new_wal is not None:
                new_wal.close()
            for f in names:
                (self.path / f).unlink(missing_ok=True)
            raise
        self._snapshot_bytes = (self.path / f"snapshot-{g}.idx").stat().st_size
        self._wal_base_applied = self.fenced.applied if self.fenced is not None else 0
        old_wal, old_g = self._wal, self.generation
        self._wal, self.generation = new_wal, g
        old_wal.close()
        for f in (f"snapshot-{old_g}.idx", f"wal-{old_g}.log", f"part-{old_g}.json",
                  f"attrs-{old_g}.bin"):
            (self.path / f).unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # recovery removes what a crash leaves of g
            fsync_dir(self.path)
        log.info("collection %s: snapshot generation %d (%d items)", self.name, g, len(self.index))

    def export(self, deadline: float | None = None) -> tuple[dict, bytes]:
        """Snapshot, then return the config (with a part replica's fencing state) and the
        snapshot file's bytes (for copying to another node). A part's prepared ops stay in
        its own log; the copy holds what it applied."""
        with self._write(deadline, part=True):
            try:
                self._snapshot_locked()
            except OSError as exc:
                raise _disk_error(exc, self.name, "nothing was exported") from None
            config = dict(self.config)
            if self.fenced is not None:
                config["part_state"] = self.fenced.to_json()
            config["attributes"] = base64.b64encode(
                (self.path / f"attrs-{self.generation}.bin").read_bytes()).decode()
            return config, (self.path / f"snapshot-{self.generation}.idx").read_bytes()

    def close(self) -> None:
        with self._writer:
            if self._wal is not None:
                self._wal.close()


class Store:
    """The collections under one data directory, and its blobs (a CollectionStore and a
    BlobStore, service.protocols)."""

    collection_class = Collection

    @property
    def blobs(self) -> Store:
        return self

    def collectors(self) -> tuple:
        return ()  # the per-collection gauges (service.metrics) cover a node

    def __init__(
        self, data_dir: str | os.PathLike, snapshot_wal_bytes: int = DEFAULT_SNAPSHOT_WAL_BYTES,
        limits: Limits = DEFAULT_LIMITS,
    ):
        self.limits = limits
        self.root = Path(data_dir) / "collections"
        self.root.mkdir(parents=True, exist_ok=True)
        self.snapshot_wal_bytes = snapshot_wal_bytes
        self._lock = threading.Lock()
        self._collections: dict[str, Collection] = {}
        for intent in sorted(self.root.glob(".swap-*.json")):
            self._finish_swap(intent)
        for entry in sorted(os.listdir(self.root)):
            path = self.root / entry
            if entry.startswith("."):  # an interrupted create, drop or import
                shutil.rmtree(path, ignore_errors=True)
            elif (path / "collection.json").exists():
                self._collections[entry] = self.collection_class(entry, path, snapshot_wal_bytes,
                                                                 limits)

    def get(self, name: str) -> Collection:
        try:
            return self._collections[name]
        except KeyError:
            raise CollectionNotFoundError(f"no collection named {name!r}") from None

    def names(self) -> list[str]:
        return sorted(self._collections)

    def create(self, name: str, dim: int, metric: str, kind: str, params: dict,
               schema: dict | None = None, part_replica: bool = False,
               incarnation: str = "") -> Collection:
        """A new collection; ``schema`` declares attribute types (others are inferred);
        ``part_replica``: a cluster part's replica (takes only fenced part writes), of the
        cluster collection ``incarnation``."""
        check_name(name)
        schema = check_schema(schema)
        if incarnation and not (part_replica and _INCARNATION_RE.fullmatch(str(incarnation))):
            raise InvalidParameterError(
                "incarnation belongs to part replicas only and is 1-64 hex digits (a cluster "
                f"collection's id); got {str(incarnation)[:80]!r}")
        if not isinstance(params, dict):
            raise InvalidParameterError(f"build params must be a JSON object; got {params!r}")
        try:  # validates kind, dim, metric, params
            items_of({"kind": kind}).new_index(
                {"dim": dim, "metric": metric, "kind": kind, "params": params})
        except TypeError as exc:
            raise InvalidParameterError(f"bad build parameters for kind {kind!r}: {exc}") from None
        with self._lock:
            if name in self._collections:
                raise CollectionExistsError(f"a collection named {name!r} exists already")
            tmp = self.root / f".create-{uuid.uuid4().hex}"
            tmp.mkdir()
            config = {"dim": dim, "metric": metric, "kind": kind, "params": params}
            if schema:
                config["schema"] = schema
            if part_replica:
                config["part_replica"] = True
            if incarnation:
                config["incarnation"] = str(incarnation)
            with open(tmp / "collection.json", "w") as f:
                json.dump(config, f)
                f.flush()
                os.fsync(f.fileno())
            fsync_dir(tmp)
            os.rename(tmp, self.root / name)
            fsync_dir(self.root)
            col = self.collection_class(name, self.root / name, self.snapshot_wal_bytes,
                                        self.limits)
            self._collections[name] = col
            return col

    def import_collection(self, name: str, config: dict, data: bytes) -> Collection:
        """Install a collection from another node's snapshot bytes, replacing one of that name.
        The file is verified (checksum) before anything is replaced. A part replica's copy
        carries ``part_state`` (its source's fencing state) and ``fence_term`` (the copying
        leader's term): a replica that has seen a newer term refuses it."""
        check_name(name)
        config = dict(config)
        part_state = config.pop("part_state", None)
        fence_term = int(config.pop("fence_term", 0) or 0)
        attributes = config.pop("attributes", None)
        if part_state is not None:
            config["part_replica"] = True
        with self._lock:
            old = self._collections.get(name)
            if old is not None and old.fenced is not None:
                old.fenced.check_term(fence_term)
            tmp = self.root / f".import-{uuid.uuid4().hex}"
            tmp.mkdir()
            try:
                if part_state is not None:
                    st = FencedState.from_json(part_state)
                    st.raise_term(fence_term)
                    with open(tmp / "part-1.json", "w") as f:
                        json.dump(st.to_json(), f)
                        f.flush()
                        os.fsync(f.fileno())
                with open(tmp / "collection.json", "w") as f:
                    json.dump(config, f)
                    f.flush()
                    os.fsync(f.fileno())
                snap = tmp / "snapshot-1.idx"
                with open(snap, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                items_of(config).load_index(snap, config)  # CorruptIndexError before the old
                # copy is touched
                if attributes is not None:
                    atomic_write(tmp / "attrs-1.bin",
                                 lambda f: f.write(base64.b64decode(attributes)))
                    AttributeTable.load(tmp / "attrs-1.bin")
                fsync_dir(tmp)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            old = self._collections.pop(name, None)
            if old is not None:
                old.close()
            self._swap_in(name, tmp)
            col = self.collection_class(name, self.root / name, self.snapshot_wal_bytes,
                                        self.limits)
            self._collections[name] = col
            return col

    def _swap_in(self, name: str, new: Path) -> None:
        """Put the complete directory ``new`` in place as collection ``name``, replacing one of
        that name. An intent file written first lets a restart finish the swap, so a crash at
        any step leaves the old collection or the new one whole, never neither."""
        key = new.name.rsplit("-", 1)[-1]
        intent = self.root / f".swap-{key}.json"
        text = json.dumps({"name": name, "new": new.name, "old": f".old-{key}"}).encode()
        atomic_write(intent, lambda f: f.write(text))
        _faults.point("import:intent-written")
        self._finish_swap(intent)

    def _finish_swap(self, intent: Path) -> None:
        """Carry out (or finish, after a crash) the swap an intent file describes."""
        try:
            plan = json.loads(intent.read_text())
            name, new, old = (check_name(plan[k]) if k == "name" else plan[k]
                              for k in ("name", "new", "old"))
        except (OSError, ValueError, KeyError, TypeError) as exc:  # written atomically: rare
            log.error("ignoring a damaged import intent %s: %s", intent.name, exc)
            intent.unlink(missing_ok=True)
            return
        target, new_path, old_path = self.root / name, self.root / new, self.root / old
        if new_path.exists():  # the new copy is not in place yet
            if target.exists() and not old_path.exists():
                os.rename(target, old_path)
                fsync_dir(self.root)
                _faults.point("import:old-moved-away")
            if not target.exists():
                os.rename(new_path, target)
            fsync_dir(self.root)
            _faults.point("import:new-in-place")
        intent.unlink(missing_ok=True)
        fsync_dir(self.root)
        shutil.rmtree(old_path, ignore_errors=True)

    def drop(self, name: str) -> None:
        with self._lock:
            col = self.get(name)
            del self._collections[name]
            col.close()
            trash = self.root / f".drop-{uuid.uuid4().hex}"
            os.rename(col.path, trash)
            fsync_dir(self.root)
            shutil.rmtree(trash, ignore_errors=True)

    # -- blobs (docs/service.md, "Blobs"): small named files beside the collections, e.g. the
    # Pyramid coordinators' router checkpoints; one file each, header + data, written atomically

    def _blob_path(self, name: str) -> Path:
        check_name(name, "blob name")
        return self.root.parent / "blobs" / name

    def put_blob(self, name: str, data: bytes, sha256: str) -> dict:
        """Store ``data`` as ``name`` (replacing it) once its checksum matches ``sha256``."""
        import hashlib

        path = self._blob_path(name)
        if len(data) > MAX_BLOB_BYTES:
            raise ResourceExhaustedError(
                f"a blob may hold at most {MAX_BLOB_BYTES} bytes; got {len(data)}")
        digest = hashlib.sha256(data).hexdigest()
        if digest != sha256:
            raise InvalidParameterError(
                f"blob {name!r}: the data's sha256 is {digest}, the request says {sha256!r}; "
                "nothing was stored")
        header = f"{BLOB_MAGIC} {digest} {len(data)}\n".encode()
        with self._lock:
            path.parent.mkdir(exist_ok=True)
            atomic_write(path, lambda f: (f.write(header), f.write(data)))
        return {"name": name, "size": len(data), "sha256": digest}

    def get_blob(self, name: str) -> tuple[bytes, str]:
        """``(data, sha256)``; CollectionNotFoundError if absent, DataLossError if damaged."""
        import hashlib

        path = self._blob_path(name)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise CollectionNotFoundError(f"no blob named {name!r}") from None
        head, _, data = raw.partition(b"\n")
        parts = head.decode(errors="replace").split()
        if len(parts) != 3 or parts[0] != BLOB_MAGIC or int(parts[2]) != len(data) or \
                hashlib.sha256(data).hexdigest() != parts[1]:
            raise DataLossError(f"blob {name!r} on this node is damaged (checksum mismatch)")
        return data, parts[1]

    def delete_blob(self, name: str) -> bool:
        """Remove a blob; False if there was none (deleting is idempotent)."""
        path = self._blob_path(name)
        with self._lock:
            try:
                path.unlink()
            except FileNotFoundError:
                return False
            fsync_dir(path.parent)
            return True

    def list_blobs(self) -> list[dict]:
        d = self.root.parent / "blobs"
        out = []
        for p in sorted(d.iterdir()) if d.exists() else []:
            if p.name.startswith("."):
                continue
            with open(p, "rb") as f:
                parts = f.readline().decode(errors="replace").split()
            if len(parts) == 3:
                out.append({"name": p.name, "size": int(parts[2]), "sha256": parts[1]})
        return out

    def close(self) -> None:
        with self._lock:
            for col in self._collections.values():
                col.close()
