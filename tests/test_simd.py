"""The compiled kernels (simsearch._simd, csrc/) against their numba references, on every
instruction set this CPU runs (simsearch.simd.use_isa forces each path on the same machine)."""

from __future__ import annotations

import numpy as np
import pytest

import simsearch as ss
from knn_check import assert_knn_equal
from simsearch import simd
from simsearch.errors import InvalidParameterError
from simsearch.quant import fastscan as FS
from simsearch.sparse import flat as sparse_flat

ISAS = simd.supported()


def random_blocks(rng, n=3000, md=15, n_lists=13, empty=(3,)):
    codes = rng.integers(0, 16, (n, md), dtype=np.uint8)
    norm_codes = rng.integers(0, 16, n, dtype=np.uint8)
    lists = rng.integers(0, n_lists, n)
    for e in empty:
        lists[lists == e] = 0
    counts = np.bincount(np.sort(lists), minlength=n_lists)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return codes, norm_codes, offsets


@pytest.mark.parametrize("md", [1, 2, 15, 16])
def test_pack_round_trip(md):
    rng = np.random.default_rng(md)
    codes, norm_codes, offsets = random_blocks(rng, n=1000, md=md)
    b = FS.pack(codes, norm_codes, offsets)
    assert b.n_pairs == (md + 1) // 2
    assert np.array_equal(FS.unpack(b, len(codes), md), codes)
    assert int(b.block_count.astype(np.int64).sum()) == len(codes)
    empty = FS.pack(codes[:0], norm_codes[:0], np.zeros(4, np.int64))
    assert empty.blocks.shape[0] == 0 and np.array_equal(empty.list_blocks, np.zeros(4))


def test_quantized_tables_bound_the_error():
    rng = np.random.default_rng(1)
    lut = rng.normal(size=(20, 7, 16)).astype(np.float32)
    q8, scale, bias = FS.quantize_luts(lut, 4)
    assert q8.shape == (20, 8, 16) and not q8[:, 7].any()  # the missing 8th table is zero
    codes = rng.integers(0, 16, (500, 7))
    exact = lut[:, np.arange(7), codes].sum(-1)  # (20, 500)
    approx = scale[:, None] * q8[:, np.arange(7), codes].astype(np.float32).sum(-1) + bias[:, None]
    assert np.all(np.abs(exact - approx) <= 7 * scale[:, None] / 2 + 1e-4)


@pytest.mark.parametrize("isa", ISAS)
def test_compiled_table_quantization_equals_numpy(isa):
    rng = np.random.default_rng(4)
    lut = (rng.normal(size=(30, 9, 16)) * rng.uniform(0.1, 10, (30, 1, 1))).astype(np.float32)
    ref = FS.quantize_luts(lut, 5, reference=True)
    with simd.use_isa(isa):
        got = FS.quantize_luts(lut, 5, n_threads=2)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-7)
    np.testing.assert_allclose(got[2], ref[2], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("k", [1, 10, 100])
@pytest.mark.parametrize("probed", [False, True])
def test_fastscan_equals_reference(isa, k, probed):
    rng = np.random.default_rng(k)
    codes, norm_codes, offsets = random_blocks(rng)
    b = FS.pack(codes, norm_codes, offsets)
    lut = rng.normal(size=(40, codes.shape[1], 16)).astype(np.float32)
    q8, scale, bias = FS.quantize_luts(lut, b.n_pairs)
    cb = np.sort(rng.uniform(0.2, 3.0, 16)).astype(np.float32)
    probes = rng.integers(-1, 13, (40, 4)) if probed else None
    ref = FS.scan(b, q8, scale, bias, cb, k, probes, True, reference=True)
    with simd.use_isa(isa):
        got = FS.scan(b, q8, scale, bias, cb, k, probes, True)
        unordered = FS.scan(b, q8, scale, bias, cb, k, probes, False, n_threads=2)
    assert_knn_equal(*got, *ref)
    order = np.argsort(-unordered[1], axis=1, kind="stable")
    assert_knn_equal(np.take_along_axis(unordered[0], order, 1),
                     np.take_along_axis(unordered[1], order, 1), *ref)


def test_fastscan_estimates_the_float_scan():
    """The 8-bit tables' estimate stays within the rounding bound of the float estimate."""
    rng = np.random.default_rng(3)
    codes, norm_codes, offsets = random_blocks(rng, n=2000, md=8, n_lists=1, empty=())
    b = FS.pack(codes, norm_codes, offsets)
    lut = rng.normal(size=(5, 8, 16)).astype(np.float32)
    cb = np.sort(rng.uniform(0.5, 2.0, 16)).astype(np.float32)
    q8, scale, bias = FS.quantize_luts(lut, b.n_pairs)
    pos, est = FS.scan(b, q8, scale, bias, cb, 2000, None, True)
    exact = cb[norm_codes[pos]] * lut[np.arange(5)[:, None, None], np.arange(8),
                                      codes[pos]].sum(-1)  # fmt: skip
    assert np.all(np.abs(est - exact) <= cb.max() * (8 * scale[:, None] / 2 + 1e-4))


def test_isa_switch_rejects_bad_names():
    with pytest.raises(InvalidParameterError, match="isa must be one of"):
        simd.set_isa("sse9")
    before = simd.isa()
    with simd.use_isa("scalar"):
        assert simd.isa() == "scalar"
    assert simd.isa() == before


@pytest.fixture(scope="module")
def graph_data():
    rng = np.random.default_rng(7)
    x = (rng.normal(size=(3000, 37)) * rng.lognormal(0, 0.5, (3000, 1))).astype(np.float32)
    q = rng.normal(size=(60, 37)).astype(np.float32)
    return x, q


@pytest.mark.parametrize("isa", ISAS)
def test_graph_walk_equals_numba(isa, graph_data):
    x, q = graph_data
    idx = ss.create_index("ipnsw-plus", x.shape[1], "ip", M=8, n_threads=1, progress=False,
                          sq8=False)
    idx.add(x)
    ref = idx.search_reference(q, 10, ef=40)
    with simd.use_isa(isa):
        r = idx.search(q, 10, ef=40)
    assert_knn_equal(r.ids, r.scores, ref.ids, ref.scores)


@pytest.mark.parametrize("isa", ISAS)
def test_sq8_walk_reranks_exactly(isa, graph_data):
    x, q = graph_data
    idx = ss.create_index("ipnsw-plus", x.shape[1], "ip", M=8, n_threads=1, progress=False,
                          sq8=True)
    idx.add(x[:2000])
    idx.add(x[2000:] * 3)  # a wider range re-encodes every code
    xs = np.concatenate([x[:2000], x[2000:] * 3])
    with simd.use_isa(isa):
        r = idx.search(q, 10, ef=64, n_threads=2)
    np.testing.assert_allclose(r.scores, np.take_along_axis(q @ xs.T, r.ids, 1), rtol=1e-4,
                               atol=1e-4)  # fmt: skip
    exact = np.argsort(-(q @ xs.T), axis=1)[:, :10]
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(r.ids, exact, strict=True)])
    assert recall >= 0.97  # observed 0.995


@pytest.mark.parametrize("isa", ISAS)
def test_sq8_walk_equals_numba(isa, graph_data):
    """The compiled walk on codes against the numba walk on the decoded codes, both re-ranking
    the beam's best 20 exactly. The walks differ by design, not by ties: the compiled one rounds
    q * vstep to int8 (exact integer sums, docs/kernels.md), the reference scores the decoded
    floats, so a close call may turn a walk; 99% of the ids must agree, and where they do, the
    exact scores."""
    x, q = graph_data
    idx = ss.create_index("ipnsw-plus", x.shape[1], "ip", M=8, n_threads=1, progress=False,
                          sq8=True)
    idx.add(x)
    ref = idx.search_reference(q, 10, ef=48, sq8=True, rerank=20)
    with simd.use_isa(isa):
        got = idx.search(q, 10, ef=48, rerank=20)
    same = got.ids == ref.ids
    assert same.mean() >= 0.99, same.mean()
    np.testing.assert_allclose(got.scores[same], ref.scores[same], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("isa", ISAS)
def test_rerank_equals_numba(isa):
    from simsearch.quant import _kernels as QK

    rng = np.random.default_rng(9)
    x = rng.normal(size=(5000, 33)).astype(np.float32)
    q = rng.normal(size=(40, 33)).astype(np.float32)
    cand = np.stack([rng.permutation(5000)[:150] for _ in range(40)])
    cand[:, ::7] = -1  # no candidate
    ref_pos, ref_s = QK.rerank_batch(cand, x, q, 10)
    with simd.use_isa(isa):
        pos, sc = FS.rerank(cand, x, q, 10, n_threads=2)
    assert_knn_equal(pos, sc, ref_pos, ref_s)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("d", [1, 13, 64, 70])
def test_flat_topk_equals_the_score_matrix(isa, d):
    """The small-batch exact scan against the BLAS score matrix + numba top-k it replaces (seen
    failing with the four-row reduction's lanes swapped, with ties going to the first row
    scanned instead of the smaller id, and with the sixteen-row skip comparing > instead of >=,
    which kept the first k copies of a tied row met rather than the smallest ids)."""
    from simsearch import _simd
    from simsearch._exact import exact_scores, topk_from_scores

    rng = np.random.default_rng(d)
    x = rng.normal(size=(1003, d)).astype(np.float32)
    x[500:520] = x[7]  # ties, stored under ids in no particular order
    ids = rng.permutation(10**6)[:1003].astype(np.int64)
    q = np.vstack([rng.normal(size=(3, d)), x[7:8]]).astype(np.float32)
    sq = (x * x).sum(1)
    for metric, xsq in (("ip", None), ("l2", sq)):
        for k in (1, 10, 30, 1003):
            ref = topk_from_scores(exact_scores(q, x, metric, sq), k, metric == "ip", ids)
            with simd.use_isa(isa):
                got = _simd.flat_topk(q, x, ids, xsq, k)
            assert_knn_equal(*got, *ref, rtol=1e-4, atol=1e-4)
            if metric == "l2":  # the query equal to row 7: the smallest ids of its 21 copies
                copies = np.sort(np.concatenate([ids[7:8], ids[500:520]]))
                assert list(got[0][3, : min(k, 21)]) == list(copies[: min(k, 21)])


def test_flat_topk_refuses_bad_shapes():
    from simsearch import _simd

    x, ids = np.ones((5, 4), np.float32), np.arange(5)
    with pytest.raises(ValueError, match="k must be"):
        _simd.flat_topk(x[:1], x, ids, None, 6)
    with pytest.raises(ValueError, match="ids"):
        _simd.flat_topk(x[:1], x, ids[:4], None, 2)
    with pytest.raises(ValueError, match="xsq"):
        _simd.flat_topk(x[:1], x, ids, np.ones(4, np.float32), 2)


def test_sq8_codes_cover_every_value(graph_data):
    x, _ = graph_data
    idx = ss.create_index("ipnsw-plus", x.shape[1], "ip", M=8, progress=False, sq8=True)
    idx.add(x)
    n = len(x)
    dec = idx._vmin + idx._vstep * idx._codes[:n].astype(np.float32)
    assert np.all(np.abs(dec - x) <= idx._vstep / 2 + 1e-6)


def test_sq8_growing_values_reencode_rarely(monkeypatch):
    """Adds whose values keep growing (a stream, one item at a time) re-encode every code only
    a logarithmic number of times. The defect: each add that widened a range re-encoded all
    codes, so a growing stream cost O(n) per add (200 full re-encodes for 200 adds here)."""
    from simsearch.graph import ipnsw_plus

    full = []
    real = ipnsw_plus.sq8_encode
    monkeypatch.setattr(ipnsw_plus, "sq8_encode",
                        lambda x, lo, step: full.append(len(x)) or real(x, lo, step))
    idx = ss.create_index("ipnsw-plus", 4, "ip", M=4, progress=False)
    rng = np.random.default_rng(0)
    for i in range(200):
        idx.add((rng.random((1, 4)) + i).astype(np.float32))
        if i > 0:  # every value is still decoded to within half a step
            n = len(idx)
            dec = idx._vmin + idx._vstep * idx._codes[:n].astype(np.float32)
            assert np.all(np.abs(dec - idx._xb[:n]) <= idx._vstep / 2 + 1e-5)
    reencodes = sum(1 for m in full if m > 1)
    assert reencodes <= 4 * np.ceil(np.log(200) / np.log(1.25)), reencodes  # per dimension


@pytest.mark.parametrize("n", [64, 1 << 17])  # a query's floats (GIL kept), a batch's (released)
def test_all_finite_finds_every_nan_and_inf(n):
    """The finiteness check of every search and add (seen failing with the exponent mask one bit
    short: the largest finite float32 counted as infinite)."""
    from simsearch import _simd

    x = np.full(n, np.finfo(np.float32).max, np.float32)
    x[0] = np.finfo(np.float32).tiny / 2  # a subnormal is finite
    assert _simd.all_finite(x)
    for bad in (np.nan, np.inf, -np.inf):
        y = x.copy()
        y[n - 1] = bad
        assert not _simd.all_finite(y)


@pytest.mark.parametrize("isa", ISAS)
def test_seismic_walk_with_every_block_open_is_exact(isa, monkeypatch):
    """With every posting list kept whole, every query term visited and every block opened, the
    compiled walk must answer as the exact inverted scan: ties to the smaller id, filters, a
    tail of rows added after the blocks were built, and rows longer than a vector's 16 lanes.
    Seen failing with the last lanes' mask one lane short (AVX-512 scores
    off) and with ties kept in the order met instead of to the smaller id (every instruction
    set)."""
    monkeypatch.setattr(sparse_flat, "TAIL_MIN", 100)  # blocks from 100 items on, not 4,096
    rng = np.random.default_rng(4)
    dim, n = 300, 900

    def rows(m, lo, hi):
        out = []
        for _ in range(m):
            t = np.sort(rng.choice(dim, int(rng.integers(lo, hi)), replace=False))
            out.append((t, (rng.integers(1, 128, t.size) / 64).astype(np.float32)))
        return out

    items = rows(n, 1, 40)
    items[50:60] = [items[3]] * 10  # tied rows
    queries = rows(12, 2, 30) + [items[3]]
    seismic = ss.SeismicIndex(dim, n_postings=n, centroid_fraction=0.1)
    exact = ss.SparseFlatIndex(dim)
    for index in (seismic, exact):
        index.add(items[:800], ids=np.arange(800) * 7)
        index.add(items[800:], ids=np.arange(800, n) * 7)  # the tail
    allow = np.arange(0, n * 7, 14)
    kw = dict(query_cut=dim, heap_factor=1e-6)
    with simd.use_isa(isa):
        for k in (1, 10, 25):
            assert_knn_equal(*seismic.search(queries, k, **kw), *exact.search(queries, k),
                             rtol=1e-5, atol=1e-5)
            assert_knn_equal(*seismic.search(queries, k, allow=allow, **kw),
                             *exact.search(queries, k, allow=allow), rtol=1e-5, atol=1e-5)
        got = seismic.search(queries[-1:], 12, **kw).ids[0]
        assert list(got[:11]) == sorted([21] + [7 * i for i in range(50, 60)])


def test_seismic_walk_agrees_on_every_instruction_set(monkeypatch):
    """At pruning settings (blocks skipped by their bounds) every instruction set's walk
    answers alike."""
    monkeypatch.setattr(sparse_flat, "TAIL_MIN", 100)  # blocks from 100 items on, not 4,096
    rng = np.random.default_rng(5)
    dim = 500
    items = [(np.sort(rng.choice(dim, 30, replace=False)),
              rng.random(30).astype(np.float32)) for _ in range(3000)]
    index = ss.SeismicIndex(dim, n_postings=200)
    index.add(items)
    got = []
    for isa in ISAS:
        with simd.use_isa(isa):
            got.append(index.search(items[:50], 10, query_cut=5, heap_factor=0.9))
    for r in got[1:]:
        assert_knn_equal(r.ids, r.scores, got[0].ids, got[0].scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("isa", ISAS)
def test_seismic_answers_carry_exact_scores(isa, monkeypatch):
    """The scores the walk answers are the exact inner products of the ids it answers, best
    first (seen failing when the walk scored built rows from a half-precision copy and answered
    those scores: relative errors near 1e-4)."""
    monkeypatch.setattr(sparse_flat, "TAIL_MIN", 100)  # blocks from 100 items on, not 4,096
    rng = np.random.default_rng(6)
    dim = 400
    items = [(np.sort(rng.choice(dim, 25, replace=False)),
              rng.random(25).astype(np.float32) + 0.1) for _ in range(2000)]
    index = ss.SeismicIndex(dim, n_postings=300)
    index.add(items)
    dense = np.zeros((len(items), dim), np.float64)
    for r, (t, v) in enumerate(items):
        dense[r, t] = v
    queries = items[:30]
    qd = np.zeros((len(queries), dim), np.float64)
    for r, (t, v) in enumerate(queries):
        qd[r, t] = v
    with simd.use_isa(isa):
        got = index.search(queries, 10, query_cut=8, heap_factor=0.8)
    want = np.take_along_axis(qd @ dense.T, got.ids, axis=1)
    np.testing.assert_allclose(got.scores, want, rtol=2e-6)
    assert (np.diff(got.scores, axis=1) <= 0).all()
