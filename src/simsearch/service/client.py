"""Python client: ``simsearch.connect(address)`` and collections that behave like an Index.

    import simsearch
    client = simsearch.connect("127.0.0.1:50051", token=None, tls_ca=None)
    col = client.create_collection("docs", dim=64, metric="ip", kind="hnsw", M=16)
    col.add(x); res = col.search(q, 10, ef=64); col.remove([3, 4])

A collection has the Index surface (``add``, ``search``, ``remove``, ``train``, ``len``, ``dim``,
``metric``; results are :class:`simsearch.SearchResult`) and raises the same
:mod:`simsearch.errors` types as a local index; service faults raise
:mod:`simsearch.service.errors` types. Input is checked locally before it is sent. Batches larger
than the server's message limit are split into several calls: a split add is then several
writes, each durable on its own. grpc is imported only when a client is made.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import random
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidParameterError
from ..index import SearchResult, check_deadline
from .api import ClientAPI
from .errors import ERROR_BASES_KEY, ERROR_TYPE_KEY, ServiceError, error_class
from .requests import REQUEST_OVERHEAD, ClientRequests, CollectionRequests, describe_info, run

__all__ = ["Client", "RemoteCollection", "connect", "error_from"]

#: calls grpc retries on UNAVAILABLE (its service config). Add and Remove are retried too, but
#: only when the call is idempotent (an upsert with explicit ids, a remove with missing_ok): the
#: service config is per method and cannot tell, so Client._call does that one.
_RETRIED = ("Search", "DescribeCollection", "ListCollections", "ServerInfo", "Snapshot")
RETRY_ATTEMPTS = 5
#: how often a call the server shed (past its --max-concurrent-rpcs) is sent again: it never
#: ran, so any call may be, after a jittered backoff
SHED_ATTEMPTS = 8


def retry_after(err, attempt: int, idempotent_attempts: int) -> float | None:
    """Seconds to wait before sending a failed call again, or None to give up: UNAVAILABLE
    while ``idempotent_attempts`` last, and a call the server shed (gRPC's RESOURCE_EXHAUSTED
    "Concurrent RPC limit exceeded", before the handler ran) up to SHED_ATTEMPTS."""
    import grpc

    code = err.code()
    if code == grpc.StatusCode.UNAVAILABLE and attempt + 1 < idempotent_attempts:
        return min(2.0, 0.1 * 2**attempt)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and attempt + 1 < SHED_ATTEMPTS and \
            "Concurrent RPC limit" in (err.details() or ""):
        return min(1.0, 0.02 * 2**attempt) * (0.5 + random.random())
    return None


def _service_config() -> str:

    retry = {
        "maxAttempts": RETRY_ATTEMPTS,
        "initialBackoff": "0.1s",
        "maxBackoff": "2s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"],
    }
    return json.dumps({
        "loadBalancingConfig": [{"pick_first": {}}],
        "methodConfig": [
            {"name": [{"service": "simsearch.v1.SimSearch", "method": m} for m in _RETRIED],
             "retryPolicy": retry},
            {"name": [{"service": "grpc.health.v1.Health"}], "retryPolicy": retry},
        ],
    })


def channel_options(retries: bool) -> list[tuple[str, Any]]:
    """The channel's options (the sync and the asyncio client's). The client never refuses a
    size itself: it splits batches, and the server judges."""
    return [
        ("grpc.max_send_message_length", -1),
        ("grpc.max_receive_message_length", -1),
        ("grpc.service_config", _service_config()),
        ("grpc.enable_retries", int(retries)),
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 2_000),
    ]


def _target(address: str | Sequence[str]) -> str:
    """A grpc target for one address or several (resolved to IP literals for the ipv4/ipv6
    resolvers, which take a list)."""
    import socket

    addrs = [a.strip() for a in (address.split(",") if isinstance(address, str) else address)]
    addrs = [a for a in addrs if a]
    if not addrs:
        raise InvalidParameterError(f"address must name at least one host:port; got {address!r}")
    if len(addrs) == 1:
        return addrs[0]
    v4, v6 = [], []
    for a in addrs:
        host, _, port = a.rpartition(":")
        if not host or not port.isdigit():
            raise InvalidParameterError(f"each address must be host:port; got {a!r}")
        host = host.strip("[]")
        for fam, *_, sa in socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM):
            (v4 if fam == socket.AF_INET else v6).append(
                f"{sa[0]}:{port}" if fam == socket.AF_INET else f"[{sa[0]}]:{port}")
            break
    if v4 and v6:
        raise InvalidParameterError("several addresses must all be IPv4 or all IPv6")
    return ("ipv4:" + ",".join(v4)) if v4 else ("ipv6:" + ",".join(v6))


def connect(
    address: str | Sequence[str] | None = None,
    token: str | None = None,
    tls_ca: str | os.PathLike | bytes | None = None,
    *,
    path: str | os.PathLike | None = None,
    timeout: float = 60.0,
    tls_server_name: str | None = None,
    max_message_bytes: int | None = None,
    retries: bool = True,
) -> ClientAPI:
    """The collections of a node, a cluster, or this process, with one API (``api.ClientAPI``,
    which ``Client`` and ``EmbeddedClient`` implement).

    ``connect(":memory:")``: in this process, kept until closed; ``connect(path="./data")``:
    in this process, durable in that directory (a node's data directory format). Both are
    ``service.embedded.EmbeddedClient``s; the arguments below apply to servers only.

    Otherwise connect to a node at ``host:port``, or to any of several (a list, or comma-separated):
    calls go to the first that answers and move to the next when it goes away (grpc's
    pick_first policy), reads and idempotent writes are retried on UNAVAILABLE by grpc's own
    retry policy, and keepalives notice a dead connection. Use it as a context manager to close
    the channel.

    token: bearer token sent with every call. tls_ca: PEM bytes or a path to the CA that signed
    the server's certificate (turns TLS on). timeout: seconds each call may take (its deadline).
    tls_server_name: the name to check the certificate against when it differs from the host.
    max_message_bytes: split batches to this size; default: the server's advertised limit.
    retries: False turns every retry off, grpc's transparent ones too, for a caller that
    re-routes a failed call itself (a follower coordinator forwarding to its leader).
    """
    if path is not None or address == ":memory:":
        from .embedded import EmbeddedClient

        if path is not None and address is not None:
            raise InvalidParameterError("connect takes an address or a path, not both; got "
                                        f"{address!r} and path={str(path)!r}")
        return EmbeddedClient(path)
    if address is None:
        raise InvalidParameterError('connect needs an address ("host:port"), ":memory:", or '
                                    "path=")
    return Client(
        address,
        token,
        tls_ca,
        timeout=timeout,
        tls_server_name=tls_server_name,
        max_message_bytes=max_message_bytes,
        retries=retries,
    )


def error_from(err) -> Exception:
    """The typed simsearch error for a failed gRPC call (``ServiceError`` types carry ``.code``,
    the gRPC status name)."""
    code = err.code().name if err.code() is not None else "UNKNOWN"
    meta = dict(err.trailing_metadata() or ())
    cls = error_class(meta.get(ERROR_TYPE_KEY), code, meta.get(ERROR_BASES_KEY, ""))
    message = err.details() or code
    return cls(message, code) if issubclass(cls, ServiceError) else cls(message)


def raise_from(err) -> None:
    raise error_from(err) from None


class Client(ClientRequests):
    """A connection to one node. Thread-safe; share one per process.

    >>> import numpy as np, simsearch as ss
    >>> x = np.random.default_rng(0).standard_normal((1000, 16)).astype("float32")
    >>> import tempfile
    >>> from simsearch.service.server import create_server
    >>> server = create_server(tempfile.mkdtemp(), port=0)     # a node, here in this process
    >>> client = ss.connect(f"127.0.0.1:{server.port}")
    >>> col = client.create_collection("docs", 16, "l2", "hnsw", M=16)
    >>> col.add(x[:100], attributes={"even": [i % 2 == 0 for i in range(100)]}).size
    100
    >>> r = col.search(x[:2], k=2, where={"even": True})   # attributes filter
    >>> r.ids[0, 0].item(), bool((r.ids % 2 == 0).all())
    (0, True)
    >>> client.list_collections()
    ['docs']
    >>> client.close(); server.stop()
    """

    def __init__(
        self,
        address: str,
        token: str | None = None,
        tls_ca=None,
        *,
        timeout: float = 60.0,
        tls_server_name: str | None = None,
        max_message_bytes: int | None = None,
        retries: bool = True,
    ):
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        from . import convert
        from .protos.simsearch.v1 import simsearch_pb2 as pb
        from .protos.simsearch.v1 import simsearch_pb2_grpc as pb_grpc

        self._grpc, self._pb, self._convert = grpc, pb, convert
        self._health_pb2 = health_pb2
        self.address = address
        self.timeout = timeout
        target = _target(address)
        self._failover = target.startswith(("ipv4:", "ipv6:"))
        options = channel_options(retries)
        if tls_ca is not None:
            ca = tls_ca if isinstance(tls_ca, bytes) else open(tls_ca, "rb").read()
            if tls_server_name:
                options.append(("grpc.ssl_target_name_override", tls_server_name))
            self._channel = grpc.secure_channel(
                target, grpc.ssl_channel_credentials(root_certificates=ca), options=options
            )
        else:
            self._channel = grpc.insecure_channel(target, options=options)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._bound_deadline: float | None = None
        self._stub = pb_grpc.SimSearchStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._info = None
        self._max_message_bytes = max_message_bytes
        self.retry_attempts = RETRY_ATTEMPTS if retries else 1

    # -- plumbing ---------------------------------------------------------------------------

    def bound(self, deadline: float | None = None, token: str | None = None) -> Client:
        """A view of this client on the same channel whose calls end by ``deadline``
        (time.monotonic()) even when its timeout is longer, and send ``token`` (None: this
        client's own): a coordinator forwarding a write with its caller's deadline and
        credentials (docs/service.md, "Security model"). Close the client, not the view."""
        view = copy.copy(self)
        view._bound_deadline = deadline
        if token is not None:
            view._metadata = (("authorization", f"Bearer {token}"),)
        return view

    def _call(self, method: str, request, idempotent: bool = False,
              deadline: float | None = None):
        """One call. ``idempotent``: a write that may be repeated (an upsert with explicit ids,
        a remove with missing_ok) is retried on UNAVAILABLE like the reads grpc retries.
        ``deadline``: the caller's (time.monotonic()), when earlier than the client's timeout."""
        attempts = self.retry_attempts if idempotent else 1
        # options only when set: gRPC handles each one it is given on every call
        kw: dict[str, Any] = {}
        metadata = self._metadata
        if metadata:
            kw["metadata"] = metadata
        if self._failover and (idempotent or method in _RETRIED):
            kw["wait_for_ready"] = True  # with several addresses, wait for a live one
        for attempt in range(SHED_ATTEMPTS):
            try:
                return getattr(self._stub, method)(request, timeout=self._timeout(deadline),
                                                   **kw)
            except self._grpc.RpcError as err:
                wait = retry_after(err, attempt, attempts)
                if wait is None:
                    raise_from(err)
                time.sleep(wait)

    def _timeout(self, deadline: float | None = None) -> float:
        scoped = self._bound_deadline
        if deadline is None and scoped is None:
            return self.timeout
        end = min(d for d in (deadline, scoped) if d is not None)
        return max(0.001, min(self.timeout, end - time.monotonic()))

    def _run(self, plan, deadline: float | None = None):
        if deadline is None:
            return run(plan, self._call)
        check_deadline(deadline)
        return run(plan, functools.partial(self._call, deadline=deadline))

    @property
    def max_message_bytes(self) -> int:
        return self._run(self._max_bytes_plan())

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- server -----------------------------------------------------------------------------

    def server_info(self) -> dict[str, Any]:
        return self._run(self._server_info_plan())

    def health(self, service: str = "") -> str:
        """The standard health check's status name, e.g. "SERVING"."""
        try:
            r = self._health.Check(
                self._health_pb2.HealthCheckRequest(service=service), timeout=self.timeout
            )
        except self._grpc.RpcError as err:
            raise_from(err)
        return self._health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)

    # -- collections ------------------------------------------------------------------------

    def create_collection(
        self, name: str, dim: int, metric: str = "l2", kind: str = "flat",
        schema: dict[str, str] | None = None, *, part_replica: bool = False,
        incarnation: str = "", **build_params: Any
    ) -> RemoteCollection:
        """Create a collection holding an index of ``kind`` (see simsearch.index_kinds());
        ``schema`` declares attribute types (docs/filters.md), others are inferred on add.
        ``part_replica``: a Pyramid part's replica on a shard server (a cluster's leader makes
        these; it needs a token of role "cluster"), of the cluster collection ``incarnation``."""
        return RemoteCollection(self, self._run(self._create_plan(
            name, dim, metric, kind, schema, part_replica, incarnation, build_params)))

    def collection(self, name: str) -> RemoteCollection:
        return RemoteCollection(self, self._describe(name))

    def _describe(self, name: str):
        return self._run(self._describe_plan(name))

    def drop_collection(self, name: str) -> None:
        self._run(self._drop_plan(name))

    def list_collections(self) -> list[str]:
        return self._run(self._list_plan())

    def _stream_in(self, method: str, name: str) -> tuple[dict[str, Any], bytes]:
        """A server stream of SnapshotChunk: (JSON meta of the first chunk, all the data)."""

        meta, parts = None, []
        try:
            for chunk in getattr(self._stub, method)(
                self._pb.CollectionRequest(name=name), timeout=self._timeout(),
                metadata=self._metadata,
            ):
                if meta is None:
                    meta = json.loads(chunk.config_json)
                parts.append(chunk.data)
        except self._grpc.RpcError as err:
            raise_from(err)
        return meta or {}, b"".join(parts)

    def _stream_out(self, method: str, name: str, meta: dict[str, Any], data: bytes):
        """Send ``data`` as a client stream of SnapshotChunk (name and JSON meta first)."""

        step = max(1, self.max_message_bytes - REQUEST_OVERHEAD)
        chunks = [self._pb.SnapshotChunk(collection=name, config_json=json.dumps(meta))]
        chunks += [self._pb.SnapshotChunk(data=data[i : i + step])
                   for i in range(0, len(data), step)]
        try:
            return getattr(self._stub, method)(iter(chunks), timeout=self._timeout(),
                                               metadata=self._metadata)
        except self._grpc.RpcError as err:
            raise_from(err)

    def export_collection(self, name: str) -> tuple[dict[str, Any], bytes]:
        """A collection's config and snapshot bytes (the server snapshots it first)."""
        return self._stream_in("ExportCollection", name)

    def import_collection(self, name: str, config: dict[str, Any], data: bytes) -> RemoteCollection:
        """Install (or replace) a collection from :meth:`export_collection`'s output."""
        return RemoteCollection(self, self._stream_out("ImportCollection", name, config, data))

class RemoteCollection(CollectionRequests):
    """A collection on a node, with the Index contract's surface. Searches may run
    concurrently; the server serializes writes.

    >>> import numpy as np, simsearch as ss
    >>> x = np.random.default_rng(0).standard_normal((1000, 16)).astype("float32")
    >>> import tempfile
    >>> from simsearch.service.server import create_server
    >>> server = create_server(tempfile.mkdtemp(), port=0)
    >>> with ss.connect(f"127.0.0.1:{server.port}") as client:
    ...     col = client.create_collection("docs", 16, "l2", "flat")
    ...     ids = col.add(x[:10], ids=range(100, 110))
    ...     got = col.get([101, 5], vectors=True)        # held ids only, in the order asked
    ...     removed = col.remove([100, 101])
    >>> got["ids"].tolist(), got["vectors"].shape, removed
    ([101], (1, 16), 2)
    >>> server.stop()
    """

    def __repr__(self) -> str:
        return (
            f"RemoteCollection({self.name!r} at {self._client.address}, kind={self.kind!r}, "
            f"dim={self.dim}, metric={self.metric!r})"
        )

    def describe(self) -> dict[str, Any]:
        return describe_info(self._client._run(self._info_plan()))

    def __len__(self) -> int:
        return int(self._client._run(self._info_plan()).count)

    @property
    def is_trained(self) -> bool:
        return bool(self._client._run(self._info_plan()).trained)

    def train(self, x: Any = None, encoder: Any = None, **fit_params: Any) -> None:
        """``Index.train`` on the server; a string collection fits its CNN-ED encoder on strings
        x (with ``fit_params``), or takes ``encoder`` (a trained CNNEDEncoder, or its bytes)."""
        self._client._run(self._train_plan(x, encoder, fit_params))

    def add(self, x: Any, ids: Any = None, upsert: bool = False,
            attributes: dict[str, Any] | None = None) -> np.ndarray:
        """Add (or with ``upsert`` replace) items (vectors, or str); returns
        their int64 ids. ``attributes``: {name: one value per item} (docs/filters.md)."""
        return self._client._run(self._add_plan(x, ids, upsert, attributes))

    def search(self, q: Any, k: int, *, allow: Any = None, deny: Any = None,
               where: dict | None = None, deadline: float | None = None,
               **params: Any) -> SearchResult:
        """``Index.search`` on the server: top-k per query (vectors, or str for a string
        collection); ``allow`` / ``deny`` id lists and ``where``, a filter over the attributes
        (docs/filters.md); ``deadline`` (time.monotonic()) ends the call earlier than the
        client's timeout; per-call parameters as the collection's index kind takes them."""
        c = self._client
        req = self._one_message_search(q, k, allow, deny, where, params)
        if req is None:
            return c._run(self._search_plan(q, k, allow, deny, where, params), deadline)
        check_deadline(deadline)  # the common call without the plan: it is on every search's path
        return c._convert.from_search_response(c._call("Search", req, deadline=deadline))

    def get(self, ids: Any = None, vectors: bool = False,
            where: dict | None = None) -> dict[str, Any]:
        """The asked ``ids`` the collection holds, in the order asked (others are skipped), or
        with ``ids=None`` every item; of those, only the ones ``where`` selects (docs/filters.md);
        with their attributes ({name: one value per id, None where it has none}) and, when
        ``vectors``, their stored vectors: ``{"ids", "attributes", "vectors"}``."""
        return self._client._run(self._get_plan(ids, vectors, where))

    def remove(self, ids: Any, missing_ok: bool = False) -> int:
        """Remove ids; with ``missing_ok`` ids that are not stored are skipped."""
        return self._client._run(self._remove_plan(ids, missing_ok))

    def snapshot(self) -> int:
        """Make the server save this collection and start a fresh log; returns its item count."""
        return self._client._run(self._snapshot_plan())
