"""A coordinator's Prometheus metrics (docs/service.md, "Metrics")."""

from __future__ import annotations


def collect(coord):
    """Prometheus metrics of a coordinator (docs/service.md, "Metrics"): its role, shards up,
    the fan-out, hedges, router log bytes, etcd compactions, router rebuilds, out-of-sync
    replicas, part latency and search batching."""
    # the service extra's; imported when a scrape asks, not with every coordinator
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    pool = coord.pool
    leader = GaugeMetricFamily("simsearch_pyramid_leader", "1 while this coordinator leads")
    leader.add_metric([], 1.0 if coord.is_leader() else 0.0)
    up = GaugeMetricFamily("simsearch_pyramid_shards_up", "shards answering health checks")
    up.add_metric([], float(sum(bool(v) for v in pool.up.values())))
    queries = CounterMetricFamily("simsearch_pyramid_queries", "queries searched here")
    queries.add_metric([], float(coord.queries))
    fanout = CounterMetricFamily(
        "simsearch_pyramid_query_parts",
        "(query, part) pairs asked; divided by simsearch_pyramid_queries: the fan-out")
    fanout.add_metric([], float(pool.query_parts))
    hedges = CounterMetricFamily("simsearch_pyramid_hedges", "hedged part calls sent")
    hedges.add_metric([], float(pool.hedges))
    log_bytes = CounterMetricFamily("simsearch_pyramid_router_log_bytes",
                                    "router log bytes this coordinator wrote to etcd as leader")
    log_bytes.add_metric([], float(coord.log_bytes))
    compactions = CounterMetricFamily("simsearch_pyramid_etcd_compactions",
                                      "etcd compactions after router checkpoints")
    compactions.add_metric([], float(coord.compactions))
    rebuilds = CounterMetricFamily("simsearch_pyramid_router_rebuilds",
                                   "routers rebuilt from their parts (every checkpoint copy lost)")
    rebuilds.add_metric([], float(coord.router_rebuilds))
    stale = GaugeMetricFamily("simsearch_pyramid_replicas_out_of_sync",
                              "part replicas not in sync (no reads until re-copied)",
                              labels=["collection"])
    for name in coord.names():
        parts = coord.state.part_map(name).get("parts", {})
        stale.add_metric([name], float(sum(len(set(e["replicas"]) - set(e["in_sync"]))
                                           for e in parts.values())))
    p95 = GaugeMetricFamily("simsearch_pyramid_part_latency_p95_seconds",
                            "p95 of a part's recent calls (its hedge delay)", labels=["part"])
    for part in sorted(pool.parts):
        p95.add_metric([part], pool.hedge_delay(part))
    yield from (leader, up, queries, fanout, hedges, log_bytes, compactions, rebuilds, stale,
                p95)
    batcher = coord.batcher
    if batcher is not None:  # off with --search-batches 0
        batches = CounterMetricFamily(
            "simsearch_pyramid_search_batches",
            "search batches sent to the parts (concurrent searches merged; batching.py)")
        batches.add_metric([], float(batcher.batches))
        batched = CounterMetricFamily(
            "simsearch_pyramid_batched_searches",
            "searches in those batches; over simsearch_pyramid_search_batches: searches per "
            "batch")
        batched.add_metric([], float(batcher.batched))
        yield from (batches, batched)
