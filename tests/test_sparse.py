"""Sparse items and SparseFlatIndex against a dense numpy oracle on small seeded data."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import scipy.sparse as sp

import simsearch as ss
from simsearch.errors import InvalidParameterError
from simsearch.sparse import SparseBatch, count_tokens, sparse_batch
from simsearch.sparse import flat as sparse_flat

DIM, N, NQ, K = 500, 3000, 40, 10


def corpus(n, dim=DIM, density=0.02, seed=0):
    rng = np.random.default_rng(seed)
    m = sp.random(n, dim, density=density, format="csr", random_state=rng,
                  data_rvs=lambda s: rng.gamma(1.0, 1.0, s)).astype(np.float32)
    m.sort_indices()
    return m


def oracle(x: sp.csr_matrix, ids: np.ndarray, q: sp.csr_matrix, k: int, allowed=None):
    """Exact top-k by inner product (float64) among the items sharing a term with each query,
    ties to the smaller id; -1 / -inf padded."""
    scores = (q.astype(np.float64) @ x.astype(np.float64).T).toarray()
    qb, xb = q.copy(), x.copy()
    qb.data[:], xb.data[:] = 1, 1
    shares = (qb @ xb.T).toarray() > 0
    out_i = np.full((q.shape[0], k), -1, np.int64)
    out_s = np.full((q.shape[0], k), -np.inf)
    for r in range(q.shape[0]):
        ok = shares[r] if allowed is None else shares[r] & allowed[r]
        cand = np.flatnonzero(ok)
        order = np.lexsort((ids[cand], -scores[r, cand]))[:k]
        out_i[r, : order.size], out_s[r, : order.size] = ids[cand[order]], scores[r, cand[order]]
    return out_i, out_s


def assert_same(got, want_i, want_s):
    """Equal scores, and equal ids wherever the oracle's scores are not within float32 noise of
    a tie."""
    np.testing.assert_allclose(got.scores, want_s, rtol=1e-5, atol=1e-5)
    s = np.where(np.isfinite(want_s), want_s, -1e30)
    gap = np.minimum(np.abs(np.diff(s, axis=1, prepend=np.inf)),
                     np.abs(np.diff(s, axis=1, append=-np.inf)))
    clear = gap > 1e-4 * np.maximum(1.0, np.abs(s))
    np.testing.assert_array_equal(got.ids[clear], want_i[clear])


@pytest.fixture(scope="module")
def data():
    return corpus(N), corpus(NQ, density=0.03, seed=1)


# -- the batch type ---------------------------------------------------------------------------


def test_every_form_of_a_batch_is_the_same_batch(data):
    x, _ = data
    pairs = [(x.indices[x.indptr[r]:x.indptr[r + 1]], x.data[x.indptr[r]:x.indptr[r + 1]])
             for r in range(5)]
    a = sparse_batch(x[:5], DIM)
    for other in (sparse_batch(pairs, DIM), sparse_batch(x[:5].tocoo(), DIM),
                  sparse_batch(a, DIM), SparseBatch.from_bytes(a.to_bytes(), DIM)):
        assert len(other) == 5
        for name in ("indptr", "indices", "values"):
            np.testing.assert_array_equal(getattr(other, name), getattr(a, name))
    one = sparse_batch(pairs[2], DIM)  # a single (indices, values) pair: one item
    assert len(one) == 1 and (one.to_scipy() != x[2]).nnz == 0
    sub = a[np.array([4, 0])]
    assert (sub.to_scipy() != x[[4, 0]]).nnz == 0 and len(a[1:3]) == 2


@pytest.mark.parametrize("bad, match", [
    ([([3, 1], [1.0, 1.0])], "strictly increasing"),
    ([([1, 1], [1.0, 1.0])], "strictly increasing"),
    ([([1, DIM], [1.0, 1.0])], "outside the vocabulary"),
    ([([-1], [1.0])], "outside the vocabulary"),
    ([([1], [np.nan])], "finite"),
    ([([1], [-0.5])], ">= 0"),
    ([([1, 2], [1.0])], "as many indices as values"),
    ([([1.5], [1.0])], "integers"),
    ([([1], ["a"])], "numbers"),
    ([[1, 2, 3]], "pairs"),
    (np.ones((2, DIM), np.float32), "sparse rows"),
    (sp.csr_matrix((np.ones(2), np.array([3, 3]), np.array([0, 2])), shape=(1, DIM)),
     "sum_duplicates"),
    (sp.csr_matrix((1, DIM + 1)), "columns"),
])
def test_bad_items_are_typed_errors_and_change_nothing(bad, match, data):
    x, q = data
    idx = ss.SparseFlatIndex(DIM)
    idx.add(x[:100])
    before = idx.search(q, K)
    with pytest.raises(InvalidParameterError, match=match):
        idx.add(bad)
    assert len(idx) == 100
    after = idx.search(q, K)
    np.testing.assert_array_equal(after.ids, before.ids)


def test_negative_weights_where_the_kind_allows_them():
    idx = ss.SparseFlatIndex(10, nonnegative=False)
    idx.add([([1, 2], [-1.0, 2.0]), ([1], [3.0])])
    r = idx.search(([1], [1.0]), 2)
    assert r.ids.tolist() == [[1, 0]] and r.scores.tolist() == [[3.0, -1.0]]
    with pytest.raises(InvalidParameterError):
        ss.SparseFlatIndex(10, nonnegative="yes")


# -- exact answers ----------------------------------------------------------------------------


def test_answers_equal_the_oracle_through_adds_removes_and_compactions(data, monkeypatch):
    """Small enough thresholds that the tail (rows not in the posting lists yet), the rebuild of
    the lists and the compaction of removed rows all happen several times."""
    monkeypatch.setattr(sparse_flat, "TAIL_MIN", 200)
    x, q = data
    idx = ss.SparseFlatIndex(DIM)
    rng = np.random.default_rng(2)
    held = np.empty(0, np.int64)
    for start in range(0, N, 250):
        ids = np.arange(start, start + 250) * 3 + 7  # sparse, unordered by position
        idx.add(x[start:start + 250], ids)
        held = np.concatenate([held, ids])
        gone = rng.choice(held, 60, replace=False)
        idx.remove(gone)
        held = np.setdiff1d(held, gone)
        rows = (held - 7) // 3
        want = oracle(x[rows], held, q, K)
        assert_same(idx.search(q, K), *want)
    assert len(idx) == held.size
    back = idx.get_vectors(held[:20])
    assert isinstance(back, SparseBatch) and (back.to_scipy() != x[(held[:20] - 7) // 3]).nnz == 0


def test_filters_shared_and_per_query_equal_the_oracle(data):
    x, q = data
    idx = ss.SparseFlatIndex(DIM)
    ids = np.arange(N) + 100
    idx.add(x, ids)
    rng = np.random.default_rng(3)
    allow = np.sort(rng.choice(ids, 300, replace=False))
    want = oracle(x, ids, q, K, np.broadcast_to(np.isin(ids, allow), (NQ, N)))
    assert_same(idx.search(q, K, allow=allow), *want)
    deny = [np.sort(idx.search(q[[i]], 3).ids[0]) for i in range(NQ)]  # each query's best
    ok = np.stack([~np.isin(ids, d) for d in deny])
    assert_same(idx.search(q, K, deny=deny), *oracle(x, ids, q, K, ok))


def test_k_beyond_the_candidates_pads_and_an_empty_query_finds_nothing(data):
    x, _ = data
    idx = ss.SparseFlatIndex(DIM)
    idx.add(x[:50])
    r = idx.search([([0], [1.0]), ([], [])], 60)
    assert (r.ids[1] == -1).all() and np.isneginf(r.scores[1]).all()
    held = r.ids[0][r.ids[0] >= 0]
    assert held.size == (x[:50, 0] != 0).sum()


def test_save_load_bytes_and_the_log_form_round_trip(data, tmp_path):
    x, q = data
    idx = ss.SparseFlatIndex(DIM)
    idx.add(x[:1000])
    idx.remove(np.arange(0, 1000, 3))
    idx.save(tmp_path / "s.idx")
    for back in (ss.load(tmp_path / "s.idx"), ss.loads(idx.to_bytes())):
        assert isinstance(back, ss.SparseFlatIndex) and len(back) == len(idx)
        np.testing.assert_array_equal(back.search(q, K).ids, idx.search(q, K).ids)
    b = idx.check_items(x[:7])
    again = idx.items_from_bytes(idx.item_bytes(b))
    assert (again.to_scipy() != x[:7]).nnz == 0


def test_searches_overlapping_writes_never_crash_and_stay_exact_about_membership(data):
    x, q = data
    idx = ss.SparseFlatIndex(DIM)
    idx.add(x[:500])
    stop, errors = threading.Event(), []

    def searcher():
        while not stop.is_set():
            try:
                r = idx.search(q, K)
                assert ((r.ids >= 0) <= np.isfinite(r.scores)).all()
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

    threads = [threading.Thread(target=searcher) for _ in range(2)]
    for t in threads:
        t.start()
    for start in range(500, 2500, 100):
        idx.add(x[start:start + 100], np.arange(start, start + 100))
        idx.remove(np.arange(start - 500, start - 400))
    stop.set()
    for t in threads:
        t.join()
    assert not errors
    held = idx.ids()
    assert_same(idx.search(q, K), *oracle(x[held], held, q, K))


# -- BM25 -------------------------------------------------------------------------------------

TEXT = """the quick brown fox jumps over the lazy dog
a fast brown fox leaps over a sleepy dog again and again
the dog barks at the fox and the fox runs into the forest
search engines rank documents by term frequency and inverse document frequency
bm25 weighs a term by how often it appears in a document and how rare it is in the corpus
sparse vectors hold a weight for each term a document contains
an inverted index lists for each term the documents that contain it
the lazy cat sleeps all day while the dog watches the door
maximum inner product search finds the vectors with the largest inner product
learned sparse models such as splade expand a passage with related terms""".splitlines()


def test_bm25_equals_bm25s_and_stays_exact_through_adds_and_removes():
    """Same tokens, k1 and b: the scores bm25s computes (its Lucene variant) to 1e-5, the same
    top-10; then after removing and adding documents, the scores of a bm25s index built fresh
    on what is held."""
    bm25s = pytest.importorskip("bm25s")
    rng = np.random.default_rng(5)
    words = " ".join(TEXT).split()
    corpus = TEXT + [" ".join(rng.choice(words, rng.integers(3, 30))) for _ in range(400)]
    queries = ["brown fox", "the dog and the fox", "inverse document frequency",
               "sparse term weight", "lazy lazy cat"]

    def build(texts):
        tok = bm25s.tokenize(texts, stopwords=None, show_progress=False)
        ref = bm25s.BM25(k1=1.2, b=0.7)
        ref.index(tok, show_progress=False)
        return tok, ref

    tok, ref = build(corpus)
    vocab = tok.vocab
    dim = len(vocab)
    idx = ss.create_index("bm25", dim, "ip", k1=1.2, b=0.7)
    idx.add(count_tokens(tok.ids, dim))

    def check(texts, ids_of_rows):
        _, fresh = build(texts)
        for qtext in queries:
            qtok = [vocab[w] for w in qtext.split() if w in vocab]
            want = fresh.get_scores([fresh.vocab_dict[w] for w in qtext.split()
                                     if w in fresh.vocab_dict])
            got = idx.search(count_tokens([qtok], dim), 10)
            held = got.ids[0] >= 0
            rows = np.array([ids_of_rows[i] for i in got.ids[0][held]])
            np.testing.assert_allclose(got.scores[0][held], want[rows], rtol=1e-5, atol=1e-5)
            top = np.sort(want)[::-1][: held.sum()]
            np.testing.assert_allclose(np.sort(got.scores[0][held])[::-1], top, rtol=1e-5,
                                       atol=1e-5)

    check(corpus, {i: i for i in range(len(corpus))})
    gone = rng.choice(len(corpus), 40, replace=False)
    idx.remove(gone)
    extra = [" ".join(rng.choice(words, 12)) for _ in range(40)]
    known = [t for t in extra if all(w in vocab for w in t.split())]
    new = idx.add(count_tokens([[vocab[w] for w in t.split()] for t in known], dim))
    kept = [i for i in range(len(corpus)) if i not in set(gone.tolist())]
    texts = [corpus[i] for i in kept] + known
    check(texts, {**{old: r for r, old in enumerate(kept)},
                  **{int(n): len(kept) + j for j, n in enumerate(new)}})
    back = ss.loads(idx.to_bytes())
    q = count_tokens([[vocab["fox"]]], dim)
    np.testing.assert_array_equal(back.search(q, 10).ids, idx.search(q, 10).ids)


def test_bm25_vectors_score_as_the_index_does():
    """encode_documents(x) . encode_queries(q) is the BM25 score the index answers (any inner
    product index can then hold BM25), rows with no token and a slice included."""
    rng = np.random.default_rng(3)
    docs = [rng.integers(0, 60, rng.integers(1, 25)).tolist() for _ in range(300)]
    x = count_tokens(docs, 60)
    idx = ss.create_index("bm25", 60, "ip", k1=1.2, b=0.6)
    idx.add(x)
    q = count_tokens([[1, 2, 2], [7], [3, 40, 41, 42]], 60)
    got = idx.search(q, 10)
    scores = (idx.encode_queries(q).to_scipy() @ idx.encode_documents(x).to_scipy().T).toarray()
    for r in range(3):
        held = got.ids[r] >= 0
        np.testing.assert_allclose(got.scores[r][held], scores[r, got.ids[r][held]], rtol=1e-5)
    some = idx.encode_documents(x[5:9])
    np.testing.assert_allclose(some.to_scipy().toarray(),
                               idx.encode_documents(x).to_scipy()[5:9].toarray(), rtol=1e-6)
    empty = idx.encode_documents(sparse_batch([([], [])], 60, allow_empty_rows=True))
    assert len(empty) == 1 and empty.nnz == 0
    for bad in ([([70], [1.0])], [([1], [np.nan])], [([2], [-1.0])]):  # past dim, NaN, negative
        with pytest.raises(InvalidParameterError):
            idx.encode_documents(bad)
        with pytest.raises(InvalidParameterError):
            idx.encode_queries(bad)
    assert len(idx) == 300  # encoding changes nothing held


def test_a_dictd_dictionary_becomes_passages():
    """dict-gcide's format: an index of (headword, base64 offset, base64 length) into the text;
    headwords sharing an entry give it once; markup out, short paragraphs dropped."""
    from simsearch.datasets import dictd_entries, gcide_passages

    text = ('Weir \\Weir\\, n. [AS. wer.]\n   A dam in a river to stop and raise the water.'
            '\n   [1913 Webster]\n\n   {Weir table}, a table of the flow of water.\n')
    data = b"00-database-info header" + text.encode()
    off = len(b"00-database-info header")

    def b64(v):
        digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
        out = ""
        while True:
            out, v = digits[v % 64] + out, v // 64
            if not v:
                return out

    index = "\n".join([f"00-database-info\tA\t{b64(off)}",
                       f"Weir\t{b64(off)}\t{b64(len(text.encode()))}",
                       f"Wier\t{b64(off)}\t{b64(len(text.encode()))}"])
    entries = dictd_entries(index, data)
    assert [h for h, _ in entries] == ["Weir"]
    assert gcide_passages(entries) == [
        ("Weir", "Weir , n. [AS. wer.] A dam in a river to stop and raise the water."),
        ("Weir", "Weir table, a table of the flow of water.")]


# -- Seismic ----------------------------------------------------------------------------------


def clustered(n, dim=DIM, n_topics=20, terms_per_topic=40, seed=0):
    """Documents drawn from topics (each a set of terms with skewed weights), as learned sparse
    vectors are: Seismic's blocks group documents of a topic."""
    rng = np.random.default_rng(seed)
    topics = [rng.choice(dim, terms_per_topic, replace=False) for _ in range(n_topics)]
    rows = []
    for _ in range(n):
        t = topics[rng.integers(n_topics)]
        terms = np.unique(np.concatenate([rng.choice(t, 15, replace=False),
                                          rng.choice(dim, 5, replace=False)]))
        rows.append((terms, rng.gamma(0.7, 1.0, terms.size).astype(np.float32)))
    return sparse_batch(rows, dim).to_scipy()


def recall(got, want):
    hits = [len(set(g[g >= 0]) & set(w[w >= 0])) / max(1, (w >= 0).sum())
            for g, w in zip(got, want, strict=True)]
    return float(np.mean(hits))


def test_seismic_recall_against_the_exact_scan_and_exact_membership(monkeypatch):
    """Recall@10 against SparseFlatIndex on topic-clustered data, at the defaults and with the
    walk widened; after removes and adds every answer is held, and what was removed never
    comes back. Blocks are built from 500 items on: at the default 4,096 these 4,000 items
    all stayed in the exactly-scanned tail and the walk went untested."""
    monkeypatch.setattr(sparse_flat, "TAIL_MIN", 500)
    x, q = clustered(4000), clustered(60, seed=9)
    exact = ss.SparseFlatIndex(DIM)
    seis = ss.create_index("sparse-seismic", DIM, "ip", n_postings=400)
    exact.add(x)
    seis.add(x)
    want = exact.search(q, K).ids
    assert recall(seis.search(q, K).ids, want) >= 0.9
    assert recall(seis.search(q, K, query_cut=50, heap_factor=1.0).ids, want) >= 0.99
    gone = np.arange(0, 4000, 7)
    for idx in (exact, seis):
        idx.remove(gone)
        idx.add(clustered(600, seed=4), np.arange(10_000, 10_600))
    got = seis.search(q, K)
    assert not np.isin(got.ids, gone).any()
    assert seis.contains(got.ids[got.ids >= 0]).all()
    assert recall(got.ids, exact.search(q, K).ids) >= 0.9
    back = ss.loads(seis.to_bytes())
    np.testing.assert_array_equal(back.search(q, K).ids, got.ids)


def test_seismic_filters_keep_only_allowed_items():
    x, q = clustered(3000), clustered(30, seed=3)
    seis = ss.create_index("sparse-seismic", DIM, "ip", n_postings=400)
    exact = ss.SparseFlatIndex(DIM)
    seis.add(x)
    exact.add(x)
    rng = np.random.default_rng(1)
    for allow in (np.sort(rng.choice(3000, 1500, replace=False)),   # the walk, filtered
                  np.sort(rng.choice(3000, 40, replace=False))):    # the exact scan of them
        got = seis.search(q, K, allow=allow)
        assert np.isin(got.ids[got.ids >= 0], allow).all()
        assert recall(got.ids, exact.search(q, K, allow=allow).ids) >= 0.9
    with pytest.raises(InvalidParameterError, match="heap_factor"):
        seis.search(q, K, heap_factor=0)
