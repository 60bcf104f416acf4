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

import contextlib
import contextvars
import json
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .._kernels import merge_topk
from ..errors import DuplicateIdError, InvalidFilterError, InvalidParameterError
from ..filters import parse_filter
from ..index import SearchResult, as_id_array, as_matrix, check_batch_ids, check_k
from .errors import ERROR_BASES_KEY, ERROR_TYPE_KEY, ServiceError, error_class

#: bytes kept free in every request for everything but the payload
_REQUEST_OVERHEAD = 4096
#: an int64 id as a protobuf varint takes at most 10 bytes
_ID_BYTES = 10


def _attribute_bytes_per_row(attributes: dict | None, n: int) -> int:
    """About how many bytes of JSON one row's attributes take (twice the mean: headroom)."""
    if not attributes or not n:
        return 0
    import json

    try:
        size = len(json.dumps({k: list(v) for k, v in attributes.items()}, default=str))
    except TypeError:
        return 0  # the server says what is wrong with them
    return 2 * size // n + 1
#: calls grpc retries on UNAVAILABLE (its service config). Add and Remove are retried too, but
#: only when the call is idempotent (an upsert with explicit ids, a remove with missing_ok): the
#: service config is per method and cannot tell, so Client._call does that one.
_RETRIED = ("Search", "DescribeCollection", "ListCollections", "ServerInfo", "Snapshot")
RETRY_ATTEMPTS = 5


#: an absolute time.monotonic() deadline for the calls made inside ``call_deadline``
_CALL_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "simsearch_call_deadline", default=None)


@contextlib.contextmanager
def call_deadline(deadline: float | None) -> Iterator[None]:
    """Calls made in this block (this thread or context) end by ``deadline`` (monotonic), even
    when the client's own timeout is longer: a server passing its caller's deadline on."""
    token = _CALL_DEADLINE.set(deadline)
    try:
        yield
    finally:
        _CALL_DEADLINE.reset(token)


#: the bearer token calls made inside ``call_as`` send instead of the client's own
_CALL_TOKEN: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "simsearch_call_token", default=None)


@contextlib.contextmanager
def call_as(token: str | None) -> Iterator[None]:
    """Calls made in this block send ``token`` (None: the client's own): a follower
    coordinator forwarding a write with its caller's credentials (docs/service.md, "Security
    model")."""
    saved = _CALL_TOKEN.set(token)
    try:
        yield
    finally:
        _CALL_TOKEN.reset(saved)


def _service_config() -> str:
    import json

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
    address: str | Sequence[str],
    token: str | None = None,
    tls_ca: str | os.PathLike | bytes | None = None,
    *,
    timeout: float = 60.0,
    tls_server_name: str | None = None,
    max_message_bytes: int | None = None,
    retries: bool = True,
) -> Client:
    """Connect to a node at ``host:port``, or to any of several (a list, or comma-separated):
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


def _raise_from(err) -> None:
    raise error_from(err) from None


class Client:
    """A connection to one node. Thread-safe; share one per process."""

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
        # The client never refuses a size itself: it splits batches, and the server judges.
        options = [
            ("grpc.max_send_message_length", -1),
            ("grpc.max_receive_message_length", -1),
            ("grpc.service_config", _service_config()),
            ("grpc.enable_retries", int(retries)),
            ("grpc.keepalive_time_ms", 20_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", 2_000),
        ]
        if tls_ca is not None:
            ca = tls_ca if isinstance(tls_ca, bytes) else open(tls_ca, "rb").read()
            if tls_server_name:
                options.append(("grpc.ssl_target_name_override", tls_server_name))
            self._channel = grpc.secure_channel(
                target, grpc.ssl_channel_credentials(root_certificates=ca), options=options
            )
        else:
            self._channel = grpc.insecure_channel(target, options=options)
        self._own_metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._stub = pb_grpc.SimSearchStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._info = None
        self._max_message_bytes = max_message_bytes
        self.retry_attempts = RETRY_ATTEMPTS if retries else 1

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def _metadata(self) -> tuple:
        token = _CALL_TOKEN.get()
        return self._own_metadata if token is None else (("authorization", f"Bearer {token}"),)

    def _call(self, method: str, request, idempotent: bool = False):
        """One call. ``idempotent``: a write that may be repeated (an upsert with explicit ids,
        a remove with missing_ok) is retried on UNAVAILABLE like the reads grpc retries."""
        attempts = self.retry_attempts if idempotent else 1
        for attempt in range(attempts):
            try:
                return getattr(self._stub, method)(
                    request, timeout=self._timeout(), metadata=self._metadata,
                    # with several addresses, wait for the channel to move to a live one
                    wait_for_ready=self._failover and (idempotent or method in _RETRIED),
                )
            except self._grpc.RpcError as err:
                if attempt + 1 < attempts and err.code() == self._grpc.StatusCode.UNAVAILABLE:
                    time.sleep(min(2.0, 0.1 * 2**attempt))
                    continue
                _raise_from(err)

    def _timeout(self) -> float:
        deadline = _CALL_DEADLINE.get()
        if deadline is None:
            return self.timeout
        return max(0.001, min(self.timeout, deadline - time.monotonic()))

    @property
    def max_message_bytes(self) -> int:
        if self._max_message_bytes is None:
            self._max_message_bytes = int(self.server_info()["max_message_bytes"])
        return self._max_message_bytes

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- server -----------------------------------------------------------------------------

    def server_info(self) -> dict[str, Any]:
        r = self._call("ServerInfo", self._pb.ServerInfoRequest())
        return {
            "version": r.version,
            "max_message_bytes": r.max_message_bytes,
            "index_kinds": list(r.index_kinds),
        }

    def health(self, service: str = "") -> str:
        """The standard health check's status name, e.g. "SERVING"."""
        try:
            r = self._health.Check(
                self._health_pb2.HealthCheckRequest(service=service), timeout=self.timeout
            )
        except self._grpc.RpcError as err:
            _raise_from(err)
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
        info = self._call(
            "CreateCollection",
            self._pb.CreateCollectionRequest(
                name=name,
                dim=dim,
                metric=metric,
                kind=kind,
                params_json=self._convert.dump_params(build_params),
                schema_json=self._convert.dump_params(schema or {}),
                part_replica=part_replica,
                incarnation=incarnation,
            ),
        )
        return RemoteCollection(self, info)

    def collection(self, name: str) -> RemoteCollection:
        return RemoteCollection(self, self._describe(name))

    def collection_handle(self, name: str, dim: int, metric: str, kind: str) -> RemoteCollection:
        """A handle on a collection whose shape the caller knows, without a Describe call (a
        cluster coordinator addressing its parts on shard servers)."""
        return RemoteCollection(self, self._pb.CollectionInfo(
            name=name, dim=dim, metric=metric, kind=kind))

    def search_once(self, name: str, q: np.ndarray, k: int, params_json: str = "",
                    timeout: float | None = None, allow: Any = None, deny: Any = None,
                    where: dict | None = None) -> SearchResult:
        """One Search call for a float32 query matrix already checked by the caller: no batch
        splitting, no retry; a failure raises the typed ServiceError. A blocking call, so a
        coordinator runs it on its own thread pool (grpc's future API starts a thread per call
        on an idle channel, which cost more than the pool's hand-off). ``allow`` / ``deny``:
        validated lists (simsearch.filters), ``where``: an attribute filter."""
        req = self._pb.SearchRequest(collection=name, queries=self._convert.to_matrix(q), k=k,
                                     params_json=params_json)
        if allow is not None:
            req.allow.CopyFrom(self._convert.to_id_list(allow))
        if deny is not None:
            req.deny.CopyFrom(self._convert.to_id_list(deny))
        if where is not None:
            req.where_json = json.dumps(where)
        try:
            resp = self._stub.Search(req, timeout=self.timeout if timeout is None else timeout,
                                     metadata=self._metadata)
        except self._grpc.RpcError as err:
            _raise_from(err)
        return self._convert.from_search_response(resp)

    def _describe(self, name: str):
        return self._call("DescribeCollection", self._pb.CollectionRequest(name=name))

    def drop_collection(self, name: str) -> None:
        self._call("DropCollection", self._pb.CollectionRequest(name=name))

    def list_collections(self) -> list[str]:
        r = self._call("ListCollections", self._pb.ListCollectionsRequest())
        return [c.name for c in r.collections]

    def _stream_in(self, method: str, name: str) -> tuple[dict[str, Any], bytes]:
        """A server stream of SnapshotChunk: (JSON meta of the first chunk, all the data)."""
        import json

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
            _raise_from(err)
        return meta or {}, b"".join(parts)

    def _stream_out(self, method: str, name: str, meta: dict[str, Any], data: bytes):
        """Send ``data`` as a client stream of SnapshotChunk (name and JSON meta first)."""
        import json

        step = max(1, self.max_message_bytes - _REQUEST_OVERHEAD)
        chunks = [self._pb.SnapshotChunk(collection=name, config_json=json.dumps(meta))]
        chunks += [self._pb.SnapshotChunk(data=data[i : i + step])
                   for i in range(0, len(data), step)]
        try:
            return getattr(self._stub, method)(iter(chunks), timeout=self._timeout(),
                                               metadata=self._metadata)
        except self._grpc.RpcError as err:
            _raise_from(err)

    def export_collection(self, name: str) -> tuple[dict[str, Any], bytes]:
        """A collection's config and snapshot bytes (the server snapshots it first)."""
        return self._stream_in("ExportCollection", name)

    def import_collection(self, name: str, config: dict[str, Any], data: bytes) -> RemoteCollection:
        """Install (or replace) a collection from :meth:`export_collection`'s output."""
        return RemoteCollection(self, self._stream_out("ImportCollection", name, config, data))

    # -- fenced part writes (a Pyramid leader to its shard servers; docs/cluster.md "Writes")

    def part_prepare(self, name: str, term: int, attempt: int, ops: list,
                     timeout: float | None = None) -> dict[str, int]:
        """Store ``ops`` (fenced.PartOp) on the part replica ``name`` without applying them."""
        req = self._pb.PartPrepareRequest(collection=name, term=term, attempt=attempt,
                                          ops=[self._convert.to_part_op(o) for o in ops])
        return self._part_call("PartPrepare", req, timeout)

    def part_sync(self, name: str, term: int, ballot: tuple[int, int] = (0, 0), first: int = 0,
                  through: int = 0, timeout: float | None = None) -> dict[str, int]:
        """Fence the part replica at ``term`` and apply its prepared ops [first, through] of
        ``ballot``; returns ``{"term", "applied", "count"}``."""
        req = self._pb.PartSyncRequest(collection=name, term=term, ballot_term=ballot[0],
                                       ballot_attempt=ballot[1], first=first, through=through)
        return self._part_call("PartSync", req, timeout)

    def part_ops(self, name: str, after: int, timeout: float | None = None
                 ) -> tuple[list, int]:
        """The ops (fenced.PartOp) the part replica applied after sequence ``after`` (a prefix
        of them if many) and its applied sequence; OpsGoneError if its log was compacted."""
        from .fenced import PartOp

        r = self._part_rpc("PartOps", self._pb.PartOpsRequest(collection=name, after=after),
                           timeout)
        dim = None
        ops = []
        for o in r.ops:
            x = None
            if not o.remove:
                dim = dim or o.vectors.cols
                x = self._convert.from_matrix(o.vectors, dim)
            ops.append(PartOp(int(o.pseq), bool(o.remove), self._convert.ids_from_bytes(o.ids),
                              x, self._convert.load_json(o.attributes_json, "attributes_json")))
        return ops, int(r.applied)

    def _part_rpc(self, method: str, req, timeout: float | None):
        try:  # no retry here: the leader decides what a failure means
            return getattr(self._stub, method)(req, timeout=timeout or self._timeout(),
                                               metadata=self._metadata)
        except self._grpc.RpcError as err:
            _raise_from(err)

    def _part_call(self, method: str, req, timeout: float | None) -> dict[str, int]:
        r = self._part_rpc(method, req, timeout)
        return {"term": int(r.term), "applied": int(r.applied), "count": int(r.count)}

    # -- blobs (docs/service.md, "Blobs")

    def put_blob(self, name: str, data: bytes) -> dict[str, Any]:
        """Store ``data`` on the node as blob ``name`` (replacing it; checksummed end to end)."""
        import hashlib

        info = self._stream_out("PutBlob", name, {"sha256": hashlib.sha256(data).hexdigest()},
                                data)
        return {"name": info.name, "size": int(info.size), "sha256": info.sha256}

    def get_blob(self, name: str) -> bytes:
        """A blob's bytes, checked against the checksum the node stored with them."""
        import hashlib

        meta, data = self._stream_in("GetBlob", name)
        if hashlib.sha256(data).hexdigest() != meta.get("sha256"):
            from .errors import DataLossError

            raise DataLossError(f"blob {name!r} arrived damaged (checksum mismatch); retry")
        return data

    def delete_blob(self, name: str) -> None:
        self._call("DeleteBlob", self._pb.CollectionRequest(name=name), idempotent=True)

    def list_blobs(self) -> list[dict[str, Any]]:
        r = self._call("ListBlobs", self._pb.ListCollectionsRequest(), idempotent=True)
        return [{"name": b.name, "size": int(b.size), "sha256": b.sha256} for b in r.blobs]


class RemoteCollection:
    """A collection on a node, with the Index contract's surface. Searches may run
    concurrently; the server serializes writes."""

    def __init__(self, client: Client, info):
        self._client = client
        self.name = info.name
        self.dim = int(info.dim)
        self.metric = info.metric
        self.kind = info.kind
        self.search_params = frozenset(info.search_params)
        self.needs_training = bool(info.needs_training)

    def __repr__(self) -> str:
        return (
            f"RemoteCollection({self.name!r} at {self._client.address}, kind={self.kind!r}, "
            f"dim={self.dim}, metric={self.metric!r})"
        )

    def describe(self) -> dict[str, Any]:
        import json

        i = self._client._describe(self.name)
        return {
            "name": i.name,
            "dim": i.dim,
            "metric": i.metric,
            "kind": i.kind,
            "params": json.loads(i.params_json or "{}"),
            "count": i.count,
            "trained": i.trained,
            "needs_training": i.needs_training,
            "supports_remove": i.supports_remove,
            "search_params": list(i.search_params),
            "schema": json.loads(i.schema_json or "{}"),
            "incarnation": i.incarnation,
            "part_replica": i.part_replica,
        }

    def __len__(self) -> int:
        return int(self._client._describe(self.name).count)

    @property
    def is_trained(self) -> bool:
        return bool(self._client._describe(self.name).trained)

    def _rows_per_call(self, bytes_per_row: int) -> int:
        budget = self._client.max_message_bytes - _REQUEST_OVERHEAD
        return max(1, budget // max(1, bytes_per_row))

    @property
    def holds_strings(self) -> bool:
        """A string collection (kind "strings"): items and queries are str, results carry edit
        distances (docs/service.md, "String collections")."""
        return self.kind == "strings"

    def train(self, x: Any = None, encoder: Any = None, **fit_params: Any) -> None:
        """Train on vectors x; a string collection fits its CNN-ED encoder on strings x (with
        ``fit_params``), or takes ``encoder`` (a trained CNNEDEncoder, or its file's bytes)."""
        c = self._client
        if not self.holds_strings:
            if encoder is not None or fit_params:
                raise InvalidParameterError("encoder and fit parameters apply to string "
                                            "collections only")
            x = as_matrix(x, self.dim, self.metric, "training vectors")
            c._call("Train", c._pb.TrainRequest(collection=self.name,
                                                vectors=c._convert.to_matrix(x)))
            return
        from ..strings._alphabet import check_strings

        req = c._pb.TrainRequest(collection=self.name, params_json=c._convert.dump_params(
            fit_params))
        if x is not None:
            req.texts.extend(check_strings(x, "training strings"))
        if encoder is not None:
            req.encoder = encoder if isinstance(encoder, bytes) else encoder.to_bytes()
        c._call("Train", req)

    def _add_strings(self, x: Any, ids: Any, upsert: bool) -> np.ndarray:
        from ..strings._alphabet import check_strings

        texts = check_strings(x)
        if ids is not None:
            ids = check_batch_ids(ids, len(texts))
        c = self._client
        widest = max(len(t.encode()) for t in texts) + 8
        step = self._rows_per_call(widest + _ID_BYTES)
        out = []
        for start in range(0, len(texts), step):
            req = c._pb.AddRequest(collection=self.name, texts=texts[start : start + step],
                                   auto_ids=ids is None, upsert=upsert)
            if ids is not None:
                req.ids.extend(ids[start : start + step].tolist())
            out.append(np.asarray(c._call("Add", req, idempotent=upsert and ids is not None).ids,
                                  dtype=np.int64))
        return np.concatenate(out)

    def _search_strings(self, q: Any, k: int, params: dict):
        from ..strings._alphabet import check_strings
        from ..strings.collection import to_distances
        from ..strings.string_index import StringSearchResult

        texts = check_strings(q, "queries")
        c = self._client
        pj = c._convert.dump_params(params)
        widest = max(len(t.encode()) for t in texts) + 8
        step = self._rows_per_call(max(widest, k * c._convert.RESULT_BYTES))
        ids, dists = [], []
        for start in range(0, len(texts), step):
            r = c._convert.from_search_response(c._call("Search", c._pb.SearchRequest(
                collection=self.name, query_texts=texts[start : start + step], k=k,
                params_json=pj)))
            ids.append(r.ids)
            dists.append(to_distances(r.scores))
        return StringSearchResult(np.concatenate(ids), np.concatenate(dists))

    def add(self, x: Any, ids: Any = None, upsert: bool = False,
            attributes: dict[str, Any] | None = None) -> np.ndarray:
        """Add (or with ``upsert`` replace) vectors, or strings in a string collection; returns
        their int64 ids. ``attributes``: {name: one value per item} (docs/filters.md)."""
        if self.holds_strings:
            return self._add_strings(x, ids, upsert)
        x = as_matrix(x, self.dim, self.metric)
        if ids is not None:
            ids = check_batch_ids(ids, x.shape[0])
        c = self._client
        attr_row = _attribute_bytes_per_row(attributes, x.shape[0])
        step = self._rows_per_call(self.dim * 4 + _ID_BYTES + attr_row)
        out = []
        for start in range(0, max(1, x.shape[0]), step):
            part = x[start : start + step]
            req = c._pb.AddRequest(
                collection=self.name,
                vectors=c._convert.to_matrix(part),
                auto_ids=ids is None,
                upsert=upsert,
                attributes_json=c._convert.dump_params(
                    {k: list(v[start : start + step]) for k, v in attributes.items()}
                    if attributes else {}),
            )
            if ids is not None:
                req.ids.extend(ids[start : start + step].tolist())
            out.append(np.asarray(c._call("Add", req, idempotent=upsert and ids is not None).ids,
                                  dtype=np.int64))
        return np.concatenate(out) if out else np.empty(0, np.int64)

    def search(self, q: Any, k: int, allow: Any = None, deny: Any = None,
               where: dict | None = None, **params: Any) -> SearchResult:
        """Top-k per query row; per-call parameters as the collection's index kind takes them.
        ``allow`` / ``deny``: id lists (one for every query, or one per query) and ``where``: a
        filter over the attributes (docs/filters.md). A string collection takes a list of str
        and returns a StringSearchResult (ids, edit distances)."""
        k = check_k(k)
        if self.holds_strings:
            return self._search_strings(q, k, params)
        q = as_matrix(q, self.dim, self.metric, "queries")
        filt = parse_filter(allow, deny, q.shape[0])
        c = self._client
        pj = c._convert.dump_params(params)
        wj = c._convert.dump_params(where) if where is not None else ""
        if where is not None and not wj:
            wj = "{}"
        budget = c.max_message_bytes - _REQUEST_OVERHEAD - len(wj)
        shared = sum(v.nbytes for v in (filt.allow, filt.deny) if isinstance(v, np.ndarray)) \
            if filt is not None else 0
        if shared > budget // 2:
            return self._search_split_allow(q, k, filt, where, params, budget // 2)
        per_row = 0
        if filt is not None and not filt.shared:
            per_row = max(sum(len(v[i]) for v in (filt.allow, filt.deny) if isinstance(v, list))
                          for i in range(q.shape[0])) * 8
        step = max(1, (budget - shared) // max(
            1, max(self.dim * 4, k * c._convert.RESULT_BYTES) + per_row))
        ids, scores, parts = [], [], []
        for start in range(0, max(1, q.shape[0]), step):
            req = c._pb.SearchRequest(
                collection=self.name,
                queries=c._convert.to_matrix(q[start : start + step]),
                k=k,
                params_json=pj,
                where_json=wj,
            )
            if filt is not None:
                sub = filt.take(np.arange(start, min(start + step, q.shape[0])))
                if sub.allow is not None:
                    req.allow.CopyFrom(c._convert.to_id_list(sub.allow))
                if sub.deny is not None:
                    req.deny.CopyFrom(c._convert.to_id_list(sub.deny))
            resp = c._call("Search", req)
            r = c._convert.from_search_response(resp)
            ids.append(r.ids)
            scores.append(r.scores)
            parts.append(r)
        if len(ids) == 1:
            return parts[0]  # keeps a partial result's coverage (Pyramid coordinators)
        n = np.array([len(r.ids) for r in parts])
        coverage = float(np.dot(n, [r.coverage for r in parts]) / n.sum())
        return SearchResult(np.concatenate(ids), np.concatenate(scores), coverage=coverage)

    def _search_split_allow(self, q, k, filt, where, params, budget) -> SearchResult:
        """A shared allow list larger than a message: search its pieces and keep the best k of
        all (the answer over a union is the best of the answers over its parts)."""
        if isinstance(filt.deny, np.ndarray) and filt.deny.nbytes > budget:
            raise InvalidFilterError(
                f"a deny list of {filt.deny.size} ids does not fit one message "
                f"({self._client.max_message_bytes} bytes); raise max_message_bytes, or pass "
                "the complement as an allow list")
        step = max(1, budget // 8)
        hib = self.metric != "l2"
        pieces = [self.search(q, k, allow=filt.allow[i : i + step], deny=filt.deny, where=where,
                              **params) for i in range(0, filt.allow.size, step)]
        ids = np.concatenate([r.ids for r in pieces], axis=1)
        scores = np.concatenate([r.scores for r in pieces], axis=1).astype(np.float32)
        return SearchResult(*merge_topk(ids.astype(np.int64), scores, k, hib))

    def remove(self, ids: Any, missing_ok: bool = False) -> int:
        """Remove ids; with ``missing_ok`` ids that are not stored are skipped."""
        ids = as_id_array(ids)
        if np.unique(ids).size != ids.size:
            raise DuplicateIdError("ids to remove must be unique")
        c = self._client
        step = self._rows_per_call(_ID_BYTES)
        n = 0
        for start in range(0, max(1, ids.size), step):
            req = c._pb.RemoveRequest(collection=self.name, ids=ids[start : start + step].tolist(),
                                      missing_ok=missing_ok)
            n += int(c._call("Remove", req, idempotent=missing_ok).removed)
        return n

    def snapshot(self) -> int:
        """Make the server save this collection and start a fresh log; returns its item count."""
        c = self._client
        return int(c._call("Snapshot", c._pb.CollectionRequest(name=self.name)).count)
