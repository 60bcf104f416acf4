"""Simple-LSH and Norm-Ranging LSH for maximum inner product search (docs/bench/lsh.md).

Simple-LSH (Neyshabur & Srebro 2015) maps every item to the unit sphere with
P(x) = [x / U, sqrt(1 - |x|^2 / U^2)] (U: the largest item norm) and a query to [q / |q|, 0],
then hashes with L sign random projections; a query probes buckets by increasing Hamming
distance. Norm-Ranging LSH (Yan et al. 2018) sorts the items by norm, cuts them into m ranges of
equal count and transforms range j with its own maximum norm U_j, so a long tail of large norms
no longer squeezes every other item towards the pole. A bucket is (range, code); a query probes
buckets by a score of (range, number of matching bits) and re-ranks the probed items exactly.

Bucket ranking (``ranking``, per call). With p the fraction of the L hash bits that match,
SRP gives P(bit matches) = 1 - a / pi, a the angle between the transformed query and item, and
cos(a) = <q, x> / (|q| U_j); so the paper's score U_j cos(pi (1 - p)) is a plug-in estimate of
<q, x> / |q|. Two rankings:

- ``"plain"``: that estimate. With L = 27 bits p has a standard deviation of ~0.1 around its
  mean, and for p < 1/2 (more than half the bits differ) the estimate is negative, so the
  larger U_j the *further back* the bucket goes. Most buckets sit near p = 1/2, so among them
  the sign of cos is decided by noise and multiplying by U_j amplifies it: the large-norm ranges,
  where MIPS answers live, have their p < 1/2 buckets probed after every low-norm bucket with
  p >= 1/2 (about half of the data). Recall plateaus (docs/bench/lsh.md has the numbers).
- ``"shifted"`` (default): the authors' code, p' = 0.4 + 0.6 p, i.e. U_j cos(0.6 pi (1 - p)):
  the angle estimate pi (1 - p) is shrunk by 0.6 towards 0. The score is positive for p > 1/6
  (h < 5L/6, which essentially never fails: a random item has p ~ 1/2 +- 0.1), so it increases
  with U_j and with p everywhere that matters. At p = 1/2, where the bits carry no evidence, it
  ranks by 0.59 U_j: it falls back to the norm prior (scan large norms first) instead of
  flipping it, and one more differing bit near p = 1/2 costs a factor of only
  1 - 0.6 pi tan(0.3 pi) / L (~0.91 at L = 27) in score, so bits trade against norms at a
  finite rate. The constants are the authors'; an upper confidence bound on <q, x> and an
  adaptive P(<q, x> >= current k-th best) ranking were implemented and measured worse or
  no better (docs/bench/lsh.md), so this is the default for a measured reason.

The score depends only on (range, matching bits), so the m (L + 1) pairs are ordered once per
call and the kernel walks them, ordering a range's buckets by Hamming distance lazily, only as far
as the walk gets (no per-query sort over all buckets).

Norm bound (``prune``, default on): every item of range j has <q, x> <= U_j |q|, so once k items
are held, pairs of ranges whose bound is below the k-th best score are skipped and the walk stops
when no later pair can beat it. Exact: the answer at a budget T is never worse than without it,
and T >= n still returns the exact answer, usually after far fewer than n items.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from .._numba_util import kernel_threads
from ..capabilities import Capabilities
from ..errors import InvalidParameterError
from ..index import Index, SearchResult, check_int, check_restored, check_threads, register
from ..planner import FilterPlanner
from . import _kernels as K

log = logging.getLogger(__name__)

RANKINGS = ("shifted", "plain")
DEFAULT_RANKING = "shifted"
_TINY = 1e-30


def pair_scores(U: np.ndarray, n_hash_bits: int, ranking: str = DEFAULT_RANKING) -> np.ndarray:
    """Score of a bucket in range r whose code differs from the query's in h of the
    ``n_hash_bits`` bits: float64 (m, L + 1). See the module docstring for the rankings."""
    L = n_hash_bits
    p = (L - np.arange(L + 1, dtype=np.float64)) / L
    if ranking == "plain":
        c = np.cos(np.pi * (1.0 - p))
    elif ranking == "shifted":
        c = np.cos(np.pi * (1.0 - (0.4 + 0.6 * p)))
    else:
        raise InvalidParameterError(f"ranking must be one of {list(RANKINGS)}; got {ranking!r}")
    return np.asarray(U, np.float64)[:, None] * c[None, :]


def pair_order(
    U: np.ndarray, n_hash_bits: int, ranking: str = DEFAULT_RANKING
) -> tuple[np.ndarray, np.ndarray]:
    """(range, Hamming distance) pairs by decreasing score; ties by larger U_j, then smaller h,
    then smaller range. Returns (pair_r int32 (P,), pair_h int32 (P,))."""
    s = pair_scores(U, n_hash_bits, ranking)
    m, H = s.shape
    r = np.repeat(np.arange(m), H)
    h = np.tile(np.arange(H), m)
    Ur = np.asarray(U, np.float64)[r]
    o = np.lexsort((r, h, -Ur, -s.ravel()))
    return np.ascontiguousarray(r[o], np.int32), np.ascontiguousarray(h[o], np.int32)


@dataclass(frozen=True)
class _State:
    """Everything a search reads, replaced as a whole by writes (searches see old or new)."""

    x: np.ndarray  # (n, d) float32, bucket order
    ids: np.ndarray  # (n,) int64
    norms: np.ndarray  # (n,) float32
    rng: np.ndarray  # (n,) int32 range of each item
    codes: np.ndarray  # (n,) uint64
    bcode: np.ndarray  # (B,) uint64
    bstart: np.ndarray  # (B + 1,) int64
    rbstart: np.ndarray  # (m + 1,) int64
    U: np.ndarray  # (m,) float64 max norm per range (the transform's U_j)
    edges: np.ndarray  # (m - 1,) float64 lower norm edge of ranges 1..m-1
    n_partitioned: int  # items when the ranges were last cut


def _empty_state(dim: int, m: int) -> _State:
    return _State(
        np.empty((0, dim), np.float32), np.empty(0, np.int64), np.empty(0, np.float32),
        np.empty(0, np.int32), np.empty(0, np.uint64), np.empty(0, np.uint64),
        np.zeros(1, np.int64), np.zeros(m + 1, np.int64), np.zeros(m, np.float64),
        np.zeros(max(m - 1, 0), np.float64), 0,
    )  # fmt: skip


class _RangedLSH(FilterPlanner, Index):
    """Shared machinery; use :class:`SimpleLSH` or :class:`NormRangingLSH`."""

    metrics = ("ip",)
    capabilities = Capabilities(
        search_params=frozenset({"n_probe_items", "ranking", "n_threads", "prune"}))

    def _setup(self, n_bits: int, n_ranges: int, seed: int) -> None:
        self.n_ranges = n_ranges
        self.range_bits = math.ceil(math.log2(n_ranges)) if n_ranges > 1 else 0
        self.n_hash_bits = n_bits - self.range_bits
        if self.n_hash_bits < 1:
            raise InvalidParameterError(
                f"n_bits must exceed the {self.range_bits} bits the range id takes with "
                f"n_ranges={n_ranges}; got n_bits={n_bits}"
            )
        rng = np.random.default_rng(seed)
        # one set of projections for every range; row b hashes bit b of [x', tail]
        self._projT = np.ascontiguousarray(
            rng.standard_normal((self.n_hash_bits, self.dim + 1)), np.float32
        )
        self._state = _empty_state(self.dim, n_ranges)

    # -- building ------------------------------------------------------------------------------

    def _hash(self, x: np.ndarray, norms: np.ndarray, U_item: np.ndarray) -> np.ndarray:
        U_item = np.maximum(U_item.astype(np.float64), _TINY)
        rel = np.minimum(norms.astype(np.float64) / U_item, 1.0)
        with kernel_threads():
            return K.hash_items(x, 1.0 / U_item, np.sqrt(1.0 - rel * rel), self._projT)

    def _cut(self, norms: np.ndarray) -> np.ndarray:
        """Lower norm edges of ranges 1..m-1 so the ranges hold equal counts."""
        m = self.n_ranges
        srt = np.sort(norms.astype(np.float64))
        pos = (np.arange(1, m) * srt.size) // m
        return srt[np.minimum(pos, srt.size - 1)] if srt.size else np.zeros(m - 1)

    def _publish(self, x, ids, norms, rng, codes, U, edges, n_partitioned) -> None:
        """Sort items into bucket order and build the compact bucket arrays."""
        m = self.n_ranges
        o = np.lexsort((ids, codes, rng))
        x, ids, norms, rng, codes = x[o], ids[o], norms[o], rng[o], codes[o]
        n = ids.size
        if n:
            new = np.ones(n, bool)
            new[1:] = (codes[1:] != codes[:-1]) | (rng[1:] != rng[:-1])
            first = np.flatnonzero(new)
        else:
            first = np.empty(0, np.int64)
        bstart = np.append(first, n).astype(np.int64)
        bcode = codes[first]
        rbstart = np.searchsorted(rng[first], np.arange(m + 1), side="left").astype(np.int64)
        self._state = _State(
            np.ascontiguousarray(x), ids, norms, rng.astype(np.int32), codes, bcode, bstart,
            rbstart, U, edges, n_partitioned,
        )  # fmt: skip

    def _add(self, x: np.ndarray, ids: np.ndarray) -> None:
        st = self._state
        norms = np.linalg.norm(x, axis=1).astype(np.float32)
        X = np.concatenate([st.x, x])
        ID = np.concatenate([st.ids, ids])
        N = np.concatenate([st.norms, norms])
        if ID.size > 2 * st.n_partitioned:
            # re-cut the ranges (and rehash everything) whenever the index has doubled since
            # the last cut: equal-count ranges at amortized O(1) rehashes per item
            edges = self._cut(N)
            R = np.searchsorted(edges, N, side="right").astype(np.int32)
            U = np.zeros(self.n_ranges)
            np.maximum.at(U, R, N.astype(np.float64))
            C = self._hash(X, N, U[R])
            log.debug("%s: cut %d items into %d ranges", type(self).__name__, ID.size,
                      self.n_ranges)  # fmt: skip
            self._publish(X, ID, N, R, C, U, edges, ID.size)
            return
        r_new = np.searchsorted(st.edges, norms, side="right").astype(np.int32)
        U = st.U.copy()
        np.maximum.at(U, r_new, norms.astype(np.float64))
        R = np.concatenate([st.rng, r_new])
        grown = np.flatnonzero(U > st.U)
        # a new item above its range's U_j raises U_j; that range's old items are rehashed
        # under the new U_j so the whole range shares one transform
        old_codes = st.codes.copy()
        if grown.size:
            redo = np.flatnonzero(np.isin(st.rng, grown))
            if redo.size:
                old_codes[redo] = self._hash(st.x[redo], st.norms[redo], U[st.rng[redo]])
        C = np.concatenate([old_codes, self._hash(x, norms, U[r_new])])
        self._publish(X, ID, N, R, C, U, st.edges, st.n_partitioned)

    def _remove(self, ids: np.ndarray) -> None:
        # U_j stays: still an upper bound of the range's norms, so the transform stays valid
        st = self._state
        keep = ~np.isin(st.ids, ids)
        self._publish(st.x[keep], st.ids[keep], st.norms[keep], st.rng[keep], st.codes[keep],
                      st.U, st.edges, st.n_partitioned)  # fmt: skip

    # -- search --------------------------------------------------------------------------------

    def _search(
        self, q: np.ndarray, k: int, n_probe_items: int = 1000, ranking: str = DEFAULT_RANKING,
        n_threads: int = 1, prune: bool = True,
    ) -> SearchResult:  # fmt: skip
        T = min(check_int("n_probe_items", n_probe_items, 1), len(self))  # all items at most
        if not isinstance(prune, (bool, np.bool_)):
            raise InvalidParameterError(f"prune must be True or False; got {prune!r}")
        n_threads = check_threads(n_threads)
        args = (q, *self._probe_args(ranking, prune), max(T, k), k)
        if n_threads == 1 or q.shape[0] == 1:
            ids, S, probed, nb = K.search_batch(*args)
        else:
            with kernel_threads(n_threads) as nt:
                ids, S, probed, nb = K.search_batch_parallel(*args, nt)
        return SearchResult(
            ids, S, stats={"probed_items": int(probed.sum()), "probed_buckets": int(nb.sum())}
        )

    # filtered search (docs/filters.md): the probed candidates grow by 1/selectivity
    def _stored(self) -> tuple[np.ndarray, np.ndarray]:
        return self._state.ids, self._state.x

    def _traversal_reads(self, k: int, params: dict) -> float:
        return float(min(len(self), params.get("n_probe_items", 1000)))

    def _widen(self, k: int, w: float, params: dict) -> tuple[int, dict]:
        n = len(self)
        t = min(n, int(np.ceil(max(params.get("n_probe_items", 1000), k) * w)))
        return min(t, int(np.ceil(2 * k * w))), {**params, "n_probe_items": t}

    def _probe_args(self, ranking: str, prune: bool) -> tuple:
        """The index arguments of the probe kernels (between the query and n_probe, k)."""
        st = self._state
        pr, ph = pair_order(st.U, self.n_hash_bits, ranking)
        seq = pr.astype(np.int64) * (self.n_hash_bits + 1) + ph
        umax = np.ascontiguousarray(np.maximum.accumulate(st.U[pr][::-1])[::-1])
        return (self._projT, st.x, st.ids, st.bcode, st.bstart, st.rbstart, seq, umax, st.U,
                bool(prune))  # fmt: skip

    def buckets(self) -> dict[str, np.ndarray]:
        """The compact bucket arrays (read-only views) for inspection: ``codes``, ``start``,
        ``range_start``, ``ids`` (items in bucket order), ``U``."""
        st = self._state
        return {"codes": st.bcode, "start": st.bstart, "range_start": st.rbstart,
                "ids": st.ids, "U": st.U}  # fmt: skip

    # -- persistence ---------------------------------------------------------------------------

    def _get_state(self):
        st = self._state
        meta = {"n_partitioned": st.n_partitioned}
        return meta, {
            "x": st.x, "ids": st.ids, "rng": st.rng, "codes": st.codes, "U": st.U,
            "edges": st.edges, "projT": self._projT,
        }  # fmt: skip

    def _set_state(self, meta, arrays):
        x = np.array(arrays["x"], np.float32)
        if arrays["projT"].shape != self._projT.shape or x.shape[1:] != (self.dim,):
            raise InvalidParameterError("saved arrays do not match the index parameters")
        self._projT = np.array(arrays["projT"], np.float32)
        rng = np.array(arrays["rng"], np.int32)
        if rng.size and (rng.min() < 0 or rng.max() >= self.n_ranges):
            raise InvalidParameterError("saved range ids out of bounds")
        ids = np.array(arrays["ids"], np.int64)
        check_restored(self._idset.sorted, ids, x, self.dim)
        m = self.n_ranges
        if rng.shape != ids.shape or arrays["codes"].shape != ids.shape or \
                arrays["U"].shape != (m,) or arrays["edges"].shape != (m - 1,) or \
                not 0 <= int(meta["n_partitioned"]) <= 2**62:
            raise InvalidParameterError("saved buckets do not match the index parameters")
        self._publish(
            x, np.array(arrays["ids"], np.int64), np.linalg.norm(x, axis=1).astype(np.float32),
            rng, np.array(arrays["codes"], np.uint64), np.array(arrays["U"], np.float64),
            np.array(arrays["edges"], np.float64), int(meta["n_partitioned"]),
        )  # fmt: skip


@register("nr-lsh")
class NormRangingLSH(_RangedLSH):
    """Norm-Ranging LSH for maximum inner product search (metric "ip" only).

    Parameters
    ----------
    dim : vector dimension.
    n_bits : total code length (the paper's L plus the range id): ceil(log2 n_ranges) bits go
        to the range id, the rest are sign-random-projection bits, so it compares with
        :class:`SimpleLSH` at equal code size (32 = 27 hash bits + 5 range bits at m = 32).
    n_ranges : number of equal-count norm ranges (the paper's m).
    seed : seed of the random projections.

    Search parameters (per call): ``n_probe_items`` (the paper's T, default 1000; raised to k):
    probe buckets in ranked order until at least T items are probed, re-rank them by exact inner
    product; T >= len(index) gives the exact answer. ``ranking``: the bucket score, "shifted"
    (default) or "plain", see the module docstring.
    ``n_threads``: 1 (default) or more / -1 (all cores) to spread a batch over numba threads.
    ``prune``: skip ranges whose norm bound U_j |q| is below the current k-th best score
    (default True; exact, see the module docstring).

    Updates: the ranges are cut (items sorted by norm, equal counts) on the first add and again
    whenever the index has doubled since the last cut, rehashing every item. In between, a new
    item joins the range its norm falls in; if its norm exceeds that range's U_j, U_j is raised
    and that range's items are rehashed. Every add and remove rebuilds the bucket arrays
    (O(n log n)); remove keeps U_j (still an upper bound). Searches may run concurrently with
    each other and with writes (they see the index before or after a write); writes are
    serialized.

    >>> import numpy as np, simsearch as ss
    >>> x = np.random.default_rng(0).standard_normal((1000, 16)).astype("float32")
    >>> idx = ss.create_index("nr-lsh", 16, "ip", n_bits=16, n_ranges=4)
    >>> _ = idx.add(x)
    >>> r = idx.search(x[:2], k=5, n_probe_items=200)   # candidates probed, then exact scores
    >>> r.ids.shape, sorted(r.stats)
    ((2, 5), ['probed_buckets', 'probed_items'])
    """

    def __init__(self, dim: int, metric: str = "ip", n_bits: int = 32, n_ranges: int = 32,
                 seed: int = 0):  # fmt: skip
        n_bits = check_int("n_bits", n_bits, 1, 64)
        n_ranges = check_int("n_ranges", n_ranges, 1, 1 << 16)
        seed = check_int("seed", seed, 0)
        super().__init__(dim, metric, n_bits=n_bits, n_ranges=n_ranges, seed=seed)
        self._setup(n_bits, n_ranges, seed)


@register("simple-lsh")
class SimpleLSH(_RangedLSH):
    """Simple-LSH for maximum inner product search (metric "ip" only): every item is scaled by
    the largest norm U and lifted to the unit sphere, P(x) = [x / U, sqrt(1 - |x|^2 / U^2)];
    ``n_bits`` sign random projections (the paper's L); buckets are probed by increasing Hamming
    distance. Same search parameters and update rules as :class:`NormRangingLSH` with one range
    (an added item above U raises U and rehashes every item; ``ranking`` has no effect).

    >>> import numpy as np, simsearch as ss
    >>> x = np.random.default_rng(0).standard_normal((1000, 16)).astype("float32")
    >>> idx = ss.create_index("simple-lsh", 16, "ip", n_bits=16)
    >>> _ = idx.add(x)
    >>> idx.search(x[:2], k=5, n_probe_items=200).ids.shape
    (2, 5)
    """

    def __init__(self, dim: int, metric: str = "ip", n_bits: int = 32, seed: int = 0):
        n_bits = check_int("n_bits", n_bits, 1, 64)
        seed = check_int("seed", seed, 0)
        super().__init__(dim, metric, n_bits=n_bits, seed=seed)
        self._setup(n_bits, 1, seed)


def simple_lsh_transform(x: np.ndarray, U: float) -> np.ndarray:
    """P(x) = [x / U, sqrt(1 - |x|^2 / U^2)] (float64 (n, d + 1)), for tests and references."""
    x = np.asarray(x, np.float64) / U
    tail = np.sqrt(np.maximum(1.0 - (x * x).sum(1), 0.0))
    return np.concatenate([x, tail[:, None]], axis=1)
