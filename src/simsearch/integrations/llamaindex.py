"""LlamaIndex's vector store over a simsearch collection (docs/integrations.md).

    from llama_index.core import StorageContext, VectorStoreIndex
    from simsearch.integrations.llamaindex import SimsearchVectorStore

    store = SimsearchVectorStore()                          # embedded, in memory
    store = SimsearchVectorStore(client="localhost:50051")  # a node, or a cluster
    index = VectorStoreIndex(nodes, storage_context=StorageContext.from_defaults(
        vector_store=store))

A node is an item of the collection: its embedding the vector, the node itself (LlamaIndex's
own serialization, text included) in a reserved attribute, its id and ``ref_doc_id`` in
attributes, and each metadata value that is an int, float, bool, string or list of strings in
an attribute of its key's name, where ``MetadataFilters`` select on it (translated to the
``where`` language of docs/filters.md).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.schema import BaseNode
from llama_index.core.vector_stores.types import (
    BasePydanticVectorStore,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
    VectorStoreQueryResult,
)
from llama_index.core.vector_stores.utils import metadata_dict_to_node, node_to_metadata_dict

from ..errors import InvalidParameterError
from ._items import (
    KEY,
    METADATA,
    HoldsCollection,
    check_new,
    item_ids,
    metadata_columns,
    open_client,
    owned,
)
from .llama_filters import REF_DOC, judge, plan_filters

__all__ = ["SimsearchVectorStore"]

def _metadata(stored: str) -> dict:
    """A node's metadata as LlamaIndex's own stores filter on it (without the node's JSON)."""
    md = json.loads(stored)
    md.pop("_node_content", None)
    return md


class SimsearchVectorStore(HoldsCollection, BasePydanticVectorStore):
    """A LlamaIndex vector store kept in one simsearch collection (module docstring).

    client: a ``simsearch.connect`` client, an address for it, or None for an embedded
    in-memory collection. collection_name: the collection (created on the first add with the
    embeddings' dimension, ``metric``, ``kind`` and ``index_params``, unless it exists: a
    cluster's, trained, is used as it is). search_params: passed to every search.

    >>> from llama_index.core.schema import TextNode
    >>> from llama_index.core.vector_stores import VectorStoreQuery
    >>> from simsearch.integrations.llamaindex import SimsearchVectorStore
    >>> store = SimsearchVectorStore()                     # embedded, in memory
    >>> store.add([TextNode(id_="a", text="one", embedding=[1.0, 0.0]),
    ...            TextNode(id_="b", text="two", embedding=[0.0, 1.0])])
    ['a', 'b']
    >>> store.query(VectorStoreQuery(query_embedding=[0.1, 0.9], similarity_top_k=1)).ids
    ['b']
    """

    stores_text: bool = True
    flat_metadata: bool = False
    collection_name: str = "llamaindex"
    metric: str = "cosine"
    kind: str = "hnsw"
    index_params: dict = {}
    search_params: dict = {}

    _client: Any = PrivateAttr()
    _owns_client: bool = PrivateAttr()
    _col: Any = PrivateAttr(default=None)

    def __init__(self, client: Any = None, **fields: Any):
        super().__init__(**fields)
        self._client, self._owns_client = open_client(client)

    @classmethod
    def class_name(cls) -> str:
        return "SimsearchVectorStore"

    @property
    def client(self) -> Any:
        return self._client

    # -- writes -------------------------------------------------------------------------------

    def add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[str]:
        if not nodes:
            return []
        ids = [n.node_id for n in nodes]
        x = np.asarray([n.get_embedding() for n in nodes], np.float32)
        col = self._collection(x.shape[1])
        keys = item_ids(ids)
        check_new(col, keys, ids)
        stored = [node_to_metadata_dict(n, flat_metadata=self.flat_metadata) for n in nodes]
        columns = metadata_columns([dict(n.metadata) for n in nodes],
                                   col.describe().get("schema") or {})
        columns.pop(REF_DOC, None)  # the node's own, below
        # "None" without a parent, as LlamaIndex's metadata says (filters select on it)
        attributes = {**columns, KEY: ids, REF_DOC: [n.ref_doc_id or "None" for n in nodes],
                      METADATA: [json.dumps(m) for m in stored]}
        col.add(x, ids=keys, upsert=True, attributes=attributes)
        return ids

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Delete every node of document ``ref_doc_id``."""
        col = self._collection()
        if col is not None and REF_DOC in (col.describe().get("schema") or {}):
            col.remove(col.get(where={REF_DOC: ref_doc_id})["ids"], missing_ok=True)

    def delete_nodes(self, node_ids: list[str] | None = None,
                     filters: MetadataFilters | None = None, **delete_kwargs: Any) -> None:
        """Delete the nodes ``node_ids`` names (all when None) that ``filters`` select."""
        col = self._collection()
        if col is None or node_ids == []:
            return
        got = self._get(col, node_ids, filters)
        keys = got["ids"] if node_ids is None else owned(got, node_ids)
        col.remove(keys, missing_ok=True)

    def clear(self) -> None:
        """Delete every node (the collection is dropped)."""
        if self._collection() is not None:
            self._client.drop_collection(self.collection_name)
            self._col = None

    # -- reads --------------------------------------------------------------------------------

    def _nodes(self, got: dict) -> list[BaseNode]:
        return [metadata_dict_to_node(json.loads(m)) for m in got["attributes"].get(
            METADATA, [])]

    def get_nodes(self, node_ids: list[str] | None = None,
                  filters: MetadataFilters | None = None) -> list[BaseNode]:
        """The nodes ``node_ids`` names (in that order; all when None) that ``filters``
        select."""
        col = self._collection()
        if col is None or node_ids == []:
            return []
        got = self._get(col, node_ids, filters)
        if node_ids is not None:
            mine = set(owned(got, node_ids).tolist())
            keep = [j for j, k in enumerate(got["ids"].tolist()) if k in mine]
            got = {"ids": got["ids"][keep],
                   "attributes": {n: [v[j] for j in keep] for n, v in got["attributes"].items()}}
        return self._nodes(got)

    def _plan(self, col: Any, filters: MetadataFilters | None) -> tuple[dict | None, Any]:
        """(a where exact for the items it covers, the ids of the other items the filters
        select, judged here; None when there are none): llama_filters.FilterPlan."""
        schema = col.describe().get("schema") or {}
        if KEY not in schema:  # no node was ever added: nothing to select
            return None, None
        plan = plan_filters(filters, schema)
        if plan.check is None:
            return plan.where, None
        unsure = col.get(where=plan.check)
        test = judge(filters)
        picked = [k for k, m in zip(unsure["ids"].tolist(), unsure["attributes"].get(
            METADATA, []), strict=True) if test(_metadata(m))]
        rest = {"$not": plan.check}
        where = rest if plan.where is None else {"$and": [plan.where, rest]}
        return where, np.array(picked, np.int64)

    def _get(self, col: Any, node_ids: list[str] | None, filters: MetadataFilters | None
             ) -> dict:
        keys = None if node_ids is None else item_ids(node_ids)
        where, picked = self._plan(col, filters)
        got = col.get(keys, where=where)
        if picked is not None and picked.size:
            if keys is not None:
                picked = keys[np.isin(keys, picked)]
            more = col.get(picked)
            got = {"ids": np.concatenate([got["ids"], more["ids"]]), "attributes": {
                n: list(got["attributes"].get(n, [None] * got["ids"].size)) +
                list(more["attributes"].get(n, [None] * more["ids"].size))
                for n in {*got["attributes"], *more["attributes"]}}}
            if keys is not None:  # in the order asked
                rank = {k: i for i, k in enumerate(keys.tolist())}
                order = sorted(range(got["ids"].size), key=lambda j: rank[int(got["ids"][j])])
                got = {"ids": got["ids"][order], "attributes": {
                    n: [v[j] for j in order] for n, v in got["attributes"].items()}}
        return got

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        """The ``similarity_top_k`` nearest nodes (modes "default" and "mmr"), among
        ``node_ids`` / ``doc_ids`` when given (not empty), that ``filters`` select."""
        if query.mode not in (VectorStoreQueryMode.DEFAULT, VectorStoreQueryMode.MMR):
            raise InvalidParameterError(f"query mode {query.mode.value!r} is not supported; "
                                        "use 'default' or 'mmr'")
        col = self._collection()
        if col is None or query.query_embedding is None:
            return VectorStoreQueryResult(nodes=[], similarities=[], ids=[])
        where, picked = self._plan(col, query.filters)
        docs = None
        if query.doc_ids:  # None or empty: no restriction (as LlamaIndex's own stores)
            docs = {REF_DOC: {"in": list(query.doc_ids)}}
            where = docs if where is None else {"$and": [where, docs]}
        allow = item_ids(query.node_ids) if query.node_ids else None
        k = query.similarity_top_k
        mmr = query.mode == VectorStoreQueryMode.MMR
        fetch = max(k, int(kwargs.get("mmr_prefetch_k", 4 * k))) if mmr else k
        q = np.asarray([query.query_embedding], np.float32)
        r = col.search(q, fetch, allow=allow, where=where, **self.search_params)
        keys, scores = r.ids[0][r.ids[0] >= 0], r.scores[0][r.ids[0] >= 0]
        if picked is not None and picked.size:  # the items judged here: a second search
            if allow is not None:
                picked = picked[np.isin(picked, allow)]
            r2 = col.search(q, fetch, allow=picked, where=docs, **self.search_params)
            keys = np.concatenate([keys, r2.ids[0][r2.ids[0] >= 0]])
            scores = np.concatenate([scores, r2.scores[0][r2.ids[0] >= 0]])
            order = np.lexsort((keys, scores if col.metric == "l2" else -scores))[:fetch]
            keys, scores = keys[order], scores[order]
        got = col.get(keys, vectors=mmr)
        score = dict(zip(keys.tolist(), scores.tolist(), strict=True))
        sims = [score[i] for i in got["ids"].tolist()]
        nodes = self._nodes(got)
        if mmr and nodes:
            from llama_index.core.indices.query.embedding_utils import get_top_k_mmr_embeddings

            sims, pick = get_top_k_mmr_embeddings(
                query.query_embedding, got["vectors"].tolist(), similarity_top_k=k,
                embedding_ids=list(range(len(nodes))), mmr_threshold=query.mmr_threshold)
            nodes = [nodes[i] for i in pick]
        return VectorStoreQueryResult(nodes=nodes, similarities=list(sims),
                                      ids=[n.node_id for n in nodes])
