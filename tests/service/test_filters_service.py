"""Filtered search over gRPC (docs/filters.md): typed attributes stored durably with the vectors,
the ``where`` language, allow/deny lists in the request; bad filters are INVALID_ARGUMENT and
change nothing; kill -9 after acknowledged adds and upserts keeps every filtered answer."""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest

import simsearch as ss
from conftest import unique_name
from simsearch.errors import InvalidAttributeError, InvalidFilterError
from simsearch.service import convert
from simsearch.service.attributes import AttributeTable
from simsearch.service.protos.simsearch.v1 import simsearch_pb2 as pb
from simsearch.service.protos.simsearch.v1 import simsearch_pb2_grpc as pb_grpc
from simsearch.service.store import Store

DIM = 8
GENRES = ["jazz", "blues", "rock", "pop", "folk"]


def make_items(n, seed=0, start=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, DIM)).astype(np.float32)
    ids = np.arange(start, start + n)
    attrs = {
        "genre": [GENRES[i % 5] for i in ids.tolist()],
        "year": [1950 + (i * 7) % 70 for i in ids.tolist()],
        "price": [float(i % 13) * 1.5 for i in ids.tolist()],
        "in_stock": [bool(i % 3) for i in ids.tolist()],
        "tags": [[f"t{i % 4}", f"u{i % 6}"] if i % 10 else [] for i in ids.tolist()],
        "label": [None if i % 4 == 0 else f"l{i % 2}" for i in ids.tolist()],
    }
    return x, ids, attrs


def matching(attrs, ids, pred):
    return np.array([i for j, i in enumerate(ids.tolist())
                     if pred({k: v[j] for k, v in attrs.items()})], np.int64)


FILTERS = [
    ({"genre": {"in": ["jazz", "blues"]}}, lambda a: a["genre"] in ("jazz", "blues")),
    ({"genre": "rock"}, lambda a: a["genre"] == "rock"),
    ({"year": {"gte": 1990, "lt": 2010}}, lambda a: 1990 <= a["year"] < 2010),
    ({"price": {"lte": 3}}, lambda a: a["price"] <= 3),
    ({"$not": {"in_stock": False}}, lambda a: a["in_stock"] is not False),
    ({"tags": {"in": ["t1", "u5"]}}, lambda a: "t1" in a["tags"] or "u5" in a["tags"]),
    ({"tags": {"nin": ["t1"]}}, lambda a: "t1" not in a["tags"]),
    ({"label": {"exists": False}}, lambda a: a["label"] is None),
    ({"label": {"ne": "l1"}}, lambda a: a["label"] is not None and a["label"] != "l1"),
    ({"$or": [{"genre": "pop"}, {"year": {"gt": 2015}}], "in_stock": True},
     lambda a: (a["genre"] == "pop" or a["year"] > 2015) and a["in_stock"]),
    ({"$and": [{"genre": {"nin": ["pop", "folk"]}}, {"year": {"ne": 1957}}]},
     lambda a: a["genre"] not in ("pop", "folk") and a["year"] != 1957),
    ({"genre": {"eq": "no-such-genre"}}, lambda a: False),
]


def test_where_language_matches_python_semantics():
    x, ids, attrs = make_items(400)
    t = AttributeTable({"label": "keyword"})
    t.add(ids[:150], t.check({k: v[:150] for k, v in attrs.items()}, 150))
    t.add(ids[150:], t.check({k: v[150:] for k, v in attrs.items()}, 250))
    assert t.schema == {"label": "keyword", "genre": "keyword", "year": "int", "price": "float",
                        "in_stock": "bool", "tags": "keywords"}
    for where, pred in FILTERS:
        np.testing.assert_array_equal(t.where(where), matching(attrs, ids, pred), str(where))
    t.remove(ids[::2])
    keep = ids[1::2]
    sub = {k: v[1::2] for k, v in attrs.items()}
    for where, pred in FILTERS:
        np.testing.assert_array_equal(t.where(where), matching(sub, keep, pred), str(where))
    assert t.rows_of(keep[:3]) == {k: v[:3] for k, v in sub.items()}


BAD_WHERE = {
    "unknown attribute": ({"colour": "red"}, "colour"),
    "unknown operator": ({"year": {"near": 3}}, "near"),
    "wrong type": ({"year": {"gte": "1990"}}, "year"),
    "range on keyword": ({"genre": {"lt": "m"}}, "genre"),
    "in takes a list": ({"genre": {"in": "jazz"}}, "genre"),
    "bad $ key": ({"$xor": []}, "$xor"),
    "not an object": (["genre"], "where"),
    "exists takes bool": ({"label": {"exists": 1}}, "label"),
}


@pytest.mark.parametrize("bad", sorted(BAD_WHERE))
def test_bad_where_is_typed_and_names_the_attribute(bad):
    x, ids, attrs = make_items(50)
    t = AttributeTable()
    t.add(ids, t.check(attrs, 50))
    where, name = BAD_WHERE[bad]
    with pytest.raises(InvalidFilterError, match=name.replace("$", r"\$")):
        t.where(where)


def test_store_attributes_survive_snapshot_log_and_upsert(tmp_path):
    x, ids, attrs = make_items(300)
    s = Store(tmp_path)
    col = s.create("c", DIM, "ip", "flat", {}, schema={"year": "int"})
    col.add(x[:200], ids[:200], attributes={k: v[:200] for k, v in attrs.items()})
    col.snapshot()
    col.add(x[200:], ids[200:], attributes={k: v[200:] for k, v in attrs.items()})
    col.add(x[:5], ids[:5], upsert=True, attributes={"genre": ["folk"] * 5, "year": [2020] * 5})
    col.remove(ids[10:20])
    q = x[:4]
    where = {"genre": "folk", "year": {"gte": 2000}}
    before = col.search(q, 10, where=where)
    s.close()
    col = Store(tmp_path).get("c")
    after = col.search(q, 10, where=where)
    np.testing.assert_array_equal(before.ids, after.ids)
    assert set(ids[:5]) <= set(after.ids.ravel().tolist())
    assert col.attrs.rows_of(ids[:1])["price"] == [None]  # replaced by the upsert: no price
    assert not np.isin(np.arange(10, 20), col.attrs.ids).any()


def test_bad_attributes_change_nothing(tmp_path):
    x, ids, attrs = make_items(20)
    col = Store(tmp_path).create("c", DIM, "ip", "flat", {})
    col.add(x[:10], ids[:10], attributes={k: v[:10] for k, v in attrs.items()})
    for bad in ({"year": ["x"] * 5}, {"year": [1] * 4}, {"$x": [1] * 5},
                {"tags": [[1]] * 5}, {"price": [float("nan")] * 5}, "genre"):
        with pytest.raises(ss.errors.SimsearchError) as ei:
            col.add(x[10:15], ids[10:15], attributes=bad)
        assert isinstance(ei.value, ValueError)
    assert len(col.index) == 10 and len(col.attrs) == 10


def test_grpc_filtered_search_and_kill9(server_factory):
    """kill -9 after acknowledged adds and upserts with attributes: after the restart the same
    filtered searches give the same answers (and equal an in-process oracle). The defect it
    names: attributes that are not in the log. Seen failing with the log record's attribute
    blob left out (``_attributes_blob`` returning nothing): after the restart the where filters
    fail with "unknown attribute 'genre'"."""
    srv = server_factory()
    c = srv.client()
    name = unique_name()
    col = c.create_collection(name, DIM, "ip", "hnsw", schema={"year": "int"}, M=8)
    x, ids, attrs = make_items(2000, seed=3)
    col.add(x[:1500], ids[:1500], attributes={k: v[:1500] for k, v in attrs.items()})
    col.add(x[1500:], ids[1500:], attributes={k: v[1500:] for k, v in attrs.items()})
    col.add(x[:50] * 2, ids[:50], upsert=True,
            attributes={"genre": ["jazz"] * 50, "year": [2024] * 50, "in_stock": [True] * 50})
    assert col.describe()["schema"]["tags"] == "keywords"
    rng = np.random.default_rng(4)
    q = rng.standard_normal((6, DIM)).astype(np.float32)
    deny = [rng.choice(2000, 40, replace=False) for _ in range(6)]
    calls = [dict(where=w) for w, _ in FILTERS] + [
        dict(where={"genre": "jazz"}, allow=np.arange(0, 2000, 3)),
        dict(deny=deny, where={"in_stock": True}),
        dict(allow=[np.arange(i * 100, i * 100 + 100) for i in range(6)]),
    ]
    before = [col.search(q, 10, ef=200, **kw) for kw in calls]
    srv.kill()
    srv.start()
    col = srv.client().collection(name)
    after = [col.search(q, 10, ef=200, **kw) for kw in calls]
    for b, a in zip(before, after, strict=True):
        np.testing.assert_array_equal(b.ids, a.ids)
    # the answers are the filtered ones, checked against the in-process oracle
    attrs2 = {k: list(v) for k, v in attrs.items()}
    for k_, v in {"genre": "jazz", "year": 2024, "in_stock": True}.items():
        attrs2[k_][:50] = [v] * 50
    for k_ in ("price", "tags", "label"):
        attrs2[k_][:50] = [None] * 50
    xs = x.copy()
    xs[:50] *= 2
    flat = ss.FlatIndex(DIM, "ip")
    flat.add(xs, ids)
    for (where, pred), r in zip(FILTERS, after, strict=False):
        allowed = matching(attrs2, ids, lambda a, pred=pred: _safe(pred, a))
        want = flat.search(q, 10, allow=allowed)
        assert np.isin(r.ids[r.ids >= 0], allowed).all(), where
        assert (r.ids == want.ids).mean() >= 0.95, where
    r = after[-2]
    for i in range(6):
        assert not np.isin(r.ids[i], deny[i]).any()
    assert ((after[-1].ids // 100) == np.arange(6)[:, None]).all()


def _safe(pred, a):
    try:
        return bool(pred(a))
    except TypeError:  # a missing value compared: it does not match
        return False


def test_grpc_bad_filters_are_invalid_argument(shared_server, shared_client):
    name = unique_name()
    col = shared_client.create_collection(name, DIM, "ip", "flat")
    x, ids, attrs = make_items(100)
    col.add(x, ids, attributes=attrs)
    q = x[:2]
    before = col.search(q, 5)
    stub = pb_grpc.SimSearchStub(grpc.insecure_channel(shared_server.address))
    for where, attr in BAD_WHERE.values():
        with pytest.raises(InvalidFilterError, match=attr.replace("$", r"\$")):
            col.search(q, 5, where=where)
        with pytest.raises(grpc.RpcError) as ei:  # the status on the wire
            stub.Search(pb.SearchRequest(collection=name, queries=convert.to_matrix(q), k=5,
                                         where_json=json.dumps(where)), timeout=30)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ei.value.details()
    with pytest.raises(grpc.RpcError) as ei:
        stub.Search(pb.SearchRequest(collection=name, queries=convert.to_matrix(q), k=5,
                                     allow=pb.IdList(ids=b"\0" * 16, lengths=[1])), timeout=30)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "allow" in ei.value.details()
    with pytest.raises(InvalidAttributeError, match="year"):
        col.add(x[:2], [500, 501], attributes={"year": ["nineteen", "ninety"]})
    with pytest.raises(InvalidFilterError):
        col.search(q, 5, allow=[1.5])
    assert len(col) == 100
    np.testing.assert_array_equal(col.search(q, 5).ids, before.ids)
    r = col.search(q, 5, where={"genre": "nothing-like-this"})
    assert (r.ids == -1).all()
    shared_client.drop_collection(name)


def test_grpc_large_lists_are_split(server_factory):
    srv = server_factory()
    c = srv.client(max_message_bytes=64 * 1024)
    col = c.create_collection(unique_name(), DIM, "ip", "flat")
    x, ids, _ = make_items(30000, seed=5)
    col.add(x, ids)
    q = x[:20]
    allow = np.arange(0, 30000, 2)  # 120 kB of ids: more than one message
    r = col.search(q, 10, allow=allow)
    f = ss.FlatIndex(DIM, "ip")
    f.add(x, ids)
    np.testing.assert_array_equal(r.ids, f.search(q, 10, allow=allow).ids)
    per = [np.arange(i, 30000, 7)[:3000] for i in range(20)]  # 24 kB each: a few rows per call
    r = col.search(q, 10, deny=per)
    np.testing.assert_array_equal(r.ids, f.search(q, 10, deny=per).ids)
