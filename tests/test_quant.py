"""NEQ (simsearch.quant): kernels against numpy references, the estimator, the relative-norm
target, recall against the exact oracle, persistence and bad input."""

from __future__ import annotations

import numpy as np
import pytest

import simsearch as ss
from knn_check import assert_knn_equal
from simsearch import errors
from simsearch.datasets import synthetic_longtail
from simsearch.eval import recall_at_k
from simsearch.quant import NEQIndex, faiss_baseline, pad, padded_dim
from simsearch.quant import _kernels as K
from simsearch.quant.neq import encode_norm, norm_codebook_1d

DIM = 16


@pytest.fixture(scope="module")
def data():
    base, queries = synthetic_longtail(n=4000, dim=DIM, n_queries=40, n_clusters=40, seed=3)
    return base, queries


@pytest.fixture(scope="module")
def oracle(data):
    base, queries = data
    f = ss.FlatIndex(DIM, "ip")
    f.add(base)
    return f.search(queries, 10)


def small(base_kind: str, **kw) -> NEQIndex:
    kw = {"n_codebooks": 3, "nbits": 5, "progress": False} | kw
    if base_kind == "lsq":
        kw.setdefault("lsq_train_iters", 4)
    return NEQIndex(DIM, base=base_kind, **kw)


# -- slow references ----------------------------------------------------------------------------


def scan_reference(lut, codes, norm_codes, norm_codebook, k):
    """numpy: score every item, top-k best first, ties to the smaller position."""
    nq, M, _ = lut.shape
    s = np.zeros((nq, codes.shape[0]), np.float32)
    for m in range(M):
        s += lut[:, m, codes[:, m]]
    s *= norm_codebook[norm_codes][None, :]
    order = np.lexsort((np.broadcast_to(np.arange(s.shape[1]), s.shape), -s), axis=1)[:, :k]
    pos = np.full((nq, k), -1, np.int64)
    sc = np.full((nq, k), -np.inf, np.float32)
    pos[:, : order.shape[1]] = order
    sc[:, : order.shape[1]] = np.take_along_axis(s, order, 1)
    return pos, sc


def scan_lists_reference(lut, codes, norm_codes, norm_codebook, k, offsets, probes):
    """numpy: the exhaustive reference with items outside the probed lists scored -inf."""
    lists = np.repeat(np.arange(offsets.size - 1), np.diff(offsets))
    pos, sc = scan_reference(lut, codes, norm_codes, norm_codebook, codes.shape[0])
    inside = np.array([np.isin(lists[p], pr) for p, pr in zip(pos, probes, strict=True)])
    out_p = np.full((lut.shape[0], k), -1, np.int64)
    out_s = np.full((lut.shape[0], k), -np.inf, np.float32)
    for q in range(lut.shape[0]):
        keep = pos[q][inside[q]][:k]
        out_p[q, : keep.size] = keep
        out_s[q, : keep.size] = sc[q][inside[q]][:k]
    return out_p, out_s


def kmeans_1d_reference(v, c, n_iter):
    for _ in range(n_iter):
        a = np.abs(v[:, None] - c[None, :]).argmin(1)
        c = np.array([v[a == j].mean() if (a == j).any() else c[j] for j in range(c.size)])
        c.sort()
    return c


@pytest.mark.parametrize("n,k", [(500, 10), (7, 10), (300, 300), (5000, 100)])
def test_scan_kernel_matches_reference(n, k):
    """k <= 32 keeps a heap, a larger k a buffer cut back when full (5000 items: cut often)."""
    rng = np.random.default_rng(n)
    lut = rng.standard_normal((5, 3, 16)).astype(np.float32)
    lut[:, :, 3] = lut[:, :, 4]  # force ties between items
    codes = rng.integers(0, 16, (n, 3)).astype(np.uint8)
    nc = rng.integers(0, 16, n).astype(np.uint8)
    ncb = rng.uniform(0.5, 2, 16).astype(np.float32)
    ref_pos, ref_s = scan_reference(lut, codes, nc, ncb, k)
    whole = K.whole(n, len(lut))
    for fn in (K.scan_lists_batch, K.scan_lists_batch_parallel):
        pos, s = fn(lut, codes, nc, ncb, k, *whole)
        np.testing.assert_allclose(s, ref_s, rtol=1e-5, atol=1e-5)
        assert_knn_equal(pos, s, ref_pos, ref_s)
        # unordered (candidates for a re-rank): the same k best, in any order
        pos_u, s_u = fn(lut, codes, nc, ncb, k, *whole, False)
        np.testing.assert_array_equal(np.sort(pos_u, 1), np.sort(pos, 1))
        np.testing.assert_allclose(np.sort(s_u, 1), np.sort(s, 1), rtol=1e-6)


@pytest.mark.parametrize("k", [10, 300])
def test_list_scan_kernel_matches_reference(k):
    rng = np.random.default_rng(k)
    n, n_lists = 400, 12
    lut = rng.standard_normal((6, 3, 16)).astype(np.float32)
    codes = rng.integers(0, 16, (n, 3)).astype(np.uint8)
    nc = rng.integers(0, 16, n).astype(np.uint8)
    ncb = rng.uniform(0.5, 2, 16).astype(np.float32)
    counts = rng.multinomial(n, np.ones(n_lists) / n_lists)
    counts[3] = 0  # an empty list
    counts[0] += n - counts.sum()
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    probes = np.stack([rng.choice(n_lists, 4, replace=False) for _ in range(6)]).astype(np.int64)
    ref_pos, ref_s = scan_lists_reference(lut, codes, nc, ncb, k, offsets, probes)
    for fn in (K.scan_lists_batch, K.scan_lists_batch_parallel):
        pos, s = fn(lut, codes, nc, ncb, k, offsets, probes)
        assert_knn_equal(pos, s, ref_pos, ref_s)


def test_kmeans_1d_matches_reference():
    rng = np.random.default_rng(0)
    v = np.sort(rng.lognormal(0, 0.5, 3000))
    init = np.quantile(v, (np.arange(8) + 0.5) / 8)
    np.testing.assert_allclose(K.kmeans_1d(v, init, 20), kmeans_1d_reference(v, init, 20),
                               rtol=1e-9)  # fmt: skip
    cb = norm_codebook_1d(v, 8)
    assert np.all(np.diff(cb) >= 0)
    # nearest-codeword encoding
    codes = encode_norm(v.astype(np.float32), cb)
    assert (codes == np.abs(v[:, None] - cb[None, :]).argmin(1)).mean() > 0.999


# -- the estimator --------------------------------------------------------------------------------


@pytest.mark.parametrize("base_kind", ["pq", "opq", "rq", "lsq"])
def test_scan_estimate_equals_decode_then_dot(base_kind, data):
    base, queries = data
    idx = small(base_kind)
    idx.train(base[:2000])
    idx.add(base)
    it = idx._items
    est = queries[:5] @ idx.decode(it.codes, it.norm_codes).T
    r = idx.search(queries[:5], len(idx))
    np.testing.assert_allclose(r.scores, np.take_along_axis(est, r.ids, 1), rtol=1e-4,
                               atol=1e-5)  # fmt: skip
    assert (np.diff(r.scores, axis=1) <= 0).all()


def test_relative_norm_is_the_target(data):
    base, _ = data
    idx = NEQIndex(DIM, base="pq", n_codebooks=3, nbits=8, progress=False)
    idx.train(base)
    idx.add(base)
    it = idx._items
    _, rel = idx.encode_directions(base)
    nrm = np.linalg.norm(base, axis=1)
    # coarse direction codes decode to non-unit vectors, so l differs from |x| on this fixture
    assert np.median(np.abs(rel / nrm - 1)) > 0.03  # observed 0.066
    # the codebook approximates l (not |x|) ...
    err_rel = np.median(np.abs(idx._norm_codebook[it.norm_codes] - rel) / rel)
    assert err_rel < 0.01  # observed 0.0015
    # ... so a reconstructed item has the item's norm
    dec_norm = np.linalg.norm(idx.decode(it.codes, it.norm_codes), axis=1)
    assert np.median(np.abs(dec_norm / nrm - 1)) < 0.01  # observed 0.0015


def test_more_codebooks_never_lower_recall(data, oracle):
    base, queries = data
    recs = []
    for M in (2, 3, 5, 9):
        idx = NEQIndex(DIM, base="pq", n_codebooks=M, nbits=6, progress=False)
        idx.train(base)
        idx.add(base)
        r = idx.search(queries, 10)
        recs.append(recall_at_k(r.ids, oracle.ids, 10, gt_scores=oracle.scores, queries=queries,
                                base=base, metric="ip"))  # fmt: skip
    # observed 0.77, 0.81, 0.83, 0.89
    assert all(b >= a for a, b in zip(recs, recs[1:], strict=False)), recs
    assert recs[-1] > 0.85


def test_rerank_reaches_exact_recall(data, oracle):
    base, queries = data
    idx = NEQIndex(DIM, base="rq", n_codebooks=4, nbits=6, keep_vectors=True, progress=False)
    idx.train(base)
    idx.add(base)
    r = idx.search(queries, 10, rerank=200)
    rec = recall_at_k(r.ids, oracle.ids, 10, gt_scores=oracle.scores, queries=queries, base=base,
                      metric="ip")  # fmt: skip
    assert rec >= 0.95  # observed 1.0
    np.testing.assert_allclose(r.scores, np.take_along_axis(queries @ base.T, r.ids, 1),
                               rtol=1e-5, atol=1e-5)  # fmt: skip


def test_rerank_of_every_item_is_flat_search(data, oracle):
    """Re-scoring every item exactly is an exhaustive search, on one thread or several."""
    base, queries = data
    idx = NEQIndex(DIM, base="pq", n_codebooks=4, nbits=6, n_lists=8, keep_vectors=True,
                   progress=False)
    idx.train(base)
    idx.add(base)
    for kw in ({}, {"n_threads": 2}, {"n_probe": 8}, {"n_probe": 8, "n_threads": 2}):
        r = idx.search(queries, 10, rerank=len(base), **kw)
        np.testing.assert_array_equal(r.ids, oracle.ids)
        np.testing.assert_allclose(r.scores, oracle.scores, rtol=1e-5, atol=1e-5)


def test_threads_batches_and_remove(data):
    base, queries = data
    idx = small("pq")
    idx.train(base)
    idx.add(base)
    a = idx.search(queries, 10)
    b = idx.search(queries, 10, n_threads=2)
    c = np.vstack([idx.search(q, 10).ids for q in queries])
    np.testing.assert_array_equal(a.ids, b.ids)
    np.testing.assert_array_equal(a.ids, c)
    gone = np.unique(a.ids[:, 0])
    idx.remove(gone)
    assert len(idx) == len(base) - gone.size
    assert not np.isin(idx.search(queries, 10).ids, gone).any()


@pytest.mark.parametrize("base_kind", ["opq", "rq", "lsq"])
def test_save_load_roundtrip(base_kind, data, tmp_path):
    base, queries = data
    idx = small(base_kind, keep_vectors=True)
    idx.train(base[:1000])
    idx.add(base[:1500])
    idx.save(tmp_path / "neq.idx")
    back = ss.load(tmp_path / "neq.idx")
    assert isinstance(back, NEQIndex) and len(back) == 1500
    for kw in ({}, {"rerank": 50}):
        r1, r2 = idx.search(queries, 10, **kw), back.search(queries, 10, **kw)
        np.testing.assert_array_equal(r1.ids, r2.ids)
        np.testing.assert_array_equal(r1.scores, r2.scores)


def test_lsq_ridge_keeps_codewords_encodable():
    """faiss's default LSQ ridge (0.01) lets codewords outgrow unit-norm data on a small training
    sample, and the encoder then misses the cancelling combinations training relied on; the
    default ridge (1.0) keeps held-out directions encodable."""
    base, _ = synthetic_longtail(n=2000, dim=128, n_queries=1, n_clusters=300, seed=3)
    u = base / np.linalg.norm(base, axis=1, keepdims=True)
    errs, cw = {}, {}
    for ridge in (0.01, 1.0):
        idx = NEQIndex(128, base="lsq", n_codebooks=5, nbits=7, lsq_train_iters=4,
                       lsq_ridge=ridge, progress=False)  # fmt: skip
        idx.train(base[:1000])
        assert idx._dq.lsq.lambd == pytest.approx(ridge)
        dec = idx._dq.sa_decode(idx._dq.sa_encode(u[1000:]))
        errs[ridge] = float(((u[1000:] - dec) ** 2).sum(1).mean())
        cw[ridge] = float(np.linalg.norm(idx._tables[1], axis=0).mean())
    assert errs[1.0] < errs[0.01] - 0.05, errs  # observed 0.42 vs 0.52
    assert cw[1.0] < 0.7 * cw[0.01], cw  # observed 0.40 vs 0.73
    fb = faiss_baseline("lsq", 128, 4, nbits=7, lsq_ridge=2.5)
    assert fb.lsq.lambd == pytest.approx(2.5)  # the baseline gets the same setting


def test_coarse_lists(data, oracle, tmp_path):
    base, queries = data
    idx = NEQIndex(DIM, base="pq", n_codebooks=4, nbits=6, n_lists=16, keep_vectors=True,
                   progress=False)  # fmt: skip
    idx.train(base)
    idx.add(base[:2500])
    idx.add(base[2500:])  # a second batch is filed into the same lists
    it = idx._items
    assert (np.diff(it.lists) >= 0).all() and it.offsets[-1] == len(base)
    np.testing.assert_array_equal(it.lists, idx.assign_lists(it.x))
    full = idx.search(queries, 10)
    every = idx.search(queries, 10, n_probe=16)
    np.testing.assert_array_equal(full.ids, every.ids)
    recs = []
    for n_probe in (1, 2, 4, 8, 16):
        r = idx.search(queries, 10, n_probe=n_probe)
        # every answer comes from a probed list
        probes = idx._probes(queries, n_probe)
        if probes is not None:
            lists = idx.assign_lists(base[r.ids.ravel()]).reshape(r.ids.shape)
            assert all(np.isin(lists[q], probes[q]).all() for q in range(len(queries)))
        recs.append(recall_at_k(r.ids, oracle.ids, 10))
    # observed 0.71, 0.77, 0.78, 0.79, 0.79
    assert all(b >= a - 0.02 for a, b in zip(recs, recs[1:], strict=False)), recs
    assert recs[0] < recs[-1] - 0.04 and recs[-1] > 0.75, recs
    r_rr = idx.search(queries, 10, n_probe=8, rerank=100)
    assert recall_at_k(r_rr.ids, oracle.ids, 10) > 0.9  # observed 0.97
    gone = full.ids[:, 0]
    idx.remove(np.unique(gone))
    assert not np.isin(idx.search(queries, 10, n_probe=4).ids, gone).any()
    idx.save(tmp_path / "ivf.idx")
    back = ss.load(tmp_path / "ivf.idx")
    for kw in ({}, {"n_probe": 3}, {"n_probe": 3, "rerank": 30}):
        np.testing.assert_array_equal(back.search(queries, 10, **kw).ids,
                                      idx.search(queries, 10, **kw).ids)  # fmt: skip


def test_coarse_lists_bad_input(data):
    base, queries = data
    idx = small("pq")
    idx.train(base)
    idx.add(base[:100])
    with pytest.raises(errors.InvalidParameterError, match="n_lists"):
        idx.search(queries, 5, n_probe=2)
    with pytest.raises(errors.InvalidParameterError, match="n_lists"):
        small("pq", n_lists=64).train(base[:40])
    ivf = small("pq", n_lists=8)
    ivf.train(base)
    ivf.add(base)
    with pytest.raises(errors.InvalidParameterError):
        ivf.search(queries, 5, n_probe=0)
    with pytest.raises(errors.InvalidParameterError):
        NEQIndex(DIM, n_lists=-1)


def test_faiss_baseline_at_equal_bits(data):
    base, queries = data
    d = padded_dim(DIM, 3, "pq")
    fb = faiss_baseline("pq", DIM, 3, nbits=5)
    fb.train(pad(base, d))
    fb.add(pad(base, d))
    assert fb.sa_code_size() == small("pq").code_size == 2
    D, _ = fb.search(pad(queries, d), 5)
    assert np.isfinite(D).all()


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [{"base": "ivf"}, {"n_codebooks": 1}, {"nbits": 9}, {"nbits": 0}, {"keep_vectors": 1},
     {"rq_beam_size": 0}, {"metric": "l2"}, {"lsq_ridge": -1.0}, {"lsq_ridge": float("nan")},
     {"lsq_ridge": "1"}],
)  # fmt: skip
def test_bad_build_params(kw):
    with pytest.raises(errors.InvalidParameterError):
        NEQIndex(DIM, **kw)


def test_bad_use(data):
    base, queries = data
    idx = small("pq")
    with pytest.raises(errors.NotTrainedError):
        idx.add(base)
    with pytest.raises(errors.InvalidParameterError, match="at least"):
        idx.train(base[:10])
    idx.train(base)
    idx.add(base[:100])
    with pytest.raises(errors.InvalidParameterError, match="keep_vectors"):
        idx.search(queries, 5, rerank=10)
    with pytest.raises(errors.InvalidParameterError):
        idx.search(queries, 5, n_threads=0)
    with pytest.raises(errors.InvalidParameterError):
        idx.search(queries, 5, ef=3)
    with pytest.raises(errors.DimensionMismatchError):
        idx.search(queries[:, :3], 5)
    r = idx.search(queries[:2], 150)  # k > n pads
    assert (r.ids[:, 100:] == -1).all() and np.isneginf(r.scores[:, 100:]).all()


def test_norm_aware_list_ranking_reaches_what_centroid_ranking_misses():
    """On long-tailed norms, lists ranked by their largest norm times q·c reach recall a
    centroid ranking does not at the same number of probed lists."""
    from simsearch.datasets import synthetic_longtail

    base, queries = synthetic_longtail(n=20_000, dim=32, n_queries=100, n_clusters=200,
                                       norm_sigma=0.8, seed=2)
    idx = NEQIndex(32, "ip", base="pq", n_codebooks=8, nbits=6, n_lists=64, keep_vectors=True,
                   progress=False)
    idx.train(base)
    idx.add(base)
    flat = ss.FlatIndex(32, "ip")
    flat.add(base)
    truth = flat.search(queries, 10).ids

    def recall(**kw):
        got = idx.search(queries, 10, rerank=100, **kw).ids
        return np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, truth, strict=True)])

    norm = [recall(n_probe=p, list_ranking="norm") for p in (2, 4, 8, 16)]
    plain = [recall(n_probe=p, list_ranking="centroid") for p in (2, 4, 8, 16)]
    assert all(a >= c - 0.01 for a, c in zip(norm, plain, strict=True)), (norm, plain)
    assert norm[2] >= plain[2] + 0.03, (norm, plain)  # observed 0.82 against 0.75 at 8 lists
    with pytest.raises(errors.InvalidParameterError, match="list_ranking"):
        idx.search(queries, 10, n_probe=2, list_ranking="nope")
