"""A numpy array that grows by appends in amortized O(added) (a node's attribute columns, a
sparse index's rows)."""

from __future__ import annotations

from typing import Any

import numpy as np


class Grow:
    """A numpy array that appends in amortized O(added): capacity doubles."""

    __slots__ = ("arr", "n")

    def __init__(self, dtype: Any, data: np.ndarray | None = None):
        self.arr = np.empty(0, dtype) if data is None else np.array(data, dtype)
        self.n = self.arr.size

    def view(self) -> np.ndarray:
        return self.arr[: self.n]

    def append(self, values: np.ndarray) -> None:
        m = self.n + len(values)
        if m > self.arr.size:
            grown = np.empty(max(m, 2 * self.arr.size, 16), self.arr.dtype)
            grown[: self.n] = self.arr[: self.n]
            self.arr = grown
        self.arr[self.n : m] = values
        self.n = m

    def extend_with(self, value: Any, count: int) -> None:
        self.append(np.full(count, value, self.arr.dtype))

    def keep(self, mask_or_index: np.ndarray) -> None:
        self.arr = self.view()[mask_or_index].copy()
        self.n = self.arr.size
