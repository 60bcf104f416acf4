"""Write + read load for cluster fault tests and the fault benchmark (bench/pyramid/faults.py).

    load = Load(addresses, "docs", dim=16, seed=0)      # coordinators' host:port
    load.start(); ...inject faults...; load.stop()
    load.verify()                  # every acknowledged id is its own nearest neighbour
    load.series()                  # per-second acked writes / ok reads / failed reads

One writer thread sends batches with explicit, never reused ids (upserts) and retries a batch with
the SAME ids until it is acknowledged, trying the next coordinator on each failure; every ack is
logged with its send and ack times. Reader threads search random stored vectors; a read counts as
failed only when every coordinator failed it once in a row. Vectors are a pure function of the id
(seeded), so verification needs no copy of what was sent.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger(__name__)


def vectors_for(ids: np.ndarray, dim: int, seed: int) -> np.ndarray:
    """The vector of each id: seeded by (seed, id), so any process can recompute it."""
    out = np.empty((len(ids), dim), dtype=np.float32)
    for r, i in enumerate(np.asarray(ids, dtype=np.int64)):
        out[r] = np.random.default_rng([seed, int(i)]).standard_normal(dim, dtype=np.float32)
    return out


@dataclass
class Ack:
    ids: np.ndarray
    t_send: float  # monotonic, of the attempt that was acknowledged
    t_ack: float
    address: str
    attempts: int


@dataclass
class Failure:
    t: float
    address: str
    error: str


@dataclass
class LoadLog:
    acks: list[Ack] = field(default_factory=list)
    write_failures: list[Failure] = field(default_factory=list)
    read_ok: list[float] = field(default_factory=list)  # completion times
    read_retried: int = 0  # reads that failed on one coordinator and succeeded on another
    read_failures: list[Failure] = field(default_factory=list)


class MultiAddress:
    """One connection per coordinator; ``call(fn)`` runs ``fn(collection)`` on the current one and
    moves to the next on UNAVAILABLE / connection errors, trying each at most once."""

    def __init__(
        self,
        addresses: Sequence[str],
        collection: str,
        timeout: float = 5.0,
        connect: Callable | None = None,
    ):
        import simsearch as ss

        self.addresses = list(addresses)
        self.collection = collection
        self.timeout = timeout
        self._connect = connect or (lambda a: ss.connect(a, timeout=timeout))
        self._clients: dict[str, object] = {}
        self.current = 0

    def _col(self, address: str):
        c = self._clients.get(address)
        if c is None:
            c = self._clients[address] = self._connect(address)
        return c.collection(self.collection)

    def call(self, fn, on_fail: Callable[[str, Exception], None] | None = None):
        last: Exception | None = None
        for step in range(len(self.addresses)):
            address = self.addresses[(self.current + step) % len(self.addresses)]
            try:
                out = fn(self._col(address))
                self.current = (self.current + step) % len(self.addresses)
                return out, address, step
            except Exception as exc:  # noqa: BLE001 - every failure is recorded by the caller
                if not retryable(exc):
                    raise
                last = exc
                self._clients.pop(address, None)
                if on_fail is not None:
                    on_fail(address, exc)
        assert last is not None
        raise last

    def close(self) -> None:
        for c in self._clients.values():
            try:
                c.close()
            except Exception:  # noqa: BLE001 - closing a dead channel
                pass
        self._clients.clear()


def retried(fn, errors: type[BaseException] | tuple = Exception, timeout: float = 30.0,
            pause: float = 0.2):
    """``fn()``, called again while it raises ``errors`` (transient by contract), for up to
    ``timeout`` seconds; then the last error."""
    end = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except errors:
            if time.monotonic() > end:
                raise
            time.sleep(pause)


def retryable(exc: Exception) -> bool:
    from simsearch.service.errors import DeadlineExceededError, ServiceUnavailableError

    return isinstance(
        exc,
        ServiceUnavailableError | DeadlineExceededError | ConnectionError | TimeoutError | OSError,
    )


def start_threads(jobs: list[tuple[Callable, tuple]]) -> list[threading.Thread]:
    """Start a daemon thread per (function, args), named after the function."""
    threads = [threading.Thread(target=fn, args=args, daemon=True,
                                name=f"{fn.__name__.strip('_')}-{'-'.join(map(str, args))}")
               for fn, args in jobs]  # fmt: skip
    for t in threads:
        t.start()
    return threads


def stop_threads(stop: threading.Event, threads: list[threading.Thread], timeout: float) -> None:
    """Set ``stop`` and join each thread for at most ``timeout`` seconds."""
    stop.set()
    for t in threads:
        t.join(timeout)
    threads.clear()


class Load:
    """Steady writes and reads against a cluster's coordinators (see the module docstring).

    ``id_start``: first id written (ids below it are assumed to be loaded already);
    ``write_batch``: ids per write; ``write_pause``: seconds between acknowledged writes;
    ``readers``: reader threads; ``search_params``: per-call search parameters.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        collection: str,
        dim: int,
        seed: int = 0,
        id_start: int = 1_000_000,
        write_batch: int = 10,
        write_pause: float = 0.02,
        readers: int = 2,
        k: int = 5,
        search_params: dict | None = None,
        read_ids: np.ndarray | None = None,
        timeout: float = 5.0,
        writes: bool = True,
    ):
        self.addresses = list(addresses)
        self.collection = collection
        self.dim = dim
        self.seed = seed
        self.next_id = id_start
        self.id_start = id_start
        self.write_batch = write_batch
        self.write_pause = write_pause
        self.n_readers = readers
        self.k = k
        self.search_params = dict(search_params or {})
        self.read_ids = read_ids
        self.timeout = timeout
        self.writes = writes
        self.log = LoadLog()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.t0: float | None = None

    # -- running
    def start(self) -> Load:
        self.t0 = time.monotonic()
        jobs = [(self._writer, ())] if self.writes else []
        self._threads = start_threads(jobs + [(self._reader, (r,)) for r in range(self.n_readers)])
        return self

    def stop(self) -> None:
        stop_threads(self._stop, self._threads, self.timeout * (len(self.addresses) + 1) + 5)

    def _writer(self) -> None:
        conn = MultiAddress(self.addresses, self.collection, self.timeout)
        try:
            while not self._stop.is_set():
                ids = np.arange(self.next_id, self.next_id + self.write_batch, dtype=np.int64)
                x = vectors_for(ids, self.dim, self.seed)
                attempts = 0
                while not self._stop.is_set():  # same ids until acknowledged
                    attempts += 1
                    t_send = time.monotonic()

                    def fail(address, exc):
                        with self._lock:
                            self.log.write_failures.append(
                                Failure(time.monotonic(), address, f"{type(exc).__name__}: {exc}")
                            )

                    try:
                        _, address, _ = conn.call(
                            lambda c, x=x, ids=ids: c.add(x, ids=ids, upsert=True), fail
                        )
                    except Exception:  # noqa: BLE001 - all coordinators failed; logged by fail()
                        self._stop.wait(0.05)
                        continue
                    with self._lock:
                        self.log.acks.append(Ack(ids, t_send, time.monotonic(), address, attempts))
                    self.next_id += self.write_batch
                    break
                self._stop.wait(self.write_pause)
        finally:
            conn.close()

    def _reader(self, r: int) -> None:
        rng = np.random.default_rng([self.seed, 7919, r])
        conn = MultiAddress(self.addresses, self.collection, self.timeout)
        conn.current = r % len(self.addresses)
        try:
            while not self._stop.is_set():
                if self.read_ids is not None and len(self.read_ids):
                    qid = self.read_ids[rng.integers(len(self.read_ids))]
                else:
                    qid = self.id_start + rng.integers(max(1, self.next_id - self.id_start))
                q = vectors_for(np.array([qid]), self.dim, self.seed)
                failed_here = []
                try:
                    conn.call(
                        lambda c, q=q: c.search(q, self.k, **self.search_params),
                        lambda a, e, f=failed_here: f.append((a, e)),
                    )
                    with self._lock:
                        self.log.read_ok.append(time.monotonic())
                        self.log.read_retried += bool(failed_here)
                except Exception as exc:  # noqa: BLE001 - a failed read is what we count
                    with self._lock:
                        self.log.read_failures.append(
                            Failure(
                                time.monotonic(),
                                ",".join(a for a, _ in failed_here) or "?",
                                f"{type(exc).__name__}: {exc}",
                            )
                        )
                    self._stop.wait(0.05)
        finally:
            conn.close()

    # -- results
    def acked_ids(self) -> np.ndarray:
        with self._lock:
            parts = [a.ids for a in self.log.acks]
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def max_write_gap(self, after: float | None = None) -> float:
        """Longest time between consecutive acknowledgements (after monotonic ``after``)."""
        with self._lock:
            times = [a.t_ack for a in self.log.acks if after is None or a.t_ack >= after]
        return float(np.max(np.diff(times))) if len(times) > 1 else float("inf")

    def first_ack_after(self, t: float) -> Ack | None:
        with self._lock:
            return next((a for a in self.log.acks if a.t_send >= t), None)

    def series(self, bin_s: float = 1.0) -> dict[str, np.ndarray]:
        """Per-bin counts since start: ``t`` (bin start, s), ``writes`` (items acknowledged/s),
        ``reads`` (ok/s), ``read_failures`` and ``write_failures`` (per s)."""
        assert self.t0 is not None
        with self._lock:
            acks = [(a.t_ack, len(a.ids)) for a in self.log.acks]
            rok = list(self.log.read_ok)
            rf = [f.t for f in self.log.read_failures]
            wf = [f.t for f in self.log.write_failures]
        end = max(
            [time.monotonic() - self.t0]
            + [t - self.t0 for t, _ in acks]
            + [t - self.t0 for t in rok]
        )
        n = int(np.ceil(end / bin_s)) or 1
        edges = np.arange(n + 1) * bin_s

        def hist(ts, weights=None):
            return np.histogram(np.asarray(ts) - self.t0, bins=edges, weights=weights)[0] / bin_s

        return {
            "t": edges[:-1],
            "writes": hist([t for t, _ in acks], [w for _, w in acks]),
            "reads": hist(rok),
            "read_failures": hist(rf),
            "write_failures": hist(wf),
        }

    def verify(self, ids: np.ndarray | None = None, batch: int = 256) -> np.ndarray:
        """Search each id's own vector (k=1, ``search_params``) through the first coordinator that
        answers; returns the ids that did NOT come back as their own nearest neighbour."""
        ids = self.acked_ids() if ids is None else np.asarray(ids, np.int64)
        conn = MultiAddress(self.addresses, self.collection, max(self.timeout, 30.0))
        missing = []
        try:
            for s in range(0, len(ids), batch):
                chunk = ids[s : s + batch]
                q = vectors_for(chunk, self.dim, self.seed)
                res, _, _ = conn.call(lambda c, q=q: c.search(q, 1, **self.search_params))
                missing.extend(chunk[res.ids[:, 0] != chunk].tolist())
        finally:
            conn.close()
        return np.asarray(missing, np.int64)

    def summary(self) -> dict:
        with self._lock:
            return {
                "acked_batches": len(self.log.acks),
                "acked_ids": int(sum(len(a.ids) for a in self.log.acks)),
                "write_failures": len(self.log.write_failures),
                "reads_ok": len(self.log.read_ok),
                "reads_retried": self.log.read_retried,
                "read_failures": len(self.log.read_failures),
            }


def plot_series(
    series: dict[str, np.ndarray], events: Sequence[tuple[float, str]], path: str, title: str
) -> None:
    """Throughput over time (writes and reads per second) with vertical lines at ``events``
    (seconds since the load started, label)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3.6))
    ax.plot(series["t"], series["reads"], label="reads ok / s", color="tab:blue")
    ax.plot(series["t"], series["writes"], label="items written (acked) / s", color="tab:orange")
    if series["read_failures"].any():
        ax.plot(series["t"], series["read_failures"], label="failed reads / s", color="tab:red")
    for t, label in events:
        ax.axvline(t, color="grey", ls="--", lw=0.8)
        ax.text(t, ax.get_ylim()[1] * 0.97, " " + label, rotation=90, va="top", fontsize=8)
    ax.set_xlabel("time since load start (s)")
    ax.set_ylabel("per second")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
