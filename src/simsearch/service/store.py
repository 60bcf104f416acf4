"""The collections under one data directory, and its blobs (a CollectionStore and a BlobStore,
service.protocols).

Layout under the data directory::

    collections/<name>/collection.json     dim, metric, kind, build params (written once)
    collections/<name>/snapshot-<g>.idx    the index as of generation g (Index.save: atomic)
    collections/<name>/wal-<g>.log         every write since snapshot g (see wal.py)
    collections/<name>/part-<g>.json       a Pyramid part replica's fencing state as of snapshot g
                                           (fenced.py; written before snapshot-<g>.idx)
    blobs/<name>                           small named files (router checkpoints)

A collection is a Collection (collection.py), or a PartReplica (partreplica.py) when a cluster
created or copied it as a part's replica. Create, drop and import are atomic: a directory is
made whole under a temporary name and renamed; an import swaps directories through an intent
file a restart finishes (docs/service.md, "Durability").
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import uuid
from pathlib import Path

from .. import _faults
from .._durable import atomic_write, fsync_dir, write_bytes, write_json
from ..errors import InvalidParameterError
from ..index import create_index
from .attributes import check_schema
from .collection import DEFAULT_SNAPSHOT_WAL_BYTES, Collection, is_config
from .dirlock import DirectoryLock
from .errors import (
    CollectionExistsError,
    CollectionNotFoundError,
    DataLossError,
    ResourceExhaustedError,
)
from .fenced import FencedState
from .limits import DEFAULT_LIMITS, Limits, check_name
from .partreplica import PartReplica

log = logging.getLogger(__name__)

_INCARNATION_RE = re.compile(r"[0-9a-f]{1,64}")
#: blobs (the cluster's router checkpoints) are bounded: one is read whole into memory
MAX_BLOB_BYTES = 1 << 30
BLOB_MAGIC = "SSBLOB1"


class Store:
    """The collections under one data directory, and its blobs (a CollectionStore and a
    BlobStore, service.protocols)."""

    @property
    def blobs(self) -> Store:
        return self

    def collectors(self) -> tuple:
        return ()  # the per-collection gauges (service.metrics) cover a node

    def __init__(
        self, data_dir: str | os.PathLike, snapshot_wal_bytes: int = DEFAULT_SNAPSHOT_WAL_BYTES,
        limits: Limits = DEFAULT_LIMITS, durable: bool = True,
    ):
        self.limits = limits
        self.durable = durable  # False: a ":memory:" store, whose logs are never fsynced
        # before anything is read or cleaned up: the temporary directories below are another
        # owner's writes in flight if there is one
        self._dir_lock = DirectoryLock(data_dir)
        self.root = Path(data_dir) / "collections"
        self.root.mkdir(parents=True, exist_ok=True)
        self.snapshot_wal_bytes = snapshot_wal_bytes
        self._lock = threading.Lock()
        self._collections: dict[str, Collection] = {}
        try:
            for intent in sorted(self.root.glob(".swap-*.json")):
                self._finish_swap(intent)
            for entry in sorted(os.listdir(self.root)):
                path = self.root / entry
                if entry.startswith("."):  # an interrupted create, drop or import
                    shutil.rmtree(path, ignore_errors=True)
                elif (path / "collection.json").exists():
                    self._collections[entry] = self._open(entry, path)
        except BaseException:
            self._dir_lock.release()
            raise

    def _open(self, name: str, path: Path) -> Collection:
        """A collection is what it was created or copied as: a part's replica when its config
        says so, or (a part written before part replicas were declared) when it keeps a
        fencing state or its log holds part writes."""
        try:
            part = bool(json.loads((path / "collection.json").read_text()).get("part_replica"))
        except (OSError, ValueError, AttributeError):  # Collection reports the damage
            part = False
        part = part or any(path.glob("part-*.json"))
        col = (PartReplica if part else Collection)(name, path, self.snapshot_wal_bytes,
                                                    self.limits, self.durable)
        if not part and col.part_records:
            col = PartReplica(name, path, self.snapshot_wal_bytes, self.limits, self.durable)
        return col

    def get(self, name: str) -> Collection:
        try:
            return self._collections[name]
        except KeyError:
            raise CollectionNotFoundError(f"no collection named {name!r}") from None

    def names(self) -> list[str]:
        return sorted(self._collections)

    def has(self, name: str) -> bool:
        return name in self._collections

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
            create_index(kind, dim, metric, **params)
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
            write_json(tmp / "collection.json", config)
            os.rename(tmp, self.root / name)
            fsync_dir(self.root)
            col = self._open(name, self.root / name)
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
            if isinstance(old, PartReplica) and old.fenced is not None:
                old.fenced.check_term(fence_term)
            tmp = self.root / f".import-{uuid.uuid4().hex}"
            tmp.mkdir()
            try:
                if part_state is not None:
                    st = FencedState.from_json(part_state)
                    st.raise_term(fence_term)
                    write_json(tmp / "part-1.json", st.to_json())
                write_json(tmp / "collection.json", config)
                write_bytes(tmp / "snapshot-1.idx", data)
                if attributes is not None:
                    write_bytes(tmp / "attrs-1.bin", base64.b64decode(attributes))
                # before the old copy is touched (each write above fsynced the directory)
                self._check_openable(name, tmp, config)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            old = self._collections.pop(name, None)
            if old is not None:
                old.close()
            self._swap_in(name, tmp)
            col = self._open(name, self.root / name)
            self._collections[name] = col
            return col

    def _check_openable(self, name: str, path: Path, config: dict) -> None:
        """Open the collection at ``path`` as a restart would (its config, snapshot, attributes
        and log) and check that the config describes the snapshot; InvalidParameterError
        otherwise (DataLossError for damaged bytes). A restore must refuse what it cannot
        serve before it replaces anything."""
        if not is_config(config):
            raise InvalidParameterError(
                f"the copy of collection {name!r} has a malformed config (it needs dim: an "
                f"integer, metric and kind: strings, params: an object); got {config!r:.200}; "
                "nothing was replaced")
        probe = self._open(name, path)
        try:
            if probe.damaged:
                raise DataLossError(
                    f"the copy of collection {name!r} cannot be served ({probe.damaged}); "
                    "nothing was replaced")
            index = probe.index
            if (index.dim, index.metric, index.kind) != (config["dim"], config["metric"],
                                                         config["kind"]):
                raise InvalidParameterError(
                    f"the copy of collection {name!r} says dim={config['dim']!r}, "
                    f"metric={config['metric']!r}, kind={config['kind']!r}, but its snapshot "
                    f"holds dim={index.dim}, metric={index.metric!r}, kind={index.kind!r}; "
                    "nothing was replaced")
        finally:
            probe.close()

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
            self._dir_lock.release()
