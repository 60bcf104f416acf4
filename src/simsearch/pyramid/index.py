"""PyramidIndex: k-means centres, a meta-HNSW over them, a balanced graph partition of its
level-0 graph into parts, one sub-index per part, MIPS top-r replication (docs/cluster.md).

The paper: Deng et al., "Pyramid: A General Framework for Distributed Similarity Search on
Large-scale Datasets" (IEEE Big Data 2019).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._kernels import merge_topk
from ..capabilities import Capabilities
from ..errors import (
    InvalidParameterError,
    NotTrainedError,
    UnsupportedOperationError,
)
from ..filters import IdFilter
from ..hnsw import HNSWIndex
from ..index import (
    Index,
    SearchResult,
    check_int,
    create_index,
    higher_is_better,
    index_class,
    loads,
    normalize_rows,
    register,
)
from .effort import params_of, part_jobs
from .part import Fanout, Part, in_turn
from .partition import build_meta, fit_partition
from .router import Decision, Draft, Router

log = logging.getLogger(__name__)

#: sub-index kinds a part may not be (a pyramid of pyramids is not supported)
_FORBIDDEN_SUB = {"pyramid"}
#: arrays files written before the annex kept a cluster's state in under these names
_LEGACY_ANNEX = ("part_seq", "part_history")


def part_spec(params: dict) -> tuple[int, str, dict]:
    """(n_partitions, the parts' index kind, their build parameters) of a PyramidIndex's build
    parameters (a cluster makes its parts' collections from them)."""
    sig = inspect.signature(PyramidIndex.__init__).parameters
    own = {n for n, p in sig.items() if p.kind is p.POSITIONAL_OR_KEYWORD}
    return (params.get("n_partitions", sig["n_partitions"].default),
            params.get("sub_index", sig["sub_index"].default),
            {k: v for k, v in params.items() if k not in own})


def _restore_part(data: np.ndarray, cls: type, what: str) -> Index:
    idx = loads(data)
    if not isinstance(idx, cls):
        raise ValueError(f"{what} holds a {type(idx).__name__}, not a {cls.__name__}")
    return idx


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
    partition : "meta-hnsw" (the default, the paper's: items in the part of their nearest
        centre, a query asks the parts of its ``branching`` nearest centres) or "hash" (an
        id's part is a hash of the id and every query asks every part: the naive scheme the
        paper measures against, as Milvus shards by key; no MIPS copies; ``train`` only draws
        ``n_centers`` rows of the sample as centres, which place and route nothing).
    spill : 0 (the default) or a ratio >= 1: an item is also stored in the part of its nearest
        centre outside its home part when that centre is at most ``spill`` times as far as its
        nearest centre (1 - cosine, or squared L2), as ScaNN's spilled (SOAR) assignments do
        for lists: a query near a part's border then finds its neighbours in fewer parts, for
        more items stored (docs/cluster.md). Not with MIPS copies ("ip" with
        ``mips_replicas`` > 0) nor ``partition="hash"``.
    parts, fanout : given by an owner that keeps the parts itself (a cluster's coordinator,
        whose parts live on shard servers): ``n_partitions`` objects searched like an Index
        (``part.Part``), and how a search asks them (``part.Fanout``; default one after the
        other). The owner writes them, planning on ``draft()`` and ``install``-ing what
        committed; the index's own ``add``/``remove`` then refuse, and searches take no lock
        (every write replaces the router whole). Neither is a build parameter nor saved.
    **sub_params : build parameters of each part's sub-index.

    Search parameters: ``branching`` (the paper's K: how many nearest centres route the query;
    default 10), ``meta_ef`` (meta-HNSW beam, default max(2K, 32)), ``require_complete``
    (default True: raise when a part cannot answer; False returns partial results flagged with
    ``coverage``), ``part_effort`` ("uniform", the default: every asked part searches with
    the sub-index's ``ef``; "share": the query's primary part, the one holding most of its
    routed centres, and parts with more than half that share search with ``ef``, a part with
    a share ratio in (2^-(j+1), 2^-j] with ef / 2^j (j <= 3), at least ``min_ef``, default k;
    measured on glove-50 it saves less work than it loses recall, see docs/bench/pyramid.md),
    ``min_ef`` and the sub-index's own (e.g. ``ef``).

    Items go to the part of their nearest centre (for "ip"/"cosine": nearest in direction).
    A MIPS copy is kept while the item stays in its centre's top-r; removing an item does not
    refill the lists. Searches may run concurrently; writes are serialized.

    >>> import numpy as np, simsearch as ss
    >>> x = np.random.default_rng(0).standard_normal((1000, 16)).astype("float32")
    >>> from simsearch.pyramid import PyramidIndex
    >>> idx = PyramidIndex(16, "l2", n_centers=16, n_partitions=2, sub_index="flat")
    >>> idx.train(x)            # k-means centres, the meta-HNSW, the partition
    >>> _ = idx.add(x)
    >>> exact = ss.FlatIndex(16, "l2"); _ = exact.add(x)
    >>> r = idx.search(x[:5], k=10, branching=16)   # every centre routed: exact here
    >>> bool((r.ids == exact.search(x[:5], 10).ids).all())
    True
    """

    # "where" goes to the parts: a cluster's answer it from their attributes (docs/filters.md)
    capabilities = Capabilities(
        needs_training=True, takes_where=True, takes_deadline=True,
        search_params=frozenset({"branching", "meta_ef", "require_complete", "part_effort",
                                 "min_ef"}))

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
        partition: str = "meta-hnsw",
        spill: float = 0.0,
        *,
        parts: Sequence[Part] | None = None,
        fanout: Fanout = in_turn,
        **sub_params: Any,
    ):
        n_centers = check_int("n_centers", n_centers, 1, 1 << 22)
        n_partitions = check_int("n_partitions", n_partitions, 1, 4096)
        if n_partitions > n_centers:
            raise InvalidParameterError(f"n_partitions must be <= n_centers; got n_partitions="
                                        f"{n_partitions}, n_centers={n_centers}")
        if sample_size is not None:
            sample_size = check_int("sample_size", sample_size, 1)
        mips_replicas = check_int("mips_replicas", mips_replicas, 0, 1 << 20)
        seed = check_int("seed", seed, 0)
        meta_M = check_int("meta_M", meta_M, 2, 256)
        if isinstance(edge_tau, bool) or not isinstance(edge_tau, (int, float)) \
                or not 0 <= edge_tau <= 10:
            raise InvalidParameterError(f"edge_tau must be a number in [0, 10]; got {edge_tau!r}")
        if partition not in ("meta-hnsw", "hash"):
            raise InvalidParameterError(
                f"partition must be 'meta-hnsw' or 'hash'; got {partition!r}")
        if isinstance(spill, bool) or not isinstance(spill, (int, float)) or \
                not (spill == 0 or 1 <= spill <= 100):
            raise InvalidParameterError(f"spill must be 0 or a number in [1, 100]; got {spill!r}")
        if spill and (partition == "hash" or (metric == "ip" and mips_replicas > 0)):
            raise InvalidParameterError(
                "spill copies items to a second part by centre distance: not with "
                "partition='hash' nor with MIPS copies (metric 'ip' and mips_replicas > 0)")
        if not isinstance(sub_index, str) or sub_index in _FORBIDDEN_SUB:
            raise InvalidParameterError(
                f"sub_index must be an index kind other than 'pyramid'; got {sub_index!r}")
        sub_cls = index_class(sub_index)
        if sub_cls.capabilities.needs_training:
            raise InvalidParameterError(f"sub_index must not need training; {sub_index!r} does")
        super().__init__(dim, metric, n_centers=n_centers, n_partitions=n_partitions,
                         sample_size=sample_size, mips_replicas=mips_replicas,
                         sub_index=sub_index, seed=seed, meta_M=meta_M, edge_tau=edge_tau,
                         partition=partition, spill=float(spill), **sub_params)
        create_index(sub_index, dim, metric, **sub_params)  # validates sub_params now
        self.sub_params = dict(sub_params)
        self.sub_index = sub_index
        self._sub_search = sub_cls.capabilities.search_params
        self.capabilities = PyramidIndex.capabilities.but(
            search_params=PyramidIndex.capabilities.search_params | self._sub_search,
            lock_free_search=parts is not None)
        self.spherical = metric in ("ip", "cosine")
        #: the model and the placement (router.py); None until trained. Replaced whole by
        #: every write, never changed in place: a search reads one router from start to end
        self.router: Router | None = None
        if not callable(fanout):
            raise InvalidParameterError(f"fanout must be callable; got {fanout!r:.80}")
        self.fanout = fanout
        self.owns_parts = parts is None
        if parts is None:
            parts = [create_index(sub_index, dim, metric, **sub_params)
                     for _ in range(n_partitions)]
        elif not isinstance(parts, Sequence) or len(parts) != n_partitions or not all(
                callable(getattr(p, "search", None)) for p in parts):
            raise InvalidParameterError(
                f"parts must be n_partitions={n_partitions} searchable parts; got {parts!r:.80}")
        self.parts: list[Part] = list(parts)
        #: arrays the index's owner keeps in its file beside the router (a cluster keeps its
        #: replication state there, pyramid/replication.py); not read here
        self.annex: dict[str, np.ndarray] = {}

    # -- properties -------------------------------------------------------------------------

    @property
    def n_parts(self) -> int:
        return self._params["n_partitions"]

    @property
    def hashed(self) -> bool:
        return self._params["partition"] == "hash"

    @property
    def uses_mips_copies(self) -> bool:
        return self.metric == "ip" and self._params["mips_replicas"] > 0 and not self.hashed

    @property
    def centres(self) -> np.ndarray | None:
        return None if self.router is None else self.router.centres

    @property
    def part_of_centre(self) -> np.ndarray | None:
        return None if self.router is None else self.router.part_of_centre

    @property
    def meta(self) -> HNSWIndex | None:
        return None if self.router is None else self.router.meta

    def part_sizes(self) -> np.ndarray:
        """Items stored per part, MIPS copies included (the router's count)."""
        return self.router.part_sizes()

    # -- training ---------------------------------------------------------------------------

    def _train(self, x: np.ndarray) -> None:
        p = self._params
        rng = np.random.default_rng(p["seed"])
        m = p["n_centers"]
        limit = p["sample_size"] or 100 * m
        sample = x[rng.choice(x.shape[0], limit, replace=False)] if x.shape[0] > limit else x
        if sample.shape[0] < m:
            raise InvalidParameterError(
                f"training needs at least n_centers={m} vectors; got {sample.shape[0]}")
        if self.hashed:  # the centres place and route nothing: drawn, not fitted
            centres = np.ascontiguousarray(
                normalize_rows(sample[:m]) if self.spherical else sample[:m], np.float32)
            poc, sizes = np.arange(m, dtype=np.int64) % self.n_parts, np.ones(m)
            meta = build_meta(centres, self.spherical, p["meta_M"], p["seed"])
        else:
            centres, poc, meta, sizes = fit_partition(
                sample, m, self.n_parts, self.spherical, p["seed"], p["meta_M"], p["edge_tau"])
        r = p["mips_replicas"] if self.uses_mips_copies else 0
        self.router = Router(centres, poc, meta, self.n_parts, self.spherical,
                             self.uses_mips_copies, np.full((m, r), -1, np.int64),
                             np.full((m, r), -np.inf, np.float32), hashed=self.hashed,
                             spill=p["spill"])
        log.info("pyramid: %d centres in %d parts (sizes %s)", m, self.n_parts,
                 np.bincount(poc, weights=sizes, minlength=self.n_parts))

    # -- writes -----------------------------------------------------------------------------

    def plan_add(self, x: np.ndarray, ids: np.ndarray) -> Decision:
        """Where a batch would go (router.py); changes nothing."""
        return self.router.plan_add(x, ids)

    def _add(self, x: np.ndarray, ids: np.ndarray) -> None:
        self._write(self.router.plan_add(x, ids))

    def _remove(self, ids: np.ndarray) -> None:
        self._write(self.router.plan_remove(ids))

    def _vectors_of(self, ids: np.ndarray) -> np.ndarray:
        at = np.fromiter(map(self.router.home.get, ids.tolist()), np.int64, ids.size)
        out = np.empty((ids.size, self.dim), np.float32)
        for p in np.unique(at).tolist():
            out[at == p] = self.parts[p].get_vectors(ids[at == p])
        return out

    def _write(self, decision: Decision) -> None:
        if not self.owns_parts:
            raise UnsupportedOperationError(
                "this index's parts are written by their owner (a cluster's coordinator: it "
                "plans on draft() and installs what the parts committed); write through it")
        for p, op, args in decision.jobs:  # local sub-indexes, then the router
            getattr(self.parts[p], op)(*args)
        self.router = self.router.apply(decision.record)

    def draft(self) -> Draft:
        """A write planned on the current router without changing it (``Draft``)."""
        if self.router is None:
            raise NotTrainedError("PyramidIndex must be trained before add()")
        return Draft(self)

    def install(self, draft: Draft) -> None:
        """Make a draft's router current (its write committed elsewhere: the parts took it).
        ValueError if another write was installed since the draft began."""
        with self._lock.write():
            if self.router is not draft.base:
                raise ValueError("the draft was planned on a router that is no longer current")
            self.router = draft.router
            self._track_ids(d.record for d in draft.decisions)

    def apply_records(self, records: list[dict]) -> None:
        """Replay write decisions another router made (a coordinator following the leader's
        log): the router changes as if the writes were made here; no part is called."""
        with self._lock.write():
            self.router = functools.reduce(Router.apply, records, self.router)
            self._track_ids(records)

    def _track_ids(self, records) -> None:
        for rec in records:
            ids = np.asarray(rec["ids"], np.int64)
            (self._idset.remove if rec["op"] == "remove" else self._idset.add)(ids)
            self._version += 1

    # -- search -----------------------------------------------------------------------------

    def route(self, q: np.ndarray, branching: int, meta_ef: int | None = None) -> np.ndarray:
        """(nq, n_parts) bool: the parts holding each query's ``branching`` nearest centres."""
        return self.router.route_shares(q, branching, meta_ef) > 0

    def route_shares(self, q: np.ndarray, branching: int,
                     meta_ef: int | None = None) -> np.ndarray:
        """Router.route_shares on the current router."""
        return self.router.route_shares(q, branching, meta_ef)

    @staticmethod
    def _widen_small(router: Router, hit: np.ndarray, k: int) -> np.ndarray:
        """Ask every part for queries whose routed parts hold fewer than k items, so a small
        index returns all it has (as every index does)."""
        counts = router.counts
        short = (hit * counts).sum(1) < k
        hit[short] = counts > 0
        return hit

    def _search_filtered(self, q: np.ndarray, k: int, filt: IdFilter,
                         **params: Any) -> SearchResult:
        """Each asked part applies the filter itself; with an allow list a part is asked only
        for the allowed ids it holds, and not at all when it holds none (docs/filters.md)."""
        return self._search(q, k, filt=filt, **params)

    def _filtered_shares(self, router: Router, q: np.ndarray, branching: int,
                         meta_ef: int | None, filt: IdFilter) -> np.ndarray:
        """Route as deep as the filter thins the items: ``branching`` times 1/selectivity
        (rounded up to a power of two), so the routed centres hold about as many allowed items
        as ``branching`` centres hold items without a filter."""
        # counted on the router taken, not the index's id set, which a remove may swap
        # meanwhile: the search reads one consistent value from start to end
        nq, n, m = q.shape[0], len(router), router.centres.shape[0]
        by_branching: dict[int, list[np.ndarray]] = {}
        everyone = np.arange(nq)
        for i in [0] if filt.shared else range(nq):
            count = router.allowed_count(filt.allow_of(i), filt.deny_of(i))
            w = 1 << max(0, int(np.ceil(np.log2(n / max(count, 1)))))
            rows = everyone if filt.shared else everyone[i : i + 1]
            by_branching.setdefault(min(m, branching * w), []).append(rows)
        shares = np.zeros((nq, self.n_parts), np.float32)
        for b, groups in by_branching.items():
            rows = np.concatenate(groups)
            shares[rows] = router.route_shares(q[rows], b, meta_ef)
        return shares

    def _search(
        self, q: np.ndarray, k: int, branching: int = 10, meta_ef: int | None = None,
        require_complete: bool = True, part_effort: str = "uniform", min_ef: int | None = None,
        filt: IdFilter | None = None, where: dict | None = None,
        deadline: float | None = None, **sub_params: Any,
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
        router = self.router  # read once: the search uses this router from start to end
        if filt is None:
            shares = router.route_shares(q, branching, meta_ef)
        else:
            shares = self._filtered_shares(router, q, branching, meta_ef, filt)
        hit = self._widen_small(router, shares > 0, k)
        per_part = None if filt is None else router.allowed_per_part(filt, q.shape[0])
        if per_part is not None:
            held = np.array([[v.size for v in row] for row in per_part], np.int64)
            hit &= held > 0
            # routed parts holding fewer than k allowed items: ask every part holding some
            short = (held * hit).sum(1) < k
            hit[short] = held[short] > 0
        ef = sub_params.get("ef")
        if ef is not None:  # checked here: the parts' calls convert it
            ef = sub_params["ef"] = check_int("ef", ef, 1, 1 << 20)
        jobs = part_jobs(shares, hit, k, ef if "ef" in self._sub_search else None, part_effort,
                         min_ef)
        if where is not None:
            sub_params["where"] = where
        pad = -np.inf if higher_is_better(self.metric) else np.inf
        nq, P = q.shape[0], self.n_parts
        cand_ids = np.full((nq, P * k), -1, np.int64)
        cand_scores = np.full((nq, P * k), pad, np.float32)

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

        calls = [(self.parts[p], q[rows], {**params_of(efs, sub_params), **filter_of(p, rows)})
                 for p, rows, efs in jobs]
        results = self.fanout(calls, k, deadline)
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
        meta: dict[str, Any] = {"trained": self.router is not None}
        if self.router is None:
            return meta, {}
        rmeta, arrays = self.router.to_arrays()
        meta.update(rmeta)
        # the meta-HNSW and the parts it holds as whole index files (Index.to_bytes); parts
        # an owner keeps (a cluster's shards) are in its keeping, not in this file
        arrays["meta_index"] = np.frombuffer(self.router.meta.to_bytes(), np.uint8)
        if self.owns_parts:
            for j, part in enumerate(self.parts):
                arrays[f"part{j}"] = np.frombuffer(part.to_bytes(), np.uint8)
        for k, v in self.annex.items():
            arrays[f"annex.{k}"] = v
        return meta, arrays

    def _set_state(self, meta, arrays):
        if not meta["trained"]:
            return
        if "meta_index" not in arrays:
            raise ValueError("a Pyramid file from before its parts were kept as index files: "
                             "export it again with the simsearch that wrote it")
        meta_index = _restore_part(arrays["meta_index"], HNSWIndex, "the meta-HNSW")
        p = self._params
        router = Router.from_arrays(meta_index, meta, arrays, n_parts=self.n_parts,
                                    spherical=self.spherical, mips=self.uses_mips_copies,
                                    hashed=self.hashed, spill=p["spill"])
        r = p["mips_replicas"] if self.uses_mips_copies else 0
        if router.centres.shape != (p["n_centers"], self.dim) or \
                router.topr_ids.shape[1] != r:
            raise ValueError("router centres or MIPS lists do not match the parameters")
        if not np.array_equal(np.sort(np.fromiter(router.home.keys(), np.int64,
                                                  len(router.home))), self.ids()):
            raise ValueError("router homes do not place every held id once in a part")
        self.router = router
        # the owner's arrays; files from before the annex kept a cluster's there by name
        self.annex = {k[6:]: v for k, v in arrays.items() if k.startswith("annex.")}
        self.annex.update({k: arrays[k] for k in _LEGACY_ANNEX if k in arrays})
        if not self.owns_parts:  # its owner holds them
            return
        if "part0" not in arrays:
            raise ValueError("the file holds a router whose parts are kept elsewhere (a "
                             "cluster's shard servers): open it with its parts "
                             "(PyramidIndex parts=, simsearch.pyramid.open_router)")
        self.parts = [_restore_part(arrays[f"part{j}"], Index, f"part {j}")
                      for j in range(self.n_parts)]
        for j, (part, held) in enumerate(zip(self.parts, router.members(), strict=True)):
            # each part holds exactly what the router says
            if part.dim != self.dim or part.metric != self.metric or \
                    not np.array_equal(part.ids(), held):
                raise ValueError(f"part {j} does not hold the items the router places there")
