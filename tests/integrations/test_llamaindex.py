"""The LlamaIndex vector store (simsearch.integrations.llamaindex): a VectorStoreIndex built and
queried with llama-index-core's own mock embedding answers with the nodes a brute-force check
picks, over an embedded collection, a node's and a cluster's; filters, deletes and MMR."""

from __future__ import annotations

import hashlib
import itertools

import numpy as np
import pytest

pytest.importorskip("llama_index.core")

from llama_index.core import Document, StorageContext, VectorStoreIndex  # noqa: E402
from llama_index.core.base.embeddings.base import BaseEmbedding  # noqa: E402
from llama_index.core.embeddings import MockEmbedding  # noqa: E402
from llama_index.core.schema import MetadataMode, TextNode  # noqa: E402
from llama_index.core.vector_stores.types import (  # noqa: E402
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
    VectorStoreQueryMode,
)

import simsearch as ss  # noqa: E402
from simsearch.integrations._items import item_id  # noqa: E402
from simsearch.integrations.llamaindex import SimsearchVectorStore  # noqa: E402

DIM = 8
_names = itertools.count()


class HashEmbedding(BaseEmbedding):
    """A deterministic embedding with distinct vectors (the mock's are all equal)."""

    def _vec(self, text: str) -> list[float]:
        seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
        return np.random.default_rng(seed).standard_normal(DIM).tolist()

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._vec(query)

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._vec(text)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._vec(query)


def brute_force(nodes: list[TextNode], embed, query: str, k: int) -> list[str]:
    """The texts of the top-k nodes by cosine similarity of what LlamaIndex embeds (text and
    metadata), ties to the smaller collection id."""
    texts = [n.get_content() for n in nodes]
    x = np.asarray([embed.get_text_embedding(n.get_content(metadata_mode=MetadataMode.EMBED))
                    for n in nodes], np.float64)
    q = np.asarray(embed.get_query_embedding(query), np.float64)
    cos = (x @ q) / np.linalg.norm(x, axis=1) / np.linalg.norm(q)
    ids = [item_id(f"n{i}") for i in range(len(texts))]
    order = sorted(range(len(texts)), key=lambda i: (-round(float(cos[i]), 5), ids[i]))
    return [texts[i] for i in order[:k]]


def make_store(where: str, request) -> SimsearchVectorStore:
    name = f"li{next(_names)}"
    if where == "embedded":
        return SimsearchVectorStore(collection_name=name, kind="flat")
    if where == "node":
        return SimsearchVectorStore(client=request.getfixturevalue("node").address,
                                    collection_name=name, kind="flat")
    cl = request.getfixturevalue("small_cluster")
    with ss.connect(cl.coordinator, timeout=60) as c:
        c.create_collection(name, DIM, "cosine", "pyramid", n_centers=4, n_partitions=2,
                            sub_index="flat").train(
            np.random.default_rng(0).standard_normal((64, DIM)).astype(np.float32))
    return SimsearchVectorStore(client=cl.coordinator, collection_name=name)


TEXTS = [f"text number {i} about {['cats', 'dogs', 'birds'][i % 3]}" for i in range(40)]


@pytest.mark.parametrize("where", ["embedded", "node", "cluster"])
@pytest.mark.parametrize("embed", [MockEmbedding(embed_dim=DIM), HashEmbedding()],
                         ids=["mock", "hash"])
def test_a_vector_store_index_answers_like_brute_force(where, embed, request):
    store = make_store(where, request)
    try:
        nodes = [TextNode(text=t, id_=f"n{i}", metadata={"i": i}) for i, t in enumerate(TEXTS)]
        index = VectorStoreIndex(nodes, storage_context=StorageContext.from_defaults(
            vector_store=store), embed_model=embed)
        for query in ("dogs", "text number 7", "something else"):
            got = index.as_retriever(similarity_top_k=5).retrieve(query)
            assert [n.node.get_content() for n in got] == brute_force(nodes, embed, query, 5)
            assert all(n.node.metadata == {"i": TEXTS.index(n.node.get_content())} for n in got)
    finally:
        store.clear()
        store.close()


@pytest.fixture
def store():
    s = SimsearchVectorStore()
    yield s
    s.close()


def nodes_with_metadata(embed):
    out = []
    for i in range(30):
        n = TextNode(text=f"item {i}", id_=f"n{i}", metadata={
            "i": i, "kind": ["a", "b", "c"][i % 3], "tags": ["even"] if i % 2 == 0 else ["odd"],
            "w": i / 10})
        n.embedding = embed.get_text_embedding(n.text)
        n.relationships = {}
        out.append(n)
    return out


F = MetadataFilter
CASES = [
    (MetadataFilters(filters=[F(key="kind", value="b")]), lambda m: m["kind"] == "b"),
    (MetadataFilters(filters=[F(key="i", value=20, operator=FilterOperator.GTE),
                              F(key="w", value=2.5, operator=FilterOperator.LT)]),
     lambda m: 20 <= m["i"] and m["w"] < 2.5),
    (MetadataFilters(filters=[F(key="kind", value="a"), F(key="i", value=3,
                                                          operator=FilterOperator.LTE)],
                     condition=FilterCondition.OR), lambda m: m["kind"] == "a" or m["i"] <= 3),
    (MetadataFilters(filters=[F(key="kind", value=["a", "c"], operator=FilterOperator.NIN)]),
     lambda m: m["kind"] == "b"),
    (MetadataFilters(filters=[F(key="tags", value="even", operator=FilterOperator.CONTAINS),
                              F(key="i", value=10, operator=FilterOperator.NE)]),
     lambda m: m["i"] % 2 == 0 and m["i"] != 10),
    (MetadataFilters(filters=[F(key="tags", value=["odd", "x"], operator=FilterOperator.ANY)]),
     lambda m: m["i"] % 2 == 1),
    (MetadataFilters(filters=[MetadataFilters(filters=[F(key="kind", value="c")])],
                     condition=FilterCondition.NOT), lambda m: m["kind"] != "c"),
]


@pytest.mark.parametrize("filters,keep", CASES)
def test_filters_select_like_a_predicate(store, filters, keep):
    embed = HashEmbedding()
    nodes = nodes_with_metadata(embed)
    store.add(nodes)
    r = store.query(VectorStoreQuery(query_embedding=embed.get_query_embedding("item 3"),
                                     similarity_top_k=30, filters=filters))
    assert sorted(r.ids) == sorted(n.node_id for n in nodes if keep(n.metadata))
    assert sorted(n.node_id for n in store.get_nodes(filters=filters)) == sorted(r.ids)


def test_deletes_gets_clear_and_mmr(store):
    embed = HashEmbedding()
    docs = [Document(text=f"doc {d} part {p}", doc_id=f"d{d}") for d in range(3) for p in range(4)]
    index = VectorStoreIndex.from_documents(docs, storage_context=StorageContext.from_defaults(
        vector_store=store), embed_model=embed)
    every = store.get_nodes()
    assert len(every) == 12
    index.delete_ref_doc("d1")
    left = store.get_nodes()
    assert {n.ref_doc_id for n in left} == {"d0", "d2"} and len(left) == 8
    first = left[0].node_id
    assert [n.node_id for n in store.get_nodes([first, "missing"])] == [first]
    store.delete_nodes([first])
    assert first not in {n.node_id for n in store.get_nodes()}
    q = embed.get_query_embedding("doc 0")
    plain = store.query(VectorStoreQuery(query_embedding=q, similarity_top_k=3))
    mmr = store.query(VectorStoreQuery(query_embedding=q, similarity_top_k=3,
                                       mode=VectorStoreQueryMode.MMR, mmr_threshold=0.2))
    assert len(mmr.ids) == 3 and mmr.ids[0] == plain.ids[0]
    only = store.query(VectorStoreQuery(query_embedding=q, similarity_top_k=5,
                                        doc_ids=["d2"]))
    assert {n.ref_doc_id for n in only.nodes} == {"d2"}
    store.clear()
    assert store.get_nodes() == [] and store.query(VectorStoreQuery(
        query_embedding=q, similarity_top_k=3)).ids == []
