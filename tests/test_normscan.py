"""NormScanIndex: the exact norm-ordered scan equals FlatIndex, and stops early on long tails."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import simsearch as ss
from knn_check import assert_knn_equal
from simsearch import errors
from simsearch.datasets import synthetic_longtail
from simsearch.eval import recall_at_k


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


def _write_both(idx, base):
    """The same adds and removes on idx and on a FlatIndex; returns the FlatIndex."""
    flat = ss.FlatIndex(32, "ip")
    for i in (idx, flat):
        i.add(base[:5000])
        i.remove(np.arange(0, 5000, 3))
        i.add(base[5000:8000], np.arange(5000, 8000))
    return flat


def test_writes_keep_the_order(longtail, tmp_path):
    base, queries = longtail
    ns = ss.NormScanIndex(32)
    flat = _write_both(ns, base)
    ns.save(tmp_path / "ns.idx")
    back = ss.load(tmp_path / "ns.idx")
    np.testing.assert_array_equal(back.search(queries, 10).ids, flat.search(queries, 10).ids)


# -- NormIVFIndex: inverted lists of directions, each scanned by decreasing norm ---------------


@pytest.fixture(scope="module")
def norm_ivf(longtail):
    base, _ = longtail
    idx = ss.NormIVFIndex(32, n_lists=64, seed=1)
    idx.train(base)
    idx.add(base, np.random.default_rng(1).permutation(len(base)) * 7)
    return idx


def test_norm_ivf_visiting_every_list_equals_flat(longtail, norm_ivf):
    base, queries = longtail
    flat = ss.FlatIndex(32, "ip")
    flat.add(base, np.random.default_rng(1).permutation(len(base)) * 7)
    row_of = np.empty(7 * len(base), np.int64)
    row_of[np.random.default_rng(1).permutation(len(base)) * 7] = np.arange(len(base))
    for k in (1, 10, 100):
        a, b = norm_ivf.search(queries, k), flat.search(queries, k)
        # exact up to float rounding: the same k-th scores, each id's score its true q·x, no
        # repeats (two items within an ulp may come in either order: the lists' dot products
        # add in another order than FlatIndex's matrix product)
        np.testing.assert_allclose(a.scores, b.scores, rtol=1e-5, atol=1e-5)
        true = np.einsum("qkd,qd->qk", base[row_of[a.ids]], queries)
        np.testing.assert_allclose(a.scores, true, rtol=1e-5, atol=1e-5)
        assert all(len(set(r)) == k for r in a.ids)
        assert_knn_equal(a.ids, a.scores, b.ids, b.scores)
    # the stop inside each list skips most items even when every list is visited
    assert norm_ivf.scored_fraction(queries, 10) < 0.5


def test_norm_ivf_recall_grows_with_probes_and_the_stop_reads_little(longtail, norm_ivf):
    base, queries = longtail
    flat = ss.FlatIndex(32, "ip")
    flat.add(base, np.random.default_rng(1).permutation(len(base)) * 7)
    truth = flat.search(queries, 10).ids
    recalls = []
    for n_probe in (1, 2, 4, 8, 64):
        got = norm_ivf.search(queries, 10, n_probe=n_probe).ids
        recalls.append(recall_at_k(got, truth, 10))
    assert recalls == sorted(recalls) and recalls[-1] == 1.0, recalls
    assert recalls[3] >= 0.9, recalls  # 8 of 64 lists
    # 8 lists hold about an eighth of the items; the stop reads well under that
    assert norm_ivf.scored_fraction(queries, 10, n_probe=8) < 1 / 16


def test_norm_ivf_threads_give_the_same_answer(longtail, norm_ivf):
    _, queries = longtail
    for n_probe in (3, None):
        one = norm_ivf.search(queries, 10, n_probe=n_probe)
        for n_threads in (2, -1):
            many = norm_ivf.search(queries, 10, n_probe=n_probe, n_threads=n_threads)
            np.testing.assert_array_equal(many.ids, one.ids)
            np.testing.assert_array_equal(many.scores, one.scores)


def test_parallel_searches_from_many_threads_beside_blas(longtail, norm_ivf):
    """Parallel searches narrow BLAS to one thread while they run (simsearch._numba_util); from
    several threads at once, beside other threads' matrix products, every answer stays right."""
    _, queries = longtail
    want = norm_ivf.search(queries, 10, n_probe=4).ids
    a = np.random.default_rng(0).standard_normal((300, 300))
    errors_seen = []

    def searcher():
        for _ in range(10):
            got = norm_ivf.search(queries, 10, n_probe=4, n_threads=2).ids
            if not np.array_equal(got, want):
                errors_seen.append("wrong ids")

    def blas_user():
        for _ in range(30):
            if not np.allclose(a @ a.T, (a @ a.T).T):
                errors_seen.append("wrong product")

    threads = [threading.Thread(target=f) for f in (searcher,) * 4 + (blas_user,) * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors_seen


def test_norm_ivf_writes_and_reload(longtail, tmp_path):
    base, queries = longtail
    idx = ss.NormIVFIndex(32, n_lists=32)
    idx.train(base[:4000])
    flat = _write_both(idx, base)
    idx.save(tmp_path / "ivf.idx")
    back = ss.load(tmp_path / "ivf.idx")
    assert back.n_lists == 32 and len(back) == len(flat)
    np.testing.assert_array_equal(back.search(queries, 10).ids, flat.search(queries, 10).ids)
    np.testing.assert_array_equal(back.search(queries, 10, n_probe=4).ids,
                                  idx.search(queries, 10, n_probe=4).ids)


def test_norm_ivf_bad_input_is_typed_and_changes_nothing(longtail):
    base, queries = longtail
    idx = ss.NormIVFIndex(32, n_lists=16)
    with pytest.raises(errors.NotTrainedError):
        idx.add(base[:10])
    with pytest.raises(errors.InvalidParameterError, match="n_lists=16 needs at least"):
        idx.train(base[:8])
    assert not idx.is_trained
    with pytest.raises(errors.InvalidParameterError, match="metric"):
        ss.NormIVFIndex(32, "l2")
    with pytest.raises(errors.InvalidParameterError, match="n_lists"):
        ss.NormIVFIndex(32, n_lists=0)
    idx.train(base[:1000])
    idx.add(base[:1000])
    with pytest.raises(errors.InvalidParameterError, match="n_probe"):
        idx.search(queries, 10, n_probe=0)
    for bad in (0, -2, 1.5):
        with pytest.raises(errors.InvalidParameterError, match="n_threads"):
            idx.search(queries, 10, n_threads=bad)
    assert len(idx) == 1000
    # default n_lists: the square root of the training rows
    auto = ss.NormIVFIndex(32)
    auto.train(base[:2500])
    assert auto.n_lists == 50


@pytest.mark.parametrize("kind", ["norm-scan", "norm-ivf"])
def test_small_adds_go_to_the_tail_and_stay_exact(kind, monkeypatch):
    """Adds land in the unsorted tail (no re-sort of the store) and merge past its threshold;
    with items in both, searches (plain, allow, per-query deny) equal FlatIndex's, tie-aware,
    and so does a saved copy. Fails if the tail is not scored, is scored outside the visited
    lists, or a merge or remove loses rows."""
    from simsearch import normscan

    monkeypatch.setattr(normscan, "_TAIL_MIN", 64)  # merges happen within the test
    base, queries = synthetic_longtail(n=2500, dim=12, n_queries=15, n_clusters=10, seed=3)
    idx = ss.create_index(kind, 12, "ip", **({"n_lists": 8} if kind == "norm-ivf" else {}))
    if idx.capabilities.needs_training:
        idx.train(base)
    flat = ss.FlatIndex(12, "ip")
    rng = np.random.default_rng(0)
    start, merges = 0, 0
    while start < len(base):
        step = int(rng.integers(1, 90))
        ids = np.arange(start, min(start + step, len(base)))
        idx.add(base[ids], ids)
        flat.add(base[ids], ids)
        merges += idx._tail.n == 0
        start += step
        if start % 7 == 0:
            gone = rng.choice(ids, max(1, ids.size // 3), replace=False)
            idx.remove(gone)
            flat.remove(gone)
        if rng.random() < 0.15 or start >= len(base):
            a, b = idx.search(queries, 10), flat.search(queries, 10)
            assert_knn_equal(a.ids, a.scores, b.ids, b.scores)
    assert merges > 0 and idx._tail.n > 0  # both paths ran; the last check had a tail
    allow = np.flatnonzero(rng.random(len(base)) < 0.2)
    deny = [rng.choice(len(base), 300, replace=False) for _ in range(len(queries))]
    for kw in ({"allow": allow}, {"deny": deny}):
        a, b = idx.search(queries, 10, **kw), flat.search(queries, 10, **kw)
        assert_knn_equal(a.ids, a.scores, b.ids, b.scores)
    copy = ss.loads(idx.to_bytes())
    a, b = copy.search(queries, 10), flat.search(queries, 10)
    assert_knn_equal(a.ids, a.scores, b.ids, b.scores)
