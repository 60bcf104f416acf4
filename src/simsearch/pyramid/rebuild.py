"""Rebuilding a router from its parts when every copy of its checkpoint is lost (docs/cluster.md,
"Routers"): the model (kept beside every part replica, checkpoints.model_blob), the parts'
committed sequences (the log's tail and what the replicas applied), and the placement planned
afresh from the items the parts hold.

The leader (collection.py, ``_rebuild``) loads the model, brings the replicas to their
sequences, reads each part's items, plans their placement on the empty router, and commits
that plan as one write whose part ops take away what a part holds but should not and add what
it lacks (MIPS copies the fresh plan lists); the write's router is stored as a checkpoint.
"""

from __future__ import annotations

import base64
import logging
import tempfile
from pathlib import Path

import numpy as np

from ..index import loads
from ..service.attributes import AttributeTable
from ..service.errors import ServiceUnavailableError
from . import routerlog
from .replication import PartSequences
from .router import Decision
from .routerlog import log_key

log = logging.getLogger(__name__)


def part_shards(coord, name: str) -> list[int]:
    """Every shard the map gives a replica of one of ``name``'s parts."""
    prefix = f"{name}.p"
    return sorted({s for p, sids in coord.state.all_parts().items() if p.startswith(prefix)
                   for s in sids})


def committed_sequences(coord, name: str, parts, since: int) -> tuple[PartSequences, int]:
    """(the parts' committed sequences, the log's last record) from the log records after
    ``since`` (the lost checkpoint's) and the sequences the replicas applied. Refuses while so
    many replicas of a part are down that an acknowledged write might be on none of the others
    (fewer than replicas - ``--min-insync-replicas`` + 1 up)."""
    seqs, last = PartSequences.empty(len(parts)), since
    for key, value, _ in coord.etcd.get_from(f"log/{name}/", log_key(name, since + 1)):
        last = int(key.rsplit("/", 1)[1])
        for rec in routerlog.decode(value):
            if rec["op"] == "seq":
                seqs = seqs.committed(rec)
    pool, need = coord.pool, coord.min_insync_replicas()
    applied = seqs.seq.copy()
    for j, part in enumerate(parts):
        shards = part.shards
        up = [s for s in shards if pool.up.get(s)]
        if len(up) < len(shards) - need + 1:
            raise ServiceUnavailableError(
                f"{name}: rebuilding its router waits for the replicas of {part.name} "
                f"(up: {up} of {shards}); retry")
        for sid in up:
            applied[j] = max(applied[j], pool.client(sid).part_ops(part.name, 2**62)[1])
    return PartSequences(applied, seqs.history), last


def read_items(coord, parts) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, dict | None]:
    """(the sorted ids each part holds, every held id once, their vectors, their attributes
    ({name: one value per id}, None without any)), each part read from an in-sync replica."""
    pool = coord.pool
    held, got_ids, got_x, rows = [], [], [], []
    for part in parts:
        sources = [s for s in part.shards if pool.up.get(s) and pool.in_sync(part.name, s)]
        if not sources:
            raise ServiceUnavailableError(f"{part.name}: no in-sync replica is up to read; retry")
        config, data = pool.client(sources[0]).export_collection(part.name)
        idx = loads(data)
        ids = idx.ids()
        held.append(ids)
        got_ids.append(ids)
        got_x.append(idx.get_vectors(ids))
        rows.append(_attribute_rows(config, ids))
    all_ids = np.concatenate(got_ids) if got_ids else np.empty(0, np.int64)
    ids, first = np.unique(all_ids, return_index=True)  # a MIPS copy: the same item again
    x = np.concatenate(got_x)[first] if got_x else None
    names = sorted({n for r in rows for n in r})
    attributes = None
    if names:
        flat = {n: [v for r, i in zip(rows, got_ids, strict=True)
                    for v in r.get(n, [None] * i.size)] for n in names}
        attributes = {n: [flat[n][j] for j in first.tolist()] for n in names}
    return held, ids, x, attributes


def _attribute_rows(config: dict, ids: np.ndarray) -> dict[str, list]:
    raw = base64.b64decode(config.get("attributes") or "")
    if not raw:
        return {}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "attrs.bin"
        path.write_bytes(raw)
        table = AttributeTable.load(path)
    have = np.isin(ids, table.ids)
    known = table.rows_of(ids[have])
    out = {n: [None] * ids.size for n in known}
    for n, vals in known.items():
        for r, v in zip(np.flatnonzero(have).tolist(), vals, strict=True):
            out[n][r] = v
    return out


def plan(router, held: list[np.ndarray], ids: np.ndarray, x: np.ndarray) -> Decision:
    """The placement of ``ids`` planned on the empty ``router`` as a write, with the part jobs
    that make each part hold exactly what the plan gives it."""
    decision = router.plan_add(x, ids)
    want = router.apply(decision.record).members()
    row = {i: r for r, i in enumerate(ids.tolist())}
    jobs = []
    for p, (have, need) in enumerate(zip(held, want, strict=True)):
        extra = np.setdiff1d(have, need)
        lack = np.setdiff1d(need, have)
        if extra.size:
            jobs.append((p, "remove", (extra,)))
        if lack.size:
            jobs.append((p, "add", (x[[row[i] for i in lack.tolist()]], lack)))
    return Decision(decision.record, jobs)
