"""Prometheus metrics: off by default; with --metrics-port the counters move and name what the
operator needs (docs/service.md, "Metrics")."""

from __future__ import annotations

import json
import urllib.request

import numpy as np


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def _value(text: str, prefix: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(prefix))


def test_metrics_move_with_calls(server_factory):
    server = server_factory("--metrics-port", "0")
    port = json.loads((server.data_dir.parent / f"{server.data_dir.name}.ready").read_text())[
        "metrics_port"]
    col = server.client().create_collection("m", 8, "l2", "flat")
    col.add(np.random.default_rng(0).standard_normal((30, 8)).astype(np.float32))
    before = _scrape(port)
    for _ in range(5):
        col.search(np.zeros((2, 8), np.float32), 3)
    try:
        col.search(np.zeros((2, 8), np.float32), 3, bogus=1)  # refused: counted with its status
    except Exception:
        pass
    after = _scrape(port)
    ok = 'simsearch_requests_total{code="OK",collection="m",rpc="Search"}'
    bad = 'simsearch_requests_total{code="INVALID_ARGUMENT",collection="m",rpc="Search"}'
    assert _value(after, ok) - _value(before, ok) == 5
    assert _value(after, bad) == 1
    assert _value(after, 'simsearch_collection_items{collection="m"}') == 30
    for name in ("simsearch_request_seconds_bucket", "simsearch_wal_bytes",
                 "simsearch_snapshot_age_seconds", "simsearch_collection_damaged"):
        assert name in after, name


def test_metrics_are_off_by_default(server_factory):
    server = server_factory()
    ready = json.loads((server.data_dir.parent / f"{server.data_dir.name}.ready").read_text())
    assert ready["metrics_port"] is None


def test_observe_asks_for_one_name_not_the_list():
    """Per RPC the metrics check the collection's name alone. Seen failing with the old check,
    which listed and sorted every name on every RPC: O(collections) a call on a node with many,
    and a scan of the whole etcd cache a call on a coordinator."""
    from simsearch.service.metrics import ServiceMetrics

    class Store:
        def collectors(self):
            return []

        def names(self):
            raise AssertionError("every name listed for one RPC")

        def has(self, name):
            return name == "a"

    m = ServiceMetrics(Store())
    m.observe("Search", "OK", "a", 0.001)
    m.observe("Search", "OK", "no-such-name", 0.001)  # a typo, a fuzzer: counted without it
    got = {s.labels["collection"]: s.value for s in m.requests.collect()[0].samples
           if s.name.endswith("_total")}
    assert got == {"a": 1.0, "": 1.0}


def test_a_dropped_collection_leaves_no_series_behind(server_factory):
    """The defect: the request counter kept a label set for every collection a node ever
    held, dropped ones included (a node that creates and drops collections all day grows its
    scrape without bound)."""
    server = server_factory("--metrics-port", "0")
    port = json.loads((server.data_dir.parent / f"{server.data_dir.name}.ready").read_text())[
        "metrics_port"]
    c = server.client()
    for i in range(3):
        col = c.create_collection(f"tmp{i}", 4, "l2", "flat")
        col.add(np.ones((2, 4), np.float32))
        col.search(np.ones((1, 4), np.float32), 1)
        c.drop_collection(f"tmp{i}")
    c.create_collection("kept", 4, "l2", "flat").add(np.ones((2, 4), np.float32))
    text = _scrape(port)
    assert 'collection="kept"' in text
    assert not any(f'collection="tmp{i}"' in text for i in range(3))
