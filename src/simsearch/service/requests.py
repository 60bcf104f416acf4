"""The client's calls without their transport: each public call is a plan, a generator that
checks the input, yields ``(method, request, idempotent)`` for every RPC it needs, receives the
response, and returns the answer. ``Client`` (client.py) runs plans over a blocking channel and
``AsyncClient`` (aio.py) over grpc.aio, so the two cannot drift apart.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Generator
from typing import Any

import numpy as np

from .._kernels import merge_topk
from ..errors import DuplicateIdError, InvalidFilterError, InvalidParameterError
from ..filters import parse_filter
from ..index import (
    SearchResult,
    as_id_array,
    as_matrix,
    check_batch_ids,
    check_k,
    higher_is_better,
    index_class,
)
from ..strings import string_batch

#: bytes kept free in every request for everything but the payload
REQUEST_OVERHEAD = 4096
#: an int64 id as a protobuf varint takes at most 10 bytes
_ID_BYTES = 10

#: a plan: yields (method, request, idempotent), is sent each response, returns the answer
Plan = Generator[tuple[str, Any, bool], Any, Any]


def run(plan: Plan, call) -> Any:
    """Run ``plan`` with the blocking ``call(method, request, idempotent)``."""
    try:
        step = next(plan)
        while True:
            step = plan.send(call(*step))
    except StopIteration as done:
        return done.value


async def arun(plan: Plan, call) -> Any:
    """Run ``plan`` with the coroutine ``call(method, request, idempotent)``."""
    try:
        step = next(plan)
        while True:
            step = plan.send(await call(*step))
    except StopIteration as done:
        return done.value


def _attribute_bytes_per_row(attributes: dict | None, n: int) -> int:
    """About how many bytes of JSON one row's attributes take (twice the mean: headroom)."""
    if not attributes or not n:
        return 0
    try:
        size = len(json.dumps({k: list(v) for k, v in attributes.items()}, default=str))
    except TypeError:
        return 0  # the server says what is wrong with them
    return 2 * size // n + 1


def describe_info(i) -> dict[str, Any]:
    """A CollectionInfo message as ``describe``'s dict."""
    return {
        "name": i.name, "dim": i.dim, "metric": i.metric, "kind": i.kind,
        "params": json.loads(i.params_json or "{}"), "count": i.count, "trained": i.trained,
        "needs_training": i.needs_training, "supports_remove": i.supports_remove,
        "search_params": list(i.search_params), "schema": json.loads(i.schema_json or "{}"),
        "incarnation": i.incarnation, "part_replica": i.part_replica,
    }


class ClientRequests:
    """The client-level plans; a client provides ``_pb``, ``_convert`` and
    ``_max_message_bytes``."""

    _max_message_bytes: int | None

    def _max_bytes_plan(self):
        if self._max_message_bytes is None:
            info = yield from self._server_info_plan()
            self._max_message_bytes = int(info["max_message_bytes"])
        return self._max_message_bytes

    def _server_info_plan(self):
        r = yield ("ServerInfo", self._pb.ServerInfoRequest(), False)
        return {"version": r.version, "max_message_bytes": r.max_message_bytes,
                "index_kinds": list(r.index_kinds)}

    def _create_plan(self, name: str, dim: int, metric: str, kind: str,
                     schema: dict | None, part_replica: bool, incarnation: str,
                     build_params: dict):
        return (yield ("CreateCollection", self._pb.CreateCollectionRequest(
            name=name, dim=dim, metric=metric, kind=kind,
            params_json=self._convert.dump_params(build_params),
            schema_json=self._convert.dump_params(schema or {}),
            part_replica=part_replica, incarnation=incarnation), False))

    def _describe_plan(self, name: str):
        return (yield ("DescribeCollection", self._pb.CollectionRequest(name=name), False))

    def _drop_plan(self, name: str):
        yield ("DropCollection", self._pb.CollectionRequest(name=name), False)

    def _list_plan(self):
        r = yield ("ListCollections", self._pb.ListCollectionsRequest(), False)
        return [c.name for c in r.collections]


class CollectionRequests:
    """A collection's plans; a collection provides ``_client`` (a ClientRequests), ``name``,
    ``dim``, ``metric`` and ``kind``."""

    def __init__(self, client, info):
        self._client = client
        self.name = info.name
        self.dim = int(info.dim)
        self.metric = info.metric
        self.kind = info.kind
        self.search_params = frozenset(info.search_params)
        self.needs_training = bool(info.needs_training)

    @functools.cached_property
    def items(self) -> str:
        """What the collection holds: "vectors", or "strings" (a string index, docs/service.md,
        "String collections"), as its kind's class says; a kind this client does not know
        holds vectors."""
        try:
            return index_class(self.kind).capabilities.items
        except InvalidParameterError:
            return "vectors"

    def _check_items(self, x: Any, what: str = "vectors") -> Any:
        """A row-indexable batch: a float32 matrix, or an object array of str."""
        if self.items == "strings":
            return string_batch(x, what)
        return as_matrix(x, self.dim, self.metric, what)

    def _row_bytes(self, x: Any) -> int:
        if self.items == "strings":
            return max((len(t.encode()) for t in x), default=0) + 8
        return self.dim * 4

    def _put_items(self, req, texts_field: str, matrix_field: str, part: Any) -> None:
        if self.items == "strings":
            getattr(req, texts_field).extend(part.tolist())
        else:
            self._client._convert.put_matrix(getattr(req, matrix_field), part)

    def _rows_per_call(self, bytes_per_row: int):
        budget = (yield from self._client._max_bytes_plan()) - REQUEST_OVERHEAD
        return max(1, budget // max(1, bytes_per_row))

    def _info_plan(self):
        return (yield from self._client._describe_plan(self.name))

    def _train_plan(self, x: Any, encoder: Any, options: dict):
        c = self._client
        req = c._pb.TrainRequest(collection=self.name,
                                 params_json=c._convert.dump_params(options))
        if x is not None or encoder is None:
            self._put_items(req, "texts", "vectors", self._check_items(x, "training items"))
        if encoder is not None:  # a string index's trained encoder
            req.encoder = encoder if isinstance(encoder, bytes) else encoder.to_bytes()
        yield ("Train", req, False)

    def _add_plan(self, x: Any, ids: Any, upsert: bool, attributes: dict | None):
        x = self._check_items(x)
        if ids is not None:
            ids = check_batch_ids(ids, len(x))
        c = self._client
        attr_row = _attribute_bytes_per_row(attributes, len(x))
        step = yield from self._rows_per_call(self._row_bytes(x) + _ID_BYTES + attr_row)
        out = []
        for start in range(0, max(1, len(x)), step):
            req = c._pb.AddRequest(
                collection=self.name,
                auto_ids=ids is None,
                upsert=upsert,
                attributes_json=c._convert.dump_params(
                    {k: list(v[start : start + step]) for k, v in attributes.items()}
                    if attributes else {}),
            )
            self._put_items(req, "texts", "vectors", x[start : start + step])
            if ids is not None:
                req.ids.extend(ids[start : start + step].tolist())
            r = yield ("Add", req, upsert and ids is not None)
            out.append(np.asarray(r.ids, dtype=np.int64))
        return np.concatenate(out) if out else np.empty(0, np.int64)

    def _one_message_search(self, q: Any, k: int, allow: Any, deny: Any, where: dict | None,
                            params: dict):
        """The common search's one request, or None when the plan must split or check more:
        an unfiltered float32 batch that fits one message. Its values are the server's to judge
        (a NaN comes back as the InvalidVectorError the server raises): a second pass over the
        rows here would cost every call what the server does anyway."""
        c, k = self._client, check_k(k)
        if (allow is None and deny is None and where is None and type(q) is np.ndarray
                and q.dtype == np.float32 and q.ndim == 2 and q.shape[1] == self.dim
                and q.flags.c_contiguous and self.items == "vectors"
                and c._max_message_bytes is not None
                and len(q) * max(q.shape[1] * 4, k * c._convert.RESULT_BYTES)
                <= c._max_message_bytes - REQUEST_OVERHEAD):
            req = c._pb.SearchRequest(collection=self.name, k=k,
                                      params_json=c._convert.dump_params(params))
            c._convert.put_matrix(req.queries, q)
            return req
        return None

    def _search_plan(self, q: Any, k: int, allow: Any, deny: Any, where: dict | None,
                     params: dict):
        c = self._client
        req = self._one_message_search(q, k, allow, deny, where, params)
        if req is not None:
            return c._convert.from_search_response((yield ("Search", req, False)))
        k = check_k(k)
        q = self._check_items(q, "queries")
        filt = parse_filter(allow, deny, len(q))
        pj = c._convert.dump_params(params)
        wj = c._convert.dump_params(where) if where is not None else ""
        if where is not None and not wj:
            wj = "{}"
        budget = (yield from c._max_bytes_plan()) - REQUEST_OVERHEAD - len(wj)
        shared = sum(v.nbytes for v in (filt.allow, filt.deny) if isinstance(v, np.ndarray)) \
            if filt is not None else 0
        if shared > budget // 2:
            return (yield from self._search_split_allow(q, k, filt, where, params,
                                                        budget // 2))
        per_row = 0
        if filt is not None and not filt.shared:
            per_row = max(sum(len(v[i]) for v in (filt.allow, filt.deny) if isinstance(v, list))
                          for i in range(len(q))) * 8
        step = max(1, (budget - shared) // max(
            1, max(self._row_bytes(q), k * c._convert.RESULT_BYTES) + per_row))
        parts = []
        for start in range(0, max(1, len(q)), step):
            req = c._pb.SearchRequest(collection=self.name, k=k, params_json=pj, where_json=wj)
            self._put_items(req, "query_texts", "queries", q[start : start + step])
            if filt is not None:
                sub = filt.take(np.arange(start, min(start + step, len(q))))
                if sub.allow is not None:
                    req.allow.CopyFrom(c._convert.to_id_list(sub.allow))
                if sub.deny is not None:
                    req.deny.CopyFrom(c._convert.to_id_list(sub.deny))
            parts.append(c._convert.from_search_response((yield ("Search", req, False))))
        if len(parts) == 1:
            return parts[0]  # keeps a partial result's coverage (Pyramid coordinators)
        n = np.array([len(r.ids) for r in parts])
        coverage = float(np.dot(n, [r.coverage for r in parts]) / n.sum())
        return SearchResult(np.concatenate([r.ids for r in parts]),
                            np.concatenate([r.scores for r in parts]), coverage=coverage)

    def _search_split_allow(self, q, k, filt, where, params, budget):
        """A shared allow list larger than a message: search its pieces and keep the best k of
        all (the answer over a union is the best of the answers over its parts)."""
        if isinstance(filt.deny, np.ndarray) and filt.deny.nbytes > budget:
            raise InvalidFilterError(
                f"a deny list of {filt.deny.size} ids does not fit one message "
                f"({self._client._max_message_bytes} bytes); raise max_message_bytes, or pass "
                "the complement as an allow list")
        step = max(1, budget // 8)
        pieces = []
        for i in range(0, filt.allow.size, step):
            pieces.append((yield from self._search_plan(q, k, filt.allow[i : i + step],
                                                        filt.deny, where, params)))
        ids = np.concatenate([r.ids for r in pieces], axis=1)
        scores = np.concatenate([r.scores for r in pieces], axis=1).astype(np.float32)
        return SearchResult(*merge_topk(ids.astype(np.int64), scores, k,
                                        higher_is_better(self.metric)))

    def _get_plan(self, ids: Any, vectors: bool, where: dict | None):
        c = self._client
        wj = c._convert.dump_params(where) if where is not None else ""
        if where is not None and not wj:
            wj = "{}"
        got = []

        def pages(**ask):  # the server answers as many as fit one message, and where to go on
            offset = 0
            while True:
                r = yield ("Get", c._pb.GetRequest(collection=self.name, vectors=vectors,
                                                   where_json=wj, pages=True, offset=offset,
                                                   **ask), True)
                got.append(r)
                offset = int(r.next_offset)
                if not offset:
                    return

        if ids is None:
            yield from pages(all=True)
            return _merge_got(got, c._convert, self.dim, vectors)
        ids = as_id_array(ids)
        step = yield from self._rows_per_call(_ID_BYTES)  # the ids asked fit the request
        for i in range(0, max(1, ids.size), step):
            yield from pages(ids=np.ascontiguousarray(ids[i : i + step], "<i8").tobytes())
        return _merge_got(got, c._convert, self.dim, vectors)

    def _remove_plan(self, ids: Any, missing_ok: bool):
        ids = as_id_array(ids)
        if np.unique(ids).size != ids.size:
            raise DuplicateIdError("ids to remove must be unique")
        c = self._client
        step = yield from self._rows_per_call(_ID_BYTES)
        n = 0
        for start in range(0, max(1, ids.size), step):
            req = c._pb.RemoveRequest(collection=self.name, ids=ids[start : start + step].tolist(),
                                      missing_ok=missing_ok)
            n += int((yield ("Remove", req, missing_ok)).removed)
        return n

    def _snapshot_plan(self):
        c = self._client
        r = yield ("Snapshot", c._pb.CollectionRequest(name=self.name), False)
        return int(r.count)


def _merge_got(responses: list, convert, dim: int, vectors: bool) -> dict[str, Any]:
    """GetResponses of one ``get`` as one answer."""
    got_ids = [convert.ids_from_bytes(r.ids) for r in responses]
    attrs = [convert.load_json(r.attributes_json, "attributes_json") or {} for r in responses]
    names = sorted({n for a in attrs for n in a})
    x = None
    if vectors:
        x = np.concatenate([convert.from_matrix(r.vectors, dim) if r.vectors.rows else
                            np.empty((0, dim), np.float32) for r in responses])
    return {"ids": np.concatenate(got_ids), "vectors": x,
            "attributes": {n: [v for a, i in zip(attrs, got_ids, strict=True)
                               for v in a.get(n, [None] * i.size)] for n in names}}
