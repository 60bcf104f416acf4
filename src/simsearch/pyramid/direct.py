"""Client-side routing (docs/cluster.md, "Client-side routing"): a copy of a cluster
collection's router in the caller's process, searching the shard servers directly, so a query
skips the coordinator's hop.
"""

from __future__ import annotations

from typing import Any

from ..service.client import connect
from .control.etcd import Etcd
from .control.state import ClusterState
from .index import PyramidIndex
from .shards import ShardPool


def open_router(coordinator: str, name: str, etcd: str, cluster: str,
                **pool_options: Any) -> PyramidIndex:
    """A read-only copy of collection ``name``'s router. It does not follow later writes'
    routing (send writes through a coordinator, and re-open to see them).
    ``router.parts[0].pool`` holds the connections; close it when done."""
    client = Etcd(etcd, f"simsearch/{cluster}")
    state = ClusterState(client)
    pool = ShardPool(state, **pool_options)
    pool.closers += [state.close, client.close]
    with connect(coordinator, timeout=600) as c:
        config, data = c.export_collection(name)
    return pool.router(name, config, data)
