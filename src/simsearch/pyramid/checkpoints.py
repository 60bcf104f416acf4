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

from ..service.errors import ServiceUnavailableError
from .control.errors import NotLeaderError
from .control.etcd import Compare
from .routerlog import log_key

log = logging.getLogger(__name__)

CHECKPOINT_CHUNK_BYTES = 256 << 20


def checkpoint_blobs(meta: dict) -> list[str]:
    """The blobs a checkpoint is stored as (``meta``: its ``router/<name>`` value)."""
    n = int(meta.get("chunks", 1))
    return [meta["blob"]] if n == 1 else [f"{meta['blob']}.{i}" for i in range(n)]


def read_checkpoint(pool, name: str, meta: dict) -> bytes:
    """A checkpoint's bytes from the first holder that answers, checksum checked."""
    data = None
    for sid in meta["holders"]:
        try:
            cli = pool.client(sid)
            data = b"".join(cli.get_blob(b) for b in checkpoint_blobs(meta))
            break
        except Exception as exc:  # try the next holder
            log.warning("%s: router checkpoint %s not read from shard %d: %s", name,
                        meta["blob"], sid, exc)
    if data is None:
        raise ServiceUnavailableError(
            f"{name}: no shard holding router checkpoint {meta['blob']} answered; retry")
    if hashlib.sha256(data).hexdigest() != meta["sha256"]:
        raise ServiceUnavailableError(f"{name}: router checkpoint checksum mismatch")
    return data


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
    for sid in coord.checkpoint_holders():
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
