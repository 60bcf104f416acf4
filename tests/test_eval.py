import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simsearch.eval import (
    alternated_best_times,
    markdown_table,
    pareto_frontier,
    recall_at_k,
    timed,
)


def test_recall_counts_ties_by_score():
    base = np.array([[1.0, 0], [1.0, 0], [0.5, 0], [0.1, 0]], np.float32)
    q = np.array([[1.0, 0]], np.float32)
    gt_ids, gt_scores = np.array([[0, 1]]), np.array([[1.0, 1.0]], np.float32)
    swapped = np.array([[1, 0]])
    tie_kw = dict(gt_scores=gt_scores, queries=q, base=base, metric="ip")
    assert recall_at_k(swapped, gt_ids, 2, **tie_kw) == 1.0
    # an item of equal score but another id counts under ties (item 1 for true top-1 item 0)
    assert recall_at_k(np.array([[1, 3]]), np.array([[0, 1]]), 1, **tie_kw) == 1.0
    assert recall_at_k(np.array([[1, 3]]), np.array([[0, 1]]), 1) == 0.0
    # a worse item is a miss; a repeated id counts once; padding never counts
    assert recall_at_k(np.array([[0, 2]]), gt_ids, 2, **tie_kw) == 0.5
    assert recall_at_k(np.array([[0, 0]]), gt_ids, 2, **tie_kw) == 0.5
    assert recall_at_k(np.array([[-1, -1]]), gt_ids, 2, **tie_kw) == 0.0


def test_recall_l2_direction():
    base = np.array([[0.0], [1.0], [2.0]], np.float32)
    q = np.array([[0.1]], np.float32)
    kw = dict(gt_scores=np.array([[0.01, 0.81]], np.float32), queries=q, base=base, metric="l2")
    assert recall_at_k(np.array([[0, 1]]), np.array([[0, 1]]), 2, **kw) == 1.0
    assert recall_at_k(np.array([[0, 2]]), np.array([[0, 1]]), 2, **kw) == 0.5


@given(st.lists(st.tuples(st.floats(0, 1), st.floats(1, 1e6)), min_size=1, max_size=30))
def test_pareto_frontier_is_undominated(points):
    front = pareto_frontier(points)
    for r, q in front:
        assert not any(r2 >= r and q2 > q or r2 > r and q2 >= q for r2, q2 in points)
    for r, q in points:  # every point is dominated by or on the frontier
        assert any(fr >= r and fq >= q for fr, fq in front)


def test_markdown_table():
    t = markdown_table([{"a": 1, "b": 0.91234}, {"a": "x"}], ["a", "b"])
    assert t.splitlines()[0] == "| a | b |"
    assert "0.9123" in t and "| x |  |" in t


def test_value_at_recall_is_log_linear_and_bounded():
    from simsearch.eval import value_at_recall

    pts = [(0.8, 1000.0), (0.95, 10.0), (0.9, 100.0)]
    assert value_at_recall(pts, 0.9) == pytest.approx(100.0)
    assert value_at_recall(pts, 0.85) == pytest.approx(np.sqrt(1000.0 * 100.0))
    assert value_at_recall(pts, 0.99) is None
    assert value_at_recall(pts, 0.5) == 1000.0
    assert value_at_recall(pts, 0.5, below="none") is None


def test_timed_returns_the_output_and_the_best_time():
    calls = []
    out, seconds = timed(lambda: calls.append(1) or len(calls), repeats=3)
    assert out == 3 and len(calls) == 3 and seconds >= 0
    calls.clear()
    out, _ = timed(lambda: calls.append(1) or len(calls), repeats=3, once_above=-1.0)
    assert out == 1 and len(calls) == 1  # a run slower than once_above is not repeated


def test_alternated_best_times_interleaves_the_calls():
    order = []
    best = alternated_best_times([lambda: order.append("a"), lambda: order.append("b")],
                                 rounds=3)
    assert order == ["a", "b"] * 3 and len(best) == 2 and all(t >= 0 for t in best)
