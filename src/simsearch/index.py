"""The Index contract every index honours, the registry of index kinds, and ``save`` /
:func:`load` / ``to_bytes`` / :func:`loads` (the format itself: fileformat.py; the input checks:
_validate.py; the result type: results.py; the id set: ids.py; what a kind can do:
capabilities.py; the planner of filtered searches: planner.py).

Concurrency (docs/architecture.md, "Concurrency"): every index carries one reader-writer lock, taken
here and nowhere else. Searches and saves share the read side and run in parallel; train, add and
remove take the write side, so a search that overlaps a write sees the index before or after it,
never half of it. Search parameters are passed per call and never stored.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any, ClassVar

import numpy as np

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
from .capabilities import Capabilities
from .errors import (
    CorruptIndexError,
    InvalidParameterError,
    NotTrainedError,
    RetrainNonEmptyError,
    UnknownIdError,
    UnsupportedOperationError,
)
from .fileformat import read_index_bytes, read_index_file, write_index_bytes, write_index_file
from .filters import IdFilter, parse_filter
from .ids import IdSet, check_held, check_restored, new_ids  # noqa: F401  (re-exported)
from .registry import (  # noqa: F401  (re-exported: kinds register here)
    create_index,
    index_class,
    index_kinds,
    register,
)
from .results import (  # noqa: F401  (re-exported: the contract's result)
    Searchable,
    SearchResult,
    empty_result,
    pad_result,
    pad_score,
)

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# the contract

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
      ``_search_filtered(q, k, filt, **params)``: allow / deny lists (planner.FilterPlanner).

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
    #: what the kind can do (capabilities.py); an instance whose build parameters decide
    #: holds its own copy
    capabilities: Capabilities = Capabilities()

    def __init__(self, dim: int, metric: str = "l2", **params: Any):
        items = self.capabilities.items
        if items == "strings" and dim != 0:
            raise InvalidParameterError(f"dim must be 0 for {type(self).__name__}: its items "
                                        f"are strings, not vectors; got dim={dim!r}")
        # a sparse kind's dim is its vocabulary: term ids are uint32
        self.dim = check_int("dim", dim, 0 if items == "strings" else 1,
                             (1 << 32) - 1 if items == "sparse" else 1 << 16)
        self.metric = check_metric(metric, self.metrics)
        self._params = dict(params)  # build params, saved in the header and passed back on load
        self._idset = IdSet()
        self._is_trained = not self.capabilities.needs_training
        self._lock = RWLock()  # the concurrency rule: see the module docstring
        self._version = 0  # bumped by every write: keys the filter planner's id lookup

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
            if not ids.size and self.capabilities.items != "sparse":
                return np.empty((0, self.dim), np.float32)
            try:
                x = self._vectors_of(ids)
            except NotImplementedError:
                raise UnsupportedOperationError(
                    f"{type(self).__name__} keeps no vectors to return") from None
            # vectors as one float32 matrix; a sparse kind's rows as a SparseBatch
            return np.ascontiguousarray(x, np.float32) if isinstance(x, np.ndarray) else x

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
        caps = self.capabilities
        if options and not caps.train_options.issuperset(options):
            raise InvalidParameterError(
                f"unknown training option(s) {sorted(set(options) - caps.train_options)} for "
                f"{type(self).__name__}; allowed: {sorted(caps.train_options)}")
        x = self.check_items(x, f"training {caps.items}")
        if not caps.needs_training:
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
            raise InvalidParameterError(
                f"training {self.capabilities.items} must hold at least one; got 0")
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
        caps = self.capabilities
        if params and not caps.search_params.issuperset(params):
            unknown = set(params) - caps.search_params
            raise InvalidParameterError(
                f"unknown search parameter(s) {sorted(unknown)} for {type(self).__name__}; "
                f"allowed: {sorted(caps.search_params)}"
            )
        check_deadline(deadline)
        if where is not None:
            if not caps.takes_where:
                raise UnsupportedOperationError(
                    f"{type(self).__name__} keeps no attributes for where to filter; a "
                    "collection does (simsearch.connect(), docs/filters.md)")
            params["where"] = where
        if caps.takes_deadline:
            params["deadline"] = deadline
        q = self.check_items(q, "queries")
        check_result_size(len(q), k)
        filt = parse_filter(allow, deny, len(q))
        per_query = {name: v for name, v in params.items() if isinstance(v, (list, tuple)) or
                     (isinstance(v, np.ndarray) and v.ndim)} if params else None
        if per_query:
            return search_per_query(self, q, k, filt, params, per_query)
        locked = not caps.lock_free_search
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

    def _vectors_of(self, ids: np.ndarray) -> np.ndarray:
        """The stored vectors (unit rows under cosine) of ids, all present, float32."""
        raise NotImplementedError

    def _search_filtered(self, q: np.ndarray, k: int, filt: IdFilter,
                         **params: Any) -> SearchResult:
        raise UnsupportedOperationError(f"{type(self).__name__} does not filter by allow or "
                                        "deny lists")

def search_per_query(index: Index, q: np.ndarray, k: int, filt: IdFilter | None,
                     params: dict, per_query: dict) -> SearchResult:
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
    out = empty_result(nq, k, index.metric)
    for key, rows in groups.items():
        r_ = np.asarray(rows)
        filters = {} if filt is None else filt.take(r_).kwargs()
        r = index.search(q[r_], k, **filters, **params,
                        **dict(zip(per_query, key, strict=True)))
        out.ids[r_], out.scores[r_] = r.ids, r.scores
        out.coverage = min(out.coverage, r.coverage)
    return out


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
