"""The Index contract every index honours, its result type, the registry of index kinds, and
``save`` / :func:`load` / ``to_bytes`` / :func:`loads` (the format itself: fileformat.py; the
input checks: _validate.py).

Concurrency (docs/architecture.md, "Concurrency"): every index carries one reader-writer lock, taken
here and nowhere else. Searches and saves share the read side and run in parallel; train, add and
remove take the write side, so a search that overlaps a write sees the index before or after it,
never half of it. Search parameters are passed per call and never stored.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np

from ._exact import exact_topk
from ._rwlock import RWLock
from ._validate import (  # noqa: F401  (re-exported: the contract's validation)
    MAX_ID,
    MAX_K,
    MAX_RESULT_ENTRIES,
    METRICS,
    as_id_array,
    as_matrix,
    check_batch_ids,
    check_deadline,
    check_int,
    check_k,
    check_metric,
    check_result_size,
    check_threads,
    higher_is_better,
    normalize_rows,
)
from .errors import (
    CorruptIndexError,
    DuplicateIdError,
    InvalidIdError,
    InvalidParameterError,
    NotTrainedError,
    RetrainNonEmptyError,
    UnknownIdError,
    UnsupportedOperationError,
)
from .fileformat import read_index_bytes, read_index_file, write_index_bytes, write_index_file
from .filters import IdFilter, compact, in_sorted, parse_filter

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# results


@dataclass(slots=True)
class SearchResult:
    """Top-k answers, best first. ``ids`` int64 (nq, k), -1 where fewer than k results exist.
    ``scores`` float32 (nq, k): inner product ("ip"), cosine similarity ("cosine") or squared L2
    distance ("l2"); padding is -inf for similarities and +inf for "l2". ``coverage``: the
    fraction of the data that answered (below 1.0 only from a cluster that returned a partial
    result, docs/cluster.md). ``stats``: the batch's work counters, summed over its queries, where
    the index counts them (ip-NSW+: distance computations; the LSH indexes: probed items and
    buckets), else None.

    >>> import numpy as np, simsearch as ss
    >>> x = np.random.default_rng(0).standard_normal((1000, 16)).astype("float32")
    >>> idx = ss.FlatIndex(16, "l2")
    >>> _ = idx.add(x[:2])
    >>> ids, scores = idx.search(x[:1], k=3)   # unpacks; -1 and +inf pad past the 2 items
    >>> ids.tolist(), bool(np.isinf(scores[0, 2]))
    ([[0, 1, -1]], True)
    """

    ids: np.ndarray
    scores: np.ndarray
    coverage: float = 1.0
    stats: dict | None = None

    def __iter__(self) -> Iterator[np.ndarray]:  # allows `ids, scores = idx.search(...)`
        yield self.ids
        yield self.scores


class Searchable(Protocol):
    """What is index-like, whatever holds the data: an Index, a collection in process, on a
    node or on a cluster (embedded, RemoteCollection, a cluster's), a cluster's RemotePart.
    One search signature for all of them."""

    def search(self, q: Any, k: int, *, allow: Any = None, deny: Any = None,
               where: dict | None = None, deadline: float | None = None,
               **params: Any) -> SearchResult: ...
    def __len__(self) -> int: ...


def pad_score(metric: str) -> float:
    return -np.inf if higher_is_better(metric) else np.inf


def empty_result(nq: int, k: int, metric: str) -> SearchResult:
    return SearchResult(
        np.full((nq, k), -1, dtype=np.int64), np.full((nq, k), pad_score(metric), np.float32)
    )


def pad_result(r: SearchResult, k: int, metric: str) -> SearchResult:
    """Widen a (nq, kk) result to (nq, k) with padding; the padding is all it costs."""
    nq, kk = r.ids.shape
    if kk >= k:
        return r
    out = empty_result(nq, k, metric)
    out.ids[:, :kk] = r.ids
    out.scores[:, :kk] = r.scores
    return out


def check_restored(held: np.ndarray, ids: np.ndarray, x: np.ndarray | None = None,
                   dim: int = 0) -> None:
    """ValueError unless a restored index's per-row ``ids`` are the held ids, once each, and its
    vectors ``x`` are (rows, dim): a crafted file must not send a kernel out of bounds."""
    if ids.ndim != 1 or ids.size != held.size or not np.array_equal(np.sort(ids), held):
        raise ValueError("the stored ids do not match the ids the index holds")
    if x is not None and x.shape != (ids.size, dim):
        raise ValueError(f"stored vectors of shape {x.shape}; expected ({ids.size}, {dim})")


def new_ids(ids: Any, n: int, next_id: int, contains: Callable[[np.ndarray], np.ndarray]
            ) -> np.ndarray:
    """The ids of an added batch of n rows: the given ones, checked (unique, not held yet), or
    n consecutive ids from ``next_id``."""
    if ids is None:
        if next_id + n - 1 > MAX_ID:
            raise InvalidIdError(f"{n} new ids from {next_id} would pass the largest id, "
                                 f"{MAX_ID}; give ids explicitly")
        return np.arange(next_id, next_id + n, dtype=np.int64)
    ids = check_batch_ids(ids, n)
    present = contains(ids)
    if present.any():
        raise DuplicateIdError(
            f"ids must not already be in the index; {int(present.sum())} are, "
            f"e.g. id {int(ids[present][0])} (remove it first)"
        )
    return ids


def relayout(reorder: Callable[[], None], n: int) -> None:
    """An add's automatic reorder, best effort: the items are in by then and must stay
    recorded, and a reorder that fails (out of memory) leaves the old layout whole, so the
    failure is logged and the add goes on."""
    try:
        reorder()
    except (MemoryError, RuntimeError) as e:
        log.warning("kept insertion order for %d items: the reorder failed (%s)", n, e)


def check_held(ids: np.ndarray, contains: Callable[[np.ndarray], np.ndarray]) -> None:
    """Ids to remove: unique and all held."""
    if np.unique(ids).size != ids.size:
        raise DuplicateIdError("ids to remove must be unique")
    missing = ~contains(ids)
    if missing.any():
        raise UnknownIdError(
            f"ids to remove must be in the index; {int(missing.sum())} are not, "
            f"e.g. id {int(ids[missing][0])}"
        )


class IdSet:
    """The external ids an index holds, as a sorted int64 array (compact, vectorised lookups)."""

    def __init__(self, ids: np.ndarray | None = None, next_id: int = 0):
        self.sorted = np.sort(ids) if ids is not None else np.empty(0, np.int64)
        self.next_id = max(next_id, int(self.sorted[-1]) + 1 if self.sorted.size else 0)
        self._cached: tuple | None = None  # (the sorted array it was built from, the table)

    def __len__(self) -> int:
        return int(self.sorted.size)

    def contains(self, ids: np.ndarray) -> np.ndarray:
        if not self.sorted.size:
            return np.zeros(ids.shape, bool)
        if ids.size > 4096:  # long lists (filters): a table of the held ids, when they are dense
            table = self._table()
            if table is not None:
                inside = (ids >= 0) & (ids < table.size)
                out = np.zeros(ids.shape, bool)
                out[inside] = table[ids[inside]]
                return out
        pos = np.minimum(np.searchsorted(self.sorted, ids), self.sorted.size - 1)
        return self.sorted[pos] == ids

    def _table(self) -> np.ndarray | None:
        """A boolean per id 0..max held (None for sparse ids), rebuilt when the set changes."""
        srt = self.sorted
        cached = self._cached
        if cached is not None and cached[0] is srt:
            return cached[1]
        top = int(srt[-1])
        if top > 4 * srt.size + (1 << 20):
            return None
        table = np.zeros(top + 1, bool)
        table[srt] = True
        self._cached = (srt, table)
        return table

    def add(self, ids: np.ndarray) -> None:
        if ids.size:  # merged in by position: one copy, not a sort of every id held
            new = np.sort(ids)
            self.sorted = np.insert(self.sorted, np.searchsorted(self.sorted, new), new)
            self.next_id = max(self.next_id, int(ids.max()) + 1)

    def remove(self, ids: np.ndarray) -> None:
        self.sorted = self.sorted[~np.isin(self.sorted, ids)]


# ---------------------------------------------------------------------------------------------
# the contract

_REGISTRY: dict[str, type[Index]] = {}
# Kinds that register on import; later index modules add one line here so load() can find them.
_KIND_MODULES = {
    "flat": "simsearch.flat",
    "norm-scan": "simsearch.normscan",
    "auto": "simsearch.auto",
    "hnsw": "simsearch.hnsw",
    "nr-lsh": "simsearch.lsh",
    "simple-lsh": "simsearch.lsh",
    "ipnsw-plus": "simsearch.graph.ipnsw_plus",
    "neq": "simsearch.quant",
    "pyramid": "simsearch.pyramid",
    "strings": "simsearch.strings.string_index",
}


def register(kind: str) -> Callable[[type[Index]], type[Index]]:
    """Class decorator: make an Index kind loadable by :func:`load` and creatable by name."""

    def deco(cls: type[Index]) -> type[Index]:
        cls.kind = kind
        _REGISTRY[kind] = cls
        return cls

    return deco


def index_class(kind: str) -> type[Index]:
    if kind not in _REGISTRY and kind in _KIND_MODULES:
        importlib.import_module(_KIND_MODULES[kind])
    if kind not in _REGISTRY:
        raise InvalidParameterError(
            f"unknown index kind {kind!r}; known kinds: {index_kinds()}"
        )
    return _REGISTRY[kind]


def index_kinds() -> list[str]:
    return sorted(set(_KIND_MODULES) | set(_REGISTRY))


def create_index(kind: str, dim: int, metric: str = "l2", **params: Any) -> Index:
    """Make an index by registry name, e.g. ``create_index("hnsw", 64, "ip", M=32)``."""
    return index_class(kind)(dim, metric=metric, **params)


class Index:
    """Base class of every index. Subclasses implement ``_add``, ``_search`` and, where they can,
    ``_train`` and ``_remove``; the base validates input over the whole batch first, keeps the id
    set, serializes writes and owns the file format.

    Subclass hooks:
      ``_add(x, ids)``: x float32 (n, dim) validated, ids int64 fresh and unique.
      ``_search(q, k, **params) -> SearchResult``: called only when the index holds items.
      ``_remove(ids)``: ids known to be present.
      ``_get_state() -> (meta: dict, arrays: dict[str, ndarray])`` and
      ``_set_state(meta, arrays)`` for persistence (``__init__`` params go in ``_params``).

    >>> import numpy as np, simsearch as ss
    >>> x = np.random.default_rng(0).standard_normal((1000, 16)).astype("float32")
    >>> import os, tempfile
    >>> idx = ss.create_index("hnsw", 16, "l2", M=8)   # any registered kind by name
    >>> isinstance(idx, ss.Index), idx.add(x[:10]).tolist()[:3]
    (True, [0, 1, 2])
    >>> path = os.path.join(tempfile.mkdtemp(), "x.idx")
    >>> idx.save(path)                                  # atomic and checksummed
    >>> len(ss.load(path))                              # the file says its kind
    10
    """

    kind: ClassVar[str] = "abstract"
    metrics: ClassVar[tuple[str, ...]] = METRICS
    #: names of per-call search parameters this index accepts
    search_params: ClassVar[frozenset[str]] = frozenset()
    needs_training: ClassVar[bool] = False
    #: True where a search reads only state that writes replace whole and its own parts order
    #: themselves, so it takes no lock: a Pyramid router over remote parts, whose searches must
    #: not wait behind a write's network calls (docs/cluster.md, "What is linearizable")
    lock_free_search: bool = False
    #: True where ``search`` passes ``where`` / ``deadline`` on to ``_search`` (a cluster's
    #: router: its remote parts answer the one and are given the other)
    takes_where: ClassVar[bool] = False
    takes_deadline: ClassVar[bool] = False
    #: what an item is: "vectors" (float rows of ``dim``) or "strings" (str; ``dim`` 0)
    items: ClassVar[str] = "vectors"
    #: options ``train`` takes besides the sample
    train_options: ClassVar[frozenset[str]] = frozenset()
    #: a node logs training and replays it (quick and deterministic); False: it snapshots
    #: the trained index at once instead
    train_logged: ClassVar[bool] = True

    def __init__(self, dim: int, metric: str = "l2", **params: Any):
        if self.items != "vectors" and dim != 0:
            raise InvalidParameterError(f"dim must be 0 for {type(self).__name__}: its items "
                                        f"are {self.items}, not vectors; got dim={dim!r}")
        self.dim = check_int("dim", dim, 1 if self.items == "vectors" else 0, 1 << 16)
        self.metric = check_metric(metric, self.metrics)
        self._params = dict(params)  # build params, saved in the header and passed back on load
        self._idset = IdSet()
        self._is_trained = not self.needs_training
        self._lock = RWLock()  # the concurrency rule: see the module docstring
        self._version = 0  # bumped by every write: keys the filter planner's id lookup
        self._lookup: tuple | None = None

    # -- public API -------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._idset)

    @property
    def next_id(self) -> int:
        """The first id an ``add`` without ids gives (one past the largest id ever held)."""
        return self._idset.next_id

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in self._params.items())
        return f"{type(self).__name__}(dim={self.dim}, metric={self.metric!r}{extra}) n={len(self)}"

    @property
    def is_trained(self) -> bool:
        return self._is_trained

    def ids(self) -> np.ndarray:
        """The ids held, sorted (a copy)."""
        with self._lock.read():
            return self._idset.sorted.copy()

    def contains(self, ids: Any) -> np.ndarray:
        """A boolean per id: is it in the index?"""
        ids = as_id_array(ids)
        with self._lock.read():
            return self._idset.contains(ids)

    def get_vectors(self, ids: Any) -> np.ndarray:
        """The stored vectors of ``ids`` (all held), float32 (n, dim), in the order given: unit
        rows under cosine, a quantized index's reconstructions (faiss's ``reconstruct_batch``,
        hnswlib's ``get_items``). UnknownIdError names ids not held."""
        ids = as_id_array(ids)
        with self._lock.read():
            missing = ~self._idset.contains(ids)
            if missing.any():
                raise UnknownIdError(f"ids must be in the index; {int(missing.sum())} are not, "
                                     f"e.g. id {int(ids[missing][0])}")
            if not ids.size:
                return np.empty((0, self.dim), np.float32)
            try:
                x = self._vectors_of(ids)
            except NotImplementedError:
                raise UnsupportedOperationError(
                    f"{type(self).__name__} keeps no vectors to return") from None
            return np.ascontiguousarray(x, np.float32)

    def check_items(self, x: Any, what: str = "vectors") -> Any:
        """A checked batch of items (what ``add``, ``train`` and ``search`` take), indexable by
        an array of rows: a float32 (n, dim) matrix here."""
        return as_matrix(x, self.dim, self.metric, what)

    def item_bytes(self, x: Any) -> bytes:
        """Checked items as bytes (a node's log); ``items_from_bytes`` reads them back."""
        return np.ascontiguousarray(x, np.float32).tobytes()

    def items_from_bytes(self, blob: bytes) -> Any:
        return np.frombuffer(blob, np.float32).reshape(-1, self.dim)

    def train(self, x: Any, **options: Any) -> None:
        """Learn what the method needs from a sample; a no-op for indexes that learn nothing.
        Re-training a trained index that holds items raises RetrainNonEmptyError and changes
        nothing; an empty index may be re-trained. ``options``: the class's
        ``train_options``."""
        if options and not self.train_options.issuperset(options):
            raise InvalidParameterError(
                f"unknown training option(s) {sorted(set(options) - self.train_options)} for "
                f"{type(self).__name__}; allowed: {sorted(self.train_options)}")
        x = self.check_items(x, f"training {self.items}")
        if not self.needs_training:
            return
        self._check_retrain()
        learnt = self._learn(x, **options)
        with self._lock.write():
            self._check_retrain()
            self._train(learnt)
            self._is_trained = True

    def _check_retrain(self) -> None:
        if self._is_trained and len(self):
            # new codebooks or a new partition would not match the items already encoded
            raise RetrainNonEmptyError(
                f"{type(self).__name__} holds {len(self)} items and is trained; re-training "
                "would strand them. Remove them first, or build a new index and add them")

    def _learn(self, x: Any, **options: Any) -> Any:
        """What ``train`` can do without the lock (a long fit); its result goes to ``_train``.
        """
        if len(x) == 0:
            raise InvalidParameterError(f"training {self.items} must hold at least one; got 0")
        return x

    def add(self, x: Any, ids: Any = None) -> np.ndarray:
        """Add items: vectors x (n, dim) (or strings, for a string index); ids default to
        consecutive integers after the largest id so far. Returns the int64 ids. The whole batch
        is checked before anything changes."""
        x = self.check_items(x)
        with self._lock.write():
            if not self._is_trained:
                raise NotTrainedError(f"{type(self).__name__} must be trained before add()")
            ids = new_ids(ids, len(x), self._idset.next_id, self._idset.contains)
            if len(x):
                self._add(x, ids)
                self._idset.add(ids)
                self._version += 1
            return ids

    def search(self, q: Any, k: int, *, allow: Any = None, deny: Any = None,
               where: dict | None = None, deadline: float | None = None,
               **params: Any) -> SearchResult:
        """Top-k for each query row. q (nq, dim) or (dim,). ``allow`` / ``deny``: None, one
        array of ids for every query, or one array per query; the result holds only allowed,
        non-denied ids (docs/filters.md). ``where`` filters a collection's attributes: an index
        keeps none, so only an index whose parts do (a cluster's) takes it. ``deadline``: an
        absolute ``time.monotonic()`` by which the answer is due (DeadlineExceededError once it
        has passed). Per-call parameters: see the class; one given as a list (or 1-d array)
        holds one value per query, and the queries sharing a value are searched together."""
        k = check_k(k)
        if params and not self.search_params.issuperset(params):
            unknown = set(params) - self.search_params
            raise InvalidParameterError(
                f"unknown search parameter(s) {sorted(unknown)} for {type(self).__name__}; "
                f"allowed: {sorted(self.search_params)}"
            )
        check_deadline(deadline)
        if where is not None:
            if not self.takes_where:
                raise UnsupportedOperationError(
                    f"{type(self).__name__} keeps no attributes for where to filter; a "
                    "collection does (simsearch.connect(), docs/filters.md)")
            params["where"] = where
        if self.takes_deadline:
            params["deadline"] = deadline
        q = self.check_items(q, "queries")
        check_result_size(len(q), k)
        filt = parse_filter(allow, deny, len(q))
        per_query = {name: v for name, v in params.items() if isinstance(v, (list, tuple)) or
                     (isinstance(v, np.ndarray) and v.ndim)} if params else None
        if per_query:
            return self._search_per_query(q, k, filt, params, per_query)
        locked = not self.lock_free_search
        if locked:  # not `with`: a search is hot, and this is measurably cheaper
            self._lock.acquire_read()
        try:
            if not self._is_trained:
                raise NotTrainedError(f"{type(self).__name__} must be trained before search()")
            n = len(self)
            if n == 0 or len(q) == 0:
                return empty_result(len(q), k, self.metric)
            # work is sized by what exists: k beyond the item count costs only the padding
            if filt is None:
                return pad_result(self._search(q, min(k, n), **params), k, self.metric)
            return pad_result(self._search_filtered(q, min(k, n), filt, **params), k,
                              self.metric)
        finally:
            if locked:
                self._lock.release_read()

    def _search_per_query(self, q: np.ndarray, k: int, filt: IdFilter | None, params: dict,
                          per_query: dict) -> SearchResult:
        """Search the rows sharing the same per-query parameter values together."""
        nq = len(q)
        for name, v in per_query.items():
            if np.ndim(v) != 1 or len(v) != nq:
                raise InvalidParameterError(
                    f"{name} given per query must hold one value per query ({nq}); got "
                    f"{np.shape(v)}")
        params = {n: v for n, v in params.items() if n not in per_query}
        columns = [np.asarray(v, object).tolist() for v in per_query.values()]
        groups: dict[tuple, list[int]] = {}
        try:
            for i, key in enumerate(zip(*columns, strict=True)):
                groups.setdefault(key, []).append(i)
        except TypeError:
            raise InvalidParameterError(
                f"per-query values of {sorted(per_query)} must be numbers or strings") from None
        out = empty_result(nq, k, self.metric)
        for key, rows in groups.items():
            r_ = np.asarray(rows)
            filters = {} if filt is None else filt.take(r_).kwargs()
            r = self.search(q[r_], k, **filters, **params,
                            **dict(zip(per_query, key, strict=True)))
            out.ids[r_], out.scores[r_] = r.ids, r.scores
            out.coverage = min(out.coverage, r.coverage)
        return out

    def remove(self, ids: Any) -> int:
        """Remove the given ids (all must be present). Returns how many were removed."""
        ids = as_id_array(ids)
        with self._lock.write():
            check_held(ids, self._idset.contains)
            if ids.size:
                self._remove(ids)
                self._idset.remove(ids)
                self._version += 1
            return int(ids.size)

    def save(self, path: str | os.PathLike) -> None:
        """Write the index atomically (temporary file, fsync, rename): never half a file. Saving
        reads the index, so searches go on meanwhile; writes wait."""
        with self._lock.read():  # the state's arrays are views: no write until written out
            write_index_file(path, *self._file_parts())

    def to_bytes(self) -> bytes:
        """The index as the bytes ``save`` would write; ``simsearch.loads`` reads them back."""
        with self._lock.read():
            return write_index_bytes(*self._file_parts())

    def _file_parts(self) -> tuple[dict, dict[str, np.ndarray]]:
        """(header, arrays) of the file format; the caller holds the read lock."""
        meta, arrays = self._get_state()
        arrays = dict(arrays)
        arrays["__ids__"] = self._idset.sorted
        header = {
            "class": self.kind,
            "metric": self.metric,
            "dim": self.dim,
            "count": len(self),
            "next_id": self._idset.next_id,
            "trained": self._is_trained,
            "params": self._params,
            "meta": meta,
        }
        return header, arrays

    @classmethod
    def load(cls, path: str | os.PathLike) -> Index:
        idx = load(path)
        if not isinstance(idx, cls):
            raise CorruptIndexError(
                f"{path} holds a {type(idx).__name__}, not a {cls.__name__}; use simsearch.load()"
            )
        return idx

    # -- hooks ------------------------------------------------------------------------------

    def _train(self, x: np.ndarray) -> None:
        pass

    def _add(self, x: np.ndarray, ids: np.ndarray) -> None:
        raise NotImplementedError

    def _search(self, q: np.ndarray, k: int, **params: Any) -> SearchResult:
        raise NotImplementedError

    def _remove(self, ids: np.ndarray) -> None:
        raise UnsupportedOperationError(f"{type(self).__name__} does not support remove()")

    def _get_state(self) -> tuple[dict, dict[str, np.ndarray]]:
        raise NotImplementedError

    def _set_state(self, meta: dict, arrays: dict[str, np.ndarray]) -> None:
        raise NotImplementedError

    # -- filtered search (docs/filters.md) ---------------------------------------------------
    #
    # Hooks a kind overrides: _exact_under (is _search exact with these parameters?),
    # _stored (ids and stored vectors by position) or _vectors_of, _traversal_reads and _widen.

    #: how much dearer one vector read of the index's own search is than one of the exact scan
    #: of gathered rows (random access and graph bookkeeping against one matrix product)
    filter_read_cost: ClassVar[float] = 1.0

    def _exact_under(self, params: dict) -> bool:
        return False

    def _stored(self) -> tuple[np.ndarray, np.ndarray]:
        """(external id of each position, -1 where the slot is dead; the stored vectors)."""
        raise NotImplementedError

    def _positions_of(self, ids: np.ndarray) -> np.ndarray:
        """The positions of ids (all present) in :meth:`_stored`'s arrays."""
        cache = self._lookup
        if cache is None or cache[0] != self._version:  # two readers may both build it: benign
            pos_ids = self._stored()[0]
            order = np.argsort(pos_ids, kind="stable")
            cache = self._lookup = (self._version, pos_ids[order], order)
        return cache[2][np.searchsorted(cache[1], ids)]

    def _vectors_of(self, ids: np.ndarray) -> np.ndarray:
        """The stored vectors (unit rows under cosine) of ids, all present, float32."""
        return self._stored()[1][self._positions_of(ids)]

    def _traversal_reads(self, k: int, params: dict) -> float:
        """About how many vectors (or their equivalent in codes) one unfiltered query reads."""
        return float(len(self))

    def _widen(self, k: int, w: float, params: dict) -> tuple[int, dict]:
        """(k', params') that return about as many allowed items at selectivity 1/w as
        (k, params) returns items without a filter."""
        return min(len(self), int(np.ceil(2 * k * w))), params

    def _filtered_traversal(self, q: np.ndarray, k: int, filt: IdFilter, params: dict,
                            w: float) -> tuple[np.ndarray, np.ndarray] | None:
        """(ids, scores) padded, from a search that applies ``filt`` inside the index's own
        traversal at selectivity about 1/w; None (the default) to be searched widened and
        filtered after."""
        return None

    def _exact_allowed(self, q: np.ndarray, k: int, ids: np.ndarray) -> tuple:
        """Exact top-k over the items ids (sorted, present): the scan of the allowed rows."""
        x = self._vectors_of(ids)
        if self.metric == "cosine":
            q = normalize_rows(q)
        return exact_topk(q, x, ids, min(k, ids.size), self.metric)

    def _allowed_ids(self, allow: np.ndarray | None, deny: np.ndarray | None):
        """(the allowed ids held, sorted, or None when only a deny list applies; their count)."""
        held = self._idset
        if allow is not None:
            a = allow[held.contains(allow)]
            if deny is not None and deny.size:
                a = a[~in_sorted(deny, a)]
            return a, int(a.size)
        if deny.size * 4 < len(held):  # a short deny list: at least this many are allowed
            return None, len(held) - int(deny.size)
        return None, len(held) - (int(held.contains(deny).sum()) if deny.size else 0)

    def _search_filtered(self, q: np.ndarray, k: int, filt: IdFilter,
                         **params: Any) -> SearchResult:
        """The planner: per query (once for a shared filter) count the allowed items, then
        answer by the exact scan of them or by the index's own search widened by 1/selectivity
        and filtered (docs/filters.md, "The planner")."""
        nq, n = q.shape[0], len(self)
        out = empty_result(nq, k, self.metric)
        counts = np.zeros(nq, np.int64)  # allowed items per query
        exact_kind = self._exact_under(params)
        reads = 0.0 if exact_kind else self._traversal_reads(k, params)
        # the scan of rows shared by the batch is one matrix product; per query, a gather each
        cost = self.filter_read_cost if filt.shared and nq > 1 else self.filter_read_cost / 4
        scans: list[tuple[np.ndarray, np.ndarray | None]] = []  # (rows, allowed ids or None)
        wide: dict[float, list] = {}  # widening factor -> [rows]
        deny_only: list[np.ndarray] = []  # an exact kind's rows with only a deny list
        everyone = np.arange(nq)
        for i in [0] if filt.shared else range(nq):
            rows = everyone if filt.shared else everyone[i : i + 1]
            allowed, count = self._allowed_ids(filt.allow_of(i), filt.deny_of(i))
            counts[rows] = count
            if count == 0:
                continue  # nothing allowed: padding
            if exact_kind and allowed is None:
                deny_only.append(rows)
            elif exact_kind or count <= k or count * count <= cost * reads * n:
                scans.append((rows, allowed))
            else:  # widening factors rounded up to 2^(1/16): a batch per factor
                w = float(2.0 ** (np.ceil(np.log2(n / count) * 16) / 16))
                wide.setdefault(w, []).append(rows)
        if deny_only:
            rows = np.concatenate(deny_only)
            out.ids[rows], out.scores[rows] = self._exact_denied(q[rows], k, filt.take(rows))
        retry: dict[float, list] = {}
        for w, groups in wide.items():
            self._run_widened(q, k, np.concatenate(groups), w, filt, params, out, scans, retry)
        # answers that sat deeper in the index's ranking than the widening allowed for (a
        # filter correlated with the query: a deny list of its own neighbours, an allow list
        # away from it) are searched once more, as deep as they were found
        for w, groups in retry.items():
            rows = np.concatenate(groups)
            scan = cost * reads * w >= counts[rows]  # cheaper: the exact scan
            scans.extend((rows[j : j + 1], None) for j in np.flatnonzero(scan).tolist())
            if not scan.all():
                self._run_widened(q, k, rows[~scan], w, filt, params, out, scans, None)
        if filt.shared and len(scans) > 1:  # one gather and one product for all of them
            known = [a for _, a in scans if a is not None]
            scans = [(np.concatenate([r for r, _ in scans]), known[0] if known else None)]
        for rows, allowed in scans:
            if allowed is None:  # a deny list only (or a short answer): every allowed id
                i = int(rows[0])
                allowed = self._allowed_ids(filt.allow_of(i), filt.deny_of(i))[0]
                if allowed is None:
                    allowed = self._idset.sorted
                    d = filt.deny_of(i)
                    if d is not None and d.size:
                        allowed = allowed[~in_sorted(d, allowed)]
                if not allowed.size:
                    continue
            ids, scores = self._exact_allowed(q[rows], k, allowed)
            out.ids[rows], out.scores[rows] = -1, pad_score(self.metric)  # a short try's too
            out.ids[rows, : ids.shape[1]], out.scores[rows, : ids.shape[1]] = ids, scores
        return out

    def _exact_denied(self, q: np.ndarray, k: int, filt: IdFilter) -> tuple:
        """An exact kind's answer to deny lists (no allow list): the exact top k + |deny|
        hold the k best allowed items."""
        extra = max(int(self._idset.contains(filt.deny_of(i)).sum()) for i in range(len(q)))
        r = self._search(q, min(len(self), k + extra))
        ok = filt.allowed(r.ids) if filt.shared else np.stack(
            [filt.allowed(r.ids[i], i) for i in range(len(q))])
        return compact(r.ids, r.scores, ok, k, pad_score(self.metric))[:2]

    def _run_widened(self, q, k, rows, w, filt, params, out, scans, retry) -> None:
        """Search rows widened by w, keep the allowed answers in ``out``; queue for one more,
        deeper search (``retry``, a dict) the answers found deeper than 1.25 k w, and for the
        exact scan what comes back without an allowed answer (or short from the second)."""
        own = self._filtered_traversal(q[rows], k, filt.take(rows), params, w)
        if own is not None:  # the index filtered inside its own search
            out.ids[rows], out.scores[rows] = own
            kept = (own[0] >= 0).sum(1)
            scans.extend((rows[j : j + 1], None) for j in np.flatnonzero(kept < k).tolist())
            return
        kk, p = self._widen(k, w, params)
        r = self._search(q[rows], max(kk, k), **p)
        if filt.shared:
            ok = filt.allowed(r.ids)
        else:
            ok = np.stack([filt.allowed(r.ids[j], int(i)) for j, i in enumerate(rows)])
        ids, scores, kept = compact(r.ids, r.scores, ok, k, pad_score(self.metric))
        out.ids[rows], out.scores[rows] = ids, scores
        short = kept < k
        if retry is None:  # the second search: what is still short takes the exact scan
            scans.extend((rows[j : j + 1], None) for j in np.flatnonzero(short).tolist())
            return
        # the depth the k-th allowed answer sat at; for a short answer, the depth the allowed
        # density seen so far puts it at (no allowed answer at all: the exact scan)
        seen = np.maximum((r.ids >= 0).sum(1), 1)
        depth = np.where(short, k * seen / np.maximum(ok.sum(1), 1e-9),
                         np.argmax(np.cumsum(ok, axis=1) >= k, axis=1) + 1)
        for j in np.flatnonzero(short & (ok.sum(1) == 0)).tolist():
            scans.append((rows[j : j + 1], None))
        for j in np.flatnonzero((depth > 1.25 * k * w) & ~(short & (ok.sum(1) == 0))).tolist():
            w2 = float(2.0 ** (np.ceil(np.log2(1.25 * depth[j] / k) * 4) / 4))
            retry.setdefault(w2, []).append(rows[j : j + 1])


def load(path: str | os.PathLike, **given: Any) -> Index:
    """Open any saved index; its class is read from the file's header. ``given``: what the
    class takes at construction besides its build parameters and the file does not hold (a
    PyramidIndex's ``parts`` and ``fanout``, kept by a cluster)."""
    return _restore(*read_index_file(path), str(path), given)


def loads(data: bytes | bytearray | memoryview, **given: Any) -> Index:
    """An index from the bytes of ``Index.to_bytes`` (or of a saved file)."""
    return _restore(*read_index_bytes(bytearray(data), "the index bytes"), "the index bytes",
                    given)


#: file classes of kinds written in an older form, and the module that converts them
_LEGACY_MODULES = {"string-index": "simsearch.strings.string_index",
                   "string-collection": "simsearch.strings.string_index"}


def _restore(header: dict, arrays: dict[str, np.ndarray], path: str,
             given: dict[str, Any]) -> Index:
    if header.get("class") in _LEGACY_MODULES:
        try:
            module = importlib.import_module(_LEGACY_MODULES[header["class"]])
            header, arrays = module.restore_legacy(header, arrays)
        except Exception as exc:
            raise CorruptIndexError(f"{path} could not be restored: {exc}") from None
    try:
        cls = index_class(header["class"])
    except InvalidParameterError:
        raise CorruptIndexError(
            f"{path} holds an index of unknown kind {header.get('class')!r}"
        ) from None
    try:
        idx = cls(header["dim"], metric=header["metric"], **header["params"], **given)
        ids = arrays.pop("__ids__")
        next_id = header["next_id"]
        if ids.ndim != 1 or ids.dtype != np.int64 or (ids.size and (
                ids[0] < 0 or (np.diff(ids) <= 0).any())) or not isinstance(next_id, int) \
                or not (int(ids[-1]) + 1 if ids.size else 0) <= next_id < 2**62:
            raise CorruptIndexError(f"{path}: its id set is not sorted, unique, non-negative ids")
        idx._idset = IdSet(ids.copy(), next_id)
        idx._is_trained = header["trained"]
        idx._set_state(header["meta"], arrays)
    except CorruptIndexError:
        raise
    except Exception as exc:  # a header that parses but does not describe a valid index
        raise CorruptIndexError(f"{path} could not be restored: {exc}") from None
    if len(idx) != header["count"]:
        raise CorruptIndexError(f"{path}: header says {header['count']} items, found {len(idx)}")
    return idx
