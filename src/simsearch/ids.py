"""The ids an index holds (``IdSet``) and the checks of the ids a write gives (docs/architecture.md,
"The Index contract"): new ids unique and free, removed ids held, restored ids whole."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ._validate import MAX_ID, check_batch_ids
from .errors import DuplicateIdError, InvalidIdError, UnknownIdError


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
