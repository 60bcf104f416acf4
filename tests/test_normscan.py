"""NormScanIndex: the exact norm-ordered scan equals FlatIndex, and stops early on long tails."""

from __future__ import annotations

import numpy as np
import pytest

import simsearch as ss
from simsearch.datasets import synthetic_longtail


@pytest.fixture(scope="module")
def longtail():
    return synthetic_longtail(n=20_000, dim=32, n_queries=200, n_clusters=50, seed=3)


@pytest.mark.parametrize("nq", [1, 7, 200])
@pytest.mark.parametrize("k", [1, 10, 100])
def test_exact_mode_equals_flat(longtail, nq, k):
    base, queries = longtail
    ns, flat = ss.NormScanIndex(32), ss.FlatIndex(32, "ip")
    ids = np.random.default_rng(0).permutation(len(base)) * 3  # ids unrelated to the order
    ns.add(base, ids)
    flat.add(base, ids)
    a, b = ns.search(queries[:nq], k), flat.search(queries[:nq], k)
    np.testing.assert_array_equal(a.ids, b.ids)
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-5, atol=1e-5)


def test_ties_go_to_the_smaller_id():
    x = np.tile(np.eye(4, dtype=np.float32), (5, 1))  # every vector five times
    ns, flat = ss.NormScanIndex(4), ss.FlatIndex(4, "ip")
    ids = np.arange(20)[::-1].copy()
    ns.add(x, ids)
    flat.add(x, ids)
    q = np.array([[1, 0.5, 0, 0]], np.float32)
    np.testing.assert_array_equal(ns.search(q, 7).ids, flat.search(q, 7).ids)


def test_long_tail_stops_early_and_budget_bounds_the_scan(longtail):
    base, queries = longtail
    ns = ss.NormScanIndex(32)
    ns.add(base)
    frac = ns.scan_fraction(queries, 10)
    assert frac < 0.5, f"the exact stop read {frac:.0%} of a long-tailed set"
    assert ns.scan_fraction(queries, 10, max_items=500) <= 500 / len(base)
    approx = ns.search(queries, 10, max_items=500)
    assert approx.ids.shape == (200, 10) and (approx.ids >= 0).all()


def test_writes_keep_the_order(longtail, tmp_path):
    base, queries = longtail
    ns, flat = ss.NormScanIndex(32), ss.FlatIndex(32, "ip")
    for idx in (ns, flat):
        idx.add(base[:5000])
        idx.remove(np.arange(0, 5000, 3))
        idx.add(base[5000:8000], np.arange(5000, 8000))
    ns.save(tmp_path / "ns.idx")
    back = ss.load(tmp_path / "ns.idx")
    np.testing.assert_array_equal(back.search(queries, 10).ids, flat.search(queries, 10).ids)
