"""The automatic index choice: measure the candidates on the data, keep the cheapest that reaches
the target recall (docs/architecture.md, "Choosing for the data").

    idx = simsearch.auto_index(x, metric="ip", target_recall=0.9)
    idx.search(q, 10)            # with the tuned search parameter as its default
    print(idx.report)            # what was measured, and why the winner won

Nothing is guessed from the data's shape alone: each candidate that fits the memory budget is
built on a sample, its search knob is tuned to the target on sample queries (the caller's, or
items held out), its cost per query is measured, and the cost is scaled to the full size by how
the method grows (a scan with the item count, inverted lists with its square root, a graph with its
logarithm). A sample's estimate can mislead, so every candidate estimated within 4x of the
cheapest (up to three), and the best of each kind of method (a scan, inverted lists, a graph)
within 16x, is built on all the data, its knob tuned again there against the exact answers of the
held-out queries (NEQ's also at each of four re-rank depths, the fastest kept), and timed; the
measured cost decides (data no larger than the sample was measured whole: its cheapest
estimate decides). Candidates: flat,
norm-scan, norm-ivf, HNSW, ip-NSW+, NR-LSH, NEQ (docs/benchmarks.md, "auto_index against the
hand-tuned peers").
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np

from .capabilities import Capabilities
from .errors import InvalidParameterError
from .filters import IdFilter
from .index import Index, SearchResult, as_matrix, create_index, loads, register
from .planner import allowed_ids

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    kind: str
    build: dict | Callable[[int, int], dict]  # or a function of (dim, n)
    knob: str | None  # the search parameter tuned to the target (None: exact)
    grid: tuple  # knob values tried, cheapest first; "frac:" values scale with the item count
    growth: str  # "linear" (a scan), "sqrt" (inverted lists) or "log" (a graph): cost growth
    metrics: tuple[str, ...] = ("ip", "cosine", "l2")
    bytes_per_item: float = 0.0  # on top of the raw vector
    fixed: dict = field(default_factory=dict)  # search parameters always passed
    # other values of the fixed parameters tried on all the items: each tuned to the target and
    # timed beside ``fixed``, the fastest kept (NEQ's best re-rank depth: 20-200 by data set)
    variants: tuple[dict, ...] = ()

    def make(self, dim: int, metric: str, x: np.ndarray) -> Index:
        """Built (trained first where it must be) and filled with ``x``."""
        build = self.build(dim, x.shape[0]) if callable(self.build) else self.build
        idx = create_index(self.kind, dim, metric, **build)
        if idx.capabilities.needs_training:
            idx.train(x)
        return idx


def _neq_build(dim: int, n: int) -> dict:
    """NEQ over PQ with inverted lists (sqrt(n) lists, norm-aware list ranking) and exact
    re-ranking: a partition + quantized-score method, as ScaNN is (docs/bench/quant.md)."""
    return {"base": "pq", "n_codebooks": max(2, dim // 4),
            "nbits": int(min(8, max(4, math.log2(max(n, 2) / 39)))),  # ~39 points per centroid
            "n_lists": max(1, int(math.sqrt(n))), "keep_vectors": True, "progress": False}


def _neq_fast_build(dim: int, n: int) -> dict:
    """NEQ with 4-bit codes (a code per 2 dimensions, as ScaNN's) in the compiled fast-scan,
    sqrt(n) lists ranked by the norm-aware bound, exact re-rank (docs/kernels.md). A code per 4
    dimensions never reached recall 0.9 on glove-50 (0.69 re-ranking 400 of all items)."""
    return {"base": "pq", "n_codebooks": min(256, dim // 2 + 1), "nbits": 4, "fast_scan": True,
            "n_lists": max(1, int(math.sqrt(n))), "keep_vectors": True, "progress": False}


def _norm_ivf_build(dim: int, n: int) -> dict:
    """sqrt(n) lists of directions, each scanned by decreasing norm (docs/benchmarks.md)."""
    return {"n_lists": max(1, int(math.sqrt(n)))}


_FINALISTS = 3  # at most this many candidates are built and tuned on all the data ...
_FINALIST_SPREAD = 4.0  # ... those estimated within this factor of the cheapest
_FAMILY_SPREAD = 64.0  # and the best of each kind of method within this factor
_EFS = (10, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 128, 192, 256, 384, 512)
_PROBES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
# the peers bench's fastest NEQ rows re-ranked 50 on fi-300, 200 on glove-50, 20-50 elsewhere
_RERANKS = ({"rerank": 20}, {"rerank": 50}, {"rerank": 200})
_FRACTIONS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.4)
CANDIDATES = {
    "flat": Candidate("flat", {}, None, (), "linear"),
    "norm-scan": Candidate("norm-scan", {}, "max_items", _FRACTIONS + (0.6, 0.8, 1.0), "linear",
                           ("ip",), 4),
    "norm-ivf": Candidate("norm-ivf", _norm_ivf_build, "n_probe", _PROBES, "sqrt", ("ip",), 20),
    "hnsw": Candidate("hnsw", {"M": 16, "ef_construction": 200}, "ef", _EFS, "log",
                      bytes_per_item=300),
    "ipnsw-plus": Candidate("ipnsw-plus", {"M": 16, "progress": False, "sq8": False}, "ef",
                            _EFS, "log", ("ip",), bytes_per_item=600),
    "nr-lsh": Candidate("nr-lsh", {"n_bits": 16, "n_ranges": 32}, "n_probe_items", _FRACTIONS,
                        "linear", ("ip",), bytes_per_item=16),
    "neq": Candidate("neq", _neq_build, "n_probe", _PROBES, "sqrt", ("ip",), bytes_per_item=24,
                     fixed={"rerank": 100}, variants=_RERANKS),
    "neq-fast-scan": Candidate("neq", _neq_fast_build, "n_probe", _PROBES, "sqrt", ("ip",),
                               bytes_per_item=24, fixed={"rerank": 100}, variants=_RERANKS),
    # M=32: on glove-50 recall 0.917 at ef=32 where M=16 needs ef=64 (docs/kernels.md)
    "ipnsw-plus-sq8": Candidate("ipnsw-plus", {"M": 32, "ef_construction": 200,
                                                "progress": False, "sq8": True}, "ef",
                                _EFS, "log", ("ip",), bytes_per_item=1100),
}


def _memory(c: Candidate, n: int, dim: int) -> float:
    return n * (dim * 4 + c.bytes_per_item)


_SCAN_KNOBS = ("max_items", "n_probe_items")


def _knob_value(c: Candidate, v: Any, n: int) -> Any:
    """Fractional grid values of scan-like knobs become item counts at size n."""
    if c.knob in _SCAN_KNOBS:
        return max(10, int(math.ceil(v * n)))
    return v


# The promise is about the queries that come next, not the sample: a knob is accepted when a
# one-sided prediction bound (99% by default: ``confidence``) for the mean recall of _FUTURE new
# queries reaches the target.
# A bound on the sample's own mean (1.645 sigma / sqrt(n), used before) fell short on held-out
# queries (0.888 for 0.9 on ml100k-svd): the knob is the smallest that passes, so it sits where
# the sample's noise happened to favour it (docs/benchmarks.md, "auto_index keeps its target").
CONFIDENCE = 0.99
_FUTURE = 1000

# A filter makes the k-th allowed answer sit deeper in the index's ranking, and the planner's
# widening by 1/selectivity did not always make up for it (norm-ivf on synthetic-longtail:
# recall@10 0.89 at 50% and 0.83 at 10% selectivity for a target of 0.9). So the knob is
# calibrated under random allow lists of these selectivities too: the smallest boost of the
# knob that keeps the target's prediction bound (docs/filters.md, "auto_index under a filter").
_FILTER_SELECTIVITIES = (0.5, 0.1, 0.01)
_FILTER_BOOSTS = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0)


def prediction_bound(per_query: np.ndarray, confidence: float = CONFIDENCE) -> float:
    """A one-sided lower prediction bound, at this confidence, for the mean of _FUTURE new
    queries' recalls from these queries' recalls: mean - z sigma sqrt(1/n + 1/_FUTURE)."""
    per_query = np.asarray(per_query, np.float64)
    n = max(len(per_query), 1)
    sigma = per_query.std(ddof=1 if n > 1 else 0)
    z = NormalDist().inv_cdf(confidence)
    return float(per_query.mean() - z * sigma * math.sqrt(1 / n + 1 / _FUTURE))


def _per_query_recall(ids: np.ndarray, truth: np.ndarray) -> np.ndarray:
    hits = [len(set(a[a >= 0]) & set(b)) for a, b in zip(ids, truth, strict=True)]
    return np.array(hits, np.float64) / truth.shape[1]


def _recall(ids: np.ndarray, truth: np.ndarray, confidence: float) -> float:
    """The prediction bound of the recall@k of new queries, from these queries' answers."""
    return prediction_bound(_per_query_recall(ids, truth), confidence)


def _per_query_seconds(idx: Index, q: np.ndarray, k: int, params: dict) -> float:
    """Best time per query of a batch search over the sample queries, one thread (what the
    recall/QPS tables of docs/benchmarks.md measure)."""
    from .eval import thread_limit

    best = math.inf
    with thread_limit(1):
        for _ in range(3):
            t = time.perf_counter()
            idx.search(q, k, **params)
            best = min(best, (time.perf_counter() - t) / len(q))
    return best


def _timing_queries(q: np.ndarray, x: np.ndarray, rng: np.random.Generator,
                    size: int = 1000) -> np.ndarray:
    """The queries finalists are timed on: the sample queries, then random items up to
    ``size``. Timed on 200 queries a graph walk ran from a warm cache (their paths fit in it)
    and looked 1.8x faster than on 1,000 new queries (synthetic-longtail, 200k items)."""
    extra = max(0, size - len(q))
    if not extra:
        return q
    return np.ascontiguousarray(np.concatenate([q, x[rng.choice(len(x), extra)]]), np.float32)


def _alternated_seconds(built: list[tuple[Index, dict]], q: np.ndarray, k: int) -> list[float]:
    """Per-query seconds of each (index, params), timed in turn (best of 5 rounds of at least
    0.05 s each, one thread): finalists timed one after another on a shared machine swapped
    places (synthetic-longtail: ip-NSW+ chosen over norm-ivf at half its speed)."""
    from .eval import alternated_best_times, thread_limit

    with thread_limit(1):
        times = alternated_best_times(
            [lambda i=i, p=p: i.search(q, k, **p) for i, p in built], rounds=5,
            min_seconds=0.05)
    return [t / len(q) for t in times]


def _tune(c: Candidate, idx: Index, q: np.ndarray, truth: np.ndarray, k: int, target: float,
          confidence: float):
    """The cheapest grid value reaching the target: (value or None, recall)."""
    n = len(idx)
    if c.knob is None:
        return None, _recall(idx.search(q, k, **c.fixed).ids, truth, confidence)
    rec = 0.0
    for v in c.grid:
        val = _knob_value(c, v, n)
        rec = _recall(idx.search(q, k, **{**c.fixed, c.knob: val}).ids, truth, confidence)
        if rec >= target:
            return v, rec
    return None, rec  # never reached it


def _progress(msg: str, on: bool) -> None:
    log.info("auto_index: %s", msg)
    if on:
        print(f"[auto] {msg}", flush=True)


@register("auto")
class AutoIndex(Index):
    """An index that picks its method by measuring candidates on the first data it is given
    (see the module docstring); afterwards it behaves as the chosen index, whose tuned search
    parameter is the default. ``report`` says what was measured and why the winner won.

    Build parameters: ``target_recall`` (0.9), ``k`` (10: the recall@k tuned for),
    ``candidates`` (names from ``CANDIDATES``; default all that take the metric),
    ``memory_budget`` (bytes; candidates whose estimate exceeds it are skipped),
    ``sample_size`` (20,000 items built per candidate), ``n_eval`` (200 held-out queries),
    ``seed``, ``progress``, ``confidence`` (0.99: how sure the prediction bound is that new
    queries average the target; lower is faster and less sure, docs/benchmarks.md "What
    auto_index's promise costs").

    >>> import numpy as np, simsearch as ss
    >>> x = np.random.default_rng(0).standard_normal((1000, 16)).astype("float32")
    >>> idx = ss.AutoIndex(16, "l2", target_recall=0.9, candidates=("flat", "hnsw"),
    ...                    n_eval=20, progress=False)
    >>> _ = idx.add(x)            # measures the candidates on this first batch, keeps the best
    >>> idx.chosen in ("flat", "hnsw")
    True
    """

    capabilities = Capabilities(search_params=frozenset(
        {"ef", "max_items", "n_probe_items", "n_probe", "rerank", "n_threads"}))

    def __init__(self, dim: int, metric: str = "ip", target_recall: float = 0.9, k: int = 10,
                 candidates: list[str] | tuple[str, ...] | None = None,
                 memory_budget: int | None = None, sample_size: int = 20_000, n_eval: int = 200,
                 seed: int = 0, progress: bool = False, confidence: float = CONFIDENCE):
        if not (isinstance(target_recall, (int, float)) and 0 < target_recall <= 1):
            raise InvalidParameterError(f"target_recall must be in (0, 1]; got {target_recall!r}")
        if not (isinstance(confidence, (int, float)) and not isinstance(confidence, bool)
                and 0.5 <= confidence <= 0.9999):
            raise InvalidParameterError(
                f"confidence must be in [0.5, 0.9999] (how sure auto is that the next queries "
                f"average the target; 0.99 by default); got {confidence!r}")
        names = [c for c, cand in CANDIDATES.items() if metric in cand.metrics] \
            if candidates is None else list(candidates)
        unknown = set(names) - set(CANDIDATES)
        if unknown or not names:
            raise InvalidParameterError(
                f"candidates must be a non-empty subset of {sorted(CANDIDATES)}; "
                f"got {candidates!r}")
        super().__init__(dim, metric, target_recall=float(target_recall), k=int(k),
                         candidates=names, memory_budget=memory_budget,
                         sample_size=int(sample_size), n_eval=int(n_eval), seed=int(seed),
                         progress=bool(progress), confidence=float(confidence))
        self._inner: Index | None = None
        self._defaults: dict = {}
        self._filter_boosts: list[tuple[float, float]] = []  # (selectivity, knob boost)
        self.report = "nothing chosen yet: the first add() measures the candidates"
        self._queries: np.ndarray | None = None  # the caller's sample queries, if any
        self._chosen: str | None = None

    def sample_queries(self, queries: Any) -> AutoIndex:
        """Tune on these queries (rows of ``dim``) instead of held-out items; call before the
        first ``add``. Returns the index."""
        self._queries = as_matrix(queries, self.dim, self.metric, "queries")
        return self

    @property
    def chosen(self) -> str | None:
        """The chosen candidate's name (a key of CANDIDATES), None before the first add."""
        return None if self._inner is None else self._chosen

    @property
    def tuned_params(self) -> dict:
        """The chosen index's search parameters as tuned (the defaults of ``search``; a scan
        budget as a share of the items), {} before the first add."""
        return dict(self._defaults)

    # -- choosing ---------------------------------------------------------------------------

    def _choose(self, x: np.ndarray, ids: np.ndarray) -> None:
        p = self._params
        rng = np.random.default_rng(p["seed"])
        n, k, target = x.shape[0], p["k"], p["target_recall"]
        self_ids = None  # held-out items are in the final index: their own id is no answer
        if self._queries is not None:
            q_eval = self._queries[: p["n_eval"]]
            pool = np.arange(n)
        else:  # held-out items stand in for queries
            perm = rng.permutation(n)
            n_q = min(p["n_eval"], max(1, n // 10))
            q_eval, pool = x[perm[:n_q]], perm[n_q:]
            self_ids = ids[perm[:n_q]]
        sample = pool if len(pool) <= p["sample_size"] else rng.choice(
            pool, p["sample_size"], replace=False)
        xs = x[np.sort(sample)]
        norms = np.linalg.norm(x, axis=1)
        tail = float(np.percentile(norms, 99) / max(np.median(norms), 1e-12))
        lines = [f"data: {n} items x {self.dim}, metric {self.metric}, norm p99/median {tail:.2f}; "
                 f"target recall@{k} {target}; {len(q_eval)} "
                 f"{'given' if self._queries is not None else 'held-out'} queries; "
                 f"candidates built on {len(xs)} items"]
        kk = min(k, len(xs))
        truth = _flat_truth(xs, q_eval, kk, self.metric)
        rows = []
        for name in p["candidates"]:
            c = CANDIDATES[name]
            if self.metric not in c.metrics:
                continue
            mem = _memory(c, n, self.dim)
            if p["memory_budget"] is not None and mem > p["memory_budget"]:
                why = f"skipped: needs ~{mem / 2**20:.0f} MiB"
                rows.append((name, None, None, None, None, why))
                continue
            _progress(f"building {name} on {len(xs)} items", p["progress"])
            idx = c.make(self.dim, self.metric, xs)
            idx.add(xs)
            v, rec = _tune(c, idx, q_eval, truth, kk, target, p["confidence"])
            if v is None and c.knob is not None:
                rows.append((name, None, rec, None, None, "never reached the target"))
                continue
            params = {**c.fixed, **({} if c.knob is None else {c.knob: _knob_value(c, v,
                                                                                 len(xs))})}
            sec = _per_query_seconds(idx, q_eval, kk, params)
            scale = {"linear": n / len(xs), "sqrt": math.sqrt(n / len(xs))}.get(
                c.growth, math.log(max(n, 2)) / math.log(max(len(xs), 2)))
            rows.append((name, v, rec, sec, sec * scale, "ok"))
            _progress(f"{name}: {c.knob}={v} recall {rec:.3f}, {sec * 1e6:.0f} us/query "
                      f"on the sample, ~{sec * scale * 1e6:.0f} us at full size", p["progress"])
        ok = [r for r in rows if r[5] == "ok"]
        if not ok:
            raise InvalidParameterError(
                f"no candidate reached recall {target}: " + "; ".join(
                    f"{r[0]}: {r[5]}" for r in rows))
        ok.sort(key=lambda r: r[4])
        lines.append("| candidate | knob | recall | us/query (sample) | us/query (est. full) | |")
        lines.append("|---|---|---|---|---|---|")
        for r in rows:
            lines.append(
                f"| {r[0]} | {'' if r[1] is None else f'{c_knob(r[0])}={r[1]}'} | "
                f"{'' if r[2] is None else f'{r[2]:.3f}'} | "
                f"{'' if r[3] is None else f'{r[3] * 1e6:.1f}'} | "
                f"{'' if r[4] is None else f'{r[4] * 1e6:.1f}'} | {r[5]} |")
        # held-out items join the index only after tuning: a query that is itself a node of a
        # graph finds its neighbours through its own edges, and would tune the knob too low
        late = np.zeros(n, bool) if self_ids is None else np.isin(ids, self_ids)
        m = int((~late).sum())
        truth_full = _flat_truth(x[~late], q_eval, min(k, m), self.metric, ids[~late])
        # a sample's estimate can mislead (a graph's ef may need to grow 10x from 20k to 200k
        # items): when the candidates were built on a sample, the cheapest few are built on all
        # the data, tuned there and timed, and the measured cost decides
        finalists = [r for r in ok if r[4] <= _FINALIST_SPREAD * ok[0][4]][:_FINALISTS]
        # a sample misleads most across kinds of method (on 20k of synthetic-longtail's 200k,
        # inverted lists needed 16x the probes they need at full size, a graph a tenth of the
        # ef): the best two of each kind (a scan, lists, a graph) within a wider spread are
        # built too (one was not enough: NEQ fast-scan's estimate passed norm-ivf's by 12% on
        # synthetic-longtail, so norm-ivf, 2.6x faster at full size, was never built; and 16x
        # was not wide enough once the graph walk got faster: norm-ivf estimated at 21x the
        # sq8 graph from the sample, measured 1.3x faster than it on all the items)
        for growth in ("linear", "sqrt", "log"):
            same = [r for r in ok if CANDIDATES[r[0]].growth == growth]
            for r in same[:2]:
                if r not in finalists and r[4] <= _FAMILY_SPREAD * ok[0][4]:
                    finalists.append(r)
        finalists.sort(key=lambda r: r[4])
        if len(xs) >= len(pool):  # the sample was all the items but the held-out queries:
            finalists = finalists[:1]  # its measurement is the full-size one
        built = []
        for r in finalists:
            _progress(f"building {r[0]} on all {n} items", p["progress"])
            built.append((r, *self._build_full(r[0], r[1], x, ids, late, q_eval, truth_full)))
        secs = [r[4] for r in finalists] if len(built) == 1 else _alternated_seconds(
            [(inner, defaults) for _, inner, defaults, _ in built],
            _timing_queries(q_eval, x, rng), min(k, m))
        best = None
        for (r, inner, defaults, rec), sec in zip(built, secs, strict=True):
            c = CANDIDATES[r[0]]
            params = defaults
            knob = "exact" if c.knob is None else f"{c.knob}={defaults[c.knob]}"
            if c.variants:  # which of the fixed parameters' values was kept
                knob += " with " + ", ".join(f"{n_}={v_}" for n_, v_ in defaults.items()
                                             if n_ != c.knob)
            mean = float(_per_query_recall(inner.search(q_eval, min(k, m), **params).ids,
                                           truth_full).mean())
            lines.append(f"on all {n} items: {r[0]} tuned to {knob} (recall on the sample "
                         f"queries {mean:.3f}; {p['confidence']:.0%} prediction bound for new "
                         f"queries {rec:.3f}: "
                         f"the promise costs {mean - target:+.3f} of recall over the target), "
                         f"{sec * 1e6:.1f} us/query")
            if best is None or sec < best[0]:
                best = (sec, r[0], inner, defaults)
        _, name, inner, defaults = best
        c = CANDIDATES[name]
        self._chosen = name
        why = "the lowest measured cost at full size" if len(finalists) > 1 else \
            "the lowest estimated cost at the target"
        lines.append(f"chose {name}: {why}")
        if late.any():
            inner.add(x[late], ids[late])
        if c.knob in _SCAN_KNOBS and defaults:
            # a scan budget is a share of the items: kept as a fraction, so it grows with the index
            defaults = {c.knob: defaults[c.knob] / n}
        self._inner, self._defaults = inner, defaults
        self._filter_boosts = self._calibrate_filters(x, ids, q_eval, self_ids, rng, lines)
        self.report = "\n".join(lines)

    def _calibrate_filters(self, x, ids, q_eval, self_ids, rng, lines) -> list:
        """Per selectivity of _FILTER_SELECTIVITIES, the smallest boost of the tuned knob with
        which random allow lists of that selectivity keep the target (by the same prediction
        bound as the unfiltered tuning); [] for an exact choice."""
        c = CANDIDATES[self._chosen]
        if c.knob is None or c.knob not in self._defaults:
            return []
        k, target, n = self._params["k"], self._params["target_recall"], len(ids)
        candidates = ids if self_ids is None else ids[~np.isin(ids, self_ids)]
        out = []
        for s in _FILTER_SELECTIVITIES:
            allow = np.sort(candidates[rng.random(len(candidates)) < s])
            if allow.size <= k:
                continue
            pos = np.flatnonzero(np.isin(ids, allow))
            truth = _flat_truth(x[pos], q_eval, min(k, allow.size), self.metric, ids[pos])
            boost, rec = _FILTER_BOOSTS[-1], 0.0
            for b in _FILTER_BOOSTS:
                got = self._inner.search(q_eval, truth.shape[1], allow=allow,
                                         **self._boosted(b)).ids
                rec = _recall(got, truth, self._params["confidence"])
                if rec >= target:
                    boost = b
                    break
            out.append((s, boost))
            lines.append(f"under random allow lists of {s:.0%} ({allow.size} of {n} items): "
                         f"{c.knob} x{boost:g} keeps the target (bound {rec:.3f})")
        return out

    def _boosted(self, boost: float) -> dict:
        """The default knob (as search parameters at the current size) times ``boost``."""
        out = {}
        knob = CANDIDATES[self._chosen].knob if boost != 1.0 else None
        for name, v in self._defaults.items():
            if name in _SCAN_KNOBS:
                v = max(10, math.ceil(v * len(self._inner)))
            if name == knob:
                v = int(math.ceil(v * boost))
                if name in _SCAN_KNOBS:
                    v = min(v, len(self._inner))
            out[name] = v
        return out

    def _boost_for(self, selectivity: float) -> float:
        """The calibrated boost for a filter of this selectivity: that of the next calibrated
        selectivity at or below it (a sparser filter needed at least as much), else the
        sparsest's."""
        below = [b for s, b in self._filter_boosts if s <= selectivity * 1.0001]
        if below:
            return below[0]
        return self._filter_boosts[-1][1] if self._filter_boosts else 1.0

    def _build_full(self, name, v, x, ids, late, q_eval, truth_full):
        """Build candidate ``name`` on all items but the late ones and tune its knob there
        against the exact answers, with its fixed parameters and with each of its variants
        (the fastest of those reaching the target kept): (index, defaults, recall bound)."""
        c, n = CANDIDATES[name], x.shape[0]
        k, target = truth_full.shape[1], self._params["target_recall"]
        inner = c.make(self.dim, self.metric, x[~late])
        inner.add(x[~late], ids[~late])
        conf = self._params["confidence"]
        if c.knob is None:
            return inner, dict(c.fixed), _recall(inner.search(q_eval, k, **c.fixed).ids,
                                                 truth_full, conf)

        def tuned(fixed: dict) -> tuple[dict, float]:
            def rec_at(val):
                return _recall(inner.search(q_eval, k, **{**fixed, c.knob: val}).ids,
                               truth_full, conf)

            start = c.grid.index(v)
            # at full size the knob may need less than on the sample (the share of items a
            # scan must read falls as the data grows): step down the grid while the target
            # still holds
            while start and rec_at(_knob_value(c, c.grid[start - 1], n)) >= target:
                start -= 1
            lo = _knob_value(c, c.grid[start - 1], n) if start else 1
            for g in c.grid[start:]:
                hi = _knob_value(c, g, n)
                rec = rec_at(hi)
                if rec >= target:
                    break
                lo = hi
            while hi - lo > max(1, hi // 64):  # bisect the integer knob between the grid steps
                mid = (lo + hi) // 2
                r = rec_at(mid)
                if r >= target:
                    hi, rec = mid, r
                else:
                    lo = mid
            return {**fixed, c.knob: hi}, rec

        tried = [tuned(dict(c.fixed))]
        tried += [tuned({**c.fixed, **var}) for var in c.variants]
        reached = [t for t in tried if t[1] >= target]
        if len(reached) < 2:
            return inner, *(reached or tried)[0]
        secs = _alternated_seconds([(inner, params) for params, _ in reached],
                                   _timing_queries(q_eval, x, np.random.default_rng(0)), k)
        return inner, *reached[int(np.argmin(secs))]

    # -- the Index hooks --------------------------------------------------------------------

    def _add(self, x: np.ndarray, ids: np.ndarray) -> None:
        if self._inner is None:
            self._choose(x, ids)
        else:
            self._inner.add(x, ids)

    def _remove(self, ids: np.ndarray) -> None:
        self._inner.remove(ids)

    def _vectors_of(self, ids: np.ndarray) -> np.ndarray:
        return self._inner.get_vectors(ids)

    def _search_filtered(self, q: np.ndarray, k: int, filt: IdFilter,
                         **params: Any) -> SearchResult:
        """The chosen index plans it, with the knob boosted as calibrated for the filter's
        selectivity (per-query filters: the sparsest's)."""
        rows = [0] if filt.shared else range(len(q))
        allowed = min(allowed_ids(self._idset, filt.allow_of(i), filt.deny_of(i))[1]
                      for i in rows)
        boost = self._boost_for(allowed / max(len(self), 1))
        return self._search(q, k, filt.allow, filt.deny, boost, **params)

    def _search(self, q: np.ndarray, k: int, allow: Any = None, deny: Any = None,
                boost: float = 1.0, **params: Any) -> SearchResult:
        inner = self._inner
        takes = inner.capabilities.search_params
        extra = set(params) - takes
        if extra:
            raise InvalidParameterError(
                f"the chosen index ({inner.kind}) takes {sorted(takes)}; got {sorted(extra)}")
        return inner.search(q, k, allow=allow, deny=deny, **{**self._boosted(boost), **params})

    def _get_state(self):
        meta = {"defaults": self._defaults, "report": self.report, "chosen": self._chosen,
                "filter_boosts": self._filter_boosts}
        if self._inner is None:
            return meta, {}
        return meta, {"inner": np.frombuffer(self._inner.to_bytes(), np.uint8)}

    def _set_state(self, meta, arrays):
        self._defaults, self.report = dict(meta["defaults"]), meta["report"]
        self._chosen = meta.get("chosen")
        self._filter_boosts = [(float(s), float(b)) for s, b in meta.get("filter_boosts", [])]
        if not all(0 < s <= 1 and 1 <= b < math.inf for s, b in self._filter_boosts):
            raise ValueError(f"filter boosts out of range: {self._filter_boosts}")
        if "inner" in arrays:
            self._inner = loads(arrays["inner"])
            if self._chosen is None:  # a file from before candidates had their own names
                self._chosen = self._inner.kind


def c_knob(name: str) -> str:
    return CANDIDATES[name].knob or "exact"


def _flat_truth(x, q, k, metric, ids=None) -> np.ndarray:
    f = create_index("flat", x.shape[1], metric)
    f.add(x, ids)
    return f.search(q, k).ids


def auto_index(x: Any, metric: str = "ip", target_recall: float = 0.9, queries: Any = None,
               memory_budget: int | None = None, k: int = 10, ids: Any = None,
               progress: bool = True, **params: Any) -> AutoIndex:
    """Measure the candidate indexes on ``x`` and return the cheapest that reaches
    ``target_recall`` (recall@k), built on all of ``x`` and ready to search; ``queries`` are
    sample queries (default: held-out items). ``idx.report`` explains the choice."""
    x = np.asarray(x)
    if x.ndim != 2:
        raise InvalidParameterError(f"x must be a (n, dim) array; got shape {x.shape}")
    idx = AutoIndex(x.shape[1], metric, target_recall=target_recall, k=k,
                    memory_budget=memory_budget, progress=progress, **params)
    if queries is not None:
        idx.sample_queries(queries)
    idx.add(x, ids)
    return idx


__all__ = ["AutoIndex", "CANDIDATES", "auto_index"]
