"""Searches overlapping writes (docs/architecture.md, "Concurrency"), for every kind in
tests/support/concurrency.py; each stress runs in a child process so a crash fails the test only."""

from __future__ import annotations

import pytest

from concurrency import ALL, cases, run_child
from simsearch.index import index_kinds


@pytest.mark.parametrize("case_id,metric", cases())
def test_searches_during_writes(case_id, metric):
    rc, report, out = run_child(case_id, metric)
    assert rc == 0, f"the child process died (exit {rc}):\n{out}"
    assert report["errors"] == [], report["errors"]
    assert report["searches"] > 0, "no search ran alongside the writes"
    assert report["bad_ids"] == 0, "a search returned an id that was never added"
    assert report["stale_ids"] == 0, \
        "a search that started after a remove returned gave back the removed id"
    assert report["len"] == report["expected_len"]
    case = ALL[case_id]
    if case.exact:
        assert report["exact_equal"], "after the writes the answers differ from the oracle's"
    else:  # the same recall as an index built from the final data without concurrency
        assert report["recall"] >= min(case.min_recall, report["calm_recall"]) - 0.03, report


def test_every_kind_joins():
    missing = set(index_kinds()) - set(ALL)
    assert not missing, f"kinds missing from tests/support/contract.py (and this suite): {missing}"
