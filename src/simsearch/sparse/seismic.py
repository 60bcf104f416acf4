"""SeismicIndex: approximate sparse MIPS by Seismic (docs/sparse.md, "Seismic"), written from the
paper: Bruch, Nardini, Rulli, Venturini, "Efficient Inverted Indexes for Approximate Retrieval
over Learned Sparse Representations" (SIGIR 2024).

Per term, its posting list pruned to the ``n_postings`` largest weights, clustered into blocks
of similar documents, each block summarised by the coordinate-wise maximum of its documents
(pruned to ``summary_energy`` of its mass, 8-bit codes). A query visits its ``query_cut``
heaviest terms' blocks whose summary bound reaches ``heap_factor`` times the k-th best score
so far (the authors' convention) and scores their documents exactly from the forward rows.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from .._simd import seismic_search
from ..capabilities import Capabilities
from ..errors import InvalidParameterError
from ..index import SearchResult, check_int, register
from ._kernels import term_blocks
from .batch import SparseBatch
from .flat import TAIL_MIN, SparseStore

#: the vocabulary a Seismic index holds a dense query vector of (float32 a term)
MAX_VOCABULARY = 1 << 26
#: blocks per posting list (numbered in 16 bits within the list)
MAX_BLOCKS = 1 << 16
#: the compact rows' code of a term they do not hold
NO_CODE = 0xFFFF


class _Blocks(NamedTuple):
    """The walk's arrays (``seismic_search``'s, in its order): each term's blocks, their
    documents (positions), each block's summary scale; the summaries term-major per list: each
    term's summary terms, their entries, each entry's block within the list and 8-bit code."""

    term_blocks: np.ndarray     # (dim + 1,) int64: term t's blocks, [t]..[t + 1]
    block_docs_ptr: np.ndarray  # (n_blocks + 1,) int64
    block_docs: np.ndarray      # int64 positions, by block
    scale: np.ndarray           # (n_blocks,) float32: a code's weight
    term_comps: np.ndarray      # (dim + 1,) int64: term t's list's summary terms, [t]..[t + 1]
    comps: np.ndarray           # uint32, ascending within a list
    comp_ptr: np.ndarray        # (n_comps + 1,) int64: each summary term's entries
    ent_block: np.ndarray       # uint16: the entry's block, counted from the list's first
    ent_code: np.ndarray        # uint8
    compact: np.ndarray         # uint32 by entry of the rows in blocks (``compact_rows``), or empty
    term_code: np.ndarray       # (dim,) uint16: a term's code in them, or empty


def compact_rows(fi: np.ndarray, fv: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows in 4 bytes an entry, as the walk reads them: each term's 16-bit code (codes by
    decreasing frequency, so the query weights most read share cache lines) in the low half, the
    weight as float16 in the high half; and each term's code (``NO_CODE``: no row holds it).
    Empty arrays when the rows hold more than 65,535 terms or a weight float16 cannot hold."""
    none = (np.empty(0, np.uint32), np.empty(0, np.uint16))
    counts = np.bincount(fi, minlength=dim)
    used = np.flatnonzero(counts)
    if used.size > NO_CODE or (fv.size and np.abs(fv).max() > np.finfo(np.float16).max):
        return none
    code = np.full(dim, NO_CODE, np.uint16)
    code[used[np.argsort(-counts[used], kind="stable")]] = np.arange(used.size, dtype=np.uint16)
    half = fv.astype(np.float16).view(np.uint16).astype(np.uint32)
    return code[fi].astype(np.uint32) | (half << 16), code


@register("sparse-seismic")
class SeismicIndex(SparseStore):
    """Seismic over sparse items (``dim``: the vocabulary). Build parameters: ``n_postings``
    (the paper's λ: entries kept per posting list, default 1,000), ``centroid_fraction`` (blocks
    per list as a share of its kept entries, the paper's β / λ, default 0.1), ``summary_energy``
    (the paper's α: the share of a block's mass its summary keeps, default 0.4), ``seed``,
    ``rebuild_after`` (below).
    Search parameters: ``query_cut`` (the query's heaviest terms visited, default 10),
    ``heap_factor`` (a block is visited when its bound reaches this times the k-th best score,
    as in the authors' pyseismic-lsr; default 0.9: lower visits more).

    Items added after the last build are scored exactly, every one, until they reach an eighth
    of the built ones (or ``rebuild_after``, default 4,096), when the blocks are built again;
    removed items are skipped and dropped at the next build. So membership is always exact;
    only the ranking of built items is approximate.

    >>> import simsearch as ss
    >>> idx = ss.SeismicIndex(10)
    >>> idx.add([([1, 4], [0.5, 2.0]), ([4, 7], [1.0, 1.0]), ([2], [3.0])]).tolist()
    [0, 1, 2]
    >>> r = idx.search(([4, 7], [1.0, 0.5]), k=2, query_cut=2)
    >>> r.ids.tolist(), r.scores.tolist()
    ([[0, 1]], [[2.0, 1.5]])
    """

    capabilities = Capabilities(items="sparse",
                                search_params=frozenset({"query_cut", "heap_factor"}))

    def __init__(self, dim: int, metric: str = "ip", n_postings: int = 1000,
                 centroid_fraction: float = 0.1, summary_energy: float = 0.4, seed: int = 0,
                 rebuild_after: int = TAIL_MIN):
        n_postings = check_int("n_postings", n_postings, 1, 1 << 24)
        rebuild_after = check_int("rebuild_after", rebuild_after, 1, 1 << 40)
        for name, v in (("centroid_fraction", centroid_fraction),
                        ("summary_energy", summary_energy)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
                raise InvalidParameterError(f"{name} must be a number in (0, 1]; got {v!r}")
        seed = check_int("seed", seed, 0, (1 << 31) - 1)
        if isinstance(dim, int) and dim > MAX_VOCABULARY:
            raise InvalidParameterError(f"dim (the vocabulary) must be at most {MAX_VOCABULARY} "
                                        f"for sparse-seismic; got {dim}")
        super().__init__(dim, metric, n_postings=n_postings,
                         centroid_fraction=float(centroid_fraction),
                         summary_energy=float(summary_energy), seed=seed,
                         rebuild_after=rebuild_after)

    def _build_lists(self, n_main: int) -> None:
        """The blocks and summaries of the first ``n_main`` positions."""
        super()._build_lists(n_main)  # the posting lists: the exact scan a narrow filter takes
        p = self._params
        post = self._post
        fp, fi, fv = self._fp, self._fi, self._fv
        scratch = np.zeros(self.dim, np.float32)
        mark = np.zeros(self.dim, bool)
        terms = np.empty(self.dim, np.uint32)
        tb = np.zeros(self.dim + 1, np.int64)  # each term's blocks
        tc = np.zeros(self.dim + 1, np.int64)  # each term's summary terms
        parts: dict[str, list] = {f: [] for f in _Blocks._fields}
        n_docs = n_ent = 0
        for t in np.flatnonzero(np.diff(post[0])).tolist():
            a, b = post[0][t], post[0][t + 1]
            kept = min(b - a, p["n_postings"])
            # a block's number within its list is 16 bits wide in the summaries
            nb = min(MAX_BLOCKS, max(1, math.ceil(kept * p["centroid_fraction"])))
            order, starts, comps, cptr, eblk, ecode, scl = term_blocks(
                post[1][a:b], post[2][a:b], p["n_postings"], nb, fp, fi, fv,
                np.float32(p["summary_energy"]), p["seed"] + t, scratch, mark, terms)
            tb[t + 1] = starts.size - 1
            tc[t + 1] = comps.size
            parts["block_docs"].append(order)
            parts["block_docs_ptr"].append(starts[:-1] + n_docs)
            parts["scale"].append(scl)
            parts["comps"].append(comps)
            parts["comp_ptr"].append(cptr[:-1] + n_ent)
            parts["ent_block"].append(eblk)
            parts["ent_code"].append(ecode)
            n_docs += order.size
            n_ent += eblk.size
        cat = (lambda f, dt, end=None: np.concatenate(
            parts[f] + ([np.array([end])] if end is not None else [])).astype(dt)
            if parts[f] or end is not None else np.empty(0, dt))
        compact, term_code = compact_rows(fi[: fp[n_main]], fv[: fp[n_main]], self.dim)
        self._blocks = _Blocks(
            term_blocks=np.cumsum(tb), block_docs_ptr=cat("block_docs_ptr", np.int64, n_docs),
            block_docs=cat("block_docs", np.int64), scale=cat("scale", np.float32),
            term_comps=np.cumsum(tc), comps=cat("comps", np.uint32),
            comp_ptr=cat("comp_ptr", np.int64, n_ent), ent_block=cat("ent_block", np.uint16),
            ent_code=cat("ent_code", np.uint8), compact=compact, term_code=term_code)

    def memory_bytes(self) -> int:
        """Bytes held: the store's (``SparseStore.memory_bytes``), the blocks, their summaries
        and the compact rows."""
        return super().memory_bytes() + int(sum(a.nbytes for a in self._blocks))

    def _scan(self, q: SparseBatch, k: int, ok: np.ndarray, query_cut: int = 10,
              heap_factor: float = 0.9) -> SearchResult:
        query_cut = check_int("query_cut", query_cut, 1, 1 << 20)
        if isinstance(heap_factor, bool) or not isinstance(heap_factor, (int, float)) or \
                not 0 < heap_factor <= 10:
            raise InvalidParameterError(
                f"heap_factor must be a number in (0, 10]; got {heap_factor!r}")
        ids, scores = seismic_search(
            q.indptr, q.indices, q.values, query_cut, heap_factor, *self._blocks, self._n_main,
            self._fp, self._fi, self._fv, self._pos_ids, ok.view(np.uint8), k, self.dim)
        return SearchResult(ids, scores)

    def _scan_filtered(self, q: SparseBatch, k: int, ok: np.ndarray,
                       **params: Any) -> SearchResult:
        """A filter that leaves fewer than ``32 k`` items takes the exact scan of them (the walk
        would find too few of them)."""
        if ok.sum() < 32 * k:
            return self._exact(q, k, ok)
        return self._scan(q, k, ok, **params)
