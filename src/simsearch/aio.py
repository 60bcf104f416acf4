"""``simsearch.aio.connect``: the asyncio client of a node or a cluster (service/aio.py)."""

from .service.aio import AsyncClient, AsyncCollection, connect

__all__ = ["AsyncClient", "AsyncCollection", "connect"]
