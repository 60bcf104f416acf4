"""Tie-aware equality of top-k results (as faiss's check_ref_knn_with_draws): two results are the
same when their scores agree within float tolerance and, within each run of tied scores, they
hold the same ids; only the last run, cut by k, may hold different members of the tie."""

from __future__ import annotations

import numpy as np


def assert_knn_equal(ids, scores, ref_ids, ref_scores, rtol: float = 1e-5, atol: float = 1e-5):
    ids, ref_ids = np.asarray(ids), np.asarray(ref_ids)
    scores, ref_scores = np.asarray(scores), np.asarray(ref_scores)
    assert ids.shape == ref_ids.shape, (ids.shape, ref_ids.shape)
    np.testing.assert_allclose(scores, ref_scores, rtol=rtol, atol=atol)
    k = ids.shape[1]
    for r in range(ids.shape[0]):
        rs = ref_scores[r]
        assert ((ids[r] < 0) == (ref_ids[r] < 0)).all(), f"row {r}: padding differs"
        start = 0
        for j in range(1, k + 1):
            if j < k and np.isfinite(rs[j]) and abs(rs[j] - rs[j - 1]) <= atol + rtol * abs(rs[j]):
                continue  # still the same run of tied scores
            if j < k:  # a run cut inside the top k: the same members
                got, want = set(ids[r, start:j].tolist()), set(ref_ids[r, start:j].tolist())
                assert got == want, f"row {r}, ranks {start}..{j - 1}: {got} != {want}"
            start = j
