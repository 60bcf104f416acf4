"""Filtered search (docs/filters.md) over every index kind in tests/support/contract.py:
results hold only
allowed, non-denied ids; exact kinds equal numpy's filtered exact top-k; approximate kinds keep
their recall at every selectivity (the planner); bad filters are typed errors."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import simsearch as ss
from contract import CASES, Case, dim_of, items_of
from simsearch import errors
from simsearch.datasets import synthetic_longtail
from simsearch.index import higher_is_better

DIM = 24
N = 3000
K = 10


@pytest.fixture
def data(request):
    """(base, queries) of the case's items (vectors without a case)."""
    case = getattr(request.node, "callspec", None)
    case = case.params.get("case") if case is not None else None
    if case is None:
        return synthetic_longtail(n=N, dim=DIM, n_queries=40, n_clusters=30, seed=11)
    return items_of(case, N, 40, DIM, 11)


def params():
    return [pytest.param(c, m, id=f"{c.id}-{m}") for c in CASES for m in c.metrics]


_BUILT: dict = {}


def built(case: Case, metric: str, base: np.ndarray) -> ss.Index:
    key = (case.id, metric)
    if key not in _BUILT:  # building is the slow part; the filters never change the index
        idx = case.make(dim_of(case, DIM), metric, base)
        idx.add(base)
        _BUILT[key] = idx
    return _BUILT[key]


def sparse_scores(q, x, kind: str) -> np.ndarray:
    """Exact scores of sparse rows (float64): the inner product, or BM25 over the rows' counts
    (Lucene's variant, k1 1.5, b 0.75, with x's statistics); -inf where no term is shared."""
    qm, xm = q.to_scipy().astype(np.float64), x.to_scipy().astype(np.float64)
    qb, xb = qm.copy(), xm.copy()
    qb.data[:], xb.data[:] = 1, 1
    shares = (qb @ xb.T).toarray() > 0
    if kind == "bm25":
        n = xm.shape[0]
        df = np.asarray(xb.sum(0)).ravel()
        idf = np.log1p((n - df + 0.5) / (df + 0.5))
        dl = np.asarray(xm.sum(1)).ravel()
        w = xm.tocoo()
        w.data = w.data / (w.data + 1.5 * (1 - 0.75 + 0.75 * dl[w.row] / dl.mean()))
        s = (qm.multiply(idf[None, :]).tocsr() @ w.tocsr().T).toarray()
    else:
        s = (qm @ xm.T).toarray()
    return np.where(shares, s, -np.inf)


def exact_scores(q, x, metric, case=None):
    if case is not None and case.items == "sparse":
        return sparse_scores(q, x, case.id)
    if metric == "edit":  # strings
        from simsearch.strings import edit_distance_matrix

        return -edit_distance_matrix(list(q), list(x)).astype(np.float64)
    if metric == "cosine":
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
    if metric == "l2":
        return -((q[:, None, :] - x[None, :, :]) ** 2).sum(-1)  # higher is better here
    return q.astype(np.float64) @ x.T.astype(np.float64)


def oracle(q, x, metric, ok, case=None):
    """numpy's filtered exact top-K: ids (nq, K) -1 padded and scores (higher is better)."""
    s = np.where(ok, exact_scores(q, x, metric, case), -np.inf)
    order = np.argsort(-s, axis=1, kind="stable")[:, :K]
    top = np.take_along_axis(s, order, 1)
    return np.where(np.isfinite(top), order, -1), top


def check(idx, case, metric, base, q, ok, **filt):
    """Every returned id allowed, no repeats, padding where fewer than K exist; returns the
    tie-aware recall against the filtered oracle (a hit scores at least the true K-th)."""
    r = idx.search(q, K, **filt, **case.search_kw)
    truth, top = oracle(q, base, metric, ok, case)
    hits = total = 0
    s_all = exact_scores(q, base, metric, case)
    for i in range(len(q)):
        got = r.ids[i][r.ids[i] >= 0]
        assert ok[i, got].all(), f"query {i}: disallowed ids {got[~ok[i, got]]}"
        assert np.unique(got).size == got.size
        n_allowed = int(ok[i].sum())
        assert (r.ids[i, n_allowed:] == -1).all()
        want = int((truth[i] >= 0).sum())
        if case.min_recall == 1.0:
            assert got.size == want
        kth = top[i, want - 1] if want else np.inf
        tol = 1e-4 * max(abs(kth), 1e-6) if want else 0
        hits += min(want, int((s_all[i, got] >= kth - tol).sum()))
        total += want
    return r, hits / max(total, 1)


def masks(rng, n_q, selectivity):
    return rng.random((n_q, N)) < selectivity


@pytest.mark.parametrize("case,metric", params())
def test_shared_allow_every_selectivity(case, metric, data):
    base, queries = data
    idx = built(case, metric, base)
    rng = np.random.default_rng(1)
    for sel in (0.5, 0.1, 0.01, 0.002):
        allow = np.flatnonzero(rng.random(N) < sel)
        ok = np.zeros((len(queries), N), bool)
        ok[:, allow] = True
        r, rec = check(idx, case, metric, base, queries, ok, allow=allow)
        assert rec >= case.min_recall, f"selectivity {sel}: recall {rec:.3f}"
        if case.exact:
            want = oracle(queries, base, metric, ok, case)
            np.testing.assert_allclose(
                np.where(r.ids >= 0, r.scores, 0),
                np.where(want[0] >= 0, want[1] if higher_is_better(metric) else -want[1], 0),
                rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case,metric", params())
def test_per_query_allow_and_deny(case, metric, data):
    base, queries = data
    idx = built(case, metric, base)
    rng = np.random.default_rng(2)
    nq = len(queries)
    # a different selectivity per query, 50% down to 0.1%, and a per-query deny list
    sel = np.geomspace(0.5, 0.001, nq)
    ok = rng.random((nq, N)) < sel[:, None]
    allow = [np.flatnonzero(row) for row in ok]
    deny = [rng.choice(N, 60, replace=False) for _ in range(nq)]
    for i in range(nq):
        ok[i, deny[i]] = False
    _, rec = check(idx, case, metric, base, queries, ok, allow=allow, deny=deny)
    assert rec >= case.min_recall, f"recall {rec:.3f}"


@pytest.mark.parametrize("case,metric", params())
def test_deny_lists_leave_out_the_best(case, metric, data):
    base, queries = data
    idx = built(case, metric, base)
    # deny each query's own unfiltered top 5: the filter hits exactly the neighbourhood
    top = idx.search(queries, 5, **case.search_kw).ids
    ok = np.ones((len(queries), N), bool)
    for i, row in enumerate(top):
        ok[i, row] = False
    r, rec = check(idx, case, metric, base, queries, ok, deny=list(top))
    assert rec >= case.min_recall, f"recall {rec:.3f}"
    shared = np.unique(top[:, 0])
    ok = np.ones((len(queries), N), bool)
    ok[:, shared] = False
    _, rec = check(idx, case, metric, base, queries, ok, deny=shared)
    assert rec >= case.min_recall


@pytest.mark.parametrize("case,metric", params())
def test_filter_correlated_against_the_query(case, metric, data):
    base, queries = data
    idx = built(case, metric, base)
    # allow only the items far from every query (a region the queries' neighbourhoods miss)
    s = exact_scores(queries, base, metric, case).max(0)
    allow = np.argsort(s)[: N // 10]
    ok = np.zeros((len(queries), N), bool)
    ok[:, allow] = True
    _, rec = check(idx, case, metric, base, queries, ok, allow=allow)
    assert rec >= case.min_recall, f"recall {rec:.3f}"


@pytest.mark.parametrize("case,metric", params())
def test_padding_unknown_ids_and_nothing_allowed(case, metric, data):
    base, queries = data
    idx = built(case, metric, base)
    q = queries[:3]
    if case.items == "sparse":  # queries sharing a term with every item asked for below
        from simsearch.sparse import sparse_batch

        union = base[[1, 2, 5, 7, 17, 99]].to_scipy().sum(0)
        q = sparse_batch(sp.csr_matrix(np.tile(union, (3, 1))), idx.dim)
    r = idx.search(q, K, allow=[5, 17, 99, 10**12, 4 * N], **case.search_kw)  # 2 unknown
    assert (np.sort(r.ids[:, :3], axis=1) == [5, 17, 99]).all()
    assert (r.ids[:, 3:] == -1).all()
    assert np.isneginf(r.scores[:, 3:]).all() if higher_is_better(metric) else np.isposinf(
        r.scores[:, 3:]).all()
    for allow, deny in (([], None), ([10**12], None), ([3, 4], [3, 4]), (None, np.arange(N))):
        r = idx.search(q, K, allow=allow, deny=deny, **case.search_kw)
        assert (r.ids == -1).all()
    r = idx.search(q, K, allow=[[1, 2], [], [7]], **case.search_kw)
    assert sorted(r.ids[0, :2].tolist()) == [1, 2] and (r.ids[1] == -1).all()
    assert r.ids[2, 0] == 7 and (r.ids[2, 1:] == -1).all()


BAD_FILTERS = {
    "float_ids": dict(allow=[1.5, 2.0]),
    "bool_mask": dict(allow=np.ones(N, bool)),
    "strings": dict(deny=["a", "b"]),
    "3d": dict(allow=np.zeros((2, 2, 2), np.int64)),
    "per_query_count": dict(deny=[[1], [2]]),  # 3 queries
    "not_a_list": dict(allow=3.5),
    "ragged_scalar": dict(allow=[[1, 2], 3, [4]]),
    "dict": dict(deny={"a": 1}),
}


@pytest.mark.parametrize("bad", sorted(BAD_FILTERS))
@pytest.mark.parametrize("case,metric", params())
def test_bad_filters_are_typed_and_change_nothing(case, metric, bad, data):
    base, queries = data
    idx = built(case, metric, base)
    before = idx.search(queries[:3], K, **case.search_kw)
    kw = BAD_FILTERS[bad]
    with pytest.raises(errors.InvalidFilterError) as ei:
        idx.search(queries[:3], K, **kw, **case.search_kw)
    assert next(iter(kw)) in str(ei.value)  # names the argument
    after = idx.search(queries[:3], K, **case.search_kw)
    np.testing.assert_array_equal(before.ids, after.ids)
    assert len(idx) == N


@pytest.mark.parametrize("case,metric", [p for p in params() if p.values[0].supports_remove])
def test_filters_after_remove_and_readd(case, metric, data):
    base, queries = data
    idx = case.make(dim_of(case, DIM), metric, base)
    idx.add(base[:1000])
    idx.remove(np.arange(0, 1000, 2))
    idx.add(base[:10:2], ids=np.arange(0, 10, 2))  # back again
    live = np.zeros(N, bool)
    live[1:1000:2] = True
    live[0:10:2] = True
    allow = np.arange(0, 40)
    ok = np.zeros((len(queries), N), bool)
    ok[:, allow] = live[allow]
    check(idx, case, metric, base, queries, ok, allow=allow)


def test_norm_ivf_skips_disallowed_items_inside_its_lists(data):
    """With fewer lists than all, a shared filter is applied inside the list scan (a mask per
    position): only allowed ids, and the recall of the probed lists kept."""
    base, queries = data
    idx = ss.NormIVFIndex(DIM, n_lists=32)
    idx.train(base)
    idx.add(base)
    case = Case("norm-ivf-probed", None, metrics=("ip",), search_kw={"n_probe": 8},
                min_recall=0.9)
    unfiltered = check(idx, case, "ip", base, queries, np.ones((len(queries), N), bool))[1]
    rng = np.random.default_rng(5)
    for sel in (0.5, 0.2):
        allow = np.flatnonzero(rng.random(N) < sel)
        ok = np.zeros((len(queries), N), bool)
        ok[:, allow] = True
        _, rec = check(idx, case, "ip", base, queries, ok, allow=allow)
        assert rec >= unfiltered - 0.05, f"selectivity {sel}: {rec:.3f} vs {unfiltered:.3f}"
    deny = np.flatnonzero(rng.random(N) < 0.3)
    ok = np.ones((len(queries), N), bool)
    ok[:, deny] = False
    _, rec = check(idx, case, "ip", base, queries, ok, deny=deny)
    assert rec >= unfiltered - 0.05
