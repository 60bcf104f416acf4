"""LangChain's ``VectorStore`` over a simsearch collection (docs/integrations.md).

    from simsearch.integrations.langchain import SimsearchVectorStore

    store = SimsearchVectorStore(embedding=embeddings)                  # embedded, in memory
    store = SimsearchVectorStore(embedding=embeddings, client="localhost:50051")   # a node
    store.add_documents(docs, ids=["a", "b"])
    store.similarity_search("query", k=4, filter={"source": {"$in": ["x", "y"]}})

A document is an item of the collection: its embedding the vector, its text, id and metadata
(as JSON, so they come back exactly) in reserved attributes, and each metadata value that is an
int, float, bool, string or list of strings also in an attribute of the metadata key's name, so
that ``filter`` (the ``where`` language of docs/filters.md: ``{"key": value}``, ``$eq``, ``$ne``,
``$in``, ``$nin``, ``$lt``..., ``$and``, ``$or``, ``$not``) can select on it. LangChain's string
ids map to the collection's int64 ids through a 62-bit hash; the id is stored, and a collision
is refused, never silently merged.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import VectorStore
from langchain_core.vectorstores.utils import maximal_marginal_relevance

from ..errors import InvalidParameterError
from ._items import (
    KEY,
    METADATA,
    TEXT,
    HoldsCollection,
    check_new,
    item_ids,
    metadata_columns,
    open_client,
    owned,
)

__all__ = ["SimsearchVectorStore"]


class SimsearchVectorStore(HoldsCollection, VectorStore):
    """A LangChain vector store kept in one simsearch collection (module docstring).

    embedding: the LangChain ``Embeddings``. client: a ``simsearch.connect`` client, an address
    for it (``"host:port"``, ``":memory:"``), or None for an embedded in-memory collection.
    collection_name: the collection (created on the first add with the embedding's dimension,
    ``metric``, ``kind`` and ``index_params``, unless it exists: a cluster's, trained, is used
    as it is). search_params: passed to every search (e.g. ``{"ef": 128}``).

    >>> from langchain_core.embeddings import DeterministicFakeEmbedding
    >>> from simsearch.integrations.langchain import SimsearchVectorStore
    >>> store = SimsearchVectorStore(embedding=DeterministicFakeEmbedding(size=16))
    >>> ids = store.add_texts(["cats purr", "dogs bark"], metadatas=[{"n": 1}, {"n": 2}])
    >>> [d.page_content for d in store.similarity_search("dogs bark", k=1)]
    ['dogs bark']
    >>> [d.metadata for d in store.similarity_search("cats purr", k=2, filter={"n": 1})]
    [{'n': 1}]
    """

    def __init__(self, embedding: Embeddings, *, client: Any = None,
                 collection_name: str = "langchain", metric: str = "cosine",
                 kind: str = "hnsw", index_params: dict | None = None,
                 search_params: dict | None = None):
        self._client, self._owns_client = open_client(client)
        self._embedding = embedding
        self.collection_name, self.metric, self.kind = collection_name, metric, kind
        self.index_params = dict(index_params or {})
        self.search_params = dict(search_params or {})
        self._col: Any = None

    @property
    def embeddings(self) -> Embeddings:
        return self._embedding

    @property
    def client(self) -> Any:
        return self._client

    # -- writes -------------------------------------------------------------------------------

    def add_texts(self, texts: Iterable[str], metadatas: list[dict] | None = None, *,
                  ids: list[str | None] | None = None, **kwargs: Any) -> list[str]:
        texts = list(texts)
        if not texts:
            return []
        metadatas = [dict(m or {}) for m in (metadatas or [{}] * len(texts))]
        ids = [str(i) if i is not None else str(uuid.uuid4())
               for i in (ids if ids is not None else [None] * len(texts))]
        if not len(texts) == len(metadatas) == len(ids):
            raise InvalidParameterError(f"texts, metadatas and ids must have one entry per "
                                        f"text; got {len(texts)}, {len(metadatas)}, {len(ids)}")
        x = np.asarray(self._embedding.embed_documents(texts), np.float32)
        col = self._collection(x.shape[1])
        keys = item_ids(ids)
        check_new(col, keys, ids)
        attributes = {TEXT: texts, KEY: ids,
                      METADATA: [json.dumps(m, default=str) for m in metadatas],
                      **metadata_columns(metadatas, col.describe().get("schema") or {})}
        col.add(x, ids=keys, upsert=True, attributes=attributes)
        return ids

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        """Delete these documents (missing ones are skipped), or with ``ids=None`` all of
        them (the collection is dropped)."""
        if ids is None:
            if self._collection() is not None:
                self._client.drop_collection(self.collection_name)
                self._col = None
            return True
        col = self._collection()
        if col is not None and ids:
            col.remove(owned(col.get(item_ids(ids)), ids), missing_ok=True)
        return True

    # -- reads --------------------------------------------------------------------------------

    def _documents(self, keys: np.ndarray, vectors: bool = False):
        """(documents of the held ``keys`` in their order, their vectors or None)."""
        got = self._col.get(keys, vectors=vectors)
        a, none = got["attributes"], [None] * got["ids"].size
        docs = [Document(id=i if i is not None else str(k), page_content=t or "",
                         metadata=json.loads(m) if m else {})
                for k, i, t, m in zip(got["ids"].tolist(), a.get(KEY, none), a.get(TEXT, none),
                                      a.get(METADATA, none), strict=True)]
        return docs, got["ids"], got["vectors"]

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        if self._collection() is None or not ids:
            return []
        docs, _, _ = self._documents(item_ids(ids))
        return [d for d in docs if d.id in {str(i) for i in ids}]

    def _search(self, embedding: list[float], k: int, filter: dict | None, **kwargs: Any):
        """(ids, scores) of the best ``k`` held items, best first."""
        if self._collection() is None:
            return np.empty(0, np.int64), np.empty(0, np.float32)
        params = {**self.search_params, **kwargs}
        r = self._col.search(np.asarray([embedding], np.float32), k, where=filter, **params)
        ok = r.ids[0] >= 0
        return r.ids[0][ok], r.scores[0][ok]

    def similarity_search_with_score_by_vector(
            self, embedding: list[float], k: int = 4, filter: dict | None = None,
            **kwargs: Any) -> list[tuple[Document, float]]:
        """The ``k`` nearest documents and their scores (the collection's metric: cosine
        similarity by default, higher is closer)."""
        keys, scores = self._search(embedding, k, filter, **kwargs)
        if not keys.size:
            return []
        docs, held, _ = self._documents(keys)
        score = dict(zip(keys.tolist(), scores.tolist(), strict=True))
        return [(d, score[h]) for d, h in zip(docs, held.tolist(), strict=True)]

    def similarity_search_with_score(self, query: str, k: int = 4, filter: dict | None = None,
                                     **kwargs: Any) -> list[tuple[Document, float]]:
        return self.similarity_search_with_score_by_vector(
            self._embedding.embed_query(query), k, filter, **kwargs)

    def similarity_search_by_vector(self, embedding: list[float], k: int = 4,
                                    filter: dict | None = None, **kwargs: Any) -> list[Document]:
        return [d for d, _ in self.similarity_search_with_score_by_vector(embedding, k, filter,
                                                                          **kwargs)]

    def similarity_search(self, query: str, k: int = 4, filter: dict | None = None,
                          **kwargs: Any) -> list[Document]:
        return self.similarity_search_by_vector(self._embedding.embed_query(query), k, filter,
                                                **kwargs)

    def _select_relevance_score_fn(self) -> Callable[[float], float]:
        """Scores as relevance in [0, 1]: cosine similarity s as (1 + s) / 2; squared L2
        distance d (of unit vectors) as 1 - sqrt(d) / 2; inner products as cosine (for
        normalized embeddings)."""
        if self.metric == "l2":
            return lambda d: 1.0 - math.sqrt(max(d, 0.0)) / 2.0
        return lambda s: (1.0 + s) / 2.0

    def max_marginal_relevance_search_by_vector(
            self, embedding: list[float], k: int = 4, fetch_k: int = 20,
            lambda_mult: float = 0.5, filter: dict | None = None,
            **kwargs: Any) -> list[Document]:
        """``fetch_k`` nearest documents, of which ``k`` are chosen for relevance and
        diversity (LangChain's maximal marginal relevance over their stored vectors)."""
        keys, _ = self._search(embedding, fetch_k, filter, **kwargs)
        if not keys.size:
            return []
        docs, _, x = self._documents(keys, vectors=True)
        pick = maximal_marginal_relevance(np.asarray(embedding, np.float32), list(x),
                                          lambda_mult=lambda_mult, k=min(k, len(docs)))
        return [docs[i] for i in pick]

    def max_marginal_relevance_search(self, query: str, k: int = 4, fetch_k: int = 20,
                                      lambda_mult: float = 0.5, filter: dict | None = None,
                                      **kwargs: Any) -> list[Document]:
        return self.max_marginal_relevance_search_by_vector(
            self._embedding.embed_query(query), k, fetch_k, lambda_mult, filter, **kwargs)

    @classmethod
    def from_texts(cls, texts: list[str], embedding: Embeddings,
                   metadatas: list[dict] | None = None, *, ids: list[str] | None = None,
                   **kwargs: Any) -> SimsearchVectorStore:
        store = cls(embedding, **kwargs)
        store.add_texts(texts, metadatas, ids=ids)
        return store
