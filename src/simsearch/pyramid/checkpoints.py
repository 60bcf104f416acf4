"""Router checkpoints (docs/cluster.md, "Routers"): a router's file stored as blobs on several
shards, and ``router/<name>`` in etcd pointing at them with the log record they cover.

A checkpoint is cut into blobs of at most ``CHECKPOINT_CHUNK_BYTES`` (a shard keeps a blob of
at most 1 GiB), so a router of any size checkpoints. Storing one points etcd at it in a
transaction fenced by the election, then drops the log records it covers, compacts etcd's
history and deletes the blobs of the checkpoint before.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging

from ..service.errors import (
    AuthenticationError,
    CollectionNotFoundError,
    DataLossError,
    PermissionDeniedError,
    ServiceUnavailableError,
)
from .control.errors import NotLeaderError
from .control.etcd import Compare
from .routerlog import log_key

log = logging.getLogger(__name__)

CHECKPOINT_CHUNK_BYTES = 256 << 20


def checkpoint_blobs(meta: dict) -> list[str]:
    """The blobs a checkpoint is stored as (``meta``: its ``router/<name>`` value)."""
    n = int(meta.get("chunks", 1))
    return [meta["blob"]] if n == 1 else [f"{meta['blob']}.{i}" for i in range(n)]


class CheckpointLostError(ServiceUnavailableError):
    """Every copy of a router checkpoint is gone (each holder retired, lost for good, or
    answering that its blobs are absent or damaged): the leader rebuilds the router from its
    parts (rebuild.py)."""


def read_checkpoint(pool, name: str, meta: dict, lost=lambda sid: False) -> bytes:
    """A checkpoint's bytes from the first holder that answers with them intact.
    CheckpointLostError when no holder has them any more (``lost(sid)``: the shard is gone for
    good); ServiceUnavailableError when some holder may yet answer."""
    gone = 0
    for sid in meta["holders"]:
        if lost(sid):
            gone += 1
            continue
        try:
            cli = pool.client(sid)
            data = b"".join(cli.get_blob(b) for b in checkpoint_blobs(meta))
        except (CollectionNotFoundError, DataLossError) as exc:
            gone += 1
            log.warning("%s: router checkpoint %s is gone from shard %d: %s", name, meta["blob"],
                        sid, exc)
            continue
        except Exception as exc:  # try the next holder
            log.warning("%s: router checkpoint %s not read from shard %d: %s", name,
                        meta["blob"], sid, exc)
            continue
        if hashlib.sha256(data).hexdigest() == meta["sha256"]:
            return data
        gone += 1
        log.warning("%s: router checkpoint %s on shard %d fails its checksum", name,
                    meta["blob"], sid)
    if gone == len(meta["holders"]):
        raise CheckpointLostError(f"{name}: every copy of router checkpoint {meta['blob']} "
                                  "is lost")
    raise ServiceUnavailableError(
        f"{name}: no shard holding router checkpoint {meta['blob']} answered; retry")


def model_blob(name: str) -> str:
    """The blob holding a collection's trained router before any item (its model: centres,
    partition, meta-HNSW), kept beside every replica of its parts for rebuild.py."""
    return f"{name}.model"


def store_model(pool, name: str, incarnation: str, data: bytes, shards) -> None:
    """Put the model on ``shards`` (at least one must take it)."""
    blob = _model_header(incarnation) + data
    took, refused = [], []
    for sid in shards:
        try:
            pool.client(sid).put_blob(model_blob(name), blob)
            took.append(sid)
        except (AuthenticationError, PermissionDeniedError) as exc:
            refused.append(sid)
            log.error("%s: shard %d refused the coordinator's shard token: %s", name, sid, exc)
        except Exception as exc:
            log.warning("%s: model not stored on shard %d: %s", name, sid, exc)
    if not took and refused:
        raise PermissionDeniedError(
            f"{name}: shards {refused} refused this coordinator's shard token; it needs the "
            "cluster role on every shard (--shard-token-file; docs/service.md, \"Security "
            "model\")")
    if not took:
        raise ServiceUnavailableError(f"{name}: no shard took the router's model")


def copy_model(pool, name: str, source: int, target: int) -> None:
    """Give shard ``target`` the model ``source`` holds (a part replica moved or re-copied
    there), unless it has it. Best effort: the checkpoints are the router's first copies."""
    blob = model_blob(name)
    try:
        cli = pool.client(target)
        if not any(b["name"] == blob for b in cli.list_blobs()):
            cli.put_blob(blob, pool.client(source).get_blob(blob))
    except Exception as exc:
        log.warning("%s: model not copied from shard %d to %d: %s", name, source, target, exc)


def read_model(pool, name: str, incarnation: str, shards) -> bytes:
    """The model of this incarnation from the first of ``shards`` that holds it."""
    head = _model_header(incarnation)
    for sid in shards:
        try:
            data = pool.client(sid).get_blob(model_blob(name))
        except Exception as exc:
            log.warning("%s: model not read from shard %d: %s", name, sid, exc)
            continue
        if data.startswith(head):
            return data[len(head):]
        log.warning("%s: the model on shard %d is another incarnation's", name, sid)
    raise ServiceUnavailableError(f"{name}: no shard holding one of its parts has its model")


def _model_header(incarnation: str) -> bytes:
    return json.dumps({"incarnation": incarnation}).encode() + b"\n"


def store_checkpoint(coord, name: str, seq: int, data: bytes) -> None:
    """Store ``data``, the router as of log record ``seq``, on the shards that take checkpoints
    (a holder counts once it took every blob), then point etcd at it (fenced), drop the log
    records it covers, compact etcd and delete the older checkpoint's blobs."""
    blob = f"{name}.router.{seq}"
    step = CHECKPOINT_CHUNK_BYTES
    meta = {"seq": seq, "blob": blob, "sha256": hashlib.sha256(data).hexdigest(),
            "size": len(data), "chunks": max(1, -(-len(data) // step))}
    view = memoryview(data)
    holders = []
    for sid in coord.rebalancer.checkpoint_holders():
        try:
            cli = coord.pool.client(sid)
            for i, b in enumerate(checkpoint_blobs(meta)):
                cli.put_blob(b, bytes(view[i * step : (i + 1) * step]))
            holders.append(sid)
        except Exception as exc:
            log.warning("%s: checkpoint not stored on shard %d: %s", name, sid, exc)
    if not holders:
        raise ServiceUnavailableError(f"{name}: no shard took the router checkpoint")
    key = f"router/{name}"
    old, rev = coord.etcd.get(key)
    old = json.loads(old) if old else None
    meta["holders"] = holders
    if not coord.etcd.cas([*coord.fence(), Compare.mod(key, rev)], {key: json.dumps(meta)}):
        raise NotLeaderError("router checkpoint refused: no longer the leader")
    coord.etcd.delete_range(f"log/{name}/", log_key(name, seq + 1))
    coord.compact()
    if old:
        for sid in old["holders"]:
            if old["blob"] == blob and sid in holders:
                continue  # the same checkpoint written again (moved off a leaving shard)
            for b in checkpoint_blobs(old):
                with contextlib.suppress(Exception):
                    coord.pool.client(sid).delete_blob(b)
    log.info("%s: router checkpoint at log record %d (%d bytes in %d blobs on shards %s)",
             name, seq, len(data), meta["chunks"], holders)
