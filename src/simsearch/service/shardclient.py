"""The calls a Pyramid coordinator makes on its shard servers (docs/cluster.md): fenced part
writes, router checkpoints kept as blobs, and the fan-out's one-call searches. They are not on
the public client (``simsearch.connect``): a user never makes them, and a node refuses them
to every role but ``cluster`` (docs/service.md, "Security model")."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..index import SearchResult
from .client import Client, RemoteCollection, raise_from


def connect_shard(address: str | Sequence[str], token: str | None = None, tls_ca: Any = None,
                  **options: Any) -> ShardClient:
    """A ShardClient of the node at ``address`` (``connect``'s options)."""
    return ShardClient(address, token, tls_ca, **options)


class ShardClient(Client):
    """``Client`` and the cluster-internal calls (module docstring)."""

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
        req = self._pb.SearchRequest(collection=name, k=k, params_json=params_json)
        self._convert.put_matrix(req.queries, q)
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
            raise_from(err)
        return self._convert.from_search_response(resp)

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
            raise_from(err)

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
