"""Allow and deny lists: their validation and the small pieces the planner of filtered searches
is made of (the planner itself: planner.py; docs/filters.md).

``Index.search(q, k, allow=None, deny=None)``: each of ``allow`` / ``deny`` is None, one array of
ids for every query, or a sequence of one array per query. A result holds only ids that are
allowed and not denied. Unknown ids in the lists are ignored.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import InvalidFilterError

IdLists = np.ndarray | list[np.ndarray] | None  # shared, per query, or absent


class IdFilter:
    """Validated lists: ``allow`` and ``deny`` each None, one sorted unique int64 array (every
    query) or a list of them (one per query)."""

    __slots__ = ("allow", "deny")

    def __init__(self, allow: IdLists, deny: IdLists):
        self.allow, self.deny = allow, deny

    @property
    def shared(self) -> bool:
        """Is it the same filter for every query?"""
        return not isinstance(self.allow, list) and not isinstance(self.deny, list)

    def allow_of(self, i: int) -> np.ndarray | None:
        return self.allow[i] if isinstance(self.allow, list) else self.allow

    def deny_of(self, i: int) -> np.ndarray | None:
        return self.deny[i] if isinstance(self.deny, list) else self.deny

    def take(self, rows: np.ndarray) -> IdFilter:
        """The filter of a subset of the queries (a cluster part asked for some of them)."""
        def sub(v: IdLists) -> IdLists:
            return [v[i] for i in rows.tolist()] if isinstance(v, list) else v

        return IdFilter(sub(self.allow), sub(self.deny))

    def kwargs(self) -> dict[str, Any]:
        """As ``search`` keyword arguments."""
        return {"allow": self.allow, "deny": self.deny}

    def allowed(self, ids: np.ndarray, i: int | None = None) -> np.ndarray:
        """A boolean per entry of ``ids`` (any shape, -1 padding is never allowed): allowed and
        not denied, under query i's lists (a shared filter: i is ignored)."""
        a = self.allow if i is None else self.allow_of(i)
        d = self.deny if i is None else self.deny_of(i)
        ok = ids >= 0
        if a is not None:
            ok &= in_sorted(a, ids)
        if d is not None and d.size:
            ok &= ~in_sorted(d, ids)
        return ok


def in_sorted(sorted_ids: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Is each entry of x in the sorted array? (O(len(x) log n), any shape of x.)"""
    if not sorted_ids.size:
        return np.zeros(np.shape(x), bool)
    pos = np.minimum(np.searchsorted(sorted_ids, x), sorted_ids.size - 1)
    return sorted_ids[pos] == x


def parse_filter(allow: Any, deny: Any, nq: int) -> IdFilter | None:
    """Validate ``allow`` / ``deny`` for a batch of nq queries; None when there is no filter.
    Raises InvalidFilterError naming the argument on a bad shape or type."""
    if allow is None and deny is None:
        return None
    return IdFilter(_id_lists(allow, "allow", nq), _id_lists(deny, "deny", nq))


def _is_list_like(v: Any) -> bool:
    return isinstance(v, (list, tuple, np.ndarray, set, frozenset, range))


def _id_lists(value: Any, name: str, nq: int) -> IdLists:
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        if value.ndim == 2:
            per = list(value)
        elif value.ndim <= 1:
            return _id_list(value, name)
        else:
            raise InvalidFilterError(
                f"{name} must be a 1-D array of ids (every query) or one per query; got an "
                f"array of shape {value.shape}")
    elif isinstance(value, (set, frozenset, range)):
        return _id_list(list(value), name)
    elif isinstance(value, (list, tuple)):
        if not value or not any(_is_list_like(v) for v in value):
            return _id_list(value, name)
        per = list(value)
    else:
        raise InvalidFilterError(
            f"{name} must be None, an array of ids for every query, or a sequence of one array "
            f"per query; got {type(value).__name__}")
    if len(per) != nq:
        raise InvalidFilterError(
            f"a per-query {name} needs one id array per query: got {len(per)} for {nq} queries")
    out = []
    for i, v in enumerate(per):
        if not _is_list_like(v):
            raise InvalidFilterError(
                f"{name}[{i}] must be an array of ids; got {type(v).__name__}")
        out.append(_id_list(list(v) if isinstance(v, (set, frozenset)) else v, f"{name}[{i}]"))
    return out


def _id_list(value: Any, name: str) -> np.ndarray:
    """Sorted unique int64 ids; negative ids (never in an index) dropped."""
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise InvalidFilterError(f"{name} must be a 1-D array of integer ids; got {exc}") from None
    if arr.ndim > 1:
        raise InvalidFilterError(
            f"{name} must be a 1-D array of integer ids; got shape {arr.shape}")
    if not arr.size:
        return np.empty(0, np.int64)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise InvalidFilterError(
            f"{name} must hold integer ids; got dtype {arr.dtype} (a boolean mask is not an id "
            "list: pass np.flatnonzero(mask) of your ids)")
    arr = arr.reshape(-1).astype(np.int64, copy=False)
    if arr.size > 1 and not (arr[1:] > arr[:-1]).all():  # sorted unique lists pass as they are
        arr = np.sort(arr)  # (np.unique hashes first: 4x slower on short lists)
        repeat = arr[1:] == arr[:-1]
        if repeat.any():
            arr = arr[np.concatenate(([True], ~repeat))]
    return arr[np.searchsorted(arr, 0) :] if arr[0] < 0 else arr


def compact(ids: np.ndarray, scores: np.ndarray, ok: np.ndarray, k: int,
            pad: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Keep, per row, the first k entries where ``ok``, order kept, padded with -1 / ``pad``.
    Returns (ids (nq, k), scores (nq, k), how many each row kept)."""
    nq = ids.shape[0]
    order = np.argsort(~ok, axis=1, kind="stable")[:, :k]
    out_i = np.take_along_axis(ids, order, 1)
    out_s = np.take_along_axis(scores, order, 1).astype(np.float32, copy=False)
    kept = np.minimum(ok.sum(1), k)
    bad = np.arange(order.shape[1])[None, :] >= kept[:, None]
    out_i = np.where(bad, -1, out_i)
    out_s = np.where(bad, pad, out_s).astype(np.float32)
    if out_i.shape[1] < k:
        wide_i = np.full((nq, k), -1, np.int64)
        wide_s = np.full((nq, k), pad, np.float32)
        wide_i[:, : out_i.shape[1]], wide_s[:, : out_s.shape[1]] = out_i, out_s
        out_i, out_s = wide_i, wide_s
    return out_i, out_s, kept
