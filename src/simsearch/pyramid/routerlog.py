"""The router's replicated log (docs/cluster.md, "Routers"): a write's routing decisions
(the records of ``router.Decision``: what ``Router.apply`` applies) as compact bytes for an
etcd value, and back.

A record holds ids, home parts, MIPS copy changes and the changed MIPS list rows; never vectors,
so a batch of 1,000 L2 items is ~16 KB. ``encode`` returns None when the records would not fit
``limit`` bytes; the leader then writes a router checkpoint instead.
"""

from __future__ import annotations

import io
import zlib

import numpy as np

#: the largest log record (etcd's default request limit is 1.5 MiB; leave room for the txn)
RECORD_LIMIT = 1 << 20


def log_key(name: str, seq: int) -> str:
    """The etcd key of collection ``name``'s log record ``seq``."""
    return f"log/{name}/{seq:012d}"


def encode(records: list[dict], limit: int = RECORD_LIMIT) -> bytes | None:
    arrays = {}
    for j, rec in enumerate(records):
        arrays[f"{j}.op"] = np.frombuffer(rec["op"].encode(), np.uint8)
        for k, v in rec.items():
            if k != "op":
                arrays[f"{j}.{k}"] = np.asarray(v)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    out = zlib.compress(buf.getvalue(), 1)
    return out if len(out) <= limit else None


def decode(data: bytes) -> list[dict]:
    with np.load(io.BytesIO(zlib.decompress(data)), allow_pickle=False) as z:
        out: dict[int, dict] = {}
        for name in z.files:
            j, k = name.split(".", 1)
            rec = out.setdefault(int(j), {})
            rec[k] = bytes(z[name]).decode() if k == "op" else z[name]
    return [out[j] for j in sorted(out)]
