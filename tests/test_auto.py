"""auto_index: measures its candidates, reaches the target on held-out queries, explains itself."""

from __future__ import annotations

import re

import numpy as np
import pytest

import simsearch as ss
from simsearch.datasets import synthetic_longtail
from simsearch.errors import CorruptIndexError, InvalidParameterError


def finalists(report: str) -> dict[str, float]:
    """us/query of each finalist timed on all the items, from the report's lines."""
    found = re.findall(r"^on all \d+ items: (\S+) tuned to .*, ([0-9.]+) us/query$", report, re.M)
    return {name: float(us) for name, us in found}


@pytest.fixture(scope="module")
def longtail():
    return synthetic_longtail(n=8000, dim=24, n_queries=100, n_clusters=40, seed=5)


def test_reaches_the_target_and_reports(longtail, tmp_path):
    base, queries = longtail
    idx = ss.auto_index(base, "ip", target_recall=0.9, queries=queries[:50], progress=False,
                        candidates=("flat", "norm-scan", "hnsw", "nr-lsh"), sample_size=4000)
    # the choice follows its own measurements: the finalist with the lowest cost at full size
    costs = finalists(idx.report)
    assert len(costs) >= 2 and idx.chosen == min(costs, key=costs.get), idx.report
    assert f"chose {idx.chosen}" in idx.report and "| candidate |" in idx.report
    flat = ss.FlatIndex(24, "ip")
    flat.add(base)
    held_out = queries[50:]  # queries the choice never saw
    got, truth = idx.search(held_out, 10).ids, flat.search(held_out, 10).ids
    rec = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, truth, strict=True)])
    assert rec >= 0.9 - 0.005, idx.report  # the promise, on queries it never saw
    idx.save(tmp_path / "auto.idx")
    back = ss.load(tmp_path / "auto.idx")
    assert back.chosen == idx.chosen and back.report == idx.report
    np.testing.assert_array_equal(back.search(held_out, 10).ids, got)
    knob = ss.auto.CANDIDATES[idx.chosen].knob  # the tuned knob, as the report states it
    assert knob is None or (knob in idx.tuned_params and f"{knob}=" in idx.report)
    assert back.tuned_params == idx.tuned_params


def test_memory_budget_and_bad_settings(longtail):
    base, _ = longtail
    small = ss.auto_index(base, "ip", memory_budget=base.nbytes + 8000 * 8, progress=False,
                          candidates=("hnsw", "norm-scan"), sample_size=3000)
    assert small.chosen == "norm-scan" and "skipped: needs" in small.report
    with pytest.raises(InvalidParameterError, match="candidates"):
        ss.create_index("auto", 8, "ip", candidates=("nope",))
    with pytest.raises(InvalidParameterError, match="target_recall"):
        ss.create_index("auto", 8, "ip", target_recall=1.5)
    for bad in (0.3, 1.0, True, "high"):
        with pytest.raises(InvalidParameterError, match="confidence"):
            ss.create_index("auto", 8, "ip", confidence=bad)


def test_a_lower_confidence_tunes_a_smaller_knob(longtail):
    """The promise's confidence is the knob's margin: a less sure bound accepts a smaller scan
    budget, and the report names the confidence (seen failing with the confidence not passed
    to the tuning: both budgets equal)."""
    base, queries = longtail
    got = {}
    for conf in (0.99, 0.6):
        idx = ss.auto_index(base, "ip", target_recall=0.9, queries=queries[:50],
                            progress=False, candidates=("norm-scan",), confidence=conf)
        got[conf] = idx.tuned_params["max_items"]
        assert f"{conf:.0%} prediction bound" in idx.report
    assert got[0.6] < got[0.99], got


def test_a_scan_budget_grows_with_the_index(longtail):
    base, queries = longtail
    idx = ss.auto_index(base[:2000], "ip", target_recall=0.9, queries=queries[:50],
                        progress=False, candidates=("norm-scan",))
    idx.add(base[2000:])  # four times the items the budget was tuned on
    flat = ss.FlatIndex(24, "ip")
    flat.add(base)
    got, truth = idx.search(queries[50:], 10).ids, flat.search(queries[50:], 10).ids
    rec = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, truth, strict=True)])
    assert rec >= 0.9 - 0.005, (rec, idx.report)


def test_the_partition_and_quantization_candidate(longtail, tmp_path):
    """NEQ (PQ, inverted lists ranked by their largest norm, exact re-ranking) as a candidate:
    trained, tuned on n_probe with its fixed re-rank, and it reaches the target held out."""
    base, queries = longtail
    idx = ss.auto_index(base, "ip", target_recall=0.9, queries=queries[:50], progress=False,
                        candidates=("neq",), sample_size=4000)
    assert re.search(r"neq tuned to n_probe=\d+", idx.report), idx.report
    flat = ss.FlatIndex(24, "ip")
    flat.add(base)
    got, truth = idx.search(queries[50:], 10).ids, flat.search(queries[50:], 10).ids
    rec = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, truth, strict=True)])
    assert rec >= 0.9 - 0.005, (rec, idx.report)
    idx.save(tmp_path / "auto.idx")
    np.testing.assert_array_equal(ss.load(tmp_path / "auto.idx").search(queries[50:], 10).ids,
                                  got)


def test_the_bound_holds_for_the_next_queries():
    """The promise is about the next 1,000 queries: over 4,000 seeded trials (200 tuning
    queries, 1,000 new ones, per-query recalls from one skewed distribution whose mean sits at
    the tuning knob), the new queries' mean falls below the bound in at most 2.5% of them
    (observed 1.9%: the left-skewed recalls make the normal bound a little optimistic). Seen
    failing with the earlier bound on the sample's own mean (mean - 1.645 sigma / sqrt(n)):
    8.7% of trials fell below it, the shortfall measured on ml100k-svd held out."""
    from simsearch.auto import prediction_bound

    rng = np.random.default_rng(0)
    levels = np.linspace(0.0, 1.0, 11)
    p = np.exp(8 * levels)
    p /= p.sum()  # mean 0.92, sigma 0.12, like the per-query recalls measured
    misses = 0
    trials = 4000
    for _ in range(trials):
        tune, new = rng.choice(levels, 200, p=p), rng.choice(levels, 1000, p=p)
        misses += new.mean() < prediction_bound(tune)
    assert misses / trials <= 0.025, misses / trials


def test_the_compiled_candidates(longtail):
    """NEQ 4-bit fast-scan and ip-NSW+ on 8-bit codes as candidates: named in the report and
    by ``chosen``, the promise's margin stated, the target reached held out."""
    base, queries = longtail
    flat = ss.FlatIndex(24, "ip")
    flat.add(base)
    truth = flat.search(queries[50:], 10).ids
    for name in ("neq-fast-scan", "ipnsw-plus-sq8"):
        idx = ss.auto_index(base, "ip", target_recall=0.9, queries=queries[:50], progress=False,
                            candidates=(name,), sample_size=4000)
        assert idx.chosen == name and f"chose {name}" in idx.report
        assert "99% prediction bound" in idx.report and "the promise costs" in idx.report
        got = idx.search(queries[50:], 10).ids
        rec = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, truth, strict=True)])
        assert rec >= 0.9, (name, rec, idx.report)


def test_the_fastest_variant_of_a_fixed_parameter_is_kept(longtail, monkeypatch):
    """NEQ's re-rank depth is tried at 20, 50, 100 and 200 on all the items, each with n_probe
    tuned to the target, and the fastest of those reaching it is kept (its recall held out).
    Defect: the re-rank stayed at 100 whatever the data: on fi-300 auto ran at 0.88x NEQ's best
    setting at equal recall, which re-ranked 50 (seen failing: no variant was ever timed)."""
    import simsearch.auto as auto

    timed = []
    real = auto._alternated_seconds

    def slowest_first(built, q, k):  # make the last one tried the fastest, whatever it is
        timed.append([dict(params) for _, params in built])
        return [float(len(built) - i) for i in range(len(built))]

    monkeypatch.setattr(auto, "_alternated_seconds", slowest_first)
    base, queries = longtail
    idx = ss.auto_index(base, "ip", target_recall=0.9, queries=queries[:50], progress=False,
                        candidates=("neq-fast-scan",), sample_size=4000)
    monkeypatch.setattr(auto, "_alternated_seconds", real)
    assert len(timed) == 1 and len(timed[0]) >= 2, (timed, idx.report)
    assert {p["rerank"] for p in timed[0]} <= {20, 50, 100, 200}
    assert idx.tuned_params == timed[0][-1], (idx.tuned_params, timed)
    assert f"with rerank={timed[0][-1]['rerank']}" in idx.report
    flat = ss.FlatIndex(24, "ip")
    flat.add(base)
    got, truth = idx.search(queries[50:], 10).ids, flat.search(queries[50:], 10).ids
    rec = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, truth, strict=True)])
    assert rec >= 0.9 - 0.005, (rec, idx.report)


@pytest.fixture(scope="module")
def longtail_200k():
    return synthetic_longtail(n=200_000, dim=64, n_queries=400, n_clusters=1000, seed=3)


@pytest.mark.parametrize("name", ["norm-ivf", "neq-fast-scan"])
def test_filtered_recall_keeps_the_target(name, longtail_200k, tmp_path):
    """Under random allow lists of 50%, 10% and 1% selectivity the chosen index keeps the
    target on queries it never saw. The defect: the knob was tuned without a filter and the
    planner's widening by 1/selectivity fell short at 10% (recall@10 0.80 for norm-ivf and 0.81
    for NEQ here, with the calibration taken out; norm-ivf's lists unwidened: 0.64 on
    synthetic-longtail 200k in bench/filters/auto_filters.py). The calibration is saved."""
    base, queries = longtail_200k
    idx = ss.auto_index(base, "ip", target_recall=0.9, queries=queries[:200], progress=False,
                        candidates=(name,), sample_size=20000)
    assert "under random allow lists of 10%" in idx.report
    good = idx._filter_boosts
    idx._filter_boosts = [(0.5, 0.0)]  # a boost of 0 would search with ef / n_probe 0
    with pytest.raises(CorruptIndexError, match="filter boosts"):
        ss.loads(idx.to_bytes())
    idx._filter_boosts = good
    idx.save(tmp_path / "auto.idx")
    idx = ss.load(tmp_path / "auto.idx")
    held_out = queries[200:]
    flat = ss.FlatIndex(64, "ip")
    flat.add(base)
    rng = np.random.default_rng(11)
    for s in (0.5, 0.1, 0.01):
        allow = np.flatnonzero(rng.random(len(base)) < s)
        got = idx.search(held_out, 10, allow=allow).ids
        truth = flat.search(held_out, 10, allow=allow).ids
        rec = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, truth, strict=True)])
        assert rec >= 0.9 - 0.005, (name, s, rec, idx.report)
