"""A durable named collection on disk: an index, its write-ahead log, snapshots (the node's
Store keeps them and says where their files are, store.py; a cluster part's replica is a
PartReplica, partreplica.py).

State = the newest snapshot (or an empty index at g = 0) + replay of its log. A snapshot writes
wal-<g+1> (with a part's prepared, unapplied ops), the fencing state and attributes, then
snapshot-<g+1> (the commit point), then deletes generation g: a crash or a failure at any point
leaves either the old generation or the new one, both complete.

Every write is checked whole, appended to the log and fsynced, then applied to the in-memory
index and acknowledged: a search never sees a write the log does not hold, and a failed append
(a full disk) changes nothing. Writes on a collection are serialized; searches run concurrently
with each other and wait only while a write changes the index (docs/service.md,
"Durability").
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from .._durable import fsync_dir
from .._rwlock import RWLock
from .._validate import check_batch_ids
from ..errors import (
    CorruptIndexError,
    DuplicateIdError,
    InvalidParameterError,
    NotTrainedError,
    RepeatedIdError,
    RetrainNonEmptyError,
    SimsearchError,
    UnknownIdError,
    UnsupportedOperationError,
)
from ..filters import in_sorted
from ..index import (
    Index,
    SearchResult,
    as_id_array,
    create_index,
    load,
)
from . import wal as walmod
from .attributes import AttributeTable
from .errors import (
    DataLossError,
    DeadlineExceededError,
    NotPartReplicaError,
    ResourceExhaustedError,
    ServiceUnavailableError,
)
from .limits import DEFAULT_LIMITS, Limits
from .paging import fit_rows
from .wal import WriteAheadLog

log = logging.getLogger(__name__)

_SNAP_RE = re.compile(r"^snapshot-(\d+)\.idx$")
_WAL_RE = re.compile(r"^wal-(\d+)\.log$")
_PART_RE = re.compile(r"^part-(\d+)\.json$")
_ATTR_RE = re.compile(r"^attrs-(\d+)\.bin$")
PART_OPS = (walmod.OP_PART_PREPARE, walmod.OP_PART_SYNC)  # a part replica's log records
DEFAULT_SNAPSHOT_WAL_BYTES = 256 << 20
#: after an automatic snapshot failed (a full disk): seconds before the next try
SNAPSHOT_RETRY_SECONDS = 5
# A log is also snapshotted once it outgrows the snapshot it follows (and this floor): replaying it
# then costs about one rebuild of what the collection holds, however long the collection churns.
# The soak found restarts taking minutes under add/remove churn below the byte cap.
MIN_SNAPSHOT_WAL_BYTES = 16 << 20



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
    return min(left, threading.TIMEOUT_MAX)


def _and_allow(allow: Any, matched: np.ndarray) -> Any:
    """An allow list (None, one array, or one per query) narrowed to the ids a where matched."""
    if allow is None:
        return matched
    if isinstance(allow, list):
        return [np.intersect1d(np.asarray(a, np.int64), matched) for a in allow]
    return np.intersect1d(np.asarray(allow, np.int64), matched)


def check_unique(ids: np.ndarray, what: str) -> None:
    """A batch that repeats an id: RepeatedIdError, as in process."""
    uniq, counts = np.unique(ids, return_counts=True)
    if uniq.size != ids.size:
        raise RepeatedIdError(f"{what}; id {int(uniq[counts > 1][0])} repeats")


def upsert_items(index: Index, x: Any, ids: np.ndarray, attrs: AttributeTable | None = None,
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


def _apply(index: Index, rec: walmod.Record, attrs: AttributeTable) -> None:
    """Replay one log record."""
    if rec.op == walmod.OP_REMOVE:
        ids = np.frombuffer(rec.blobs[0], np.int64)
        index.remove(ids)
        attrs.remove(ids)
        return
    x = index.items_from_bytes(rec.blobs[0])
    if rec.op == walmod.OP_TRAIN:
        index.train(x)
    elif rec.op == walmod.OP_ADD:
        ids = np.frombuffer(rec.blobs[1], np.int64)
        index.add(x, ids)
        attrs.add(ids, _attributes_of(rec))
    elif rec.op == walmod.OP_UPSERT:
        upsert_items(index, x, np.frombuffer(rec.blobs[1], np.int64), attrs, _attributes_of(rec))
    else:
        raise ValueError(f"unknown log op {rec.op}")


def is_config(config: Any) -> bool:
    """Whether ``config`` has the shape of a collection.json (dim, metric, kind, params)."""
    return (isinstance(config, dict)
            and type(config.get("dim")) is int
            and isinstance(config.get("metric"), str)
            and isinstance(config.get("kind"), str)
            and isinstance(config.get("params"), dict))


def _read_config(path: Path) -> dict:
    """A collection's collection.json, checked: ValueError if it is not one."""
    config = json.loads(path.read_text())
    if not is_config(config):
        raise ValueError(f"{path} is not a collection config (dim, metric, kind, params)")
    return config


class Collection:
    """One named index with its log. Thread-safe. An ordinary collection refuses a cluster
    part's fenced writes; a part's replica is the subclass PartReplica (partreplica.py), which
    takes those and nothing else."""

    def __init__(self, name: str, path: Path, snapshot_wal_bytes: int = DEFAULT_SNAPSHOT_WAL_BYTES,
                 limits: Limits = DEFAULT_LIMITS, durable: bool = True):
        self.name = name
        # False (":memory:"): the log is written but never fsynced; it lives as long as the
        # process, and only serves to undo a write that failed while applied
        self.durable = durable
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
        self.part_records = False  # its log holds part writes: it is a PartReplica (Store)
        try:
            self.config = _read_config(path / "collection.json")
        except (OSError, ValueError) as exc:  # this collection is lost, the node's others serve
            self.config = {}
            self._mark_damaged(f"collection {name!r} has an unreadable collection.json", exc)
            return
        self.recover()

    # -- recovery ---------------------------------------------------------------------------

    def _new_index(self) -> Index:
        c = self.config
        return create_index(c["kind"], c["dim"], c["metric"], **c["params"])

    def _load_index(self, path: Path) -> Index:
        """Restore a snapshot."""
        return load(path)

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
            state = self._load_state(g)
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
                state = self._replay(index, rec, attrs, state)
        except walmod.WalCorruptError as exc:  # its message names the file and offset only
            self._mark_damaged(f"collection {self.name!r} failed a checksum on recovery: {exc}",
                               exc)
            return
        except CorruptIndexError as exc:
            self._mark_damaged(f"collection {self.name!r} failed a checksum on recovery", exc)
            return
        except MemoryError as exc:  # the files are as they were: not damage
            self._mark_damaged(f"collection {self.name!r} could not be loaded: out of memory", exc,
                               "its files are intact: restart the node with more memory free")
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
        self._keep_state(state)
        self._snapshot_bytes = (self.path / f"snapshot-{g}.idx").stat().st_size if g else 0
        try:
            self._wal = WriteAheadLog(self.path / f"wal-{g}.log")
        except OSError as exc:  # out of file descriptors: this collection, not the node
            self._mark_damaged(f"collection {self.name!r} could not open its log ({exc})", exc,
                               "its files are intact: raise the node's open-file limit "
                               "(ulimit -n) and restart it")
            return
        log.info(
            "collection %s: %d items (generation %d, %d log records)",
            self.name,
            len(index),
            g,
            len(records),
        )

    # hooks of a collection with state beside its index (PartReplica: the fencing state)
    def _load_state(self, g: int) -> Any:
        """The state kept beside snapshot ``g`` (None here)."""
        return None

    def _replay(self, index: Index, rec: walmod.Record, attrs: AttributeTable, state: Any
                ) -> Any:
        """Apply one log record in recovery; returns the state after it."""
        if rec.op in PART_OPS:  # a part written before part replicas were declared
            self.part_records = True
            raise ValueError("its log holds a cluster part's writes")
        _apply(index, rec, attrs)
        return state

    def _keep_state(self, state: Any) -> None:
        """Keep what recovery rebuilt beside the index."""

    def _mark_damaged(self, why: str, exc: BaseException,
                      advice: str = "restore it from a backup") -> None:
        log.error("%s: %s", why, exc)
        self.index, self.damaged = None, f"{why}; {advice}"

    def _index(self) -> Index:
        if self.damaged or self.index is None:
            raise DataLossError(self.damaged or
                                "collection is unavailable; restore it from a backup")
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
        caps = index.capabilities
        out.update(
            count=len(index),
            trained=index.is_trained,
            needs_training=caps.needs_training,
            supports_remove=caps.supports_remove,
            # the instance's: a pyramid widens its class's with its sub-index's
            search_params=sorted(caps.search_params),
            schema=dict(self.attrs.schema),
            incarnation=str(self.config.get("incarnation", "")),
        )
        return out

    def search(self, q: Any, k: int, *, allow: Any = None, deny: Any = None,
               where: dict | None = None, deadline: float | None = None,
               **params: Any) -> SearchResult:
        """``Index.search``; ``where`` is answered from the attributes (docs/filters.md)."""
        self._rw.acquire_read(deadline)  # not `with`: a search is hot (as in Index.search)
        try:
            index = self._index()
            if where is not None:
                allow = _and_allow(allow, self.attrs.where(where, deadline))
            return index.search(q, k, allow=allow, deny=deny, deadline=deadline, **params)
        finally:
            self._rw.release_read()

    def get(self, ids: Any = None, vectors: bool = False, where: dict | None = None,
            deadline: float | None = None, offset: int = 0,
            max_bytes: int | None = None) -> dict:
        """The asked ``ids`` this collection holds, in the order asked (others are skipped),
        or with ``ids=None`` every item (sorted); of those, only the ones ``where`` selects;
        with their attributes ({name: one value per id, None where it has none}) and, when
        ``vectors``, their stored vectors: ``{"ids", "attributes", "vectors", "next"}``.
        From the ``offset``-th selected item, as many as fit ``max_bytes`` (paging.py);
        ``next``: where the next page starts, 0 after the last."""
        with self._rw.read(deadline):
            index = self._index()
            if ids is None:
                held = index.ids()
            else:
                ids = as_id_array(ids)
                held = ids[index.contains(ids)] if ids.size else ids
            if where is not None:
                held = held[in_sorted(self.attrs.where(where, deadline), held)]
            if vectors and index.capabilities.items != "vectors":
                raise UnsupportedOperationError(f"collection {self.name!r} holds strings, "
                                                "not vectors")
            held = held[offset:]
            n, attrs = fit_rows(held.size, (index.dim * 4 if vectors else 0) + 8,
                                lambda m: self.attrs.rows_of(held[:m]), max_bytes)
            x = index.get_vectors(held[:n]) if vectors else None
            return {"ids": held[:n], "attributes": attrs, "vectors": x,
                    "next": offset + n if n < held.size else 0}

    # -- writes -----------------------------------------------------------------------------

    @contextmanager
    def _write(self, deadline: float | None, part: bool | str = False):
        """One write at a time. A part replica takes only fenced part writes (``part`` true);
        ``part="only"``: a fenced part write, refused by an ordinary collection."""
        if not self._writer.acquire(timeout=_timeout(deadline)):
            raise DeadlineExceededError("the call's deadline passed while waiting for other writes")
        try:
            index = self._index()
            self._check_writer(part)
            yield index
        finally:
            self._writer.release()

    def _check_writer(self, part: bool | str) -> None:
        """Refuse a write this class does not take (``_write``'s ``part``)."""
        if part == "only":
            raise NotPartReplicaError(
                f"collection {self.name!r} is not a Pyramid part replica: part writes go "
                "only to collections a cluster created as parts")

    def _commit(self, op: int, meta: dict, blobs: tuple[bytes, ...], apply: Callable[[], Any],
                sync: bool = True) -> Any:
        """Log a checked write, then apply it (``apply()``, under the exclusive lock): searches
        never see a write that is not in the log. A failed append changes nothing (a full disk
        is ResourceExhaustedError, other I/O errors ServiceUnavailableError); an apply that
        fails takes its record out of the log again and reloads the index from disk, where the
        write is not: a failure half-way (out of memory) must not leave part of a refused write
        searchable, to be saved by the next snapshot and duplicated by the caller's retry."""
        mark = self._wal.size()
        try:
            self._wal.append(op, meta, blobs, sync and self.durable)
        except OSError as exc:
            raise _disk_error(exc, self.name, "the write was not made") from None
        with self._rw.write():
            try:
                result = apply()
            except BaseException as exc:  # still exclusive: no search meets the half-applied
                try:
                    self._wal.cut_to(mark)
                except OSError:  # the record stays, and the reload below applies all of it
                    log.exception("collection %s: could not take a failed write out of its "
                                  "log", self.name)
                self._reload_after(exc)
                raise
        self._maybe_snapshot()
        return result

    def _reload_after(self, exc: BaseException) -> None:
        """Rebuild the index from its snapshot and log after a write failed while applying
        (the caller may hold the exclusive lock: it is re-entrant); out of memory is then
        ResourceExhaustedError (the caller may retry), not INTERNAL."""
        log.error("collection %s: a write failed while being applied (%s: %s); reloading "
                  "the index from disk", self.name, type(exc).__name__, exc)
        with self._rw.write():
            self.recover()
        if isinstance(exc, MemoryError):
            raise ResourceExhaustedError(
                f"collection {self.name!r}: the server ran out of memory applying the write; "
                "nothing of it was kept") from None

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
            x = index.check_items(x)
            n = len(x)
            checked = self.attrs.check(attributes, n)
            if not index.is_trained:
                raise NotTrainedError(f"{type(index).__name__} must be trained before add()")
            if ids is None:
                ids = np.arange(index.next_id, index.next_id + n, dtype=np.int64)
            else:
                check_unique(as_id_array(ids), "ids must be unique within a batch")
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
                    upsert_items(index, x, ids, self.attrs, checked)
            else:
                def apply():
                    index.add(x, ids)
                    self.attrs.add(ids, checked)
            self._commit(walmod.OP_UPSERT if upsert else walmod.OP_ADD, {"n": n},
                         (index.item_bytes(x), ids.tobytes(), *_attributes_blob(checked)),
                         apply)
            return ids

    def remove(self, ids: Any, deadline: float | None = None, missing_ok: bool = False) -> int:
        with self._write(deadline) as index:
            ids = as_id_array(ids)
            check_unique(ids, "ids to remove must be unique")
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
        """Train the index; ``options``: its kind's ``train_options`` (a string index's
        ``encoder_file`` and fit parameters)."""
        with self._write(deadline) as index:
            if not index.capabilities.train_logged:  # slow and not replayable: snapshot it now
                try:
                    with self._rw.write():
                        index.train(x, **options)
                except SimsearchError:
                    raise  # refused before the index changed (Index.train checks first)
                except BaseException as exc:
                    self._reload_after(exc)
                    raise
                try:
                    self._snapshot_locked()
                except OSError as exc:  # not durable: undo it, as if it had not happened
                    with self._rw.write():
                        self.recover()
                    raise _disk_error(exc, self.name, "the training was not kept") from None
                return
            if options:
                raise InvalidParameterError(
                    f"{type(index).__name__} takes no training options; got {sorted(options)}")
            x = index.check_items(x, "training vectors")
            if not index.capabilities.needs_training:
                return
            if len(x) == 0:
                raise InvalidParameterError("training vectors must hold at least one; got 0")
            if index.is_trained and len(index):
                raise RetrainNonEmptyError(
                    f"{type(index).__name__} holds {len(index)} items and is trained; "
                    "re-training would strand them. Remove them first, or create a new collection")
            self._commit(walmod.OP_TRAIN, {"n": len(x)}, (index.item_bytes(x),),
                         lambda: index.train(x))

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
            self._snapshot_state(g, new_wal)
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
        self._snapshot_done()
        old_wal, old_g = self._wal, self.generation
        self._wal, self.generation = new_wal, g
        old_wal.close()
        for f in (f"snapshot-{old_g}.idx", f"wal-{old_g}.log", f"part-{old_g}.json",
                  f"attrs-{old_g}.bin"):
            (self.path / f).unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # recovery removes what a crash leaves of g
            fsync_dir(self.path)
        log.info("collection %s: snapshot generation %d (%d items)", self.name, g, len(self.index))

    def _snapshot_state(self, g: int, new_wal: WriteAheadLog) -> None:
        """Write the state kept beside snapshot ``g`` (before the snapshot file, the commit)."""

    def _snapshot_done(self) -> None:
        """Generation g's snapshot is in place."""

    def _export_config(self) -> dict:
        return dict(self.config)

    def export(self, deadline: float | None = None) -> tuple[dict, bytes]:
        """Snapshot, then return the config and the snapshot file's bytes (for copying to
        another node)."""
        with self._write(deadline, part=True):
            try:
                self._snapshot_locked()
            except OSError as exc:
                raise _disk_error(exc, self.name, "nothing was exported") from None
            config = self._export_config()
            config["attributes"] = base64.b64encode(
                (self.path / f"attrs-{self.generation}.bin").read_bytes()).decode()
            return config, (self.path / f"snapshot-{self.generation}.idx").read_bytes()

    def close(self) -> None:
        with self._writer:
            if self._wal is not None:
                self._wal.close()
