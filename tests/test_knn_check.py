"""tests/support/knn_check.py itself: it must reject what it exists to catch (a tie-aware check that
passes everything would make the kernel tests that use it unable to fail)."""

from __future__ import annotations

import numpy as np
import pytest

from knn_check import assert_knn_equal

REF_IDS = np.array([[7, 3, 5, 9, 1]])
REF_SCORES = np.array([[9.0, 8.0, 8.0, 7.0, 6.0]], np.float32)


def test_tied_ids_in_any_order_pass():
    assert_knn_equal([[7, 5, 3, 9, 1]], REF_SCORES, REF_IDS, REF_SCORES)


def test_the_last_run_cut_by_k_may_hold_other_members():
    scores = np.array([[9.0, 8.0, 8.0, 7.0, 7.0]], np.float32)
    assert_knn_equal([[7, 3, 5, 9, 4]], scores, [[7, 3, 5, 9, 2]], scores)


@pytest.mark.parametrize("ids,scores", [
    ([[7, 3, 5, 2, 1]], REF_SCORES),  # another id at an untied rank
    ([[3, 7, 5, 9, 1]], REF_SCORES),  # ids swapped across different scores
    ([[7, 3, 4, 9, 1]], REF_SCORES),  # a tie holding another member inside the top k
    (REF_IDS, REF_SCORES + np.float32(0.01)),  # scores off
    ([[7, 3, 5, 9, -1]], REF_SCORES),  # padding where the reference has an item
])
def test_a_different_answer_fails(ids, scores):
    with pytest.raises(AssertionError):
        assert_knn_equal(ids, scores, REF_IDS, REF_SCORES)
