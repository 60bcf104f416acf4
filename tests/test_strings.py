"""CNN-ED string search: kernels against numpy references, the loss against a hand-computed
example, a tiny trained model's ranking, determinism, persistence, and input errors."""

from __future__ import annotations

import numpy as np
import pytest

import simsearch as ss
from deps import requires
from simsearch import errors
from simsearch.strings import (
    Alphabet,
    CGKEncoder,
    CNNEDEncoder,
    InvalidStringError,
    StringIndex,
    UnknownCharacterError,
    brute_force_search,
    edit_distance_matrix,
    hamming_search,
)
from simsearch.strings import _kernels as K

pytestmark = requires("torch", "rapidfuzz")

ACGT = "acgt"


def mutate(s: str, n_edits: int, rng: np.random.Generator) -> str:
    s = list(s)
    for _ in range(n_edits):
        op, i = rng.integers(3), int(rng.integers(len(s)))
        c = ACGT[rng.integers(4)]
        if op == 0:
            s[i] = c
        elif op == 1:
            s.insert(i, c)
        elif len(s) > 2:
            del s[i]
    return "".join(s)


@pytest.fixture(scope="module")
def clustered():
    """60 random centres of length 10-16 over acgt, each with 12 variants at 1-3 edits."""
    rng = np.random.default_rng(7)
    out = set()
    for _ in range(60):
        c = "".join(rng.choice(list(ACGT), int(rng.integers(10, 17))))
        out.add(c)
        out.update(mutate(c, int(rng.integers(1, 4)), rng) for _ in range(12))
    return sorted(out)


@pytest.fixture(scope="module")
def encoder(clustered):
    enc = CNNEDEncoder(alphabet=ACGT, max_len=20, embed_dim=32, seed=1)
    enc.fit(clustered, epochs=12, n_train=500, n_neighbors=20, n_threads=1, progress=False)
    return enc


# -- references -----------------------------------------------------------------------------


def ref_levenshtein(a: str, b: str) -> int:
    prev = np.arange(len(b) + 1)
    for i, ca in enumerate(a, 1):
        cur = np.empty_like(prev)
        cur[0] = i
        for j, cb in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb))
        prev = cur
    return int(prev[-1])


def ref_cgk(codes, lengths, bits):
    n, M = codes.shape
    out = np.zeros((n, bits.shape[0]), np.uint8)
    for r in range(n):
        i = 0
        for j in range(bits.shape[0]):
            if i < lengths[r]:
                out[r, j] = codes[r, i]
                i += int(bits[j, codes[r, i]])
    return out


def test_cgk_kernel_matches_reference():
    rng = np.random.default_rng(0)
    strings = ["".join(rng.choice(list(ACGT), int(rng.integers(0, 12)))) for _ in range(50)]
    codes, lengths = Alphabet(ACGT).encode(strings, 10)
    bits = rng.integers(0, 2, (30, 5), dtype=np.uint8)
    out = np.empty((50, 30), np.uint8)
    K.cgk_embed(codes, lengths, bits, out)
    np.testing.assert_array_equal(out, ref_cgk(codes, lengths, bits))


def test_hamming_kernel_and_search_match_reference():
    rng = np.random.default_rng(1)
    xb = rng.integers(0, 4, (300, 24), dtype=np.uint8)
    xq = rng.integers(0, 4, (7, 24), dtype=np.uint8)
    ref = (xq[:, None, :] != xb[None]).sum(-1)
    out = np.empty((7, 300), np.int32)
    K.hamming_distances(xq, xb, out)
    np.testing.assert_array_equal(out, ref)
    ids, d = hamming_search(xq, xb, 20)
    order = np.lexsort((np.broadcast_to(np.arange(300), ref.shape), ref), axis=1)[:, :20]
    np.testing.assert_array_equal(ids, order)
    np.testing.assert_array_equal(d, np.take_along_axis(ref, order, 1))


def test_cgk_hamming_tracks_edit_distance(clustered):
    cgk = CGKEncoder(max_len=20, seed=3).fit(clustered)
    codes = cgk.encode(clustered)
    assert codes.shape == (len(clustered), 60)
    np.testing.assert_array_equal(codes, CGKEncoder(ACGT, max_len=20, seed=3).encode(clustered))
    # CGK: Hamming <= O(ED^2) w.h.p. and >= ED/2; on this data near pairs stay near on average
    ed = edit_distance_matrix(clustered[:80], clustered)
    hd = (codes[:80, None, :] != codes[None]).sum(-1)
    near, far = (ed > 0) & (ed <= 2), ed >= 8
    assert hd[near].mean() < hd[far].mean()


def test_brute_force_matches_reference():
    rng = np.random.default_rng(2)
    base = ["".join(rng.choice(list(ACGT), int(rng.integers(0, 9)))) for _ in range(60)]
    queries = ["".join(rng.choice(list(ACGT), int(rng.integers(1, 9)))) for _ in range(5)]
    ref = np.array([[ref_levenshtein(q, b) for b in base] for q in queries])
    np.testing.assert_array_equal(edit_distance_matrix(queries, base), ref)
    ids, d = brute_force_search(queries, base, 10)
    np.testing.assert_array_equal(d, np.sort(ref, 1)[:, :10])
    np.testing.assert_array_equal(np.take_along_axis(ref, ids, 1), d)
    ids, d = brute_force_search(queries, base[:3], 5)
    assert (ids[:, 3:] == -1).all() and (d[:, 3:] == np.iinfo(np.int32).max).all()


# -- the loss -------------------------------------------------------------------------------


def test_loss_matches_hand_computed_example():
    import torch

    from simsearch.strings.training import cnned_loss, schedule_weights

    ea = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    ep = torch.tensor([[3.0, 4.0], [1.0, 2.0]])  # |ea-ep| = 5, 1
    en = torch.tensor([[0.0, 6.0], [1.0, 4.0]])  # |ea-en| = 6, 3 ; |ep-en| = sqrt(13), 2
    d_ap = torch.tensor([1.0, 0.5])
    d_an = torch.tensor([3.0, 1.0])
    d_pn = torch.tensor([2.0, 1.0])
    # triplet: relu(5 - 6 + 2) = 1, relu(1 - 3 + 0.5) = 0        -> mean 0.5
    # approx: sqrt(16 + 9 + (sqrt13 - 2)^2), sqrt(0.25 + 4 + 1)  -> mean
    a0 = np.sqrt(16 + 9 + (np.sqrt(13) - 2) ** 2)
    a1 = np.sqrt(0.25 + 4 + 1)
    total, tri, app = cnned_loss(ea, ep, en, d_ap, d_an, d_pn, 2.0, 0.5)
    assert tri.item() == pytest.approx(0.5, abs=1e-6)
    assert app.item() == pytest.approx((a0 + a1) / 2, abs=1e-5)
    assert total.item() == pytest.approx(2.0 * 0.5 + 0.5 * (a0 + a1) / 2, abs=1e-5)
    assert schedule_weights(0, 10) == (1.0, 10.0)
    assert schedule_weights(9, 10) == (1.0, 0.01)

    # relative: |e - d| / d over the three pairs of both triplets
    e = np.array([[5, 6, np.sqrt(13)], [1, 3, 2]])
    d = np.array([[1, 3, 2], [0.5, 1, 1]])
    _, tri, rel = cnned_loss(ea, ep, en, d_ap, d_an, d_pn, 1.0, 1.0, "relative")
    assert tri.item() == pytest.approx(0.5, abs=1e-6)
    # (4 + 1 + 0.8028) / 3 and (1 + 2 + 1) / 3
    assert rel.item() == pytest.approx((np.abs(e - d) / d).mean(), abs=1e-5)
    assert rel.item() == pytest.approx(((4 + 1 + (np.sqrt(13) - 2) / 2) + 4) / 6, abs=1e-5)
    # log: |log(e + 0.05) - log(d + 0.05)|
    _, _, lg = cnned_loss(ea, ep, en, d_ap, d_an, d_pn, 1.0, 1.0, "log")
    assert lg.item() == pytest.approx(np.abs(np.log((e + 0.05) / (d + 0.05))).mean(), abs=1e-5)
    # log(5.05/1.05) + log(6.05/3.05) + log(3.6556/2.05) + log(1.05/.55) + log(3.05/1.05)
    # + log(2.05/1.05) = 1.5707 + 0.6849 + 0.5784 + 0.6466 + 1.0664 + 0.6690, / 6
    assert lg.item() == pytest.approx(0.8693, abs=1e-4)
    with pytest.raises(ValueError, match="approx_form"):
        cnned_loss(ea, ep, en, d_ap, d_an, d_pn, 1.0, 1.0, "l1")


def test_triplets_come_from_the_nearest_2k(clustered):
    from simsearch.strings.training import nearest_neighbours, sample_triplets

    strings = clustered[:200]
    nb = nearest_neighbours(strings, 10, workers=1, progress=False)
    ed = edit_distance_matrix(strings, strings)
    off = ~np.eye(200, dtype=bool)
    assert nb.mean_distance == pytest.approx(ed[off].mean())
    kth = np.sort(np.where(off, ed, 10**6), 1)[:, 9]
    np.testing.assert_array_equal(nb.dists[:, -1], kth)
    a, p, n, dap, dan = sample_triplets(nb, np.arange(200), np.random.default_rng(0))
    assert (p != n).all() and (dap <= dan).all() and (a != p).all()
    np.testing.assert_array_equal(dap, ed[a, p])
    assert (ed[a, n] <= kth).all()
    # far negatives: a random string of the pool (distance left to the caller, -1)
    a, p, n, dap, dan = sample_triplets(nb, np.arange(200), np.random.default_rng(0), 0.5, 200)
    far = dan < 0
    assert 70 <= far.sum() <= 130 and (n != a).all() and (a != p).all()
    np.testing.assert_array_equal(dap, ed[a, p])
    np.testing.assert_array_equal(dan[~far], ed[a, n][~far])
    assert (ed[a, p] <= kth).all() and (ed[a[far], n[far]] > kth[far]).mean() > 0.8


def ref_bigram_profile(codes, lengths, stride, n_buckets):
    out = np.zeros((codes.shape[0], n_buckets), np.float32)
    for r in range(codes.shape[0]):
        for i in range(int(lengths[r]) - 1):
            out[r, (int(codes[r, i]) * stride + int(codes[r, i + 1])) % n_buckets] += 1
    return out


def test_bigram_kernel_matches_reference():
    rng = np.random.default_rng(0)
    strings = ["".join(rng.choice(list(ACGT), int(rng.integers(0, 12)))) for _ in range(50)]
    codes, lengths = Alphabet(ACGT).encode(strings, 10)
    for n_buckets in (7, 25):
        out = np.zeros((50, n_buckets), np.float32)
        K.bigram_profile(codes, lengths, 5, n_buckets, out)
        np.testing.assert_array_equal(out, ref_bigram_profile(codes, lengths, 5, n_buckets))


def test_profile_features_match_counts():
    """sqrt of letter and letter-pair counts of the (truncated) strings; the pad code's
    entries stay 0; and the initial profile projection puts random pairs at mean distance 1."""
    import torch

    from simsearch.strings.model import CNNEDNet

    strings = ["acca", "g", "", "ttttttttttttt", "acgtacgt"]
    codes, _ = Alphabet(ACGT).encode(strings, 8)
    net = CNNEDNet(4, 8, 6, 3, 4, 0, profile=True)
    f = net.profile_features(codes).numpy()
    ref = np.zeros((5, 5 + 25))
    for r, s in enumerate(strings):
        c = [ACGT.index(ch) + 1 for ch in s[:8]]
        for a in c:
            ref[r, a] += 1
        for a, b in zip(c[:-1], c[1:], strict=True):
            ref[r, 5 + a * 5 + b] += 1
    np.testing.assert_allclose(f, np.sqrt(ref), atol=1e-6)
    assert ref[3, 4] == 8 and ref[3, 5 + 4 * 5 + 4] == 7  # truncated to 8
    feats = torch.from_numpy(np.sqrt(ref).astype(np.float32))
    net.init_profile(feats, 0)
    x = net(*net.inputs(codes)).detach().numpy()
    np.testing.assert_allclose(x, np.sqrt(ref) @ net.prof.weight.detach().numpy().T, atol=1e-5)
    g = torch.Generator().manual_seed(0)
    torch.randn(net.prof.weight.shape, generator=g)  # the projection drawn first
    perm = torch.randperm(5, generator=g).numpy()
    dist = np.linalg.norm(x - x[perm], axis=1)[perm != np.arange(5)]
    assert dist.mean() == pytest.approx(1.0, abs=1e-5)


def test_pool_neighbours_match_exact_lists(clustered):
    """With every string a candidate, the pool lists are the exact nearest 2K; with fewer
    candidates they are still true distances, ascending."""
    from simsearch.strings.training import pool_neighbours

    strings = clustered[:300]
    codes, lengths = Alphabet(ACGT).encode(strings, 20)
    anchors = np.arange(0, 300, 7)
    ed = edit_distance_matrix(strings, strings).astype(np.int64)
    ed[np.arange(300), np.arange(300)] = 10**6
    kth = np.sort(ed[anchors], 1)[:, 9]
    for n_candidates in (None, 299):
        nb = pool_neighbours(strings, codes, lengths, 4, anchors, 10, n_candidates,
                             progress=False)
        np.testing.assert_array_equal(nb.anchors, anchors)
        np.testing.assert_array_equal(nb.dists[:, -1], kth)
        np.testing.assert_array_equal(nb.dists, np.take_along_axis(ed[anchors], nb.ids, 1))
    off = ed < 10**6
    assert nb.mean_distance == pytest.approx(ed[off].mean(), rel=0.05)
    few = pool_neighbours(strings, codes, lengths, 4, anchors, 10, 30, progress=False)
    np.testing.assert_array_equal(few.dists, np.take_along_axis(ed[anchors], few.ids, 1))
    assert (np.diff(few.dists, axis=1) >= 0).all() and (few.dists[:, -1] >= kth).all()
    assert (few.ids != anchors[:, None]).all()


# -- the trained encoder --------------------------------------------------------------------


def test_tiny_model_ranks_near_before_far(encoder, clustered):
    x = encoder.encode(clustered)
    assert x.dtype == np.float32 and x.shape == (len(clustered), 32)
    ed = edit_distance_matrix(clustered, clustered)
    emb = np.sqrt(((x[:, None, :] - x[None]) ** 2).sum(-1))
    near, far = (ed >= 1) & (ed <= 2), ed >= 6
    # every anchor's near strings against its far ones: fraction of correctly ordered pairs
    ok = [(emb[i, near[i]][:, None] < emb[i, far[i]][None]).mean()
          for i in range(0, len(clustered), 5) if near[i].any() and far[i].any()]
    assert np.mean(ok) >= 0.95  # observed 0.9996
    assert encoder.report.epochs_run == 12


def test_string_index_recall_against_brute_force(encoder, clustered):
    rng = np.random.default_rng(5)
    queries = [mutate(clustered[i], 1, rng) for i in rng.choice(len(clustered), 40)]
    idx = StringIndex(encoder=encoder, index="hnsw", M=8, ef_construction=64)
    ids = idx.add(clustered)
    np.testing.assert_array_equal(ids, np.arange(len(clustered)))
    gt_ids, gt_d = brute_force_search(queries, clustered, 10)
    res = idx.search(queries, 10, n_candidates=50)
    assert (res.scores >= gt_d).all()
    hits = (res.scores <= gt_d[:, 9:10]).sum(1) / 10  # ties: anything within the k-th
    assert hits.mean() >= 0.92  # observed 0.95
    exact = idx.search(queries, 10, n_candidates=len(clustered))
    np.testing.assert_array_equal(exact.scores, gt_d)
    # the re-ranking's cutoffs change nothing: plain distances of the same candidates
    cand = idx._vectors.search(encoder.encode(queries), 300, ef=300).ids
    res = idx.search(queries, 10, n_candidates=300)
    for r, c in enumerate(cand):
        d = edit_distance_matrix(queries[r : r + 1], [clustered[i] for i in c])[0]
        order = np.lexsort((c, d))[:10]
        np.testing.assert_array_equal(res.ids[r], c[order])
        np.testing.assert_array_equal(res.scores[r], d[order])
    flat = StringIndex(encoder=encoder, index="flat")
    flat.add(clustered)
    np.testing.assert_array_equal(flat.search(queries, 10, n_candidates=len(clustered)).ids,
                                  gt_ids)


def test_fit_and_encode_are_deterministic(encoder, clustered):
    again = CNNEDEncoder(alphabet=ACGT, max_len=20, embed_dim=32, seed=1)
    again.fit(clustered, epochs=12, n_train=500, n_neighbors=20, n_threads=1, progress=False)
    a = encoder.encode(clustered)
    np.testing.assert_array_equal(a, encoder.encode(clustered))
    np.testing.assert_array_equal(a, again.encode(clustered))
    # another batch size changes the GEMM blocking, hence the last bits only
    np.testing.assert_allclose(a[:7], encoder.encode(clustered[:7], batch_size=3), atol=1e-5)


def test_early_stopping_keeps_within_budget(clustered):
    enc = CNNEDEncoder(alphabet=ACGT, max_len=20, embed_dim=16, seed=2)
    enc.fit(clustered, epochs=200, n_train=300, n_neighbors=20, early_stopping=2, n_threads=1,
            progress=False)
    assert enc.report.stopped_early and enc.report.epochs_run < 200
    assert all("val_triplet" in h for h in enc.report.history)


def test_save_load_identical(encoder, clustered, tmp_path):
    encoder.save(tmp_path / "enc")
    back = CNNEDEncoder.load(tmp_path / "enc")
    np.testing.assert_array_equal(back.encode(clustered), encoder.encode(clustered))
    assert back.alphabet == encoder.alphabet and back.mean_distance == encoder.mean_distance

    idx = StringIndex(encoder=encoder, index="hnsw", M=8)
    idx.add(clustered[:300])
    idx.add(clustered[300:], ids=np.arange(1000, 1000 + len(clustered) - 300))
    idx.save(tmp_path / "idx")
    again = StringIndex.load(tmp_path / "idx")
    q = clustered[::17]
    a, b = idx.search(q, 5, n_candidates=30), again.search(q, 5, n_candidates=30)
    np.testing.assert_array_equal(a.ids, b.ids)
    np.testing.assert_array_equal(a.scores, b.scores)
    assert len(again) == len(clustered) and again.get_strings([1000]) == [clustered[300]]

    raw = bytearray((tmp_path / "idx").read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (tmp_path / "bad").write_bytes(bytes(raw))
    with pytest.raises(errors.CorruptIndexError):
        StringIndex.load(tmp_path / "bad")
    (tmp_path / "short").write_bytes(bytes(raw[:100]))
    with pytest.raises(errors.CorruptIndexError):
        CNNEDEncoder.load(tmp_path / "short")
    with pytest.raises(errors.CorruptIndexError):
        StringIndex.load(tmp_path / "enc")  # an encoder file is not an index


# -- errors ---------------------------------------------------------------------------------


def test_bad_input_gives_typed_errors(encoder, clustered):
    with pytest.raises(errors.InvalidParameterError, match="empty"):
        encoder.encode([])
    with pytest.raises(InvalidStringError, match="item 1 is int"):
        encoder.encode(["acg", 5])
    with pytest.raises(InvalidStringError, match="single str"):
        encoder.encode("acgt")
    with pytest.raises(UnknownCharacterError, match="'x'"):
        encoder.encode(["acg", "axc"])
    assert issubclass(InvalidStringError, TypeError)
    assert issubclass(UnknownCharacterError, ValueError)
    with pytest.raises(errors.NotTrainedError):
        CNNEDEncoder(max_len=8).encode(["a"])
    with pytest.raises(errors.NotTrainedError):
        StringIndex(encoder=CNNEDEncoder(max_len=8))
    with pytest.raises(errors.InvalidParameterError, match="max_len"):
        CNNEDEncoder(max_len=0)
    with pytest.raises(errors.InvalidParameterError, match="3 distinct"):
        CNNEDEncoder(max_len=8).fit(["a", "a", "b"])
    idx = StringIndex(encoder=encoder, index="flat")
    assert idx.add([]).size == 0
    with pytest.raises(UnknownCharacterError):
        idx.add(["acgt", "ACGT"])
    assert len(idx) == 0  # the whole batch is checked first
    res = idx.search(["acg"], 3)  # empty index: padding, no error
    assert (res.ids == -1).all()
    idx.add(clustered[:20])
    with pytest.raises(errors.InvalidParameterError, match="k must"):
        idx.search(["acg"], 0)
    with pytest.raises(errors.InvalidParameterError, match="n_candidates"):
        idx.search(["acg"], 3, n_candidates=0)
    with pytest.raises(InvalidStringError):
        idx.search([b"acg"], 3)
    with pytest.raises(errors.DuplicateIdError):
        idx.add(["acg"], ids=[0])


def test_deep_layout_for_long_strings(clustered, tmp_path):
    from simsearch.strings.model import default_n_layers

    assert default_n_layers(32) == 1 and default_n_layers(512) == 5
    long = [s * 5 for s in clustered[:200]]  # lengths 50-80: max_len 128 -> 3 layers, deep
    enc = CNNEDEncoder(alphabet=ACGT, max_len=128, embed_dim=16, seed=0)
    assert enc.n_layers == 3
    enc.fit(long, epochs=2, n_train=100, n_neighbors=10, n_threads=1, progress=False)
    assert not enc._net.per_char
    x = enc.encode(long)
    assert x.shape == (200, 16) and np.isfinite(x).all()
    assert enc.profile and enc._net.prof is not None  # deep stacks: the profile path by default
    enc.save(tmp_path / "deep")
    np.testing.assert_array_equal(CNNEDEncoder.load(tmp_path / "deep").encode(long), x)
    with pytest.raises(errors.InvalidParameterError, match="approx_form"):
        enc.fit(long, approx_form="l1")


def test_concurrent_sessions_leave_torch_settings_as_they_found_them():
    import threading

    import torch

    from simsearch.strings import model as M

    before = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled())
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()

    def a():  # enters first, leaves while the main thread's session is still open
        with M.torch_session(1):
            a_in.set()
            b_in.wait(10)
        a_out.set()

    t = threading.Thread(target=a)
    t.start()
    a_in.wait(10)
    with M.torch_session(1):
        b_in.set()
        a_out.wait(10)
        assert torch.are_deterministic_algorithms_enabled()  # A's exit did not undo ours
        assert torch.get_num_threads() == 1
    t.join(10)
    assert (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()) == before


def test_string_search_during_removes_never_fails(encoder, clustered):
    import threading

    idx = StringIndex(encoder=encoder, index="flat")
    idx.add(clustered)
    queries = clustered[:8]
    failures, stop = [], threading.Event()

    def reader():
        while not stop.is_set():
            try:
                r = idx.search(queries, 5, n_candidates=len(clustered))
                assert (r.ids >= -1).all()
            except Exception as exc:  # a KeyError here was the defect
                failures.append(exc)
                return

    ts = [threading.Thread(target=reader) for _ in range(2)]
    for t in ts:
        t.start()
    for i in range(0, len(clustered) - 10, 10):
        idx.remove(np.arange(i, i + 10))
    stop.set()
    for t in ts:
        t.join(30)
    assert failures == []
    with pytest.raises(errors.UnknownIdError):
        idx.get_strings([0])


def test_a_string_index_file_of_the_old_form_loads(encoder, clustered, tmp_path):
    """Files written before StringIndex was an ordinary kind (class "string-index": ids in
    insertion order, no id set; "string-collection": an untrained node collection) load as
    the same index: a node's string snapshots survive the upgrade. Before the converter,
    load() raised CorruptIndexError "unknown kind 'string-index'"."""
    from simsearch.fileformat import write_index_file

    idx = StringIndex(encoder=encoder, index="flat")
    ids = np.arange(len(clustered))[::-1] * 3  # insertion order is not id order
    idx.add(clustered, ids)
    enc_header, enc_arrays = encoder._state()
    blobs = [s.encode() for s in clustered]
    offsets = np.zeros(len(blobs) + 1, np.int64)
    np.cumsum([len(b) for b in blobs], out=offsets[1:])
    inner = ss.create_index("flat", encoder.dim, "l2")
    inner.add(encoder.encode(clustered), ids)
    arrays = {f"encoder/{k}": v for k, v in enc_arrays.items()}
    arrays.update(ids=ids.astype(np.int64), offsets=offsets,
                  text=np.frombuffer(b"".join(blobs), np.uint8),
                  vectors=np.frombuffer(inner.to_bytes(), np.uint8))
    write_index_file(tmp_path / "old.idx", {
        "class": "string-index", "metric": "edit", "dim": encoder.dim, "count": len(ids),
        "params": {"index": "flat"}, "meta": {"encoder": enc_header}}, arrays)
    back = ss.load(tmp_path / "old.idx")
    assert isinstance(back, StringIndex) and len(back) == len(clustered)
    q = clustered[:5]
    a, b = idx.search(q, 5), back.search(q, 5)
    np.testing.assert_array_equal(a.ids, b.ids)
    np.testing.assert_array_equal(a.scores, b.scores)
    assert back.get_strings(ids[:3]) == clustered[:3]
    assert back.add(["acgt"]).tolist() == [int(ids.max()) + 1]
    write_index_file(tmp_path / "untrained.idx", {"class": "string-collection", "params": {
        "index": "hnsw", "encoder": {"max_len": 8}, "M": 8}}, {})
    u = ss.load(tmp_path / "untrained.idx")
    assert isinstance(u, StringIndex) and not u.is_trained and u.index_params == {"M": 8}


def test_string_files_whose_parts_disagree_are_refused(encoder, clustered):
    """The defect: a string index file whose embeddings came from an index of another
    dimension than its encoder's, or whose string offsets were moved, loaded, then failed every
    search (the first) or served strings cut from other items' bytes (the second). Each file
    here is re-sealed with a valid checksum: only the consistency checks can refuse it."""
    from simsearch.fileformat import read_index_bytes, write_index_bytes

    idx = StringIndex(encoder=encoder, index="flat")
    idx.add(clustered[:50])
    header, arrays = read_index_bytes(bytearray(idx.to_bytes()))
    other = ss.FlatIndex(encoder.embed_dim + 1, "l2")
    other.add(np.ones((50, encoder.embed_dim + 1), np.float32))
    off = arrays["offsets"].copy()
    off[10] = off[12]  # a string's bytes taken from its neighbour's
    for bad in ({"vectors": np.frombuffer(other.to_bytes(), np.uint8)}, {"offsets": off},
                {"offsets": arrays["offsets"] + 1}):
        with pytest.raises(errors.CorruptIndexError):
            ss.loads(write_index_bytes(header, {**arrays, **bad}))
    assert ss.loads(write_index_bytes(header, arrays)).get_strings([10]) == [clustered[10]]
