"""Evaluation shared by tests, the benchmark runner and the demo: tie-tolerant recall, thread
limits, timing, and the recall/QPS table and plot."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from ._validate import higher_is_better


def true_scores(queries: np.ndarray, base: np.ndarray, ids: np.ndarray, metric: str) -> np.ndarray:
    """Exact score of base[ids[i, j]] for query i (float32 (nq, k)); NaN where ids == -1.
    Under "edit", queries and base are strings."""
    valid = ids >= 0
    if metric == "edit":
        from rapidfuzz.distance import Levenshtein

        s = np.array([[Levenshtein.distance(q, base[i]) for i in row.tolist()]
                      for q, row in zip(queries, np.where(valid, ids, 0), strict=True)],
                     np.float64).reshape(ids.shape)
        return np.where(valid, s, np.nan).astype(np.float32)
    rows = base[np.where(valid, ids, 0)]  # (nq, k, d)
    q = queries[:, None, :]
    if metric == "l2":
        s = ((rows - q) ** 2).sum(-1)
    elif metric == "cosine":
        s = (rows * q).sum(-1) / (
            np.linalg.norm(rows, axis=-1) * np.linalg.norm(q, axis=-1) + 1e-30
        )
    else:
        s = (rows * q).sum(-1)
    return np.where(valid, s, np.nan).astype(np.float32)


def recall_at_k(
    ids: np.ndarray,
    gt_ids: np.ndarray,
    k: int,
    *,
    gt_scores: np.ndarray | None = None,
    queries: np.ndarray | None = None,
    base: np.ndarray | None = None,
    metric: str | None = None,
    per_query: bool = False,
    rtol: float = 1e-4,
):
    """Fraction of the true top-k found among the first k returned ids.

    With ``gt_scores``, ``queries``, ``base`` and ``metric`` the count is tie-tolerant: a returned
    id is a hit when its exact score is at least as good as the true k-th score (within ``rtol``),
    so an index that returns a different item of equal score is not penalised. ``ids`` index rows
    of ``base``. Without them, hits are counted by id.
    """
    ids = np.asarray(ids)[:, :k]
    gt_ids = np.asarray(gt_ids)
    if gt_ids.shape[1] < k:
        raise ValueError(f"ground truth holds {gt_ids.shape[1]} neighbours; recall@{k} needs k")
    tie = gt_scores is not None and queries is not None and base is not None and metric
    if tie:
        s = true_scores(queries, base, ids, metric)
        kth = np.asarray(gt_scores)[:, k - 1 : k].astype(np.float64)
        tol = rtol * np.maximum(np.abs(kth), 1e-6)
        good = (s >= kth - tol) if higher_is_better(metric) else (s <= kth + tol)
        good &= ids >= 0
        # count each id once
        srt = np.sort(np.where(good, ids, -1), axis=1)
        distinct = np.concatenate(
            [srt[:, :1] >= 0, (srt[:, 1:] != srt[:, :-1]) & (srt[:, 1:] >= 0)], 1
        )
        hits = np.minimum(distinct.sum(1), k)
    else:
        gt = gt_ids[:, :k]
        hits = np.array([np.intersect1d(a[a >= 0], b).size for a, b in zip(ids, gt, strict=True)])
    r = hits / float(k)
    return r if per_query else float(r.mean())


# -- threads and timing ----------------------------------------------------------------------


@contextlib.contextmanager
def thread_limit(n: int | None) -> Iterator[None]:
    """Limit BLAS, faiss OpenMP and numba threads to n (None: leave as is). numpy's BLAS and
    faiss's OpenMP otherwise fight over the cores."""
    if n is None:
        yield
        return
    import faiss
    from threadpoolctl import threadpool_limits

    old_faiss = faiss.omp_get_max_threads()
    try:
        import numba

        from ._numba_util import set_kernel_threads

        old_numba = numba.get_num_threads()
        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
        old_width = set_kernel_threads(n)  # reaches the kernels run in other threads too
    except Exception:  # numba absent or threading layer unavailable
        numba, old_numba = None, None
    faiss.omp_set_num_threads(n)
    try:
        with threadpool_limits(limits=n):
            yield
    finally:
        faiss.omp_set_num_threads(old_faiss)
        if numba is not None:
            numba.set_num_threads(old_numba)
            set_kernel_threads(old_width)


def best_time(fn: Callable[[], object], repeats: int = 3, min_seconds: float = 0.0) -> float:
    """Best wall time of fn() over ``repeats`` runs (and at least ``min_seconds`` of running)."""
    return timed(fn, repeats, min_seconds)[1]


def timed(fn: Callable[[], object], repeats: int = 3, min_seconds: float = 0.0,
          once_above: float = np.inf) -> tuple[object, float]:
    """fn()'s last output and its best wall time over ``repeats`` runs (and at least
    ``min_seconds`` of running); a single run when it took longer than ``once_above`` seconds."""
    best, spent, r, out = np.inf, 0.0, 0, None
    while r < repeats or spent < min_seconds:
        t = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t
        best, spent, r = min(best, dt), spent + dt, r + 1
        if best > once_above:
            break
    return out, best


def alternated_best_times(fns: Sequence[Callable[[], object]], rounds: int = 3,
                          min_seconds: float = 0.0) -> list[float]:
    """Best wall time of each fn, timed in turn round after round (each turn at least
    ``min_seconds``), so that all of them see the same machine load: for ratios."""
    best = [np.inf] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            best[i] = min(best[i], timed(fn, 1, min_seconds)[1])
    return best


def latency_stats(seconds: np.ndarray) -> dict[str, float]:
    s = np.asarray(seconds) * 1e3
    return {
        "mean_ms": float(s.mean()),
        "p50_ms": float(np.percentile(s, 50)),
        "p99_ms": float(np.percentile(s, 99)),
    }


# -- tables and plots ------------------------------------------------------------------------


def _fmt(v: object) -> str:
    if isinstance(v, float):
        if v == 0 or 1e-3 <= abs(v) < 1e12:
            return f"{v:.4g}" if abs(v) < 1 else f"{v:,.1f}" if abs(v) < 100 else f"{v:,.0f}"
        return f"{v:.3g}"
    return str(v)


def markdown_table(rows: Sequence[dict], columns: Sequence[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row.get(c, "")) for c in columns) + " |")
    return "\n".join(lines)


def value_at_recall(points: Sequence[tuple[float, float]], target: float,
                    below: str = "first") -> float | None:
    """A measured (recall, value) curve read at ``recall = target``, log-linear in the value
    (q/s, items probed): None past the best recall; below the smallest recall, the first value
    (``below="first"``: the cheapest setting already reaches the target) or None (``"none"``)."""
    pts = sorted(points)
    if not pts or pts[-1][0] < target - 1e-12:
        return None
    if pts[0][0] >= target:
        return float(pts[0][1]) if below == "first" or pts[0][0] - target <= 1e-12 else None
    for (r0, v0), (r1, v1) in zip(pts, pts[1:], strict=False):
        if r0 <= target <= r1 and r1 > r0:
            f = (target - r0) / (r1 - r0)
            return float(np.exp(np.log(v0) + f * (np.log(v1) - np.log(v0))))
    return None


def pareto_frontier(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points not dominated in (recall, qps), by increasing recall."""
    front: list[tuple[float, float]] = []
    for r, q in sorted(points, key=lambda p: (-p[0], -p[1])):
        if not front or q > front[-1][1]:
            front.append((r, q))
    return front[::-1]


def plot_recall_qps(
    series: dict[str, Sequence[tuple[float, float]]],
    path: str | Path,
    title: str,
    xlabel: str = "recall@10",
    ylabel: str = "queries/s (log)",
) -> Path:
    """Recall against queries/s on a log axis, one Pareto frontier per series, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    for label, pts in series.items():
        pts = [p for p in pts if p[1] > 0]
        if not pts:
            continue
        ax.scatter(*zip(*pts, strict=True), s=8, alpha=0.35)
        fr = pareto_frontier(pts)
        ax.plot(*zip(*fr, strict=True), marker="o", ms=4, label=label)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
