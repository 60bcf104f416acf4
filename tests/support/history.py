"""A history checker for cluster fault tests (docs/cluster.md, "Failure model").

    h = History(addresses, "docs", dim=16, ids=np.arange(300), seed=3)
    h.start(); ...inject a fault...; h.stop()
    report = h.check(etcd_url, cluster)     # {"violations": [...], "diverged": [...], ...}

Client threads upsert versioned vectors and remove ids of a fixed set through the coordinators,
each op retried on the same logical value until acknowledged (or given up: outcome unknown), and
record each op's invocation and completion times and outcome. Reader threads search and record
when searches failed. At the end the checker reads every replica of every part straight from
its shard server and judges:

- **replicas agree**: every replica of a part holds the same ids at the same versions;
- **no ghosts**: every id some replica holds is known to the router (``contains``), and every id
  the router knows is held by its part;
- **histories**: each id's final state (absent, or version v) is explained by its history: there
  is an op that left that state (an upsert of v, a remove, or the initial load) that did not fail
  definitely, such that every acknowledged op on the id was invoked before that op completed
  (an unacknowledged op may take effect at any time after its invocation).

Vectors are a pure function of (seed, id, version), so a replica's version of an id is found by
an exact search of each candidate version's vector: the collection must be "l2" (distance 0 is
a match; under "ip" MIPS copies would also put an id in several parts).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

import numpy as np

from faultload import MultiAddress, retryable, start_threads, stop_threads


def versioned(ids, versions, dim: int, seed: int) -> np.ndarray:
    """The vector of (id, version) for each pair."""
    out = np.empty((len(ids), dim), np.float32)
    for r, (i, v) in enumerate(zip(np.asarray(ids).tolist(), np.asarray(versions).tolist(),
                                   strict=True)):
        out[r] = np.random.default_rng([seed, int(i), int(v)]).standard_normal(dim,
                                                                               dtype=np.float32)
    return out


@dataclass
class Op:
    ids: np.ndarray
    kind: str  # "upsert" | "remove"
    version: int  # upserts: the version written (unique per op); removes: -1
    t_inv: float
    t_done: float = math.inf  # completion (ack) time; inf while unknown
    outcome: str = "unknown"  # "ok" | "unknown" | "failed" (a definite refusal)


class History:
    """The load and the record (see the module docstring)."""

    def __init__(self, addresses, collection: str, dim: int, ids: np.ndarray, seed: int = 0,
                 clients: int = 3, readers: int = 1, batch: int = 3, remove_share: float = 0.3,
                 timeout: float = 5.0, give_up: float = 30.0, k: int = 10,
                 search_params: dict | None = None):
        self.addresses = list(addresses)
        self.collection, self.dim, self.seed = collection, dim, seed
        self.ids = np.asarray(ids, np.int64)
        self.n_clients, self.n_readers = clients, readers
        self.batch, self.remove_share = batch, remove_share
        self.timeout, self.give_up, self.k = timeout, give_up, k
        self.search_params = dict(search_params or {})
        self.ops: list[Op] = []
        self.read_ok: list[float] = []
        self.read_failures: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._version = 0
        self._by_id: dict[int, list[Op]] = {}
        self.t_start = time.monotonic()

    def load_initial(self) -> None:
        """Version 0 of every id, acknowledged before the run starts."""
        conn = MultiAddress(self.addresses, self.collection, 60.0)
        try:
            x = versioned(self.ids, np.zeros(self.ids.size, np.int64), self.dim, self.seed)
            conn.call(lambda c: c.add(x, ids=self.ids, upsert=True))
        finally:
            conn.close()
        self.t_start = time.monotonic()

    # -- running ----------------------------------------------------------------------------

    def start(self) -> History:
        self._threads = start_threads([(self._client, (c,)) for c in range(self.n_clients)]
                                      + [(self._reader, (r,)) for r in range(self.n_readers)])
        return self

    def stop(self) -> None:
        stop_threads(self._stop, self._threads,
                     self.give_up + self.timeout * (len(self.addresses) + 1) + 10)

    def _next_version(self) -> int:
        with self._lock:
            self._version += 1
            return self._version

    def _client(self, c: int) -> None:
        rng = np.random.default_rng([self.seed, 101, c])
        conn = MultiAddress(self.addresses, self.collection, self.timeout)
        conn.current = c % len(self.addresses)
        try:
            while not self._stop.is_set():
                ids = np.unique(rng.choice(self.ids, rng.integers(1, self.batch + 1)))
                if rng.random() < self.remove_share:
                    op = Op(ids, "remove", -1, time.monotonic())
                    fn = lambda col, ids=ids: col.remove(ids, missing_ok=True)  # noqa: E731
                else:
                    v = self._next_version()
                    x = versioned(ids, np.full(ids.size, v), self.dim, self.seed)
                    op = Op(ids, "upsert", v, time.monotonic())
                    fn = lambda col, x=x, ids=ids: col.add(x, ids=ids, upsert=True)  # noqa: E731
                with self._lock:
                    self.ops.append(op)
                end = op.t_inv + self.give_up
                while True:  # the same logical op until acknowledged, or given up (unknown)
                    try:
                        conn.call(fn)
                        op.t_done, op.outcome = time.monotonic(), "ok"
                        break
                    except Exception as exc:  # noqa: BLE001 - judged below
                        if not retryable(exc):
                            op.outcome = f"failed: {type(exc).__name__}: {exc}"
                            break
                    if time.monotonic() > end or self._stop.is_set():
                        break  # unknown: it may still take effect
                    time.sleep(0.05)
                self._stop.wait(0.01)
        finally:
            conn.close()

    def _reader(self, r: int) -> None:
        rng = np.random.default_rng([self.seed, 202, r])
        conn = MultiAddress(self.addresses, self.collection, self.timeout)
        try:
            while not self._stop.is_set():
                q = rng.standard_normal((1, self.dim)).astype(np.float32)
                try:
                    conn.call(lambda col, q=q: col.search(q, self.k, **self.search_params))
                    with self._lock:
                        self.read_ok.append(time.monotonic())
                except Exception as exc:  # noqa: BLE001 - a failed read is what we record
                    with self._lock:
                        self.read_failures.append((time.monotonic(), f"{type(exc).__name__}"))
                    self._stop.wait(0.05)
                self._stop.wait(0.01)
        finally:
            conn.close()

    # -- judging ----------------------------------------------------------------------------

    def acked_after(self, t: float) -> int:
        """Ops acknowledged after monotonic time ``t``."""
        with self._lock:
            return sum(o.outcome == "ok" and o.t_done > t for o in self.ops)

    def read_outage(self, after: float) -> float:
        """Seconds from ``after`` until the last failed read (0 if none failed after it)."""
        with self._lock:
            late = [t for t, _ in self.read_failures if t >= after]
        return max(late) - after if late else 0.0

    def replica_states(self, shards: dict[int, str], parts: dict[str, list[int]]
                       ) -> dict[str, dict[int, dict[int, int]]]:
        """``{part: {shard: {id: version}}}`` read straight from each replica (version -2: an
        id whose vector matches no version ever written)."""
        import simsearch as ss

        cands: dict[int, list[int]] = {int(i): [0] for i in self.ids}
        for op in self.ops:
            if op.kind == "upsert":
                for i in op.ids.tolist():
                    cands[i].append(op.version)
        out: dict[str, dict[int, dict[int, int]]] = {}
        for part, sids in parts.items():
            out[part] = {}
            for sid in sids:
                with ss.connect(shards[sid], timeout=60) as c:
                    col = c.collection(part)
                    n = len(col)
                    held: dict[int, int] = {}
                    if n:
                        r = col.search(np.zeros((1, self.dim), np.float32), n)
                        present = r.ids[0][r.ids[0] >= 0].tolist()
                        pairs = [(i, v) for i in present for v in cands.get(i, [])]
                        held = {i: -2 for i in present}
                        if pairs:
                            qi, qv = np.array(pairs).T
                            q = versioned(qi, qv, self.dim, self.seed)
                            rr = col.search(q, 1)
                            hit = (rr.ids[:, 0] == qi) & (rr.scores[:, 0] <= 1e-4)
                            for i, v in zip(qi[hit].tolist(), qv[hit].tolist(), strict=True):
                                held[i] = v
                    out[part][sid] = held
        return out

    def explained(self, i: int, final: int | None) -> bool:
        """Is id ``i``'s final state (None: absent; else a version) explained by its history?"""
        ops = self._by_id.get(i, [])
        init = Op(np.array([i]), "upsert", 0, -math.inf, self.t_start, "ok")
        acked = [o for o in ops if o.outcome == "ok"]
        for o in [init, *ops]:
            if o.outcome.startswith("failed"):
                continue
            state = None if o.kind == "remove" else o.version
            if state != final:
                continue
            if all(a.t_inv < o.t_done for a in acked if a is not o):
                return True
        return False

    def _ops_of(self) -> dict[int, list[Op]]:
        out: dict[int, list[Op]] = {}
        for o in self.ops:
            for i in o.ids.tolist():
                out.setdefault(i, []).append(o)
        return out

    def check(self, etcd_url: str, cluster: str, coordinator: str) -> dict:
        """Read every replica and judge (see the module docstring)."""
        from simsearch.pyramid.direct import open_router
        from simsearch.pyramid.status import cluster_status

        st = cluster_status(etcd_url, cluster)
        shards = {p["id"]: p["address"] for p in st["processes"] if p["role"] == "shard"}
        parts: dict[str, list[int]] = {}
        for p in st["processes"]:
            if p["role"] == "shard":
                for part in p["parts"]:
                    if part.startswith(self.collection + ".p"):
                        parts.setdefault(part, []).append(p["id"])
        states = self.replica_states(shards, parts)
        diverged = []
        final: dict[int, int | None] = {int(i): None for i in self.ids}
        holders: dict[int, list[str]] = {}
        for part, by_shard in states.items():
            views = list(by_shard.values())
            for i in set().union(*map(set, views)):
                vs = {v.get(i) for v in views}
                if len(vs) > 1:
                    diverged.append((part, i, {s: v.get(i) for s, v in by_shard.items()}))
            for i, v in views[0].items():
                holders.setdefault(i, []).append(part)
                if i in final:
                    final[i] = v
        held = np.asarray(sorted(holders), np.int64)
        router = open_router(coordinator, self.collection, etcd_url, cluster)
        try:
            known_held = router.contains(held)
            known = router.contains(self.ids)
        finally:
            router.parts[0].pool.close()
        ghosts = held[~known_held].tolist()  # any id a replica holds, ours or not
        lost = [i for i, k in zip(self.ids.tolist(), known.tolist(), strict=True)
                if k and i not in holders]
        twice = [(i, ps) for i, ps in holders.items() if len(ps) > 1]
        unknown_version = [i for i in self.ids.tolist() if final[i] == -2]
        self._by_id = self._ops_of()
        violations = [(i, final[i]) for i in final if not self.explained(i, final[i])]
        outcomes: dict[str, int] = {}
        for o in self.ops:
            key = o.outcome if not o.outcome.startswith("failed") else "failed"
            outcomes[key] = outcomes.get(key, 0) + 1
        return {"ops": len(self.ops), "outcomes": outcomes, "violations": violations,
                "diverged": diverged, "ghosts": ghosts, "lost": lost, "in_two_parts": twice,
                "unknown_version": unknown_version, "reads_ok": len(self.read_ok),
                "read_failures": len(self.read_failures),
                "held": sum(v is not None for v in final.values())}


def run_with(cl, fault, collection: str, dim: int, ids: np.ndarray, seed: int,
             settle: float = 3.0) -> tuple[History, dict, float]:
    """On local cluster ``cl``: load ``ids`` at version 0, start the load, run ``fault()``
    (returns when the fault ended), let the cluster settle, stop, check. Returns (history,
    report, fault end time)."""
    import json

    h = History(cl.coordinators, collection, dim, ids, seed=seed, timeout=5.0, give_up=30.0)
    h.load_initial()
    h.start()
    try:
        time.sleep(2.0)
        fault()
        t_end = time.monotonic()
        time.sleep(settle)
    finally:
        h.stop()
    wait_in_sync(cl)
    up = cl.up
    report = h.check(up["etcd"], up["cluster"], cl.coordinator)
    print(json.dumps({k: v if isinstance(v, (int, dict)) else v[:10] for k, v in report.items()}))
    return h, report, t_end


def wait_in_sync(cl, timeout: float = 60.0) -> None:
    """Until the cluster has a leader and no replica is out of sync."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        st = cl.status()
        if st["leader"] and not any(p.get("out_of_sync") for p in st["processes"]):
            return
        time.sleep(0.2)
    raise AssertionError(f"replicas still out of sync after {timeout} s: {cl.status()}")


def assert_consistent(report: dict) -> None:
    """Every id explained, replicas agree, no ghosts or losses, and the load made progress."""
    assert report["ops"] > 20, report
    assert report["outcomes"].get("ok", 0) > 10, report["outcomes"]
    for key in ("violations", "diverged", "ghosts", "lost", "in_two_parts", "unknown_version"):
        assert report[key] == [], f"{key}: {report[key][:10]}"
