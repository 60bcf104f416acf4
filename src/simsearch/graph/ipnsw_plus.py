"""ip-NSW+ (Liu et al., "Understanding and Improving Proximity Graph-based Maximum Inner
Product Search", AAAI 2020; docs/bench/graph.md): an angular HNSW graph finds a query's angular
neighbours, which seed a search on an inner-product graph."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import hnswlib
import numpy as np

from .. import _simd
from .._hnswlib import (
    hnswlib_from_saved,
    hnswlib_from_state,
    hnswlib_graph,
    hnswlib_state,
    relayout,
)
from .._kernels import bfs_order
from .._numba_util import available_cpus, kernel_width
from ..capabilities import Capabilities
from ..errors import InvalidParameterError
from ..index import (
    Index,
    SearchResult,
    check_int,
    check_restored,
    check_threads,
    register,
)
from ..planner import BeamFilterHooks, FilterPlanner
from . import _kernels as K
from ._quantized import MIN_TRAIN, QuantizedGraph, default_codebooks

log = logging.getLogger(__name__)


_CPUS = available_cpus()
# smaller indexes keep insertion order: the walk's arrays sit in the cache and the order made no
# difference (glove-50 100k: 1.01-1.06x; 400k: 1.1-1.2x; docs/bench/graph.md, "Items in walk
# order")
REORDER_MIN = 1 << 14

_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _resolve_threads(n_threads: int) -> int:
    return min(kernel_width(n_threads), _CPUS)  # capped by the process's width (--threads)


def run_blocks(fn: Callable[[int, int, int], Any], n_items: int, threads: int) -> list[Any]:
    """Run fn(lo, hi, block) over ``threads`` contiguous blocks of range(n_items), in parallel
    (the kernels release the GIL); the calling thread runs the first block. Python threads
    rather than numba's parallel layer: on this machine numba's OpenMP layer added ~40 ms per
    call, and an application's threading-layer choice stays its own."""
    global _executor
    threads = max(1, min(threads, n_items))
    step = -(-n_items // threads)
    bounds = [(b * step, min(n_items, (b + 1) * step), b) for b in range(threads)]
    if threads == 1:
        return [fn(*bounds[0])]
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(_CPUS, thread_name_prefix="simsearch-graph")
    futures = [_executor.submit(fn, *b) for b in bounds[1:]]
    first = fn(*bounds[0])
    return [first] + [f.result() for f in futures]


def insert_items(xb, links, degree, link_scores, start, stop, seeds, ef, n_links, batch,
                 visited, tags, threads) -> int:  # fmt: skip
    """Insert items start..stop-1 into the inner-product graph in batches of ``batch``: each
    item's seeded search (beam ``ef``) runs on the graph as it was before its batch
    (:func:`_kernels.search_phase`, on ``threads`` threads: rows of ``visited`` / ``tags``; the
    graph does not depend on them), then :func:`_kernels.link_phase` links the batch.
    ``seeds`` int32 (stop - start, s). Returns the distance computations."""
    ndis = 0
    for s in range(start, stop, batch):
        e = min(stop, s + batch)
        m = e - s
        cand_ids = np.empty((m, ef), np.int32)
        cand_scores = np.empty((m, ef), np.float32)
        cand_size = np.zeros(m, np.int64)
        sd = seeds[s - start : e - start]

        def block(lo, hi, b, s=s, sd=sd, cand_ids=cand_ids, cand_scores=cand_scores,
                  cand_size=cand_size):  # fmt: skip
            tags[b], nd = K.search_phase(lo, hi, xb, links, degree, s, sd, ef, visited[b],
                                         tags[b], cand_ids, cand_scores, cand_size)  # fmt: skip
            return nd

        ndis += sum(run_blocks(block, m, threads))
        ndis += K.link_phase(xb, links, degree, link_scores, s, e, n_links, cand_ids,
                             cand_scores, cand_size)  # fmt: skip
    return int(ndis)


# the quantized-graph arguments of _simd.graph_search when the walk scores codes one by one
_NO_QBLOCKS = (np.empty((0, 64), np.uint8), 1, np.empty((0, 2, 16), np.uint8),
               np.empty(0, np.float32), np.empty(0, np.float32), np.zeros(16, np.float32))


def sq8_encode(x: np.ndarray, vmin: np.ndarray, vstep: np.ndarray) -> np.ndarray:
    """8-bit codes of rows of x, x ~ vmin + vstep * code per dimension."""
    return np.clip(np.rint((x - vmin) / vstep), 0, 255).astype(np.uint8)


class _VisitedPool:
    """Reusable visited marks (one row of one-byte epochs per thread, and each row's last
    epoch), so a search allocates nothing of size n and concurrent searches never share one."""

    def __init__(self):
        self._lock = threading.Lock()
        self._free: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}

    def acquire(self, n_rows: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:
            free = self._free.get(n_rows, [])
            while free:
                vis, epochs = free.pop()
                if vis.shape[1] >= n:
                    return vis, epochs
        return np.zeros((n_rows, max(n, 1)), np.uint8), np.zeros(n_rows, np.uint8)

    def release(self, item: tuple[np.ndarray, np.ndarray]) -> None:
        with self._lock:
            self._free.setdefault(item[0].shape[0], []).append(item)


@register("ipnsw-plus")
class IPNSWPlus(BeamFilterHooks, FilterPlanner, Index):
    """ip-NSW+: maximum inner product search with two graphs over the same items.

    An angular graph (hnswlib HNSW under cosine) finds a query's angular neighbours; they seed
    a search on an inner-product graph (level 0 only, each item linked to its top ``M`` items
    by inner product, no pruning heuristic, at most 2M links per item keeping the largest
    inner products). Metric "ip" only.

    Parameters
    ----------
    dim, metric : "ip".
    M : inner-product graph links per item at insertion (the paper's M); items keep up to 2M.
    angular_M : links per node of the angular HNSW (its M; level 0 keeps 2M).
    ef_construction : beam of the inner-product graph search that finds a new item's links.
    angular_ef_construction : beam of the angular graph while building.
    n_build_seeds : angular neighbours of a new item used as seeds, found with a beam of that
        width. The paper takes up to 100; on 50k long-tailed items 16 gave the same recall
        (0.9785 vs 0.9787 at ef=10) for a fraction of the build work (docs/bench/graph.md).
    insert_batch : items inserted per batch. A batch's searches run in parallel on the graph
        as it was before the batch, and each item also considers the batch items before it
        exactly; 1 is the paper's one-by-one insertion. The graph does not depend on threads.
    seed : hnswlib's level-assignment seed.
    n_threads : threads used by add() (-1: all). With more than one thread hnswlib's angular
        graph, and so the index, may differ between runs.
    progress : show a tqdm bar while adding.
    sq8 : also keep 8-bit scalar-quantized copies of the vectors (per-dimension range, one byte
        a value) and walk both graphs on them; the beam's best ``rerank`` are then re-scored
        exactly. A quarter of the bytes read per distance, for d more bytes per item: the
        default, 1.5-2.4x the float walk's queries/s at equal recall (docs/benchmarks.md,
        "Defaults that are the fast paths"); False walks the float vectors.
    fast_scan : also keep a quantized graph: each node holds its neighbours' 4-bit NEQ codes
        in the fast-scan block layout, and the inner-product walk scores all of a node's
        neighbours with one compiled block scan (SymphonyQG's idea; docs/bench/graph.md, "The
        quantized graph"); each node is scored exactly on its float vector as it is expanded,
        and the answer is the best of those (``rerank`` does not apply). The codec trains on
        the items of the first add that brings the index to 256 items or more.
    fast_scan_codebooks : direction codebooks of those codes (default dim // 2, at most 255).
    reorder : lay the items out in walk order (:meth:`reorder`) whenever an add has doubled the
        index since the last time (from 16,384 items): 1.1-1.2x the queries/s at 400k items,
        1.2-1.4x at 1M, identical answers (docs/bench/graph.md, "Items in walk order").

    Search parameters: ``ef`` (beam of the inner-product search, default max(k, 64), raised to
    k), ``angular_ef`` (beam of the angular search and number of seeds, default 1),
    ``n_threads`` (default 1; -1 for all cores on a large batch), ``rerank`` (with sq8: beam
    entries re-scored exactly, default ef). The result's ``stats`` count the batch's distance
    computations: "angular", "ip" and "distances", their sum. A batch of queries runs
    in one call of the compiled kernel (simsearch._simd.graph_search; the numba kernel
    graph._kernels.query_block is its reference).

    Searches may run concurrently; writes (add, remove, save) are serialized. remove() marks
    items deleted: they still route searches but are never returned.

    >>> import numpy as np, simsearch as ss
    >>> x = np.random.default_rng(0).standard_normal((1000, 16)).astype("float32")
    >>> idx = ss.create_index("ipnsw-plus", 16, "ip", M=8, progress=False)
    >>> _ = idx.add(x)
    >>> r = idx.search(x[:2], k=5, ef=64)
    >>> r.ids.shape, r.stats["distances"] > 0         # distance computations, counted
    ((2, 5), True)
    """

    metrics = ("ip",)
    capabilities = Capabilities(
        search_params=frozenset({"ef", "angular_ef", "n_threads", "rerank"}))

    def __init__(
        self,
        dim: int,
        metric: str = "ip",
        M: int = 32,
        angular_M: int = 10,
        ef_construction: int = 100,
        angular_ef_construction: int = 100,
        n_build_seeds: int = 16,
        insert_batch: int = 64,
        seed: int = 0,
        n_threads: int = -1,
        progress: bool = True,
        sq8: bool = True,
        fast_scan: bool = False,
        fast_scan_codebooks: int | None = None,
        reorder: bool = True,
    ):
        M = check_int("M", M, 1, 1024)
        angular_M = check_int("angular_M", angular_M, 2, 1024)
        ef_construction = check_int("ef_construction", ef_construction, 1, 1 << 16)
        angular_ef_construction = check_int(
            "angular_ef_construction", angular_ef_construction, 1, 1 << 16
        )
        n_build_seeds = check_int("n_build_seeds", n_build_seeds, 1, 1 << 12)
        insert_batch = check_int("insert_batch", insert_batch, 1, 1 << 16)
        seed = check_int("seed", seed, 0)
        n_threads = check_threads(n_threads)
        for name, v in (("sq8", sq8), ("fast_scan", fast_scan), ("reorder", reorder)):
            if not isinstance(v, bool):
                raise InvalidParameterError(f"{name} must be a bool; got {v!r}")
        if fast_scan_codebooks is not None:
            fast_scan_codebooks = check_int("fast_scan_codebooks", fast_scan_codebooks, 1, 255)
        super().__init__(
            dim, metric, M=M, angular_M=angular_M, ef_construction=ef_construction,
            angular_ef_construction=angular_ef_construction, n_build_seeds=n_build_seeds,
            insert_batch=insert_batch, seed=seed, n_threads=n_threads, progress=bool(progress),
            sq8=sq8, fast_scan=fast_scan, fast_scan_codebooks=fast_scan_codebooks,
            reorder=reorder,
        )  # fmt: skip
        self._n = 0
        self._xb = np.empty((0, dim), np.float32)
        # with sq8: codes (rows as _xb) of x ~ vmin + vstep * code
        self._codes = np.empty((0, dim if sq8 else 0), np.uint8)
        self._vmin = np.zeros(dim, np.float32)
        self._vstep = np.zeros(dim, np.float32)
        self._inv_norm = np.empty(0, np.float32)
        self._pos_ids = np.empty(0, np.int64)  # position -> external id
        self._live = np.empty(0, np.bool_)
        self._links = np.empty((0, 2 * M), np.int32)
        self._degree = np.empty(0, np.int32)
        self._link_scores: np.ndarray | None = np.empty((0, 2 * M), np.float32)
        self._angular = self._new_angular(1024)
        self._agraph = hnswlib_graph(self._angular)
        self._pool = _VisitedPool()
        self._qgraph: QuantizedGraph | None = None  # with fast_scan, once trained
        self._laid_out = 0  # items at the last reorder
        self.build_seconds = 0.0

    # -- building -------------------------------------------------------------------------

    def _new_angular(self, capacity: int) -> hnswlib.Index:
        h = hnswlib.Index(space="cosine", dim=self.dim)
        h.init_index(max_elements=capacity, M=self._params["angular_M"],
                     ef_construction=self._params["angular_ef_construction"],
                     random_seed=self._params["seed"])  # fmt: skip
        return h

    def _grow(self, need: int) -> None:
        cap = self._xb.shape[0]
        if need <= cap:
            return
        cap = max(need, 2 * cap, 1024)
        n, width = self._n, self._links.shape[1]
        for name, shape, dt, fill in (
            ("_xb", (cap, self.dim), np.float32, 0),
            ("_codes", (cap, self._codes.shape[1]), np.uint8, 0),
            ("_inv_norm", (cap,), np.float32, 0),
            ("_pos_ids", (cap,), np.int64, -1),
            ("_live", (cap,), np.bool_, False),
            ("_links", (cap, width), np.int32, -1),
            ("_degree", (cap,), np.int32, 0),
            ("_link_scores", (cap, width), np.float32, -np.inf),
        ):
            new = np.full(shape, fill, dt)
            new[:n] = getattr(self, name)[:n]
            setattr(self, name, new)

    def _add(self, x: np.ndarray, ids: np.ndarray) -> None:
        p = self._params
        t0 = time.perf_counter()
        threads = _resolve_threads(p["n_threads"])
        n0, m = self._n, x.shape[0]
        if self._link_scores is None:  # after load: rebuilt on the first add
            self._link_scores = K.recompute_link_scores(
                self._xb[:n0], self._links[:n0], self._degree[:n0]
            )
        self._grow(n0 + m)
        self._xb[n0 : n0 + m] = x
        norms = np.linalg.norm(x, axis=1)
        # zero vectors have no direction: they sort last in the angular graph
        self._inv_norm[n0 : n0 + m] = np.where(norms > 0, 1.0 / np.maximum(norms, 1e-30), 0.0)
        if self._angular.get_max_elements() < n0 + m:
            self._angular.resize_index(max(n0 + m, 2 * self._angular.get_max_elements()))
        from tqdm.auto import tqdm

        # the quantized graph re-packs the rows that this add changes
        links_before = (self._links[:n0].copy(), self._degree[:n0].copy()) \
            if self._qgraph is not None else None
        vis = np.zeros((threads, n0 + m), np.int32)
        tags = np.zeros(threads, np.int64)
        ndis = 0
        with tqdm(total=m, desc="ip-NSW+ build", unit="item", leave=False,
                  disable=not p["progress"] or None) as bar:  # fmt: skip
            pos = n0
            while pos < n0 + m:
                # grow the angular graph in chunks of at most a quarter of what it holds, so
                # most of an item's angular neighbours are already in the inner-product graph
                end = min(n0 + m, pos + max(4096, pos // 4))
                chunk = x[pos - n0 : end - n0]
                self._angular.add_items(chunk, np.arange(pos, end), num_threads=threads)
                kk = min(p["n_build_seeds"], end)
                self._angular.set_ef(kk)  # a beam of n_build_seeds finds that many neighbours
                seeds = self._angular_neighbours(chunk, kk, threads)
                ndis += insert_items(
                    self._xb, self._links, self._degree, self._link_scores, pos, end, seeds,
                    p["ef_construction"], p["M"], p["insert_batch"], vis, tags, threads,
                )  # fmt: skip
                self._n = end
                bar.update(end - pos)
                pos = end
        self._pos_ids[n0 : n0 + m] = ids
        if self._params["sq8"]:
            self._encode_sq8(n0, n0 + m)
        if self._params["fast_scan"]:
            self._update_qgraph(n0, n0 + m, links_before)
        self._live[n0 : n0 + m] = True
        self._agraph = hnswlib_graph(self._angular)
        self._pool = _VisitedPool()
        if p["reorder"] and self._n >= max(REORDER_MIN, 2 * self._laid_out):
            relayout(self._reorder, self._n)
        dt = time.perf_counter() - t0
        self.build_seconds += dt
        log.info("ip-NSW+ added %d items in %.2f s (%.0f ip distances per item), %.1f MB",
                 m, dt, ndis / max(m, 1), self.memory_bytes() / 2**20)  # fmt: skip

    def _update_qgraph(self, start: int, stop: int, before) -> None:
        """Codes for positions start..stop-1 and blocks for every node whose links changed
        (all of them when the codec is trained now)."""
        if self._qgraph is None:
            if stop < MIN_TRAIN:
                return
            p = self._params
            m = p["fast_scan_codebooks"] or default_codebooks(self.dim)
            self._qgraph = QuantizedGraph.train(self._xb[:stop], m, self._links.shape[1],
                                                p["seed"])  # fmt: skip
            start, before = 0, None
        g = self._qgraph
        g.encode(self._xb[start:stop], start)
        links, degree = self._links[:stop], self._degree[:stop]
        changed = np.arange(start, stop)
        if before is not None:
            old_links, old_degree = before
            n0 = len(old_degree)
            diff = (old_degree != degree[:n0]) | np.any(old_links != links[:n0], axis=1)
            changed = np.concatenate([np.flatnonzero(diff), changed])
        g.repack(changed, links, degree)
        g.grow(len(self._links))  # the walk may read any position below the capacity

    def _encode_sq8(self, start: int, stop: int) -> None:
        """Codes for positions start..stop-1; when they widen a dimension's range every code is
        re-encoded (values are never clipped). A widened side gets a quarter of the range as
        headroom: values that keep growing (a stream of adds) re-encode a logarithmic number
        of times, not at every add."""
        new = self._xb[start:stop]
        lo, hi = new.min(axis=0), new.max(axis=0)
        if start:
            old_lo, old_hi = self._vmin, self._vmin + 255.0 * self._vstep
            if np.all(lo >= old_lo) and np.all(hi <= old_hi):
                self._codes[start:stop] = sq8_encode(new, self._vmin, self._vstep)
                return
            room = 0.25 * (np.maximum(hi, old_hi) - np.minimum(lo, old_lo))
            lo = np.where(lo < old_lo, lo - room, old_lo)
            hi = np.where(hi > old_hi, hi + room, old_hi)
        vstep = np.maximum(hi - lo, 1e-30).astype(np.float32) / np.float32(255.0)
        codes = sq8_encode(self._xb[:stop], lo.astype(np.float32), vstep)
        # searches in flight read (codes, vmin, vstep) together: publish a new array
        new_codes = self._codes.copy()
        new_codes[:stop] = codes
        self._codes, self._vmin, self._vstep = new_codes, lo.astype(np.float32), vstep

    def reorder(self) -> None:
        """Lay the items out in breadth-first order of the inner-product graph from the angular
        graph's entry, so a walk's neighbours sit near each other in memory (docs/bench/graph.md,
        "Items in walk order"). Ids and answers are unchanged. ``add`` does it by itself each
        time the index has doubled (``reorder=True``); items added since stay in insertion
        order, which this call mends. A write: searches wait. It holds a second copy of the
        index while it runs (as growing the arrays does), so a failure leaves the old layout."""
        with self._lock.write():
            self._reorder()
            self._version += 1  # positions moved: the filter planner's id lookup is stale

    def _reorder(self) -> None:
        n = self._n
        if n > 1:
            self._permute(bfs_order(self._links[:n], self._degree[:n],
                                      int(self._agraph["entry"])))
        self._laid_out = n

    def _permute(self, order: np.ndarray) -> None:
        """Move the item at position ``order[i]`` to position i, in every per-item array and
        in both graphs (links renumbered, the angular graph relabelled). Everything is built
        first and swapped in at the end: a failure half-way (out of memory) leaves the index as
        it was."""
        n = self._n
        new_pos = np.empty(n, np.int32)
        new_pos[order] = np.arange(n, dtype=np.int32)
        new = {}
        for name in ("_xb", "_codes", "_inv_norm", "_pos_ids", "_live", "_degree", "_links",
                     "_link_scores"):
            a = getattr(self, name)
            if a is not None:
                new[name] = b = a.copy()  # the capacity past n comes along
                b[:n] = a[order]
        links = new["_links"][:n]
        links[...] = np.where(links >= 0, new_pos[np.maximum(links, 0)], -1)
        qgraph = None if self._qgraph is None else self._qgraph.permuted(order)
        meta, arrays = hnswlib_state(self._angular)  # copies: relabelled here, then loaded
        lo, spe = meta["label_offset"], meta["size_data_per_element"]
        data = arrays["data_level0"].view(np.uint8).reshape(-1, spe)
        labels = np.ascontiguousarray(data[:, lo : lo + 8]).view(np.uint64)[:, 0]
        data[:, lo : lo + 8] = new_pos[labels.astype(np.int64)].astype(np.uint64)[:, None].view(
            np.uint8)
        ext = arrays["label_lookup_external"]
        arrays["label_lookup_external"] = new_pos[ext.astype(np.int64)].astype(np.uint64)
        angular = hnswlib_from_state(meta, arrays, positional_labels=True)
        agraph = hnswlib_graph(angular)
        for name, a in new.items():
            setattr(self, name, a)
        self._qgraph, self._angular, self._agraph = qgraph, angular, agraph
        self._pool = _VisitedPool()

    def _angular_neighbours(self, x: np.ndarray, k: int, threads: int) -> np.ndarray:
        """Positions int32 (n, k) of x's angular neighbours (-1 padding). hnswlib raises when
        its beam finds fewer than k items (tiny or disconnected graphs): retry with a smaller k."""
        while True:
            try:
                nbr, _ = self._angular.knn_query(x, k=k, num_threads=threads)
                return np.ascontiguousarray(nbr.astype(np.int32))
            except RuntimeError:
                if k == 1:
                    return np.full((x.shape[0], 1), -1, np.int32)
                k = max(1, k // 2)

    def _remove(self, ids: np.ndarray) -> None:
        n = self._n
        hit = np.isin(self._pos_ids[:n], ids) & self._live[:n]
        live = self._live.copy()  # searches in flight keep a consistent mask
        live[:n][hit] = False
        self._live = live

    def memory_bytes(self) -> int:
        """Bytes held: vectors, both graphs (hnswlib's copy of the unit vectors included),
        ids, and the build-time link scores."""
        n = self._n
        parts = (self._xb, self._codes, self._inv_norm, self._pos_ids, self._live, self._links,
                 self._degree)
        own = sum(a[:n].nbytes for a in parts)
        own += sum(v.nbytes for v in self._agraph.values() if isinstance(v, np.ndarray))
        if self._link_scores is not None:
            own += self._link_scores[:n].nbytes
        if self._qgraph is not None:
            own += self._qgraph.nbytes(n)
        return int(own + self._angular.index_file_size())

    # -- searching ------------------------------------------------------------------------

    def _search(
        self,
        q: np.ndarray,
        k: int,
        ef: int | None = None,
        angular_ef: int = 1,
        n_threads: int = 1,
        rerank: int | None = None,
    ) -> SearchResult:
        ef = max(k, 64) if ef is None else max(check_int("ef", ef, 1, 1 << 20), k)
        rerank = ef if rerank is None else check_int("rerank", rerank, 0, 1 << 20)
        # a beam wider than the graph finds nothing more (removed nodes are in the graph)
        ef = min(ef, max(self._n, k))
        angular_ef = check_int("angular_ef", angular_ef, 1, 1 << 16)
        threads = min(_resolve_threads(check_threads(n_threads)), q.shape[0])
        # links first: _grow publishes them last, so the vectors read next are as new
        links, degree = self._links, self._degree
        g, nq = self._agraph, q.shape[0]
        codes, vmin, vstep = self._codes, self._vmin, self._vstep
        xb, inv_norm, live = self._xb, self._inv_norm, self._live
        n = min(len(links), len(xb), len(codes) if codes.shape[1] else len(xb))
        pos = np.empty((nq, k), np.int32)
        scores = np.empty((nq, k), np.float32)
        ndis = np.zeros((nq, 2), np.int64)
        qg, quantized = self._qgraph, _NO_QBLOCKS
        if qg is not None:
            quantized = (qg.blocks, qg.per_node, *qg.tables(q), qg.codec.norm_codebook)
        vis, epochs = item = self._pool.acquire(threads, n)
        try:
            _simd.graph_search(q, k, ef, angular_ef, rerank, xb[:n], codes[:n], vmin, vstep,
                               inv_norm, live.view(np.uint8), g["links0"], g["degree0"],
                               g["upper_links"], g["upper_degree"], g["upper_start"], g["entry"],
                               g["max_level"], links[:n], degree[:n], *quantized, vis,
                               epochs, pos, scores, ndis, threads)  # fmt: skip
        finally:
            self._pool.release(item)
        ids = np.where(pos >= 0, self._pos_ids[np.maximum(pos, 0)], -1)
        a, b = (int(v) for v in ndis.sum(0))
        return SearchResult(ids, scores, stats={"angular": a, "ip": b, "distances": a + b})

    def search_reference(self, q: np.ndarray, k: int, ef: int, sq8: bool | None = None,
                         rerank: int | None = None) -> SearchResult:
        """The walk through the numba kernel (graph._kernels.query_block), one thread, angular_ef
        1: the reference the compiled kernel is tested and measured against. ``sq8`` (default:
        as the index walks) walks on the decoded 8-bit codes and re-scores the beam's best
        ``rerank`` (default ef) exactly."""
        q = np.ascontiguousarray(q, np.float32)
        sq8 = self._params["sq8"] if sq8 is None else sq8
        g, n = self._agraph, self._links.shape[0]
        ef = max(ef, k)
        depth = k
        xb = self._xb
        if sq8:
            xb = (self._vmin + self._vstep * self._codes[:n].astype(np.float32)).astype(np.float32)
            depth = min(ef, max(k, ef if rerank is None else rerank))
        pos = np.empty((len(q), depth), np.int32)
        sc = np.empty((len(q), depth), np.float32)
        nd = np.zeros((len(q), 2), np.int64)
        K.query_block(0, len(q), q, depth, ef, 1, xb, self._inv_norm, self._live,
                      g["links0"], g["degree0"], g["upper_links"], g["upper_degree"],
                      g["upper_start"], g["entry"], g["max_level"], self._links, self._degree,
                      np.zeros(n, np.int32), 0, pos, sc, nd)  # fmt: skip
        if sq8:  # exact scores of the beam's best, best first
            exact = np.einsum("qd,qkd->qk", q, self._xb[np.maximum(pos, 0)])
            exact = np.where(pos >= 0, exact, -np.inf).astype(np.float32)
            order = np.argsort(-exact, axis=1, kind="stable")[:, :k]
            pos, sc = np.take_along_axis(pos, order, 1), np.take_along_axis(exact, order, 1)
        ids = np.where(pos >= 0, self._pos_ids[np.maximum(pos, 0)], -1)
        return SearchResult(ids, sc)

    # filtered search (docs/filters.md): the beam widens by 1/selectivity and walks through
    # disallowed nodes; only allowed ones are kept
    filter_read_cost = 32.0  # measured: docs/filters.md, "The planner"

    def _stored(self) -> tuple[np.ndarray, np.ndarray]:
        n = self._n
        return np.where(self._live[:n], self._pos_ids[:n], -1), self._xb[:n]

    # -- persistence ----------------------------------------------------------------------

    def _get_state(self):
        n = self._n
        hmeta, harrays = hnswlib_state(self._angular)
        return {"angular": hmeta}, {
            "x": self._xb[:n], "pos_ids": self._pos_ids[:n], "live": self._live[:n],
            "links": self._links[:n], "degree": self._degree[:n],
            **{f"angular.{k}": v for k, v in harrays.items()},
            **({f"qgraph.{k}": v for k, v in self._qgraph.to_arrays(n).items()}
               if self._qgraph is not None else {}),
        }  # fmt: skip

    def _set_state(self, meta, arrays):
        x = np.array(arrays["x"], np.float32)
        n = x.shape[0]
        links = np.array(arrays["links"], np.int32)
        degree = np.array(arrays["degree"], np.int32)
        if x.shape != (n, self.dim) or arrays["live"].dtype != np.bool_:
            raise ValueError("stored vectors do not match the index's dimension")
        check_restored(self._idset.sorted, np.asarray(arrays["pos_ids"])[arrays["live"]])
        if (links.shape != (n, 2 * self._params["M"]) or degree.shape != (n,)
                or arrays["pos_ids"].shape != (n,) or arrays["live"].shape != (n,)
                or (n and (degree.min() < 0 or degree.max() > links.shape[1]))):  # fmt: skip
            raise ValueError("inconsistent inner-product graph arrays")
        valid = np.arange(links.shape[1])[None, :] < degree[:, None]
        if n and (links[valid].min(initial=0) < 0 or links[valid].max(initial=0) >= n):
            raise ValueError("inner-product graph links out of range")
        if "angular" in arrays:  # a file from before hnswlib's state was kept as arrays
            h = hnswlib_from_saved(arrays["angular"], "cosine", self.dim, int(meta["capacity"]),
                                   positional_labels=True)
        else:
            h = hnswlib_from_state(meta["angular"], {k[8:]: v for k, v in arrays.items()
                                                     if k.startswith("angular.")},
                                   positional_labels=True)
        if h.space != "cosine" or h.dim != self.dim:
            raise ValueError("the angular graph's space or dim does not match the index")
        if h.get_current_count() != n:
            raise ValueError("angular graph and vectors disagree on the item count")
        self._angular = h
        self._n = 0
        self._xb = x
        self._links, self._degree = links, degree
        norms = np.linalg.norm(x, axis=1)
        self._inv_norm = np.where(norms > 0, 1.0 / np.maximum(norms, 1e-30), 0.0).astype(
            np.float32
        )
        self._pos_ids = np.array(arrays["pos_ids"], np.int64)
        self._live = np.array(arrays["live"], np.bool_)
        self._link_scores = None
        self._codes = np.zeros((n, self.dim if self._params["sq8"] else 0), np.uint8)
        if self._params["sq8"] and n:
            self._encode_sq8(0, n)
        self._qgraph = None
        if self._params.get("fast_scan"):
            saved = {k[7:]: v for k, v in arrays.items() if k.startswith("qgraph.")}
            if saved:
                self._qgraph = QuantizedGraph.from_arrays(saved, self.dim, links.shape[1], links,
                                                          degree)
            else:  # saved before it was trained (or without one): train now
                self._n = n
                self._update_qgraph(0, n, None)
        self._n = self._laid_out = n
        self._agraph = hnswlib_graph(h)
        self._pool = _VisitedPool()
