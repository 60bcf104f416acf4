"""The SimSearch servicer: validate, call the store, map exceptions to status codes.

Every error a client sees names what was wrong; unexpected faults are logged here and reported as
INTERNAL without details (no tracebacks, no paths).
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from .._version import __version__
from ..errors import (
    InvalidFilterError,
    InvalidParameterError,
    SimsearchError,
    UnsupportedOperationError,
)
from ..index import MAX_K, index_kinds
from . import convert
from .attributes import check_where
from .auth import require_cluster_role
from .errors import (
    ERROR_BASES_KEY,
    ERROR_TYPE_KEY,
    NotPartReplicaError,
    ResourceExhaustedError,
    ServiceUnavailableError,
    code_for,
    error_bases,
)
from .limits import DEFAULT_LIMITS, Limits
from .protocols import BlobStore, CollectionStore, PartReplica, ServedCollection
from .protos.simsearch.v1 import simsearch_pb2 as pb
from .protos.simsearch.v1 import simsearch_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

#: room left in a response for everything but the ids and scores
_RESPONSE_OVERHEAD = 1024
_MAX_MESSAGE_CHARS = 1000
#: a deadline further off than this is no deadline: gRPC reports a call sent without one (the
#: default of grpcurl and of the Go, Java and JS clients) as due in about 2^63 ns, which no lock
#: wait takes (it raised OverflowError, and the call answered INTERNAL)
NO_DEADLINE_SECONDS = 30 * 86400


def abort_with(context: grpc.ServicerContext, exc: BaseException) -> None:
    """End the call with the status code for ``exc``; the message and the error's class name
    (trailing metadata) let the client re-raise the same type."""
    code = code_for(exc)
    if code == "INTERNAL" or not isinstance(exc, SimsearchError):
        log.error("internal error in %s", type(exc).__name__, exc_info=exc)
        code, type_name = "INTERNAL", ""
        message = "internal server error (details in the server log)"
    else:
        message, type_name = str(exc)[:_MAX_MESSAGE_CHARS], type(exc).__name__
    if type_name:
        context.set_trailing_metadata(((ERROR_TYPE_KEY, type_name),
                                       (ERROR_BASES_KEY, error_bases(exc))))
    context.abort(getattr(grpc.StatusCode, code), message)


class MalformedRequest:
    """What a request's bytes parse to when they are not the method's message: the handler
    answers INVALID_ARGUMENT (gRPC's own deserializer answered INTERNAL, "Exception
    deserializing request!", to any client that sent bytes of another message)."""

    __slots__ = ("message",)

    def __init__(self, message: str):
        self.message = message

    def refuse(self) -> None:
        raise InvalidParameterError(f"the request is not a valid {self.message} message")


def _parser(cls: type) -> Callable[[bytes], object]:
    def parse(data: bytes):
        try:
            return cls.FromString(data)
        except DecodeError:
            return MalformedRequest(cls.DESCRIPTOR.full_name)
    return parse


def add_to_server(servicer: SimSearchServicer, server: grpc.Server) -> None:
    """Register ``servicer`` as the generated ``add_SimSearchServicer_to_server`` does, but
    with requests that fail to parse handed to the handler as a MalformedRequest."""
    factories = {(False, False): grpc.unary_unary_rpc_method_handler,
                 (False, True): grpc.unary_stream_rpc_method_handler,
                 (True, False): grpc.stream_unary_rpc_method_handler,
                 (True, True): grpc.stream_stream_rpc_method_handler}
    service = pb.DESCRIPTOR.services_by_name["SimSearch"]
    handlers = {
        m.name: factories[m.client_streaming, m.server_streaming](
            getattr(servicer, m.name),
            request_deserializer=_parser(getattr(pb, m.input_type.name)),
            response_serializer=getattr(pb, m.output_type.name).SerializeToString)
        for m in service.methods
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)


def _rpc(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(self: SimSearchServicer, request, context: grpc.ServicerContext):
        # counted before the stopping check, so that drain() cannot miss a call it let in
        with self._inflight_lock:
            self._inflight += 1
        code = "OK"
        t0 = time.monotonic()
        try:
            if self.stopping.is_set():
                raise ServiceUnavailableError("the server is shutting down; retry later")
            if type(request) is MalformedRequest:
                request.refuse()
            remaining = context.time_remaining()
            far = remaining is None or remaining > NO_DEADLINE_SECONDS
            return fn(self, request, context, None if far else t0 + remaining)
        except Exception as exc:  # every error becomes a status (abort raises past this)
            code = code_for(exc) if isinstance(exc, SimsearchError) else "INTERNAL"
            abort_with(context, exc)
        finally:
            with self._inflight_lock:
                self._inflight -= 1
                if not self._inflight and self.stopping.is_set():
                    self._idle.set()
            if self.metrics is not None:
                name = getattr(request, "collection", None) or getattr(request, "name", "")
                self.metrics.observe(fn.__name__, code, name if isinstance(name, str) else "",
                                     time.monotonic() - t0)

    return wrapper


def _info(col: ServedCollection) -> pb.CollectionInfo:
    d = col.describe()
    return pb.CollectionInfo(
        name=d["name"],
        dim=d["dim"],
        metric=d["metric"],
        kind=d["kind"],
        params_json=json.dumps(d["params"]),
        count=d["count"],
        trained=d["trained"],
        needs_training=d["needs_training"],
        supports_remove=d["supports_remove"],
        search_params=d["search_params"],
        schema_json=json.dumps(d.get("schema", {})),
        part_replica=isinstance(col, PartReplica),
        incarnation=str(d.get("incarnation", "")),
    )


class SimSearchServicer(pb_grpc.SimSearchServicer):
    def __init__(self, store: CollectionStore, max_message_bytes: int, metrics=None,
                 limits: Limits = DEFAULT_LIMITS):
        self.store = store
        self.max_message_bytes = max_message_bytes
        self.limits = limits
        self.metrics = metrics  # a ServiceMetrics, or None when metrics are off
        self.stopping = threading.Event()
        self._inflight = 0
        self._inflight_lock = threading.Lock()  # a plain lock: this is every call's path
        self._idle = threading.Event()  # set once stopping and no call is in flight

    def drain(self, timeout: float) -> bool:
        """Refuse new calls (UNAVAILABLE) and wait for the calls in flight to finish."""
        self.stopping.set()
        with self._inflight_lock:
            if not self._inflight:
                self._idle.set()
        return self._idle.wait(timeout)

    @_rpc
    def ServerInfo(self, request, context, deadline):
        return pb.ServerInfo(
            version=__version__, max_message_bytes=self.max_message_bytes, index_kinds=index_kinds()
        )

    @_rpc
    def CreateCollection(self, request, context, deadline):
        params = convert.load_params(request.params_json, "params_json (build parameters)")
        schema = convert.load_json(request.schema_json, "schema_json")
        if request.part_replica:
            require_cluster_role("creating a part replica")
        col = self.store.create(
            request.name, request.dim, request.metric or "l2", request.kind or "flat", params,
            schema=schema, part_replica=request.part_replica,
            **({"incarnation": request.incarnation} if request.incarnation else {}),
        )
        return _info(col)

    @_rpc
    def DropCollection(self, request, context, deadline):
        self.store.drop(request.name)
        if self.metrics is not None:
            self.metrics.forget(request.name)
        return pb.DropCollectionResponse()

    @_rpc
    def ListCollections(self, request, context, deadline):
        infos = []
        for name in self.store.names():
            try:
                infos.append(_info(self.store.get(name)))
            except SimsearchError:  # dropped meanwhile, or damaged: describe says which
                infos.append(pb.CollectionInfo(name=name))
        return pb.ListCollectionsResponse(collections=infos)

    @_rpc
    def DescribeCollection(self, request, context, deadline):
        return _info(self.store.get(request.name))

    @_rpc
    def Train(self, request, context, deadline):
        col = self.store.get(request.collection)
        options = convert.load_params(request.params_json, "params_json (training options)")
        if request.encoder:  # a string index's trained encoder, instead of fitting one
            options["encoder_file"] = request.encoder
        col.train(convert.items_from(request.texts, request.vectors, col.config["dim"],
                                     "training items"), deadline=deadline, **options)
        return pb.TrainResponse()

    @_rpc
    def Add(self, request, context, deadline):
        col = self.store.get(request.collection)
        x = convert.items_from(request.texts, request.vectors, col.config["dim"])
        self._check_decoded_ids(len(request.ids))
        ids = None if request.auto_ids else np.asarray(request.ids, dtype=np.int64)
        attributes = convert.load_json(request.attributes_json, "attributes_json")
        out = col.add(x, ids, upsert=request.upsert, deadline=deadline, attributes=attributes)
        return pb.AddResponse(ids=out.tolist())

    @_rpc
    def Remove(self, request, context, deadline):
        col = self.store.get(request.collection)
        self._check_decoded_ids(len(request.ids))
        n = col.remove(np.asarray(request.ids, dtype=np.int64), deadline=deadline,
                       missing_ok=request.missing_ok)
        return pb.RemoveResponse(removed=n)

    def _check_decoded_ids(self, n: int) -> None:
        """Ids arrive as varints (1 byte each for small ids) but decode to 8 bytes: refuse a list
        whose decoded size passes the message limit before copying it (docs/service.md, Limits)."""
        if n * 8 > self.max_message_bytes:
            raise ResourceExhaustedError(
                f"{n} ids decode to {n * 8} bytes, over the server's message limit of "
                f"{self.max_message_bytes}; send fewer ids per call (the Python client splits "
                "batches for you)"
            )

    @_rpc
    def Search(self, request, context, deadline):
        col = self.store.get(request.collection)
        q = convert.items_from(request.query_texts, request.queries, col.config["dim"],
                               "queries")
        params = convert.load_params(request.params_json, "params_json (search parameters)")
        for name in ("allow", "deny", "where", "deadline"):
            if name in params:
                raise InvalidParameterError(
                    f"{name} goes in the request's own field (deadline: the call's), not in "
                    "params_json")
        for name in ("allow", "deny"):
            if request.HasField(name):
                lists = getattr(request, name)
                self._check_decoded_ids(len(lists.ids) // 8)
                params[name] = convert.from_id_list(lists, len(q), name)
        if request.where_json:
            if len(request.where_json) > self.limits.max_where_bytes:
                raise InvalidFilterError(
                    f"where_json holds {len(request.where_json)} characters, over the server's "
                    f"--max-where-bytes of {self.limits.max_where_bytes}")
            params["where"] = convert.load_json(request.where_json, "where_json")
            check_where(params["where"], self.limits)
        k = request.k
        if 1 <= k <= MAX_K:  # out-of-range k is refused by the index with its own message
            need = len(q) * k * convert.RESULT_BYTES + _RESPONSE_OVERHEAD
            if need > self.max_message_bytes:
                raise ResourceExhaustedError(
                    f"the result of {len(q)} queries x k={k} would take {need} bytes, over "
                    f"the server's message limit of {self.max_message_bytes}; send fewer queries "
                    "per call (the Python client splits batches for you)"
                )
        return convert.to_search_response(col.search(q, k, deadline=deadline, **params))

    @_rpc
    def Get(self, request, context, deadline):
        col = self.store.get(request.collection)
        self._check_decoded_ids(len(request.ids) // 8)
        ids = None if request.all else convert.ids_from_bytes(request.ids)
        where = None
        if request.where_json:
            if len(request.where_json) > self.limits.max_where_bytes:
                raise InvalidFilterError(
                    f"where_json holds {len(request.where_json)} characters, over the server's "
                    f"--max-where-bytes of {self.limits.max_where_bytes}")
            where = convert.load_json(request.where_json, "where_json")
            check_where(where, self.limits)
        budget = max(1, self.max_message_bytes - _RESPONSE_OVERHEAD)
        got = col.get(ids, vectors=request.vectors, where=where, deadline=deadline,
                      offset=int(request.offset), max_bytes=budget)
        if got["next"] and not request.pages:
            raise ResourceExhaustedError(
                f"the items selected do not fit one answer of {budget} bytes (the server's "
                "--max-message-bytes); ask in pages (GetRequest.pages, as the Python client "
                "does), for fewer ids, or with a narrower where")
        out = pb.GetResponse(ids=np.ascontiguousarray(got["ids"], "<i8").tobytes(),
                             attributes_json=convert.dump_params(got["attributes"]),
                             next_offset=got["next"])
        if got["vectors"] is not None:
            convert.put_matrix(out.vectors, got["vectors"])
        return out

    def _send_chunks(self, name: str, meta: dict, data: bytes):
        """A stream of SnapshotChunk: name and JSON meta first, then the data in message-sized
        pieces (collection snapshots and blobs)."""
        step = max(1, self.max_message_bytes - _RESPONSE_OVERHEAD)
        yield pb.SnapshotChunk(collection=name, config_json=json.dumps(meta))
        for i in range(0, len(data), step):
            yield pb.SnapshotChunk(data=data[i : i + step])

    def _receive_chunks(self, request_iterator, what: str) -> tuple[str, dict, bytes]:
        """The name, JSON meta and data of a stream; refused once it carries more than the
        server's --max-stream-bytes (before the rest is read)."""
        first = next(request_iterator, None)
        if type(first) is MalformedRequest:
            first.refuse()
        if first is None or not first.collection:
            raise InvalidParameterError(f"the first chunk must name the {what}")
        meta = convert.load_params(first.config_json, "config_json")
        cap, parts, size = self.limits.max_stream_bytes, [], len(first.config_json)
        for c in itertools.chain([first], request_iterator):
            if type(c) is MalformedRequest:
                c.refuse()
            size += len(c.data) + len(c.collection)
            if size > cap:
                raise ResourceExhaustedError(
                    f"the {what} stream carries more than the server's --max-stream-bytes "
                    f"({cap}); nothing was stored")
            parts.append(c.data)
        return first.collection, meta, b"".join(parts)

    @_rpc
    def ExportCollection(self, request, context, deadline):
        col = self.store.get(request.name)
        config, data = col.export(deadline=deadline)
        return self._send_chunks(col.name, config, data)

    @_rpc
    def ImportCollection(self, request_iterator, context, deadline):
        name, config, data = self._receive_chunks(request_iterator, "collection")
        if any(config.get(k) for k in ("part_replica", "part_state", "fence_term")):
            require_cluster_role("importing a part replica")
        return _info(self.store.import_collection(name, config, data))

    def _blobs(self) -> BlobStore:
        if self.store.blobs is None:  # a cluster coordinator keeps none
            raise UnsupportedOperationError("this server keeps no blobs (it is a coordinator)")
        return self.store.blobs

    @_rpc
    def PutBlob(self, request_iterator, context, deadline):
        name, meta, data = self._receive_chunks(request_iterator, "blob")
        return pb.BlobInfo(**self._blobs().put_blob(name, data, str(meta.get("sha256", ""))))

    @_rpc
    def GetBlob(self, request, context, deadline):
        data, sha = self._blobs().get_blob(request.name)
        return self._send_chunks(request.name, {"sha256": sha, "size": len(data)}, data)

    @_rpc
    def DeleteBlob(self, request, context, deadline):
        self._blobs().delete_blob(request.name)
        return pb.BlobInfo(name=request.name)

    @_rpc
    def ListBlobs(self, request, context, deadline):
        return pb.ListBlobsResponse(blobs=[pb.BlobInfo(**b) for b in self._blobs().list_blobs()])

    def _part(self, name: str) -> PartReplica:
        col = self.store.get(name)
        if not isinstance(col, PartReplica):  # an ordinary collection, or a coordinator's
            raise NotPartReplicaError(
                f"collection {name!r} is not a Pyramid part replica: part calls go only to "
                "collections a cluster created as parts on its shard servers")
        return col

    @_rpc
    def PartPrepare(self, request, context, deadline):
        from .fenced import PartOp

        col = self._part(request.collection)
        ops = []
        for o in request.ops:
            self._check_decoded_ids(len(o.ids) // 8)
            ids = convert.ids_from_bytes(o.ids)
            x = None if o.remove else convert.from_matrix(o.vectors, col.config["dim"])
            ops.append(PartOp(int(o.pseq), bool(o.remove), ids, x,
                              convert.load_json(o.attributes_json, "attributes_json")))
        st = col.part_prepare(request.term, request.attempt, ops, deadline=deadline)
        return pb.PartState(**st)

    @_rpc
    def PartSync(self, request, context, deadline):
        st = self._part(request.collection).part_sync(
            request.term, (request.ballot_term, request.ballot_attempt), request.first,
            request.through, deadline=deadline)
        return pb.PartState(**st)

    @_rpc
    def PartOps(self, request, context, deadline):
        ops, applied = self._part(request.collection).part_ops(
            request.after, self.max_message_bytes // 2, deadline=deadline)
        return pb.PartOpsResponse(ops=[convert.to_part_op(o) for o in ops], applied=applied)

    @_rpc
    def Snapshot(self, request, context, deadline):
        return pb.SnapshotResponse(count=self.store.get(request.name).snapshot(deadline=deadline))
