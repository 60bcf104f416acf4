"""Prometheus metrics of a node (docs/service.md, "Metrics"), exposed in the text format on an
HTTP port of their own (``--metrics-port``, loopback unless ``--metrics-host`` says otherwise).

Each server has its own registry, so several servers in one process (tests) never share counters.
Per-collection gauges are read from the store at scrape time, not kept up to date on every call.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

if TYPE_CHECKING:
    from .protocols import CollectionStore

#: request latency buckets (seconds): from a cached flat search to a long snapshot
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)


class _StoreCollector:
    """Items, log bytes and snapshot age of every collection, read when scraped."""

    def __init__(self, store: CollectionStore):
        self.store = store

    def collect(self):
        items = GaugeMetricFamily("simsearch_collection_items", "items stored",
                                  labels=["collection"])
        wal = GaugeMetricFamily("simsearch_wal_bytes", "bytes in the collection's write-ahead log",
                                labels=["collection"])
        age = GaugeMetricFamily("simsearch_snapshot_age_seconds",
                                "seconds since the collection's last snapshot (or creation)",
                                labels=["collection"])
        damaged = GaugeMetricFamily("simsearch_collection_damaged",
                                    "1 when the collection could not be recovered",
                                    labels=["collection"])
        now = time.time()
        for name in self.store.names():
            try:
                s = self.store.get(name).stats()
            except Exception:  # dropped while scraping
                continue
            damaged.add_metric([name], 1.0 if s["damaged"] else 0.0)
            if s["damaged"]:
                continue
            items.add_metric([name], s["items"])
            wal.add_metric([name], s["wal_bytes"])
            age.add_metric([name], max(0.0, now - s["snapshot_time"]))
        yield from (items, wal, age, damaged)


class ServiceMetrics:
    """The node's metrics; ``observe`` is called once per RPC by the servicer."""

    def __init__(self, store: CollectionStore):
        self.registry = CollectorRegistry()
        self.requests = Counter("simsearch_requests", "RPCs by method, status and collection",
                                ["rpc", "code", "collection"], registry=self.registry)
        self.latency = Histogram("simsearch_request_seconds", "RPC latency by method", ["rpc"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.registry.register(_StoreCollector(store))
        for collector in store.collectors():  # a coordinator's own
            self.registry.register(collector)
        self._store = store
        self._http = None
        #: the (rpc, code) label pairs each collection has used, so that a drop can forget them
        self._seen: dict[str, set[tuple[str, str]]] = {}
        self._seen_lock = threading.Lock()

    def observe(self, rpc: str, code: str, collection: str, seconds: float) -> None:
        # unknown names (a client's typo, a fuzzer) would grow the label set without bound
        if collection and not self._store.has(collection):
            collection = ""
        if collection:
            pairs = self._seen.get(collection)
            if pairs is None or (rpc, code) not in pairs:
                with self._seen_lock:
                    self._seen.setdefault(collection, set()).add((rpc, code))
        self.requests.labels(rpc, code, collection).inc()
        self.latency.labels(rpc).observe(seconds)

    def forget(self, collection: str) -> None:
        """Drop a dropped collection's label sets: a node that creates and drops collections
        all day must not keep a series for every name it ever held."""
        with self._seen_lock:
            pairs = self._seen.pop(collection, set())
        for rpc, code in pairs:
            with contextlib.suppress(KeyError):
                self.requests.remove(rpc, code, collection)

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Start the HTTP exposition; returns the bound port (0 picks a free one)."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._http = server
        return int(server.server_address[1])

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
