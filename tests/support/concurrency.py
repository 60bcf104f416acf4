"""The concurrency suite (docs/architecture.md, "Concurrency"): readers search (one of them with
allow/deny filters) while a writer adds, removes and saves. Every kind in
tests/support/contract.py joins
it through its one ``Case`` line; targets that are not an Index kind (the remote client) join
with one line in ``EXTRA``.

The stress runs in a child process (``python tests/support/concurrency.py CASE METRIC``), so a
crash of the
process (a heap corruption in a native library) fails one test instead of ending the run. The child
prints one JSON line that tests/test_concurrency.py checks.
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from contract import CASES, Case, dim_of, exact_search, items_of, tie_data  # noqa: E402
from simsearch.eval import recall_at_k  # noqa: E402

DIM, N, K = 24, 6000, 10
N_READERS = 3
BATCH = 50  # the writer adds a batch, removes a few, and every SAVE_EVERY rounds saves
SAVE_EVERY = 10


def _remote_case() -> Case:
    """An hnsw collection on an in-process node server, through the client (the service's path)."""

    def make(d, m, x):
        from simsearch.service.client import connect
        from simsearch.service.server import create_server

        tmp = tempfile.mkdtemp(prefix="simsearch-conc-")
        srv = create_server(tmp, port=0)
        col = connect(f"127.0.0.1:{srv.port}").create_collection(
            "c", dim=d, metric=m, kind="hnsw", M=16, ef_construction=100
        )
        col._server = srv  # kept alive with the collection
        return col

    return Case("remote-hnsw", make, search_kw={"ef": 64}, min_recall=0.95)


EXTRA: list[Case] = [_remote_case()]
ALL = {c.id: c for c in [*CASES, *EXTRA]}


def _save(idx, path: Path) -> None:
    if hasattr(idx, "save"):
        idx.save(path)
    else:  # a remote collection: the server writes its snapshot
        idx.snapshot()


def stress(case: Case, metric: str, seed: int = 0) -> dict:
    """Run readers against a writer; return what the parent checks."""
    base, queries = items_of(case, N, 40, DIM, seed)
    rng = np.random.default_rng(seed)
    idx = case.make(dim_of(case, DIM), metric, base)
    first = 500
    idx.add(base[:first], np.arange(first, dtype=np.int64))
    announced = np.zeros(N, bool)  # ids handed to add() so far: all a search may ever return
    announced[:first] = True
    present = set(range(first))
    removed = np.zeros(N, bool)  # ids whose remove() has returned
    stop = threading.Event()
    errors: list[str] = []
    bad_ids = [0]
    stale = [0]  # searches that started after a remove returned yet gave back a removed id
    searches = [0]

    def reader(r: int) -> None:
        local = np.random.default_rng(seed + 1 + r)
        while not stop.is_set():
            nq = int(local.integers(1, 33))  # large batches stay long in native code
            q = queries[local.integers(0, len(queries), nq)]
            flt, ok = {}, None  # reader 1 searches with filters (docs/filters.md)
            if r == 1:
                ok = np.ones((nq, N), bool)
                if local.random() < 0.5:
                    flt = {"allow": np.flatnonzero(local.random(N) < 0.1)}
                    ok[:] = False
                    ok[:, flt["allow"]] = True
                else:
                    flt = {"deny": [local.choice(N, 200, replace=False) for _ in range(nq)]}
                    for i, d in enumerate(flt["deny"]):
                        ok[i, d] = False
            gone = removed.copy()  # removes that returned before this search starts
            try:
                res = idx.search(q, K, **flt, **case.search_kw)
            except Exception as exc:  # any error is a failure of the rule
                errors.append(f"search: {type(exc).__name__}: {exc}")
                return
            ids = np.asarray(res.ids)
            if ids.shape != (nq, K):
                errors.append(f"search returned shape {ids.shape}, expected {(nq, K)}")
                return
            got = ids[ids >= 0]
            if (ids < -1).any() or (got >= N).any() or not announced[got].all():
                bad_ids[0] += 1
            elif gone[got].any():
                stale[0] += 1
            elif ok is not None and not all(ok[i, row[row >= 0]].all()
                                            for i, row in enumerate(ids)):
                bad_ids[0] += 1  # a filtered search returned an id its filter leaves out
            searches[0] += 1

    threads = [threading.Thread(target=reader, args=(r,)) for r in range(N_READERS)]
    for t in threads:
        t.start()
    nxt = first
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "idx.bin"
        try:
            for rnd in range((N - first) // BATCH):
                new = np.arange(nxt, min(nxt + BATCH, N), dtype=np.int64)
                announced[new] = True
                idx.add(base[new], new)
                present.update(new.tolist())
                nxt += new.size
                if case.supports_remove:
                    gone = rng.choice(sorted(present), BATCH // 5, replace=False)
                    idx.remove(gone)
                    removed[gone] = True
                    present.difference_update(gone.tolist())
                if rnd % SAVE_EVERY == 0:
                    _save(idx, path)
        except Exception as exc:
            errors.append(f"write: {type(exc).__name__}: {exc}")
        finally:
            stop.set()
            for t in threads:
                t.join()

    final = np.array(sorted(present), np.int64)
    got = idx.search(queries, K, **case.search_kw)
    truth = exact_search(case, metric, DIM, base[final], final, queries, K)
    calm = case.make(dim_of(case, DIM), metric, base)  # the same data, without concurrency
    calm.add(base[final], final)
    calm_got = calm.search(queries, K, **case.search_kw)
    return {
        "errors": errors,
        "bad_ids": bad_ids[0],
        "stale_ids": stale[0],
        "searches": searches[0],
        "len": len(idx),
        "expected_len": int(final.size),
        "exact_equal": bool(np.array_equal(got.ids, truth.ids)),
        # tie-aware: edit distances tie often, and which tied id comes back is no error
        "recall": float(recall_at_k(got.ids, truth.ids, K, gt_scores=truth.scores,
                                    metric=metric, **tie_data(case, queries, base))),
        "calm_recall": float(recall_at_k(calm_got.ids, truth.ids, K, gt_scores=truth.scores,
                                         metric=metric, **tie_data(case, queries, base))),
    }


def run_child(case_id: str, metric: str, timeout: float = 240.0) -> tuple[int, dict | None, str]:
    """Run ``stress`` in a child process: (exit code, its report or None, its output)."""
    import subprocess

    p = subprocess.run(
        [sys.executable, __file__, case_id, metric],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    report = json.loads(lines[-1]) if lines and p.returncode == 0 else None
    return p.returncode, report, (p.stdout + p.stderr)[-4000:]


def cases() -> list[tuple[str, str]]:
    """(case id, metric) pairs the suite runs: every case under its first metric."""
    return [(c.id, c.metrics[0]) for c in ALL.values()]


def main(argv: list[str]) -> int:
    report = stress(ALL[argv[0]], argv[1])
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
