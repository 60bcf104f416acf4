"""Norm-Explicit Quantization (Dai, Yan, Ng, Liu, Cheng, AAAI 2020) over faiss's PQ, OPQ, RQ and
LSQ, for maximum inner product search.

An item is split as x = |x| u. The direction u is encoded by an existing quantizer with M - 1
codebooks (faiss's own, wrapped in a faiss index so it serializes), and the *relative* norm
l = |x| / |decode(code(u))| gets a 1-D k-means codebook of 2^nbits entries, so the code is as
long as a plain M-codebook code. The estimate of <q, x> is

    l_code * <q, decode(code(u))> = norm_codebook[c_0] * sum_m LUT_m[c_m],

one multiply per item more than plain asymmetric scoring. Quantizing l rather than |x| makes the
estimate exact in norm whenever l is: the direction quantizer's error in length is absorbed.

:func:`faiss_baseline` builds the equal-bits faiss index with the inner-product metric and the
same quantizer settings (the comparison in the paper and in docs/bench/quant.md).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import faiss
import numpy as np

from .._lists import assign, check_ranking, rank, train_centroids
from .._numba_util import kernel_threads
from ..capabilities import Capabilities
from ..errors import InvalidParameterError
from ..index import Index, SearchResult, check_int, check_result_size, check_threads, register
from ..planner import FilterPlanner
from . import _kernels as K
from . import fastscan as FS

log = logging.getLogger(__name__)

BASES = ("pq", "opq", "rq", "lsq")
_ENCODE_BLOCK = 1 << 16
_TINY = 1e-30
# LSQ's ridge on the codebook least squares, (B'B + lambda I) C = B'X. faiss's default 0.01 is
# negligible against the ~n/K assignments per codeword, so with a training sample of ~10k rows
# the codewords grow larger than the data and cancel each other in combinations that training
# found but that the encoder (ICM from random codes) cannot find again: on 256-d unit
# directions the encoded error was 1.5x the data energy (docs/bench/quant.md, "LSQ").
LSQ_RIDGE = 1.0


def padded_dim(dim: int, n_codebooks: int, base: str) -> int:
    """Dimension the quantizer works in: PQ and OPQ need it divisible by the number of
    codebooks, so the vectors are padded with zeros (inner products unchanged); RQ and LSQ
    use ``dim`` as is."""
    if base in ("pq", "opq"):
        return -(-dim // n_codebooks) * n_codebooks
    return dim


def make_quantizer_index(
    base: str, dim: int, n_codebooks: int, nbits: int = 8, seed: int = 0,
    rq_beam_size: int = 1, lsq_train_iters: int = 25, lsq_ridge: float = LSQ_RIDGE,
) -> faiss.Index:  # fmt: skip
    """A faiss index with the inner-product metric wrapping the quantizer ``base`` with
    ``n_codebooks`` codebooks of 2^nbits over ``padded_dim(dim, ...)`` dimensions. NEQ uses it
    only to train / encode / decode (sa_encode, sa_decode); :func:`faiss_baseline` searches with
    it. RQ and LSQ use the LUT search type (ST_LUT_nonorm), whose code holds no norm."""
    d = padded_dim(dim, n_codebooks, base)
    ip = faiss.METRIC_INNER_PRODUCT
    if base in ("pq", "opq"):
        idx = faiss.IndexPQ(d, n_codebooks, nbits, ip)
        idx.pq.cp.seed = seed
        if base == "opq":
            opq = faiss.OPQMatrix(d, n_codebooks)
            opq.verbose = False
            idx = faiss.IndexPreTransform(opq, idx)
    elif base == "rq":
        idx = faiss.IndexResidualQuantizer(
            d, n_codebooks, nbits, ip, faiss.AdditiveQuantizer.ST_LUT_nonorm
        )
        idx.rq.max_beam_size = rq_beam_size
        idx.rq.cp.seed = seed
    elif base == "lsq":
        idx = faiss.IndexLocalSearchQuantizer(
            d, n_codebooks, nbits, ip, faiss.AdditiveQuantizer.ST_LUT_nonorm
        )
        idx.lsq.train_iters = lsq_train_iters
        idx.lsq.random_seed = seed
        idx.lsq.lambd = lsq_ridge
    else:
        raise InvalidParameterError(f"base must be one of {list(BASES)}; got {base!r}")
    return idx


def pad(x: np.ndarray, d: int) -> np.ndarray:
    """Zero-pad rows of x to d columns (C-contiguous float32)."""
    if x.shape[1] == d:
        return np.ascontiguousarray(x, np.float32)
    out = np.zeros((x.shape[0], d), np.float32)
    out[:, : x.shape[1]] = x
    return out


def faiss_baseline(
    base: str, dim: int, n_codebooks: int, nbits: int = 8, seed: int = 0,
    rq_beam_size: int = 1, lsq_train_iters: int = 25, lsq_ridge: float = LSQ_RIDGE,
) -> faiss.Index:  # fmt: skip
    """The plain quantizer NEQ is compared against: faiss's own index (IndexPQ, OPQ +
    IndexPQ, IndexResidualQuantizer, IndexLocalSearchQuantizer) with the inner-product metric,
    ``n_codebooks`` codebooks, the same settings as NEQ's direction quantizer. Feed it vectors
    padded with :func:`pad` to ``padded_dim(dim, n_codebooks, base)``."""
    return make_quantizer_index(
        base, dim, n_codebooks, nbits, seed, rq_beam_size, lsq_train_iters, lsq_ridge
    )


def norm_codebook_1d(values: np.ndarray, size: int, n_iter: int = 100) -> np.ndarray:
    """A ``size``-entry 1-D k-means codebook of ``values`` over *all* of them (no subsampling),
    started from quantiles. Returns sorted float32 (size,)."""
    v = np.sort(np.asarray(values, np.float64))
    init = np.quantile(v, (np.arange(size) + 0.5) / size)
    return K.kmeans_1d(v, init, n_iter).astype(np.float32)


def encode_norm(values: np.ndarray, codebook: np.ndarray) -> np.ndarray:
    """Index of the nearest entry of the sorted ``codebook`` for each value (uint8)."""
    mid = 0.5 * (codebook[1:] + codebook[:-1])
    return np.searchsorted(mid, values).astype(np.uint8)


@dataclass(frozen=True)
class _Items:
    """What a search reads; replaced as a whole on writes so searches see old or new."""

    codes: np.ndarray | None  # uint8 (n, M - 1) direction codes (None with fast_scan: in fs)
    norm_codes: np.ndarray  # uint8 (n,)
    ids: np.ndarray  # int64 (n,)
    x: np.ndarray | None  # float32 (n, dim) with keep_vectors
    lists: np.ndarray  # int64 (n,) coarse list of each item, ascending (all 0 without n_lists)
    offsets: np.ndarray  # int64 (n_lists + 1,): list l holds positions offsets[l]:offsets[l+1]
    fs: FS.Blocks | None = None  # with fast_scan: the codes in the 4-bit block layout


@register("neq")
class NEQIndex(FilterPlanner, Index):
    """Norm-Explicit Quantization for maximum inner product (metric "ip" only).

    Parameters
    ----------
    base: the direction quantizer, "pq", "opq", "rq" or "lsq" (faiss's own).
    n_codebooks: codebooks in the whole code, the paper's M; the direction gets M - 1, the
        relative norm one. PQ/OPQ pad the dimension with zeros to a multiple of M - 1.
    nbits: bits per codebook (2^nbits entries, the paper's K = 256 at 8).
    seed: seeds faiss's clustering.
    keep_vectors: also store the raw vectors so ``search(..., rerank=R)`` can re-score exactly.
    rq_beam_size: the residual quantizer's beam (1 = the paper's greedy encoding).
    lsq_train_iters: LSQ training iterations.
    lsq_ridge: LSQ's ridge lambda on the codebook update (faiss's ``lambd``; faiss defaults to
        0.01, which lets codewords blow up on small training samples).
    n_lists: 0 (default) scans every item; > 0 adds an inverted-file coarse partition (beyond
        the paper): spherical k-means with n_lists centroids on the training directions, each
        item filed under the centroid of largest inner product, items stored grouped by list.
    progress: tqdm bars while encoding large batches.
    fast_scan: score 4-bit codes (nbits=4) with the compiled fast-scan (simsearch.quant.fastscan:
        8-bit lookup tables held in SIMD registers, 32 items per shuffle); the codes are kept
        only in its block layout, (M - 1) / 2 + 1 bytes per item. Estimates differ from the
        float scan by the tables' 8-bit rounding; re-rank with ``rerank``.

    Search parameters (per call): ``rerank`` (R, default 0: return the scan's estimates; R > 0
    with keep_vectors re-scores the scan's best max(R, k) exactly), ``n_threads`` (1; -1 all),
    ``n_probe`` (with n_lists: scan only the n_probe best-ranked lists; default all lists, i.e.
    exhaustive), ``list_ranking`` ("norm", default: by the list's largest norm times q·c;
    "centroid": by q·c alone).
    Supports remove(). Searches may run concurrently; writes are serialized.

    >>> import numpy as np, simsearch as ss
    >>> x = np.random.default_rng(0).standard_normal((1000, 16)).astype("float32")
    >>> from simsearch.quant import NEQIndex
    >>> idx = NEQIndex(16, base="pq", n_codebooks=4, nbits=4, keep_vectors=True, progress=False)
    >>> idx.train(x)
    >>> _ = idx.add(x)
    >>> exact = ss.FlatIndex(16, "ip"); _ = exact.add(x)
    >>> r = idx.search(x[:5], k=10, rerank=200)        # the scan's best 200, re-scored exactly
    >>> bool((r.ids[:, 0] == exact.search(x[:5], 10).ids[:, 0]).all())
    True
    """

    metrics = ("ip",)
    capabilities = Capabilities(
        search_params=frozenset({"rerank", "n_threads", "n_probe", "list_ranking"}),
        needs_training=True)

    def __init__(
        self, dim: int, metric: str = "ip", base: str = "pq", n_codebooks: int = 4,
        nbits: int = 8, seed: int = 0, keep_vectors: bool = False, rq_beam_size: int = 1,
        lsq_train_iters: int = 25, lsq_ridge: float = LSQ_RIDGE, n_lists: int = 0,
        progress: bool = True, fast_scan: bool = False,
    ):  # fmt: skip
        if base not in BASES:
            raise InvalidParameterError(f"base must be one of {list(BASES)}; got {base!r}")
        check_int("n_codebooks", n_codebooks, 2, 256)  # 4-bit sums stay below 2^16
        check_int("nbits", nbits, 1, 8)
        check_int("seed", seed, 0, 2**31 - 1)
        check_int("rq_beam_size", rq_beam_size, 1, 1024)
        check_int("lsq_train_iters", lsq_train_iters, 1, 10_000)
        check_int("n_lists", n_lists, 0, 1 << 20)
        if (
            isinstance(lsq_ridge, bool) or not isinstance(lsq_ridge, (int, float))
            or not math.isfinite(lsq_ridge) or lsq_ridge < 0
        ):  # fmt: skip
            raise InvalidParameterError(
                f"lsq_ridge must be a finite number >= 0; got {lsq_ridge!r}"
            )
        for name, v in (("keep_vectors", keep_vectors), ("progress", progress),
                        ("fast_scan", fast_scan)):
            if not isinstance(v, bool):
                raise InvalidParameterError(f"{name} must be a bool; got {v!r}")
        super().__init__(
            dim, metric, base=base, n_codebooks=n_codebooks, nbits=nbits, seed=seed,
            keep_vectors=keep_vectors, rq_beam_size=rq_beam_size,
            lsq_train_iters=lsq_train_iters, lsq_ridge=float(lsq_ridge), n_lists=n_lists,
            progress=progress, fast_scan=fast_scan,
        )  # fmt: skip
        if fast_scan and nbits != 4:
            raise InvalidParameterError(f"fast_scan scores 4-bit codes: needs nbits=4; got {nbits}")
        self.fast_scan = fast_scan
        self.base, self.n_codebooks, self.nbits = base, n_codebooks, nbits
        self.keep_vectors, self.progress = keep_vectors, progress
        self.n_lists, self.seed = n_lists, seed
        self._centroids = np.zeros((n_lists, dim), np.float32)
        # per list: the largest norm of anything added (removes do not lower it: a stale
        # maximum only ranks a list a little high)
        self._list_norm = np.zeros(n_lists, np.float32)
        self.n_direction_codebooks = n_codebooks - 1
        self.quantizer_dim = padded_dim(dim, self.n_direction_codebooks, base)
        self._dq = make_quantizer_index(
            base, dim, self.n_direction_codebooks, nbits, seed, rq_beam_size, lsq_train_iters,
            float(lsq_ridge),
        )  # fmt: skip
        self._norm_codebook = np.zeros(1 << nbits, np.float32)
        self._tables: tuple = ()
        self._items = self._empty_items()

    def _empty_items(self) -> _Items:
        x = np.empty((0, self.dim), np.float32) if self.keep_vectors else None
        codes = np.empty((0, self.n_direction_codebooks), np.uint8)
        e = np.empty(0, np.int64)
        return _Items(
            codes, np.empty(0, np.uint8), e, x, e, np.zeros(max(self.n_lists, 1) + 1, np.int64)
        )

    # -- the quantizer -------------------------------------------------------------------------

    def _directions(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        nrm = np.linalg.norm(x, axis=1).astype(np.float32)
        u = x / np.maximum(nrm, _TINY)[:, None]
        return pad(u, self.quantizer_dim), nrm

    def _unpack(self, packed: np.ndarray) -> np.ndarray:
        if self.nbits == 8:
            return np.ascontiguousarray(packed[:, : self.n_direction_codebooks])
        return faiss.unpack_bitstrings(packed, self.n_direction_codebooks, self.nbits).astype(
            np.uint8
        )

    def _pack(self, codes: np.ndarray) -> np.ndarray:
        if self.nbits == 8:
            return np.ascontiguousarray(codes, np.uint8)
        return faiss.pack_bitstrings(codes.astype(np.int32), self.nbits)

    def encode_directions(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(direction codes uint8 (n, M - 1), relative norms l = |x| / |decode(code(u))| float32
        (n,)) for rows of x, in blocks with a progress bar."""
        from tqdm.auto import tqdm

        n = x.shape[0]
        codes = np.empty((n, self.n_direction_codebooks), np.uint8)
        rel = np.empty(n, np.float32)
        disable = not self.progress or n <= _ENCODE_BLOCK or None
        with tqdm(total=n, desc=f"NEQ-{self.base} encode", unit="vec", disable=disable,
                  leave=False) as bar:  # fmt: skip
            for s in range(0, n, _ENCODE_BLOCK):
                u, nrm = self._directions(x[s : s + _ENCODE_BLOCK])
                packed = self._dq.sa_encode(u)
                dec_norm = np.linalg.norm(self._dq.sa_decode(packed), axis=1)
                codes[s : s + len(u)] = self._unpack(packed)
                rel[s : s + len(u)] = nrm / np.maximum(dec_norm, _TINY)
                bar.update(len(u))
        return codes, rel

    def encode(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(direction codes uint8 (n, M - 1), norm codes uint8 (n,)) of rows of x."""
        codes, rel = self.encode_directions(x)
        return codes, encode_norm(rel, self._norm_codebook)

    @property
    def norm_codebook(self) -> np.ndarray:
        """The relative norms' codebook, float32 (2^nbits,), sorted (zeros before training)."""
        return self._norm_codebook

    def decode(self, codes: np.ndarray, norm_codes: np.ndarray) -> np.ndarray:
        """Reconstruct items: norm codeword times decoded direction, float32 (n, dim)."""
        u = self._dq.sa_decode(self._pack(codes))
        return (self._norm_codebook[norm_codes][:, None] * u)[:, : self.dim].astype(np.float32)

    def _extract_tables(self) -> None:
        """Pull the learned codebooks out of faiss for the lookup tables."""
        Md, Kc, d = self.n_direction_codebooks, 1 << self.nbits, self.quantizer_dim
        if self.base in ("pq", "opq"):
            if self.base == "opq":
                vt = faiss.downcast_VectorTransform(self._dq.chain.at(0))
                rot = faiss.vector_to_array(vt.A).reshape(vt.d_out, vt.d_in).astype(np.float32)
                pq = faiss.downcast_index(self._dq.index).pq
            else:
                rot, pq = None, self._dq.pq
            cent = faiss.vector_to_array(pq.centroids).reshape(Md, Kc, d // Md)
            # (M, dsub, K) so the LUT is one batched matmul over sub-spaces
            self._tables = ("pq", np.ascontiguousarray(cent.transpose(0, 2, 1), np.float32), rot)
        else:
            aq = self._dq.rq if self.base == "rq" else self._dq.lsq
            cb = faiss.vector_to_array(aq.codebooks).reshape(Md * Kc, d)
            self._tables = ("aq", np.ascontiguousarray(cb.T, np.float32), None)

    def lookup_tables(self, q: np.ndarray) -> np.ndarray:
        """LUT_m[c] = <q, codeword c of codebook m> for each query: float32 (nq, M - 1, 2^nbits).
        One matrix product per batch (per sub-space for PQ/OPQ)."""
        kind, cb, rot = self._tables
        Md, Kc = self.n_direction_codebooks, 1 << self.nbits
        qp = pad(q, self.quantizer_dim)
        if rot is not None:
            qp = qp @ rot.T  # decode(c) = R^T y, so <q, R^T y> = <R q, y>
        if kind == "pq":
            qs = qp.reshape(q.shape[0], Md, -1).transpose(1, 0, 2)  # (M, nq, dsub)
            lut = np.matmul(qs, cb).transpose(1, 0, 2)  # (nq, M, K)
        else:
            lut = (qp @ cb).reshape(q.shape[0], Md, Kc)
        return np.ascontiguousarray(lut, np.float32)

    # -- Index hooks ---------------------------------------------------------------------------

    def _train(self, x: np.ndarray) -> None:
        n_min = 1 << self.nbits
        if x.shape[0] < n_min:
            raise InvalidParameterError(
                f"training needs at least 2^nbits = {n_min} vectors; got {x.shape[0]}"
            )
        u, _ = self._directions(x)
        log.info("NEQ-%s: training %d direction codebooks on %d vectors", self.base,
                 self.n_direction_codebooks, x.shape[0])  # fmt: skip
        self._dq.train(u)
        # the relative norm l, not |x|, is what gets quantized
        _, rel = self.encode_directions(x)
        self._norm_codebook = norm_codebook_1d(rel, 1 << self.nbits)
        self._extract_tables()
        if self.n_lists:
            self._train_lists(x)
        log.info("NEQ-%s: relative norms in [%.3g, %.3g]", self.base, rel.min(), rel.max())

    # -- the coarse partition (n_lists > 0) -----------------------------------------------------

    def _train_lists(self, x: np.ndarray) -> None:
        self._centroids = train_centroids(x, self.n_lists, self.seed)
        self._list_norm = np.zeros(self.n_lists, np.float32)
        log.info("NEQ-%s: %d coarse lists on %d directions", self.base, self.n_lists, len(x))

    def assign_lists(self, x: np.ndarray) -> np.ndarray:
        """The list of each row: the centroid with the largest inner product (int64 (n,))."""
        if not self.n_lists:
            return np.zeros(x.shape[0], np.int64)
        return assign(x, self._centroids)

    def _grouped(self, codes, norm_codes, ids, x, lists) -> _Items:
        """Items stored grouped by list (stable, so insertion order within a list)."""
        if self.n_lists:
            order = np.argsort(lists, kind="stable")
            codes, norm_codes, ids, lists = (
                codes[order],
                norm_codes[order],
                ids[order],
                lists[order],
            )
            x = x[order] if x is not None else None
        counts = np.bincount(lists, minlength=max(self.n_lists, 1))
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        if self.fast_scan:
            fs = FS.pack(codes, norm_codes, offsets)
            return _Items(None, norm_codes, ids, x, lists, offsets, fs)
        return _Items(codes, norm_codes, ids, x, lists, offsets)

    def _codes(self, it: _Items) -> np.ndarray:
        """The direction codes by position (unpacked from the block layout with fast_scan)."""
        if it.codes is not None:
            return it.codes
        return FS.unpack(it.fs, len(it.ids), self.n_direction_codebooks)

    # -- writes --------------------------------------------------------------------------------

    def _add(self, x: np.ndarray, ids: np.ndarray) -> None:
        codes, nc = self.encode(x)
        lists = self.assign_lists(x)
        if self.n_lists:
            np.maximum.at(self._list_norm, lists, np.linalg.norm(x, axis=1).astype(np.float32))
        it = self._items
        self._items = self._grouped(
            np.concatenate([self._codes(it), codes]), np.concatenate([it.norm_codes, nc]),
            np.concatenate([it.ids, ids]),
            np.concatenate([it.x, x]) if self.keep_vectors else None,
            np.concatenate([it.lists, lists]),
        )  # fmt: skip

    def _remove(self, ids: np.ndarray) -> None:
        it = self._items
        keep = ~np.isin(it.ids, ids)
        self._items = self._grouped(self._codes(it)[keep], it.norm_codes[keep], it.ids[keep],
                                    it.x[keep] if it.x is not None else None,
                                    it.lists[keep])  # fmt: skip

    def _probes(self, q: np.ndarray, n_probe: int | None,
                ranking: str = "norm") -> np.ndarray | None:
        """The n_probe lists to scan per query (int64 (nq, n_probe)), or None to scan all.

        ``ranking="norm"`` (default) orders lists by their largest norm times q·c, ``"centroid"``
        by q·c alone (simsearch._lists.rank). (A strict cone bound, |q| R cos(max(0, angle(q, c)
        - widest item angle)), was measured too: spherical k-means lists are 60-70 degrees
        wide, so it ranks by R alone and lost to both; docs/bench/quant.md.)"""
        check_ranking(ranking)  # first: probing every list never reaches rank()
        if n_probe is None:
            return None
        n_probe = check_int("n_probe", n_probe, 1)
        if not self.n_lists:
            raise InvalidParameterError(
                f"n_probe={n_probe} needs a coarse partition; build with n_lists > 0"
            )
        if n_probe >= self.n_lists:
            return None
        return rank(q, self._centroids, self._list_norm, n_probe, ranking)

    def _search(
        self, q: np.ndarray, k: int, rerank: int = 0, n_threads: int = 1,
        n_probe: int | None = None, list_ranking: str = "norm",
    ) -> SearchResult:  # fmt: skip
        # more candidates than items only costs memory: the cap is the item count
        rerank = min(check_int("rerank", rerank, 0), len(self))
        check_result_size(q.shape[0], rerank, "rerank")
        n_threads = check_threads(n_threads)
        if rerank and not self.keep_vectors:
            raise InvalidParameterError(
                f"rerank={rerank} needs the raw vectors; build with keep_vectors=True"
            )
        if n_threads == 1 or q.shape[0] == 1:
            pos, S = self._scan_rerank(q, k, rerank, n_probe, list_ranking, 1)
        else:
            with kernel_threads(n_threads):  # around the lookup-table products too (_numba_util)
                pos, S = self._scan_rerank(q, k, rerank, n_probe, list_ranking, n_threads)
        ids = np.where(pos >= 0, self._items.ids[np.maximum(pos, 0)], -1)
        return SearchResult(ids.astype(np.int64), np.ascontiguousarray(S, np.float32))

    # filtered search (docs/filters.md): the re-rank depth grows by 1/selectivity
    def _stored(self) -> tuple[np.ndarray, np.ndarray | None]:
        return self._items.ids, self._items.x

    def _vectors_of(self, ids: np.ndarray) -> np.ndarray:
        it, pos = self._items, self._positions_of(ids)
        if it.x is not None:
            return it.x[pos]
        return self.decode(self._codes(it)[pos], it.norm_codes[pos])

    def _traversal_reads(self, k: int, params: dict) -> float:
        n, n_probe = len(self), params.get("n_probe")
        frac = 1.0 if n_probe is None or not self.n_lists else min(1.0, n_probe / self.n_lists)
        return n * frac * self.code_size / (4.0 * self.dim) + params.get("rerank", 0)

    def _widen(self, k: int, w: float, params: dict) -> tuple[int, dict]:
        """More candidates re-ranked and w times the lists visited: the lists an unwidened
        search visits hold a share 1/w of the allowed answers."""
        n = len(self)
        kk = min(n, int(np.ceil(2 * k * w)))
        if params.get("rerank"):
            params = {**params, "rerank": min(n, max(kk, int(np.ceil(params["rerank"] * w))))}
        if params.get("n_probe") is not None and self.n_lists:
            params = {**params, "n_probe": min(self.n_lists, int(np.ceil(params["n_probe"] * w)))}
        return kk, params

    def _scan_rerank(self, q, k, rerank, n_probe, list_ranking, n_threads):
        """The scan's best positions and scores: k, or ``rerank`` candidates re-scored exactly
        down to k."""
        probes = self._probes(q, n_probe, list_ranking)
        it, parallel = self._items, n_threads != 1
        if it.fs is not None:
            luts, scale, bias = FS.quantize_luts(self.lookup_tables(q), it.fs.n_pairs, n_threads)
            pos, S = FS.scan(it.fs, luts, scale, bias, self._norm_codebook, max(k, rerank), probes,
                             not rerank, n_threads)  # fmt: skip
        else:
            offsets, probes = (K.whole(len(it.codes), len(q)) if probes is None
                               else (it.offsets, probes))
            scan = K.scan_lists_batch_parallel if parallel else K.scan_lists_batch
            # candidates for the re-rank need no order
            pos, S = scan(self.lookup_tables(q), it.codes, it.norm_codes, self._norm_codebook,
                          max(k, rerank), offsets, probes, not rerank)
        if rerank and it.fs is not None:
            return FS.rerank(pos, it.x, q, k, n_threads)
        if rerank:
            exact = K.rerank_batch_parallel if parallel else K.rerank_batch
            return exact(pos, it.x, np.ascontiguousarray(q, np.float32), k)
        return pos[:, :k], S[:, :k]

    # -- persistence ---------------------------------------------------------------------------

    def _get_state(self):
        it = self._items
        arrays = {
            "quantizer": faiss.serialize_index(self._dq),
            "norm_codebook": self._norm_codebook,
            "codes": self._codes(it), "norm_codes": it.norm_codes, "ids": it.ids,
        }  # fmt: skip
        if self.n_lists:
            arrays["centroids"] = self._centroids
            arrays["lists"] = it.lists
            arrays["list_norm"] = self._list_norm
        if it.x is not None:
            arrays["x"] = it.x
        return {}, arrays

    def _set_state(self, meta, arrays):
        self._dq = faiss.deserialize_index(np.array(arrays["quantizer"], np.uint8))
        if self._dq.d != self.quantizer_dim:
            raise InvalidParameterError("saved quantizer does not match the index parameters")
        ncb = np.array(arrays["norm_codebook"], np.float32)
        codes = np.array(arrays["codes"], np.uint8)
        nc = np.array(arrays["norm_codes"], np.uint8)
        ids = np.array(arrays["ids"], np.int64)
        n, Kc = ids.shape[0], 1 << self.nbits
        if ncb.shape != (Kc,) or codes.shape != (n, self.n_direction_codebooks) or nc.shape != (n,):
            raise InvalidParameterError("saved arrays do not match the index parameters")
        if n and (int(codes.max()) >= Kc or int(nc.max()) >= Kc):
            raise InvalidParameterError("saved codes out of range")
        x = None
        if self.keep_vectors:
            x = np.array(arrays["x"], np.float32)
            if x.shape != (n, self.dim):
                raise InvalidParameterError("saved vectors do not match the index parameters")
        lists = np.zeros(n, np.int64)
        if self.n_lists:
            cen = np.array(arrays["centroids"], np.float32)
            lists = np.array(arrays["lists"], np.int64)
            if cen.shape != (self.n_lists, self.dim) or lists.shape != (n,):
                raise InvalidParameterError("saved coarse lists do not match the index parameters")
            if n and (lists.min() < 0 or lists.max() >= self.n_lists or np.any(np.diff(lists) < 0)):
                raise InvalidParameterError("saved coarse lists out of range or not grouped")
            self._centroids = cen
            # a file from before the norm ranking has no maxima: equal ones rank by q·c
            self._list_norm = np.array(arrays.get("list_norm", np.ones(self.n_lists)), np.float32)
        self._norm_codebook = ncb
        if self._is_trained:
            self._extract_tables()
        self._items = self._grouped(codes, nc, ids, x, lists)

    def memory_bytes(self) -> int:
        """Bytes held per the stored items: codes (or the fast-scan blocks), norm codes, ids,
        list numbers, the kept vectors, plus the codebooks and centroids."""
        it = self._items
        parts = [it.norm_codes, it.ids, it.lists, it.offsets, self._centroids, self._list_norm]
        parts += [a for a in (it.codes, it.x) if a is not None]
        fs = it.fs.nbytes if it.fs is not None else 0
        return int(sum(a.nbytes for a in parts) + fs)

    @property
    def code_size(self) -> int:
        """Bytes per item: M - 1 direction codes plus one norm code (at nbits = 8)."""
        return math.ceil(self.n_codebooks * self.nbits / 8)
