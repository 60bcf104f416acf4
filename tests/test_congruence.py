"""One API, four places: the same calls against an in-process index, an embedded collection
(in memory and on a path), a node's and a cluster's give the same answers (qdrant-client's
congruence tests are the model)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import simsearch as ss
from simsearch.errors import InvalidIdError, UnknownIdError

pytest.importorskip("grpc")

DIM, K = 12, 7
_names = itertools.count()
#: every kind a node's collection can hold (a cluster's are pyramids: the test below; strings:
#: test_strings_answer_the_same_everywhere), small enough to build in a moment
KINDS = [("flat", "l2", {}), ("flat", "cosine", {}), ("hnsw", "ip", {"M": 16}),
         ("norm-scan", "ip", {}), ("norm-ivf", "ip", {"n_lists": 4}),
         ("ipnsw-plus", "ip", {"M": 8, "n_threads": 1, "progress": False}),
         ("nr-lsh", "ip", {"n_bits": 16, "n_ranges": 4}), ("simple-lsh", "ip", {"n_bits": 16}),
         ("neq", "ip", {"base": "pq", "n_codebooks": 4, "nbits": 4, "keep_vectors": True,
                        "progress": False}),
         ("auto", "ip", {"candidates": ["flat", "norm-scan"], "n_eval": 20, "progress": False}),
         ("pyramid", "l2", {"n_centers": 8, "n_partitions": 2, "sub_index": "flat"})]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((300, DIM)).astype(np.float32)
    attrs = {"colour": [["red", "green", "blue"][i % 3] for i in range(300)],
             "n": list(range(300)), "tags": [["even"] if i % 2 == 0 else [] for i in range(300)]}
    return x, rng.standard_normal((9, DIM)).astype(np.float32), attrs


@pytest.fixture(scope="module")
def clients(node, tmp_path_factory):
    out = {"memory": ss.connect(":memory:"),
           "path": ss.connect(path=tmp_path_factory.mktemp("embedded")),
           "node": ss.connect(node.address, timeout=60)}
    yield out
    for c in out.values():
        c.close()


def calls(col, x, q, attrs):
    """The same calls; what they answered."""
    col.add(x[:200], attributes={k: v[:200] for k, v in attrs.items()})
    col.add(x[200:], ids=np.arange(1000, 1100),
            attributes={k: v[200:] for k, v in attrs.items()})
    col.remove(np.arange(0, 200, 7))
    out = [len(col), col.search(q, K), col.search(q, K, allow=np.arange(0, 1100, 3)),
           col.search(q, K, deny=[np.arange(i, 50) for i in range(len(q))]),
           col.search(q, K, where={"colour": "red", "n": {"gte": 100}}),
           col.search(q, K, where={"$or": [{"tags": "even"}, {"colour": "blue"}]},
                      allow=np.arange(0, 1100, 2))]
    got = col.get([1050, 7, 3, 5000, 0, 1], vectors=True)
    sel = col.get(where={"colour": "green", "n": {"lt": 60}})
    return out, got, sel


@pytest.mark.parametrize("kind,metric,params", KINDS, ids=[f"{k}-{m}" for k, m, _ in KINDS])
def test_the_same_calls_answer_the_same_everywhere(kind, metric, params, data, clients):
    x, q, attrs = data
    ref = ss.create_index(kind, DIM, metric, **params)
    if ref.capabilities.needs_training:
        ref.train(x)
    ref.add(x[:200])
    ref.add(x[200:], ids=np.arange(1000, 1100))
    ref.remove(np.arange(0, 200, 7))
    want_plain = ref.search(q, K)
    answers = {}
    for where, c in clients.items():
        col = c.create_collection(f"c{next(_names)}", DIM, metric, kind, **params)
        if ref.capabilities.needs_training:
            col.train(x)
        answers[where] = calls(col, x, q, attrs)
    first = answers["memory"]
    assert first[0][0] == len(ref)
    np.testing.assert_array_equal(first[0][1].ids, want_plain.ids)
    np.testing.assert_allclose(first[0][1].scores, want_plain.scores, rtol=1e-5, atol=1e-5)
    for where, (out, got, sel) in answers.items():
        assert out[0] == first[0][0], where
        for a, b in zip(out[1:], first[0][1:], strict=True):
            np.testing.assert_array_equal(a.ids, b.ids, err_msg=where)
            np.testing.assert_allclose(a.scores, b.scores, rtol=1e-5, atol=1e-5, err_msg=where)
        np.testing.assert_array_equal(got["ids"], [1050, 3, 1], err_msg=where)
        np.testing.assert_allclose(got["vectors"], ref.get_vectors([1050, 3, 1]), rtol=1e-6)
        assert got["attributes"]["n"] == [250, 3, 1] and got["attributes"]["tags"] == [
            ["even"], [], []], where
        want_sel = [i for i in range(60) if i % 3 == 1 and i % 7]
        np.testing.assert_array_equal(sel["ids"], want_sel, err_msg=where)
        assert sel["vectors"] is None and sel["attributes"]["colour"] == ["green"] * len(
            want_sel)


def test_strings_answer_the_same_everywhere(clients):
    """A string collection is an ordinary kind: add with attributes, remove, search with
    allow / deny / where, get; the same answers in process, embedded and on a node (over
    gRPC the filters once were dropped)."""
    from contract import string_encoder
    from string_fixture import strings

    base, queries = strings(400, 6, 5)
    attrs = {"colour": [["red", "green", "blue"][i % 3] for i in range(400)]}
    ref = ss.create_index("strings", 0, "edit", index="flat", encoder=string_encoder())
    ref.add(base)
    ref.remove(np.arange(0, 400, 7))
    answers = {}
    for where, c in clients.items():
        col = c.create_collection(f"s{next(_names)}", 0, "edit", "strings", index="flat")
        col.train(encoder=string_encoder())
        col.add(base, attributes=attrs)
        col.remove(np.arange(0, 400, 7))
        red = np.arange(0, 400, 3)
        answers[where] = [col.search(queries, K), col.search(queries, K, allow=red),
                          col.search(queries, K, deny=np.arange(200)),
                          col.search(queries, K, where={"colour": "red"}),
                          col.search(queries[0], K, where={"colour": "red"}, allow=red[:40])]
        got = col.get([5, 3, 7], where={"colour": "blue"})
        assert got["ids"].tolist() == [5] and got["attributes"]["colour"] == ["blue"], where
        with pytest.raises(ss.errors.UnsupportedOperationError, match="strings"):
            col.get([5], vectors=True)
    np.testing.assert_array_equal(answers["memory"][0].ids, ref.search(queries, K).ids)
    np.testing.assert_array_equal(answers["memory"][1].ids, answers["memory"][3].ids)
    for where, a in answers.items():
        for r, f in zip(a, answers["memory"], strict=True):
            np.testing.assert_array_equal(r.ids, f.ids, err_msg=where)
            np.testing.assert_array_equal(r.scores, f.scores, err_msg=where)
        assert a[2].ids.min() >= 200 and np.isin(a[4].ids[a[4].ids >= 0], red[:40]).all()


def test_one_search_signature_everywhere():
    """Every searchable takes search(q, k, *, allow, deny, where, deadline, **params)."""
    import inspect

    from simsearch.pyramid.collection import ClusterCollection
    from simsearch.pyramid.parts import RemotePart
    from simsearch.service.aio import AsyncCollection
    from simsearch.service.client import RemoteCollection
    from simsearch.service.collection import Collection
    from simsearch.service.embedded import EmbeddedCollection
    from simsearch.strings import StringIndex

    want = ["q", "k", "allow", "deny", "where", "deadline", "params"]
    kinds = [inspect.Parameter.POSITIONAL_OR_KEYWORD] * 2 + \
        [inspect.Parameter.KEYWORD_ONLY] * 4 + [inspect.Parameter.VAR_KEYWORD]
    for cls in (ss.Index, StringIndex, Collection, ClusterCollection, RemoteCollection,
                AsyncCollection, EmbeddedCollection, RemotePart):
        sig = inspect.signature(cls.search)
        params = [p for p in sig.parameters.values() if p.name != "self"]
        assert [p.name for p in params] == want, cls
        assert [p.kind for p in params] == kinds, cls
    for kind in ss.index_kinds():  # no kind overrides the contract's search
        assert ss.index.index_class(kind).search is ss.Index.search, kind


def test_where_and_a_passed_deadline(clients):
    """A bare index keeps no attributes: where is refused, typed; a deadline already passed
    is DeadlineExceededError in process, embedded and over gRPC (before any call is sent)."""
    import time

    idx = ss.FlatIndex(DIM)
    idx.add(np.ones((2, DIM), np.float32))
    with pytest.raises(ss.errors.UnsupportedOperationError, match="attributes"):
        idx.search(np.ones(DIM), 1, where={"colour": "red"})
    past = time.monotonic() - 1
    with pytest.raises(ss.errors.DeadlineExceededError):
        idx.search(np.ones(DIM), 1, deadline=past)
    assert idx.search(np.ones(DIM), 1, deadline=time.monotonic() + 60).ids[0, 0] == 0
    with pytest.raises(ss.errors.InvalidParameterError, match="deadline"):
        idx.search(np.ones(DIM), 1, deadline="soon")
    for where, c in clients.items():
        col = c.create_collection(f"d{next(_names)}", DIM, "l2", "flat")
        col.add(np.ones((2, DIM), np.float32))
        with pytest.raises(ss.errors.DeadlineExceededError):
            col.search(np.ones(DIM), 1, deadline=past)
        assert col.search(np.ones(DIM), 1, deadline=time.monotonic() + 60).ids[0, 0] == 0, where


def test_bad_input_is_refused_alike_everywhere(clients):
    for where, c in clients.items():
        col = c.create_collection(f"c{next(_names)}", DIM, "l2", "flat")
        col.add(np.ones((2, DIM), np.float32), ids=[1, 2])
        with pytest.raises(InvalidIdError, match="at most"):
            col.add(np.ones((1, DIM), np.float32), ids=[ss.MAX_ID + 1])
        with pytest.raises(UnknownIdError):
            col.remove([1, 99])
        with pytest.raises(ss.errors.InvalidFilterError):
            col.search(np.ones((1, DIM), np.float32), 1, where={"missing": 1})
        assert len(col) == 2, where


def test_an_embedded_path_keeps_its_collections_and_a_node_serves_them(tmp_path, data):
    from nodeproc import ServerProcess

    x, q, attrs = data
    with ss.connect(path=tmp_path / "d") as c:
        col = c.create_collection("kept", DIM, "cosine", "hnsw")
        col.add(x, attributes=attrs)
        want = col.search(q, K, where={"colour": "blue"})
    with ss.connect(path=tmp_path / "d") as c:  # reopened in process
        got = c.collection("kept").search(q, K, where={"colour": "blue"})
        np.testing.assert_array_equal(got.ids, want.ids)
    s = ServerProcess(tmp_path / "d")  # the same directory, served by a node
    try:
        with ss.connect(s.address, timeout=60) as c:
            got = c.collection("kept").search(q, K, where={"colour": "blue"})
            np.testing.assert_array_equal(got.ids, want.ids)
    finally:
        s.stop()


def test_a_memory_client_leaves_nothing_behind():
    import os

    c = ss.connect(":memory:")
    where = c._scratch
    c.create_collection("x", DIM).add(np.ones((3, DIM), np.float32))
    assert os.path.isdir(where)
    c.close()
    assert not os.path.exists(where)
    with pytest.raises(ss.errors.InvalidParameterError, match="not both"):
        ss.connect("localhost:1", path="x")
    with pytest.raises(ss.errors.InvalidParameterError, match=":memory:"):
        ss.connect()


def test_a_pyramid_collection_answers_alike_in_process_embedded_on_a_node_and_a_cluster(
        data, clients, tmp_path):
    """Every centre routed (branching = n_centers) over flat parts: exact everywhere."""
    from simsearch.pyramid import PyramidIndex
    from simsearch.pyramid.launcher import LocalCluster

    x, q, attrs = data
    params = dict(n_centers=8, n_partitions=2, sub_index="flat")
    ref = PyramidIndex(DIM, "l2", **params)
    ref.train(x)
    with LocalCluster(tmp_path / "cl", 2, 1) as cl:
        cluster = ss.connect(cl.coordinator, timeout=60)
        answers = {}
        for where, c in [*clients.items(), ("cluster", cluster)]:
            col = c.create_collection(f"p{next(_names)}", DIM, "l2", "pyramid", **params)
            col.train(x)
            out, got, sel = calls(col, x, q, attrs)
            answers[where] = [out[0], *(col.search(q, K, branching=8, **kw) for kw in (
                {}, {"where": {"colour": "red"}}, {"deny": np.arange(50)})), got, sel]
        cluster.close()
    ref.add(x[:200])
    ref.add(x[200:], ids=np.arange(1000, 1100))
    ref.remove(np.arange(0, 200, 7))
    first = answers["memory"]
    assert first[0] == len(ref)
    np.testing.assert_array_equal(first[1].ids, ref.search(q, K, branching=8).ids)
    for where, a in answers.items():
        assert a[0] == first[0], where
        for r, f in zip(a[1:4], first[1:4], strict=True):
            np.testing.assert_array_equal(r.ids, f.ids, err_msg=where)
            np.testing.assert_allclose(r.scores, f.scores, rtol=1e-5, atol=1e-4, err_msg=where)
        np.testing.assert_array_equal(a[4]["ids"], [1050, 3, 1], err_msg=where)
        np.testing.assert_allclose(a[4]["vectors"], x[[250, 3, 1]], rtol=1e-6, err_msg=where)
        assert a[4]["attributes"]["n"] == [250, 3, 1], where
        np.testing.assert_array_equal(a[5]["ids"], first[5]["ids"], err_msg=where)
