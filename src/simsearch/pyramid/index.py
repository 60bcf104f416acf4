"""PyramidIndex: k-means centres, a meta-HNSW over them, a balanced graph partition of its
level-0 graph into parts, one sub-index per part, MIPS top-r replication (docs/cluster.md).

The paper: Deng et al., "Pyramid: A General Framework for Distributed Similarity Search on
Large-scale Datasets" (IEEE Big Data 2019).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from .._kernels import merge_topk
from ..errors import InvalidParameterError, SimsearchError, UnsupportedOperationError
from ..filters import IdFilter
from ..hnsw import HNSWIndex
from ..index import (
    Index,
    Searchable,
    SearchResult,
    check_int,
    create_index,
    higher_is_better,
    index_class,
    loads,
    normalize_rows,
    register,
)

log = logging.getLogger(__name__)

#: sub-index kinds a part may not be (a pyramid of pyramids is not supported)
_FORBIDDEN_SUB = {"pyramid"}
#: rows of a batch scored against all centres at once while updating the MIPS lists
_MIPS_CHUNK = 4096
#: committed part writes remembered per part (first, through, ballot term, ballot attempt): a
#: replica that missed the commits of up to this many writes applies them from its prepared ops
PART_HISTORY = 16


class PartUnavailableError(SimsearchError, RuntimeError):
    """No replica of a part answered (in time)."""

    grpc_code = "UNAVAILABLE"  # how a coordinator reports it (simsearch.service.errors)

#: Makes the parts of a PyramidIndex: called with (index, n_parts), returns ``(parts,
#: search_many)``: objects searched like an Index (``search``, ``len``), and the function that
#: runs ``[(part, queries, params)]`` searches at once, giving a result or a
#: PartUnavailableError per call (hedging, deadlines and per-query parameters live there). A
#: coordinator sets ``index.parts_factory`` before training or restoring so the same index routes
#: to remote replicas, whose writes it sends itself (``defer_writes``; docs/cluster.md).
PartsFactory = Callable[["PyramidIndex", int], tuple[list, Callable]]


# ---------------------------------------------------------------------------------------------
# building blocks


def hnsw_level0_graph(meta: HNSWIndex) -> np.ndarray:
    """The level-0 graph of an hnswlib-backed HNSWIndex as (n, max_m0) int64 neighbour labels,
    -1 padded, rows ordered by label (labels must be 0..n-1)."""
    g = meta.graph()
    if len(g["links0"]) != len(meta):
        raise RuntimeError("unexpected hnswlib layout: labels are not 0..n-1")
    return g["links0"].astype(np.int64)


def _restore_part(data: np.ndarray, cls: type, what: str) -> Index:
    idx = loads(data)
    if not isinstance(idx, cls):
        raise ValueError(f"{what} holds a {type(idx).__name__}, not a {cls.__name__}")
    return idx


def _check_router_arrays(idx: PyramidIndex, meta: dict, arrays: dict) -> None:
    """ValueError unless a restored router is consistent: shapes from the parameters, parts in
    range, every held id homed once, lists and copies naming held ids (a crafted file must
    not send a search or a write out of bounds)."""
    c, w, ids = idx._params["n_centers"], idx.n_parts, idx.ids()
    centres, poc = arrays["centres"], arrays["part_of_centre"]
    if centres.shape != (c, idx.dim) or centres.dtype != np.float32 or poc.shape != (c,) \
            or poc.dtype.kind not in "iu" or (c and (poc.min() < 0 or poc.max() >= w)):
        raise ValueError("router centres or their parts do not match the parameters")
    if len(idx.meta) != c or not np.array_equal(idx.meta.ids(), np.arange(c)):
        raise ValueError("the meta-HNSW does not index the centres")
    shape = meta.get("topr_shape")
    r = idx._params["mips_replicas"] if idx.uses_mips_copies else 0
    if shape != [c, r] or arrays["topr_ids"].size != c * r or arrays["topr_scores"].size != c * r:
        raise ValueError("router MIPS lists do not match the parameters")
    topr = arrays["topr_ids"]
    listed = topr[topr >= 0]
    if (topr < -1).any() or not np.isin(listed, ids).all():
        raise ValueError("router MIPS lists name ids the index does not hold")
    hid, hp = arrays["home_ids"], arrays["home_parts"]
    if hid.shape != hp.shape or not np.array_equal(np.sort(hid), ids) or \
            (hp.size and (hp.min() < 0 or hp.max() >= w)):
        raise ValueError("router homes do not place every held id once in a part")
    copies = arrays["copies"]
    if copies.size % 2:
        raise ValueError("router copies are not (id, part) pairs")
    pairs = copies.reshape(-1, 2)
    if pairs.size and (not np.isin(pairs[:, 0], ids).all() or pairs[:, 1].min() < 0
                       or pairs[:, 1].max() >= w):
        raise ValueError("router copies name ids it does not hold or parts it does not have")
    if "part_seq" in arrays and (arrays["part_seq"].shape != (w,)
                                 or arrays["part_history"].size % (4 * w)):
        raise ValueError("router part sequences do not match the parts")


def undirected_csr(nbrs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A directed neighbour table (n, deg), -1 padded, as an undirected simple graph in CSR form
    (xadj (n+1,), adjncy), both directions stored, no self-loops or repeated edges."""
    n = nbrs.shape[0]
    src = np.repeat(np.arange(n), nbrs.shape[1])
    dst = nbrs.ravel()
    keep = (dst >= 0) & (dst != src)
    src, dst = src[keep], dst[keep]
    a = np.concatenate([src, dst])
    b = np.concatenate([dst, src])
    key = np.unique(a * n + b)
    a, b = key // n, key % n
    xadj = np.zeros(n + 1, np.int64)
    np.add.at(xadj, a + 1, 1)
    return np.cumsum(xadj), b.astype(np.int64)


def similarity_edge_weights(xadj: np.ndarray, adjncy: np.ndarray, centres: np.ndarray,
                            tau: float) -> np.ndarray:
    """Integer METIS edge weights exp((s - s_max) / tau) * 1000 (at least 1) for the inner
    product s of unit centres: cutting between very close centres costs most."""
    src = np.repeat(np.arange(xadj.shape[0] - 1), np.diff(xadj))
    sim = np.einsum("ij,ij->i", centres[src], centres[adjncy])
    return np.maximum(1, np.round(1000 * np.exp((sim - sim.max()) / tau))).astype(np.int64)


def partition_graph(
    xadj: np.ndarray, adjncy: np.ndarray, weights: np.ndarray, n_parts: int, seed: int = 0,
    edge_weights: np.ndarray | None = None,
) -> np.ndarray:
    """Balanced k-way partition with METIS (pymetis): parts of near-equal total vertex weight,
    few cut edges (or little cut edge weight). Returns int64 (n,) part per vertex."""
    n = xadj.shape[0] - 1
    if n_parts == 1:
        return np.zeros(n, np.int64)
    import pymetis

    opts = pymetis.Options(seed=seed)
    _, parts = pymetis.part_graph(
        n_parts, pymetis.CSRAdjacency(xadj.tolist(), adjncy.tolist()),
        vweights=[int(w) for w in weights], options=opts,
        eweights=None if edge_weights is None else edge_weights.tolist(),
    )
    return np.asarray(parts, np.int64)


# ---------------------------------------------------------------------------------------------
# the index


@register("pyramid")
class PyramidIndex(Index):
    """Pyramid: partitioned search routed by a meta-HNSW over k-means centres.

    Parameters
    ----------
    dim, metric : "ip" (MIPS; partitioned by direction), "cosine" or "l2".
    n_centers : k-means centres (the paper's m; 10,000 at scale), nodes of the meta-HNSW.
    n_partitions : parts (the paper's w; one per machine), each with its own sub-index.
    sample_size : items k-means trains on (default: all rows given to ``train``, at most
        ``100 * n_centers``).
    mips_replicas : for metric "ip", each centre's top-r items by inner product are also
        stored in that centre's part (the paper's r); 0 turns it off. Ignored otherwise.
    sub_index : index kind of each part (e.g. "hnsw", "flat").
    seed : k-means, sampling, meta-HNSW and partitioner seed.
    meta_M : links per node of the meta-HNSW.
    edge_tau : for "ip"/"cosine", METIS edge weights exp((s - s_max) / edge_tau) by the
        similarity s of linked centres, so very close centres stay together (measured on
        glove-50: 12% fewer parts per query at equal recall); 0 cuts edges unweighted (always
        so for "l2").
    **sub_params : build parameters of each part's sub-index.

    Search parameters: ``branching`` (the paper's K: how many nearest centres route the query;
    default 10), ``meta_ef`` (meta-HNSW beam, default max(2K, 32)), ``require_complete``
    (default True: raise when a part cannot answer; False returns partial results flagged with
    ``coverage``), ``part_effort`` ("uniform", the default: every asked part searches with
    the sub-index's ``ef``; "share": the query's primary part, the one holding most of its
    routed centres, and parts with more than half that share search with ``ef``, a part with
    a share ratio in (2^-(j+1), 2^-j] with ef / 2^j (j <= 3), at least ``min_ef``, default k;
    measured on glove-50 it saves less work than it loses recall, see docs/bench-pyramid.md),
    ``min_ef`` and the sub-index's own (e.g. ``ef``).

    Items go to the part of their nearest centre (for "ip"/"cosine": nearest in direction).
    A MIPS copy is kept while the item stays in its centre's top-r; removing an item does not
    refill the lists. Searches may run concurrently; writes are serialized.
    """

    needs_training = True
    search_params = frozenset({"branching", "meta_ef", "require_complete", "part_effort",
                               "min_ef"})

    def __init__(
        self,
        dim: int,
        metric: str = "l2",
        n_centers: int = 1000,
        n_partitions: int = 4,
        sample_size: int | None = None,
        mips_replicas: int = 300,
        sub_index: str = "hnsw",
        seed: int = 0,
        meta_M: int = 16,
        edge_tau: float = 0.1,
        **sub_params: Any,
    ):
        n_centers = check_int("n_centers", n_centers, 1, 1 << 22)
        n_partitions = check_int("n_partitions", n_partitions, 1, 4096)
        if n_partitions > n_centers:
            raise InvalidParameterError(
                f"n_partitions must be <= n_centers; got n_partitions={n_partitions}, "
                f"n_centers={n_centers}"
            )
        if sample_size is not None:
            sample_size = check_int("sample_size", sample_size, 1)
        mips_replicas = check_int("mips_replicas", mips_replicas, 0, 1 << 20)
        seed = check_int("seed", seed, 0)
        meta_M = check_int("meta_M", meta_M, 2, 256)
        if isinstance(edge_tau, bool) or not isinstance(edge_tau, (int, float)) or not (
            0 <= edge_tau <= 10
        ):
            raise InvalidParameterError(f"edge_tau must be a number in [0, 10]; got {edge_tau!r}")
        if not isinstance(sub_index, str) or sub_index in _FORBIDDEN_SUB:
            raise InvalidParameterError(
                f"sub_index must be an index kind other than 'pyramid'; got {sub_index!r}"
            )
        sub_cls = index_class(sub_index)
        if sub_cls.needs_training:
            raise InvalidParameterError(
                f"sub_index must not need training; {sub_index!r} does"
            )
        super().__init__(
            dim, metric, n_centers=n_centers, n_partitions=n_partitions,
            sample_size=sample_size, mips_replicas=mips_replicas, sub_index=sub_index, seed=seed,
            meta_M=meta_M, edge_tau=edge_tau, **sub_params,
        )
        create_index(sub_index, dim, metric, **sub_params)  # validates sub_params now
        self.sub_params = dict(sub_params)
        self.sub_index = sub_index  # the parts' index kind (a cluster creates them remotely)
        # "where" goes to remote parts, which hold the attributes (docs/filters.md)
        self.search_params = PyramidIndex.search_params | sub_cls.search_params | {"where"}
        self._sub_search = frozenset(sub_cls.search_params)
        self.spherical = metric in ("ip", "cosine")
        self.centres: np.ndarray | None = None
        self.part_of_centre: np.ndarray | None = None
        self.meta: HNSWIndex | None = None
        self.parts: list[Searchable] = []
        self.parts_factory: PartsFactory | None = None  # None: local sub-indexes
        self._home: dict[int, int] = {}  # id -> part of its nearest centre
        #: id -> parts holding a MIPS copy; each set is replaced whole, never changed in place,
        #: so a lock-free search iterating one reads it from start to end
        self._copies: dict[int, frozenset[int]] = {}
        self._topr_ids: np.ndarray | None = None  # (m, r) MIPS lists, -1 padded
        self._topr_scores: np.ndarray | None = None
        self._search_many: Callable | None = None  # remote parts' fan-out (PartsFactory)
        #: names the parts' collections when they are remote (the coordinator sets it)
        self.part_prefix: str | None = None
        #: the attribute schema the remote parts' collections are created with
        self.part_schema: dict | None = None
        self.part_incarnation = ""  # of the cluster collection whose parts these are
        #: when a list, every write appends its decisions here (see ``apply_journal``)
        self.journal: list | None = None
        #: when a list, writes append their part jobs ``(part, "add" | "remove", args)`` here
        #: instead of running them: a cluster's leader sends them itself (fenced, two-phase;
        #: docs/cluster.md "Writes") while searches go on
        self.defer_writes: list | None = None

    # -- properties -------------------------------------------------------------------------

    @property
    def n_parts(self) -> int:
        return self._params["n_partitions"]

    @property
    def uses_mips_copies(self) -> bool:
        return self.metric == "ip" and self._params["mips_replicas"] > 0

    def part_sizes(self) -> np.ndarray:
        """Items stored per part, MIPS copies included (the router's count)."""
        out = np.bincount(np.fromiter(self._home.values(), np.int64, len(self._home)),
                          minlength=self.n_parts)
        for ps in self._copies.values():
            for p in ps:
                out[p] += 1
        return out

    # -- training ---------------------------------------------------------------------------

    def _new_parts(self) -> list:
        if self.parts_factory is not None:
            parts, self._search_many = self.parts_factory(self, self.n_parts)
            # remote parts: a write only plans here (in memory) and replaces what a search reads
            self.lock_free_search = True
            return parts
        p = self._params
        return [create_index(p["sub_index"], self.dim, self.metric, **self.sub_params)
                for _ in range(self.n_parts)]

    def _centre_space(self, x: np.ndarray) -> np.ndarray:
        return normalize_rows(x) if self.spherical else x

    def _train(self, x: np.ndarray) -> None:
        import faiss

        p = self._params
        rng = np.random.default_rng(p["seed"])
        m = p["n_centers"]
        limit = p["sample_size"] or 100 * m
        sample = x[rng.choice(x.shape[0], limit, replace=False)] if x.shape[0] > limit else x
        if sample.shape[0] < m:
            raise InvalidParameterError(
                f"training needs at least n_centers={m} vectors; got {sample.shape[0]}"
            )
        sample = self._centre_space(np.ascontiguousarray(sample, np.float32))
        km = faiss.Kmeans(self.dim, m, niter=20, seed=p["seed"], spherical=self.spherical,
                          verbose=False, min_points_per_centroid=1)
        km.train(sample)
        centres = np.ascontiguousarray(km.centroids, np.float32)
        if self.spherical:
            norms = np.linalg.norm(centres, axis=1, keepdims=True)
            centres = np.where(norms > 0, centres / np.maximum(norms, 1e-30), centres)
        # cluster sizes on the sample weight the partition (parts balanced by items, not centres)
        sizes = np.bincount(self._nearest_centre(sample, centres), minlength=m)
        self._set_model(centres, self._partition(centres, sizes))
        log.info("pyramid: %d centres in %d parts (sizes %s)", m, self.n_parts,
                 np.bincount(self.part_of_centre, weights=sizes, minlength=self.n_parts))

    def _build_meta(self, centres: np.ndarray) -> HNSWIndex:
        meta = HNSWIndex(self.dim, "ip" if self.spherical else "l2", M=self._params["meta_M"],
                         ef_construction=200, seed=self._params["seed"], n_threads=1,
                         capacity=max(1, centres.shape[0]))
        meta.add(centres)
        return meta

    def _partition(self, centres: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        meta = self._build_meta(centres)
        xadj, adjncy = undirected_csr(hnsw_level0_graph(meta))
        self.meta = meta
        tau = self._params["edge_tau"]
        ew = similarity_edge_weights(xadj, adjncy, centres, tau) if tau and self.spherical \
            else None
        return partition_graph(xadj, adjncy, sizes + 1, self.n_parts, self._params["seed"], ew)

    def _set_model(self, centres: np.ndarray, part_of_centre: np.ndarray) -> None:
        self.centres = centres
        self.part_of_centre = part_of_centre.astype(np.int64)
        if self.meta is None:
            self.meta = self._build_meta(centres)
        self.parts = self._new_parts()
        self._home, self._copies = {}, {}
        self._refs: dict[int, dict[int, int]] = {}  # id -> {part: centres there listing it}
        self._counts = np.zeros(self.n_parts, np.int64)
        #: per part: the last committed part write sequence, and the last PART_HISTORY
        #: committed writes (first, through, ballot term, ballot attempt), oldest first
        self.part_seq = np.zeros(self.n_parts, np.int64)
        self.part_history = np.zeros((self.n_parts, PART_HISTORY, 4), np.int64)
        r = self._params["mips_replicas"] if self.uses_mips_copies else 0
        self._topr_ids = np.full((centres.shape[0], r), -1, np.int64)
        self._topr_scores = np.full((centres.shape[0], r), -np.inf, np.float32)

    def _nearest_centre(self, x: np.ndarray, centres: np.ndarray | None = None) -> np.ndarray:
        import faiss

        centres = self.centres if centres is None else centres
        flat = faiss.IndexFlatIP(self.dim) if self.spherical else faiss.IndexFlatL2(self.dim)
        flat.add(centres)
        _, idx = flat.search(np.ascontiguousarray(x, np.float32), 1)
        return idx[:, 0].astype(np.int64)

    # -- writes -----------------------------------------------------------------------------

    def plan_add(self, x: np.ndarray, ids: np.ndarray):
        """Decide where a batch goes: (home part per row, copies to add [(part, rows)],
        copies to drop [(part, ids)], new MIPS lists). Changes nothing."""
        home = self.part_of_centre[self._nearest_centre(self._centre_space(x))]
        if not self.uses_mips_copies:
            return home, [], [], None
        r = self._topr_ids.shape[1]
        t_ids, t_scores = self._topr_ids.copy(), self._topr_scores.copy()
        for s in range(0, x.shape[0], _MIPS_CHUNK):
            xs, ids_s = x[s : s + _MIPS_CHUNK], ids[s : s + _MIPS_CHUNK]
            sc = (xs @ self.centres.T).T  # (m, n): inner product with each centre's direction
            all_s = np.concatenate([t_scores, sc.astype(np.float32)], axis=1)
            all_i = np.concatenate([t_ids, np.broadcast_to(ids_s, sc.shape)], axis=1)
            if all_s.shape[1] > r:
                sel = np.argpartition(-all_s, r - 1, axis=1)[:, :r]
                t_scores = np.take_along_axis(all_s, sel, 1)
                t_ids = np.take_along_axis(all_i, sel, 1)
            else:
                t_scores, t_ids = all_s, all_i
        row_of = {int(i): j for j, i in enumerate(ids.tolist())}
        new_home = dict(zip(ids.tolist(), home.tolist(), strict=True))
        # only the lists that changed can change the copies: count, per (item, part), how many
        # of the part's centres list the item (a copy lives while the count is > 0)
        old = self._topr_ids
        changed = np.flatnonzero((np.sort(old, 1) != np.sort(t_ids, 1)).any(1))
        delta: dict[tuple[int, int], int] = {}
        for c in changed.tolist():
            p = int(self.part_of_centre[c])
            o, n = set(old[c].tolist()), set(t_ids[c].tolist())
            for i, d in [(i, 1) for i in n - o] + [(i, -1) for i in o - n]:
                if i >= 0 and new_home.get(i, self._home.get(i)) != p:
                    delta[(i, p)] = delta.get((i, p), 0) + d
        add_pairs, drop_pairs = [], []
        for (i, p), d in sorted(delta.items()):
            before = self._refs.get(i, {}).get(p, 0)
            if before == 0 and before + d > 0:
                add_pairs.append((p, i))
            elif before > 0 and before + d == 0:
                drop_pairs.append((p, i))
        adds: dict[int, list[int]] = {}
        for p, i in add_pairs:
            adds.setdefault(p, []).append(row_of[i])  # only batch items can newly enter a list
        drops: dict[int, list[int]] = {}
        for p, i in drop_pairs:
            drops.setdefault(p, []).append(i)
        return home, sorted(adds.items()), sorted(drops.items()), (t_ids, t_scores, delta)

    def _rebuild_refs(self) -> None:
        """Recount (item, part) list memberships from the MIPS lists (after load)."""
        self._refs = {}
        r = self._topr_ids.shape[1]
        for p, i in zip(np.repeat(self.part_of_centre, r).tolist(), self._topr_ids.ravel().tolist(),
                        strict=True):
            if i >= 0 and self._home[i] != p:
                d = self._refs.setdefault(i, {})
                d[p] = d.get(p, 0) + 1

    def _add(self, x: np.ndarray, ids: np.ndarray) -> None:
        home, copy_adds, copy_drops, topr = self.plan_add(x, ids)
        jobs = []
        for p in range(self.n_parts):
            rows = np.flatnonzero(home == p)
            extra = dict(copy_adds).get(p)
            if extra:
                rows = np.concatenate([rows, np.asarray(extra, np.int64)])
            if rows.size:
                jobs.append((p, "add", (x[rows], ids[rows])))
        for p, drop in copy_drops:
            jobs.append((p, "remove", (np.asarray(drop, np.int64),)))
        self._run_writes(jobs)
        pairs_add = [(p, int(ids[r_])) for p, rows in copy_adds for r_ in rows]
        pairs_drop = [(p, int(i)) for p, drop in copy_drops for i in drop]
        rec = {"op": "add", "ids": ids.astype(np.int64), "home": home.astype(np.int64),
               "copy_add": np.asarray(pairs_add, np.int64).reshape(-1, 2),
               "copy_drop": np.asarray(pairs_drop, np.int64).reshape(-1, 2)}
        if topr is not None:
            t_ids, t_scores, delta = topr
            rows = np.flatnonzero((t_ids != self._topr_ids).any(1)
                                  | (t_scores != self._topr_scores).any(1))
            rec.update(topr_rows=rows, topr_ids=t_ids[rows], topr_scores=t_scores[rows],
                       refs=np.asarray([(i, p, d) for (i, p), d in delta.items()],
                                       np.int64).reshape(-1, 3))
        self._commit(rec)

    def _commit(self, rec: dict) -> None:
        """Apply one write's decisions to the router state (after the parts took it), and hand
        them to ``journal`` (a coordinator's replicated log, docs/cluster.md)."""
        if rec["op"] == "remove":
            self._commit_remove(rec["ids"])
        else:
            self._commit_add(rec)
        if self.journal is not None:
            self.journal.append(rec)

    def _commit_add(self, rec: dict) -> None:
        ids, home = rec["ids"], rec["home"]
        self._home.update(zip(ids.tolist(), home.tolist(), strict=True))
        counts = self._counts + np.bincount(home, minlength=self.n_parts)
        for p, i in rec["copy_add"].tolist():
            counts[p] += 1
            self._copies[i] = self._copies.get(i, frozenset()) | {p}
        for p, i in rec["copy_drop"].tolist():
            counts[p] -= 1
            s = self._copies.get(i)
            if s is not None:
                if s - {p}:
                    self._copies[i] = s - {p}
                else:
                    del self._copies[i]
        self._counts = counts  # replaced whole: a lock-free search reads one or the other
        if "topr_rows" in rec:
            rows = rec["topr_rows"]
            self._topr_ids[rows] = rec["topr_ids"]
            self._topr_scores[rows] = rec["topr_scores"]
            for i, p, d in rec["refs"].tolist():
                refs = self._refs.setdefault(i, {})
                refs[p] = refs.get(p, 0) + d
                if refs[p] == 0:
                    del refs[p]
                if not refs:
                    del self._refs[i]

    def apply_journal(self, records: list[dict]) -> None:
        """Replay write decisions another router made (a coordinator following the leader's
        log): the router state changes as if the writes were made here; no part is called.
        A ``"seq"`` record advances the parts' committed write sequences."""
        with self._lock.write():
            for rec in records:
                if rec["op"] == "seq":
                    self._commit_seq(rec)
                    continue
                ids = np.asarray(rec["ids"], np.int64)
                if rec["op"] == "remove":
                    self._commit_remove(ids)
                    self._idset.remove(ids)
                else:
                    self._commit_add(rec)
                    self._idset.add(ids)

    def _commit_seq(self, rec: dict) -> None:
        term, attempt = (int(v) for v in rec["ballot"])
        for p, a, b in zip(*(np.asarray(rec[k]).tolist() for k in ("parts", "first", "through")),
                           strict=True):
            self.part_seq[p] = max(self.part_seq[p], b)
            h = self.part_history[p]
            h[:-1] = h[1:].copy()
            h[-1] = (a, b, term, attempt)

    def committed_writes(self, part: int) -> list[tuple[int, int, tuple[int, int]]]:
        """Part ``part``'s remembered committed writes ``(first, through, ballot)``, oldest
        first."""
        return [(a, b, (t, at)) for a, b, t, at in self.part_history[part].tolist() if b]

    def _run_writes(self, jobs: list) -> None:
        if self.defer_writes is not None:
            self.defer_writes.extend(jobs)
            return
        if self._search_many is not None:
            raise UnsupportedOperationError(
                "this router copy's parts are remote and it is read-only (open_router); write "
                "through a coordinator")
        for p, op, args in jobs:  # local sub-indexes
            getattr(self.parts[p], op)(*args)

    def _remove(self, ids: np.ndarray) -> None:
        self._run_writes([(p, "remove", (np.asarray(v, np.int64),))
                          for p, v in sorted(self._parts_holding(ids).items())])
        self._commit({"op": "remove", "ids": ids.astype(np.int64)})

    def _parts_holding(self, ids: np.ndarray) -> dict[int, list[int]]:
        by_part: dict[int, list[int]] = {}
        for i in ids.tolist():
            by_part.setdefault(self._home[i], []).append(i)
            for p in self._copies.get(i, ()):
                by_part.setdefault(p, []).append(i)
        return by_part

    def _commit_remove(self, ids: np.ndarray) -> None:
        counts = self._counts.copy()
        for p, v in self._parts_holding(ids).items():
            counts[p] -= len(v)
        self._counts = counts
        for i in ids.tolist():
            del self._home[i]
            self._copies.pop(i, None)
            self._refs.pop(i, None)
        if self._topr_ids is not None and self._topr_ids.size:
            gone = np.isin(self._topr_ids, ids)
            self._topr_ids[gone] = -1
            self._topr_scores[gone] = -np.inf

    # -- search -----------------------------------------------------------------------------

    def route(self, q: np.ndarray, branching: int, meta_ef: int | None = None) -> np.ndarray:
        """(nq, n_parts) bool: the parts holding each query's ``branching`` nearest centres."""
        return self.route_shares(q, branching, meta_ef) > 0

    def route_shares(self, q: np.ndarray, branching: int,
                     meta_ef: int | None = None) -> np.ndarray:
        """(nq, n_parts) float32: how many of each query's ``branching`` nearest centres each
        part holds (0: the part is not asked), plus 0.5 for the part of the nearest centre so
        that it wins ties for primary."""
        kk = min(branching, self.centres.shape[0])
        ef = max(2 * kk, 32) if meta_ef is None else check_int("meta_ef", meta_ef, 1, 1 << 20)
        r = self.meta.search(q, kk, ef=ef)
        nq = q.shape[0]
        shares = np.zeros((nq, self.n_parts), np.float32)
        ok = r.ids >= 0
        rows = np.broadcast_to(np.arange(nq)[:, None], r.ids.shape)
        np.add.at(shares, (rows[ok], self.part_of_centre[r.ids[ok]]), 1.0)
        first = ok[:, 0]
        shares[np.flatnonzero(first), self.part_of_centre[r.ids[first, 0]]] += 0.5
        return shares

    @staticmethod
    def effort_levels(shares: np.ndarray, hit: np.ndarray, max_level: int = 3) -> np.ndarray:
        """(nq, n_parts) int8 effort level per asked part: 0 for the query's primary part (the
        largest share of its routed centres) and for parts with more than half of that share;
        level j for a share ratio in (2^-(j+1), 2^-j] (a part expected to hold 2^-j times the
        primary's neighbours gets 2^-j of its beam), capped at ``max_level``. -1: not asked."""
        top = shares.max(1, keepdims=True)
        ratio = np.where(hit, shares / np.maximum(top, 1e-9), 1.0)
        with np.errstate(divide="ignore"):
            lev = np.floor(-np.log2(np.maximum(ratio, 1e-9))).astype(np.int64)
        lev = np.clip(lev, 0, max_level).astype(np.int8)
        lev[~hit] = -1
        return lev

    def _widen_small(self, hit: np.ndarray, k: int) -> np.ndarray:
        """Ask every part for queries whose routed parts hold fewer than k items, so a small
        index returns all it has (as every index does)."""
        counts = self._counts
        short = (hit * counts).sum(1) < k
        hit[short] = counts > 0
        return hit

    def _search_filtered(self, q: np.ndarray, k: int, filt: IdFilter,
                         **params: Any) -> SearchResult:
        """Each asked part applies the filter itself; with an allow list a part is asked only
        for the allowed ids it holds, and not at all when it holds none (docs/filters.md)."""
        return self._search(q, k, filt=filt, **params)

    def _filtered_shares(self, q: np.ndarray, branching: int, meta_ef: int | None,
                         filt: IdFilter) -> np.ndarray:
        """Route as deep as the filter thins the items: ``branching`` times 1/selectivity
        (rounded up to a power of two), so the routed centres hold about as many allowed items
        as ``branching`` centres hold items without a filter."""
        nq, n, m = q.shape[0], len(self), self.centres.shape[0]
        by_branching: dict[int, list[np.ndarray]] = {}
        everyone = np.arange(nq)
        for i in [0] if filt.shared else range(nq):
            count = self._allowed_ids(filt.allow_of(i), filt.deny_of(i))[1]
            w = 1 << max(0, int(np.ceil(np.log2(n / max(count, 1)))))
            rows = everyone if filt.shared else everyone[i : i + 1]
            by_branching.setdefault(min(m, branching * w), []).append(rows)
        shares = np.zeros((nq, self.n_parts), np.float32)
        for b, groups in by_branching.items():
            rows = np.concatenate(groups)
            shares[rows] = self.route_shares(q[rows], b, meta_ef)
        return shares

    def _allowed_per_part(self, filt: IdFilter, nq: int) -> list[list[np.ndarray]] | None:
        """[query][part] the allowed ids each part holds (homes and MIPS copies), or None
        without an allow list."""
        if filt.allow is None:
            return None
        home, copies, P = self._home, self._copies, self.n_parts

        def split(a: np.ndarray) -> list[np.ndarray]:
            parts: list[list[int]] = [[] for _ in range(P)]
            for i in a.tolist():
                p = home.get(i)
                if p is None:
                    continue  # not held: ignored
                parts[p].append(i)
                for c in copies.get(i, ()):
                    parts[c].append(i)
            return [np.array(v, np.int64) for v in parts]

        if not isinstance(filt.allow, list):
            return [split(filt.allow)] * nq
        return [split(a) for a in filt.allow]

    def _search(
        self, q: np.ndarray, k: int, branching: int = 10, meta_ef: int | None = None,
        require_complete: bool = True, part_effort: str = "uniform", min_ef: int | None = None,
        filt: IdFilter | None = None, **sub_params: Any,
    ) -> SearchResult:
        branching = check_int("branching", branching, 1, 1 << 22)
        if not isinstance(require_complete, bool):
            raise InvalidParameterError(
                f"require_complete must be true or false; got {require_complete!r}")
        if part_effort not in ("share", "uniform"):
            raise InvalidParameterError(
                f"part_effort must be 'share' or 'uniform'; got {part_effort!r}")
        if min_ef is not None:
            min_ef = check_int("min_ef", min_ef, 1, 1 << 20)
        if filt is None:
            shares = self.route_shares(q, branching, meta_ef)
        else:
            shares = self._filtered_shares(q, branching, meta_ef, filt)
        hit = self._widen_small(shares > 0, k)
        per_part = None if filt is None else self._allowed_per_part(filt, q.shape[0])
        if per_part is not None:
            held = np.array([[v.size for v in row] for row in per_part], np.int64)
            hit &= held > 0
            # routed parts holding fewer than k allowed items: ask every part holding some
            short = (held * hit).sum(1) < k
            hit[short] = held[short] > 0
        ef = sub_params.get("ef")
        if ef is not None:  # checked here: the parts' calls convert it
            ef = sub_params["ef"] = check_int("ef", ef, 1, 1 << 20)
        if part_effort == "share" and ef is not None and "ef" in self._sub_search:
            levels = self.effort_levels(shares, hit)
            floor = k if min_ef is None else min_ef
            ef_of = {j: max(floor, -(-ef // (1 << j))) for j in range(4)}
        else:  # every asked part gets the same search parameters
            levels = np.where(hit, 0, -1).astype(np.int8)
            ef_of = {0: ef}
        pad = -np.inf if higher_is_better(self.metric) else np.inf
        nq, P = q.shape[0], self.n_parts
        cand_ids = np.full((nq, P * k), -1, np.int64)
        cand_scores = np.full((nq, P * k), pad, np.float32)
        # one call per part when the parts take per-query parameters (remote parts: one RPC
        # each), else one call per (part, beam)
        ef_table = np.array([ef_of.get(j, ef) for j in range(4)], dtype=object)
        jobs = []
        for p in range(P):
            col = levels[:, p]
            rows = np.flatnonzero(col >= 0)
            if not rows.size:
                continue
            lev = col[rows]
            if self._search_many is not None or lev.min() == lev.max():
                jobs.append((p, rows, ef_table[lev]))
                continue
            by_ef: dict[Any, list[np.ndarray]] = {}
            for j in np.unique(lev).tolist():
                by_ef.setdefault(ef_of[j], []).append(rows[lev == j])
            for e, rs in by_ef.items():
                r_ = np.sort(np.concatenate(rs))
                jobs.append((p, r_, np.full(r_.size, e, dtype=object)))

        def params_of(efs):
            if efs[0] is None:
                return sub_params
            if (efs == efs[0]).all():
                return {**sub_params, "ef": int(efs[0])}
            out = {**sub_params, "per_query": {"ef": [int(e) for e in efs]}}
            out.pop("ef", None)
            return out

        def filter_of(p: int, rows: np.ndarray) -> dict:
            if filt is None:
                return {}
            out = filt.take(rows).kwargs()
            if per_part is not None:
                if filt.shared:
                    out["allow"] = per_part[0][p]
                else:
                    out["allow"] = [per_part[i][p] for i in rows.tolist()]
            return out

        calls = [(self.parts[p], q[rows], {**params_of(efs), **filter_of(p, rows)})
                 for p, rows, efs in jobs]
        if self._search_many is not None:  # remote parts: one fan-out, hedged, with deadlines
            results = self._search_many(calls, k)
        else:  # local sub-indexes, one after the other (each may use threads itself)
            results = [part.search(qs, k, **params) for part, qs, params in calls]
        missed = 0
        for (p, rows, _e), r in zip(jobs, results, strict=True):
            if isinstance(r, Exception):
                if require_complete:
                    raise r
                missed += rows.size
                continue
            cand_ids[rows, p * k : (p + 1) * k] = r.ids
            cand_scores[rows, p * k : (p + 1) * k] = r.scores
        ids, scores = merge_topk(cand_ids, cand_scores, k, higher_is_better(self.metric))
        if missed:
            total = sum(rows.size for _, rows, _e in jobs)
            return SearchResult(ids, scores, coverage=1.0 - missed / max(1, total))
        return SearchResult(ids, scores)

    # -- persistence ------------------------------------------------------------------------

    def _get_state(self):
        meta: dict[str, Any] = {"trained": self.centres is not None}
        arrays: dict[str, np.ndarray] = {}
        if self.centres is None:
            return meta, arrays
        arrays["centres"] = self.centres
        arrays["part_of_centre"] = self.part_of_centre
        meta["topr_shape"] = list(self._topr_ids.shape)
        arrays["topr_ids"] = self._topr_ids.ravel()  # flat: a (m, 0) array cannot be written
        arrays["topr_scores"] = self._topr_scores.ravel()
        hid = np.fromiter(self._home.keys(), np.int64, len(self._home))
        arrays["home_ids"] = hid
        arrays["home_parts"] = np.fromiter(self._home.values(), np.int64, len(self._home))
        pairs = [(i, p) for i, ps in self._copies.items() for p in sorted(ps)]
        arrays["copies"] = np.asarray(pairs, np.int64).ravel()  # (id, part) pairs
        arrays["part_seq"] = self.part_seq
        arrays["part_history"] = self.part_history.ravel()
        # the meta-HNSW and (local) parts as whole index files (Index.to_bytes)
        arrays["meta_index"] = np.frombuffer(self.meta.to_bytes(), np.uint8)
        meta["remote"] = self.parts_factory is not None
        meta["part_prefix"] = self.part_prefix
        if not meta["remote"]:
            for j, part in enumerate(self.parts):
                arrays[f"part{j}"] = np.frombuffer(part.to_bytes(), np.uint8)
        return meta, arrays

    def _set_state(self, meta, arrays):
        if not meta["trained"]:
            return
        self.part_prefix = meta.get("part_prefix")
        if "meta_index" not in arrays:
            raise ValueError("a Pyramid file from before its parts were kept as index files: "
                             "export it again with the simsearch that wrote it")
        self.meta = _restore_part(arrays["meta_index"], HNSWIndex, "the meta-HNSW")
        _check_router_arrays(self, meta, arrays)
        self._set_model(arrays["centres"].copy(), arrays["part_of_centre"].copy())
        shape = tuple(meta["topr_shape"])
        self._topr_ids = arrays["topr_ids"].reshape(shape).copy()
        self._topr_scores = arrays["topr_scores"].reshape(shape).copy()
        self._home = dict(zip(arrays["home_ids"].tolist(), arrays["home_parts"].tolist(),
                              strict=True))
        for i, p in arrays["copies"].reshape(-1, 2).tolist():
            self._copies[i] = self._copies.get(i, frozenset()) | {p}
        self._counts = self.part_sizes()
        if "part_seq" in arrays:  # files from before fenced part writes start at 0
            self.part_seq = arrays["part_seq"].astype(np.int64)
            self.part_history = arrays["part_history"].reshape(self.n_parts, -1, 4).astype(
                np.int64)
        self._rebuild_refs()
        if meta.get("remote") or self.parts_factory is not None:
            return
        self.parts = [_restore_part(arrays[f"part{j}"], Index, f"part {j}")
                      for j in range(self.n_parts)]
        members: list[list[int]] = [[] for _ in range(self.n_parts)]
        for i, p in self._home.items():
            members[p].append(i)
        for i, ps in self._copies.items():
            for p in ps:
                members[p].append(i)
        for j, part in enumerate(self.parts):  # each part holds exactly what the router says
            if part.dim != self.dim or part.metric != self.metric or not np.array_equal(
                    part.ids(), np.unique(np.asarray(members[j], np.int64))):
                raise ValueError(f"part {j} does not hold the items the router places there")
