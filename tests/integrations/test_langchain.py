"""The LangChain vector store (simsearch.integrations.langchain): langchain-tests' standard
suite, unmodified, over an embedded collection, a node's and a cluster's; then what the suite
does not cover (filters, scores, maximal marginal relevance, metadata types, id collisions)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("langchain_tests")

from langchain_core.documents import Document  # noqa: E402
from langchain_core.embeddings import DeterministicFakeEmbedding  # noqa: E402
from langchain_tests.integration_tests import VectorStoreIntegrationTests  # noqa: E402

import simsearch as ss  # noqa: E402
from simsearch.integrations._items import KEY, item_id  # noqa: E402
from simsearch.integrations.langchain import SimsearchVectorStore  # noqa: E402

_names = itertools.count()


class TestEmbedded(VectorStoreIntegrationTests):
    @pytest.fixture()
    def vectorstore(self):
        store = SimsearchVectorStore(self.get_embeddings())
        try:
            yield store
        finally:
            store.close()


class TestOnANode(VectorStoreIntegrationTests):
    @pytest.fixture()
    def vectorstore(self, node):
        store = SimsearchVectorStore(self.get_embeddings(), client=node.address,
                                     collection_name=f"lc{next(_names)}")
        try:
            yield store
        finally:
            store.delete()
            store.close()


class TestOnACluster(VectorStoreIntegrationTests):
    """A cluster holds Pyramid collections, trained before the first add: the store is given
    one by name (every part searched: the suite's rankings are exact)."""

    @pytest.fixture()
    def vectorstore(self, small_cluster):
        name = f"lc{next(_names)}"
        with ss.connect(small_cluster.coordinator, timeout=60) as c:
            col = c.create_collection(name, 6, "cosine", "pyramid", n_centers=4,
                                      n_partitions=2, sub_index="flat")
            col.train(np.random.default_rng(0).standard_normal((64, 6)).astype(np.float32))
        store = SimsearchVectorStore(self.get_embeddings(), client=small_cluster.coordinator,
                                     collection_name=name)
        try:
            yield store
        finally:
            store.client.drop_collection(name)
            store.close()


@pytest.fixture
def store():
    s = SimsearchVectorStore(DeterministicFakeEmbedding(size=16))
    yield s
    s.close()


def test_metadata_filters_select_like_an_exact_scan(store):
    rng = np.random.default_rng(1)
    docs = [Document(page_content=f"doc {i}", metadata={
        "n": int(i), "group": ["a", "b", "c"][i % 3], "score": float(rng.random()),
        "tags": ["even"] if i % 2 == 0 else [], "nested": {"keep": i}}) for i in range(60)]
    store.add_documents(docs, ids=[str(i) for i in range(60)])
    for flt, keep in [({"group": "b"}, lambda m: m["group"] == "b"),
                      ({"n": {"$gte": 50}}, lambda m: m["n"] >= 50),
                      ({"$or": [{"group": "a"}, {"tags": "even"}]},
                       lambda m: m["group"] == "a" or "even" in m["tags"]),
                      ({"$and": [{"group": {"$in": ["a", "c"]}}, {"n": {"$lt": 20}}]},
                       lambda m: m["group"] in ("a", "c") and m["n"] < 20)]:
        got = store.similarity_search("doc 7", k=60, filter=flt)
        assert sorted(int(d.id) for d in got) == [i for i in range(60) if keep(docs[i].metadata)]
        assert all(d.metadata == docs[int(d.id)].metadata for d in got)  # exact round trip


def test_scores_relevance_and_mmr(store):
    texts = ["apple", "apple pie", "banana", "cherry", "date", "elderberry"]
    store.add_texts(texts, ids=texts)
    emb = store.embeddings
    q = np.asarray(emb.embed_query("apple"), np.float32)
    x = np.asarray(emb.embed_documents(texts), np.float32)
    cos = (x @ q) / np.linalg.norm(x, axis=1) / np.linalg.norm(q)
    got = store.similarity_search_with_score("apple", k=6)
    assert [d.id for d, _ in got] == [texts[i] for i in np.argsort(-cos)]
    np.testing.assert_allclose([s for _, s in got], np.sort(cos)[::-1], rtol=1e-4, atol=1e-5)
    rel = store.similarity_search_with_relevance_scores("apple", k=2)
    assert rel[0][0].id == "apple" and abs(rel[0][1] - 1.0) < 1e-5 and 0 <= rel[1][1] <= 1
    from langchain_core.vectorstores.utils import maximal_marginal_relevance

    want = maximal_marginal_relevance(q, list(x[np.argsort(-cos)]), k=3, lambda_mult=0.3)
    mmr = store.max_marginal_relevance_search("apple", k=3, fetch_k=6, lambda_mult=0.3)
    assert [d.id for d in mmr] == [texts[np.argsort(-cos)[i]] for i in want]


def test_metadata_of_another_type_stays_exact_but_unfiltered(store):
    store.add_texts(["one", "two"], [{"v": 1}, {"v": 2}], ids=["1", "2"])
    store.add_texts(["three"], [{"v": "three", "x": [1, {"y": None}]}], ids=["3"])
    assert store.get_by_ids(["3"])[0].metadata == {"v": "three", "x": [1, {"y": None}]}
    assert sorted(d.id for d in store.similarity_search("one", k=5, filter={"v": {"$gt": 0}})) \
        == ["1", "2"]


def test_an_id_hash_collision_is_refused_not_merged(store, monkeypatch):
    import simsearch.integrations._items as items

    store.add_texts(["first"], ids=["a"])
    monkeypatch.setattr(items, "item_id", lambda s: item_id("a"))  # every id collides with "a"
    with pytest.raises(ss.errors.InvalidParameterError, match="same item id"):
        store.add_texts(["second"], ids=["b"])
    store.delete(["b"])  # a colliding delete leaves "a" alone
    monkeypatch.undo()
    assert [d.page_content for d in store.get_by_ids(["a"])] == ["first"]
    raw = store.client.collection("langchain").get([item_id("a")])
    assert raw["attributes"][KEY] == ["a"] and json.loads(
        raw["attributes"]["_metadata"][0]) == {}


def test_a_store_on_a_path_keeps_its_documents(tmp_path):
    emb = DeterministicFakeEmbedding(size=8)
    s = SimsearchVectorStore(emb, client=ss.connect(path=tmp_path))
    s.add_texts(["kept"], [{"k": 1}], ids=["x"])
    s.client.close()
    s = SimsearchVectorStore(emb, client=ss.connect(path=tmp_path))
    assert s.get_by_ids(["x"]) == [Document(id="x", page_content="kept", metadata={"k": 1})]
    s.client.close()


def test_metadata_keys_past_the_column_cap_are_kept():
    """The defect: after 256 distinct metadata keys every add with a new key failed; now keys
    past the adapter's column cap stay in the metadata JSON (and come back with the document)."""
    s = SimsearchVectorStore(DeterministicFakeEmbedding(size=16))
    for batch in range(6):
        s.add_texts([f"t{i}" for i in range(batch * 50, batch * 50 + 50)],
                    metadatas=[{f"k{i}": i} for i in range(batch * 50, batch * 50 + 50)])
    assert s.similarity_search("t299", k=1)[0].metadata == {"k299": 299}
