"""The asyncio client (``simsearch.aio.connect``): the sync client's surface over grpc.aio,
running the same plans (requests.py), with the same fail-over across several addresses and the
same retries.

    import simsearch.aio

    async with simsearch.aio.connect("127.0.0.1:50051") as client:
        col = await client.create_collection("docs", 64, "ip", "hnsw")
        await col.add(x)
        res = await col.search(q, 10, ef=64)
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidParameterError
from ..index import SearchResult, check_deadline
from . import client as sync
from .requests import ClientRequests, CollectionRequests, arun, describe_info

#: calls one AsyncClient keeps in flight at most (a node sheds past its
#: --max-concurrent-rpcs, 64 by default): a gather of hundreds of searches queues here
MAX_IN_FLIGHT = 32


def connect(address: str | Sequence[str], token: str | None = None, tls_ca: Any = None, *,
            timeout: float = 60.0, tls_server_name: str | None = None,
            max_message_bytes: int | None = None, retries: bool = True,
            max_in_flight: int = MAX_IN_FLIGHT) -> AsyncClient:
    """As ``simsearch.connect`` for a node or a cluster's coordinators (one address, or
    several to fail over between), with coroutine methods. Use ``async with`` (or ``await
    client.close()``). At most ``max_in_flight`` calls run at once; more wait their turn, and
    a call the server sheds anyway is sent again after a backoff."""
    return AsyncClient(address, token, tls_ca, timeout=timeout, tls_server_name=tls_server_name,
                       max_message_bytes=max_message_bytes, retries=retries,
                       max_in_flight=max_in_flight)


class AsyncClient(ClientRequests):
    """A connection to a node over grpc.aio; share one per event loop.

    >>> import numpy as np, simsearch as ss
    >>> x = np.random.default_rng(0).standard_normal((1000, 16)).astype("float32")
    >>> import asyncio, tempfile
    >>> import simsearch.aio
    >>> from simsearch.service.server import create_server
    >>> server = create_server(tempfile.mkdtemp(), port=0)
    >>> async def main():
    ...     async with simsearch.aio.connect(f"127.0.0.1:{server.port}") as client:
    ...         col = await client.create_collection("docs", 16, "l2", "flat")
    ...         await col.add(x[:20])
    ...         found = await asyncio.gather(*(col.search(x[i], k=1) for i in range(3)))
    ...         return [r.ids[0, 0].item() for r in found]
    >>> asyncio.run(main())
    [0, 1, 2]
    >>> server.stop()
    """

    def __init__(self, address, token=None, tls_ca=None, *, timeout: float = 60.0,
                 tls_server_name: str | None = None, max_message_bytes: int | None = None,
                 retries: bool = True, max_in_flight: int = MAX_IN_FLIGHT):
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        from . import convert
        from .protos.simsearch.v1 import simsearch_pb2 as pb
        from .protos.simsearch.v1 import simsearch_pb2_grpc as pb_grpc

        self._grpc, self._pb, self._convert, self._health_pb2 = grpc, pb, convert, health_pb2
        self.address, self.timeout = address, timeout
        target = sync._target(address)
        self._failover = target.startswith(("ipv4:", "ipv6:"))
        options = sync.channel_options(retries)
        if tls_ca is not None:
            ca = tls_ca if isinstance(tls_ca, bytes) else open(tls_ca, "rb").read()
            if tls_server_name:
                options.append(("grpc.ssl_target_name_override", tls_server_name))
            self._channel = grpc.aio.secure_channel(
                target, grpc.ssl_channel_credentials(root_certificates=ca), options=options)
        else:
            self._channel = grpc.aio.insecure_channel(target, options=options)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._stub = pb_grpc.SimSearchStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._max_message_bytes = max_message_bytes
        self.retry_attempts = sync.RETRY_ATTEMPTS if retries else 1
        if not (isinstance(max_in_flight, int) and max_in_flight >= 1):
            raise InvalidParameterError(f"max_in_flight must be an integer >= 1; got "
                                        f"{max_in_flight!r}")
        self._slots = asyncio.Semaphore(max_in_flight)

    async def _call(self, method: str, request, idempotent: bool = False,
                    deadline: float | None = None):
        """One call; an idempotent write is retried on UNAVAILABLE like the reads grpc
        retries (Client._call)."""
        attempts = self.retry_attempts if idempotent else 1
        for attempt in range(sync.SHED_ATTEMPTS):
            timeout = self.timeout if deadline is None else \
                max(0.001, min(self.timeout, deadline - time.monotonic()))
            try:
                async with self._slots:
                    return await getattr(self._stub, method)(
                        request, timeout=timeout, metadata=self._metadata,
                        wait_for_ready=self._failover and (idempotent or
                                                           method in sync._RETRIED))
            except self._grpc.aio.AioRpcError as err:
                wait = sync.retry_after(err, attempt, attempts)
                if wait is None:
                    raise sync.error_from(err) from None
                await asyncio.sleep(wait)

    async def _run(self, plan, deadline: float | None = None):
        if deadline is None:
            return await arun(plan, self._call)
        check_deadline(deadline)
        return await arun(plan, functools.partial(self._call, deadline=deadline))

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def server_info(self) -> dict[str, Any]:
        return await self._run(self._server_info_plan())

    async def health(self, service: str = "") -> str:
        """The standard health check's status name, e.g. "SERVING"."""
        try:
            r = await self._health.Check(self._health_pb2.HealthCheckRequest(service=service),
                                         timeout=self.timeout)
        except self._grpc.aio.AioRpcError as err:
            raise sync.error_from(err) from None
        return self._health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)

    async def create_collection(self, name: str, dim: int, metric: str = "l2",
                                kind: str = "flat", schema: dict[str, str] | None = None,
                                **build_params: Any) -> AsyncCollection:
        return AsyncCollection(self, await self._run(self._create_plan(
            name, dim, metric, kind, schema, False, "", build_params)))

    async def collection(self, name: str) -> AsyncCollection:
        return AsyncCollection(self, await self._run(self._describe_plan(name)))

    async def drop_collection(self, name: str) -> None:
        await self._run(self._drop_plan(name))

    async def list_collections(self) -> list[str]:
        return await self._run(self._list_plan())


class AsyncCollection(CollectionRequests):
    """``RemoteCollection``'s surface with coroutine methods (``count()`` for ``len``).

    >>> import asyncio, tempfile, numpy as np, simsearch.aio
    >>> from simsearch.service.server import create_server
    >>> node = create_server(tempfile.mkdtemp(), port=0)
    >>> async def items_left(address: str):
    ...     client = simsearch.aio.connect(address)
    ...     col = await client.create_collection("docs", 2, "l2", "flat")
    ...     await col.add(np.eye(2, dtype="float32"), attributes={"n": [1, 2]})
    ...     selected = (await col.get(where={"n": 2}))["ids"].tolist()
    ...     removed = await col.remove([0])
    ...     left = await col.count()
    ...     await client.close()
    ...     return selected, removed, left
    >>> asyncio.run(items_left(f"127.0.0.1:{node.port}"))
    ([1], 1, 1)
    >>> node.stop()
    """

    def __repr__(self) -> str:
        return (f"AsyncCollection({self.name!r} at {self._client.address}, kind={self.kind!r}, "
                f"dim={self.dim}, metric={self.metric!r})")

    async def describe(self) -> dict[str, Any]:
        return describe_info(await self._client._run(self._info_plan()))

    async def count(self) -> int:
        return int((await self._client._run(self._info_plan())).count)

    async def train(self, x: Any = None, encoder: Any = None, **fit_params: Any) -> None:
        await self._client._run(self._train_plan(x, encoder, fit_params))

    async def add(self, x: Any, ids: Any = None, upsert: bool = False,
                  attributes: dict[str, Any] | None = None) -> np.ndarray:
        return await self._client._run(self._add_plan(x, ids, upsert, attributes))

    async def search(self, q: Any, k: int, *, allow: Any = None, deny: Any = None,
                     where: dict | None = None, deadline: float | None = None,
                     **params: Any) -> SearchResult:
        return await self._client._run(self._search_plan(q, k, allow, deny, where, params),
                                       deadline)

    async def get(self, ids: Any = None, vectors: bool = False,
                  where: dict | None = None) -> dict[str, Any]:
        return await self._client._run(self._get_plan(ids, vectors, where))

    async def remove(self, ids: Any, missing_ok: bool = False) -> int:
        return await self._client._run(self._remove_plan(ids, missing_ok))

    async def snapshot(self) -> int:
        return await self._client._run(self._snapshot_plan())
