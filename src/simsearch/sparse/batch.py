"""Sparse items (docs/sparse.md): a batch of rows over a vocabulary of ``dim`` terms, each row its
sorted term ids (uint32) and their weights (float32), as a CSR matrix keeps them.

A batch is accepted as a ``scipy.sparse`` matrix or array (any format; CSR kept as it is), a
``SparseBatch``, a list of ``(indices, values)`` pairs, or one such pair (one item). Every
check runs before anything changes: term ids in ``[0, dim)``, strictly increasing within a row
(a scipy matrix with duplicates or unsorted indices is refused: ``sum_duplicates()`` makes it
canonical), finite weights, and, where the kind says so, no negative weight.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidParameterError

MAX_NNZ = 1 << 31  # a batch's stored entries (int64 offsets inside, uint32 term ids)


@dataclass(frozen=True, slots=True)
class SparseBatch:
    """Rows of sparse items: row ``r`` holds ``indices[indptr[r]:indptr[r+1]]`` (uint32 term ids,
    strictly increasing) with ``values`` (float32) over a vocabulary of ``dim`` terms.
    Indexable by an int, a slice or an array of rows (a batch again), as a matrix is.

    >>> from simsearch.sparse import sparse_batch
    >>> b = sparse_batch([([0, 3], [1.0, 0.5]), ([2], [2.0])], dim=5)
    >>> len(b), b.nnz, b.row(0)[0].tolist()
    (2, 3, [0, 3])
    >>> b[[1]].to_scipy().toarray().tolist()
    [[0.0, 0.0, 2.0, 0.0, 0.0]]
    """

    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    dim: int

    def __len__(self) -> int:
        return self.indptr.size - 1

    @property
    def nnz(self) -> int:
        return int(self.indptr[-1] - self.indptr[0])

    def row(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = self.indptr[r], self.indptr[r + 1]
        return self.indices[a:b], self.values[a:b]

    def __getitem__(self, rows: Any) -> SparseBatch:
        if isinstance(rows, (int, np.integer)):
            rows = np.array([rows])
        if isinstance(rows, slice):
            rows = np.arange(len(self))[rows]
        rows = np.asarray(rows)
        if rows.dtype == bool:
            rows = np.flatnonzero(rows)
        starts, ends = self.indptr[rows], self.indptr[rows + 1]
        lengths = ends - starts
        indptr = np.zeros(rows.size + 1, np.int64)
        np.cumsum(lengths, out=indptr[1:])
        take = np.repeat(starts - indptr[:-1], lengths) + np.arange(indptr[-1])
        return SparseBatch(indptr, self.indices[take], self.values[take], self.dim)

    def to_scipy(self) -> Any:
        """A ``scipy.sparse.csr_matrix`` sharing nothing it need not copy."""
        import scipy.sparse as sp  # here, not at the top: it is 0.13 s of every process's start

        a, b = self.indptr[0], self.indptr[-1]
        return sp.csr_matrix((self.values[a:b], self.indices[a:b], self.indptr - a),
                             shape=(len(self), self.dim))

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The batch transposed (CSC): each term's row offsets, rows (int64) and weights."""
        m = self.to_scipy().tocsc()
        return m.indptr.astype(np.int64), m.indices.astype(np.int64), m.data.astype(np.float32)

    def to_bytes(self) -> bytes:
        """indptr (int64, from 0), then indices (uint32), then values (float32)."""
        ip = self.indptr - self.indptr[0]
        head = np.array([len(self), ip[-1]], np.int64)
        return b"".join(a.tobytes() for a in (head, ip, self.indices, self.values))

    @classmethod
    def from_bytes(cls, blob: bytes, dim: int) -> SparseBatch:
        n, nnz = (int(v) for v in np.frombuffer(blob, np.int64, 2))
        if n < 0 or nnz < 0 or len(blob) != 16 + 8 * (n + 1) + 8 * nnz:
            raise ValueError("sparse batch bytes of the wrong length")
        ip = np.frombuffer(blob, np.int64, n + 1, 16)
        ind = np.frombuffer(blob, np.uint32, nnz, 16 + 8 * (n + 1))
        val = np.frombuffer(blob, np.float32, nnz, 16 + 8 * (n + 1) + 4 * nnz)
        return sparse_batch(cls(ip, ind, val, dim), dim, "logged items")


def _flat(a: Any) -> bool:
    """A 1-d array, or a list or tuple of numbers: one row's indices or values."""
    if isinstance(a, np.ndarray):
        return a.ndim == 1
    return isinstance(a, (list, tuple)) and all(
        isinstance(v, (int, float, np.number)) and not isinstance(v, bool) for v in a)


def _from_pairs(pairs: Sequence, what: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lengths = np.zeros(len(pairs) + 1, np.int64)
    idx, val = [], []
    for r, pair in enumerate(pairs):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise InvalidParameterError(
                f"{what} must be sparse rows: (indices, values) pairs, a scipy.sparse matrix or "
                f"a SparseBatch; row {r} is {type(pair).__name__}")
        i, v = (np.asarray(a) for a in pair)
        if i.ndim != 1 or v.ndim != 1 or i.size != v.size:
            raise InvalidParameterError(
                f"{what}: row {r} must hold as many indices as values, each 1-d; got shapes "
                f"{i.shape} and {v.shape}")
        if i.size and not np.issubdtype(i.dtype, np.integer):
            raise InvalidParameterError(f"{what}: row {r}'s indices must be integers; got "
                                        f"{i.dtype}")
        if v.size and not (np.issubdtype(v.dtype, np.floating)
                           or np.issubdtype(v.dtype, np.integer)):
            raise InvalidParameterError(f"{what}: row {r}'s values must be numbers; got "
                                        f"{v.dtype}")
        lengths[r + 1] = i.size
        idx.append(i.astype(np.int64, copy=False))
        val.append(v.astype(np.float64, copy=False))
    indptr = np.cumsum(lengths)
    cat = (lambda xs, dt: np.concatenate(xs) if xs else np.empty(0, dt))
    return indptr, cat(idx, np.int64), cat(val, np.float64)


def sparse_batch(x: Any, dim: int, what: str = "items", nonnegative: bool = True,
                 allow_empty_rows: bool = True) -> SparseBatch:
    """A checked SparseBatch of ``x`` (module docstring) over ``dim`` terms; InvalidParameterError
    naming what was wrong and what is allowed."""
    if isinstance(x, SparseBatch):
        indptr, indices, values = x.indptr - x.indptr[0], x.indices, x.values
        if x.dim != dim:
            raise InvalidParameterError(f"{what} are over {x.dim} terms; this index's "
                                        f"vocabulary has dim={dim}")
    elif (sp := sys.modules.get("scipy.sparse")) is not None and sp.issparse(x):
        # a scipy matrix exists only if scipy was imported
        if x.ndim != 2 or x.shape[1] != dim:
            raise InvalidParameterError(f"{what} must have dim={dim} columns (the vocabulary); "
                                        f"got shape {x.shape}")
        x = x.tocsr() if x.format != "csr" else x
        if not x.has_canonical_format:
            raise InvalidParameterError(
                f"{what}: a row repeats or misorders its indices; call sum_duplicates() (and "
                "sort_indices()) on the matrix first")
        indptr, indices, values = x.indptr.astype(np.int64), x.indices, x.data
        if values.size and not (np.issubdtype(values.dtype, np.floating)
                                or np.issubdtype(values.dtype, np.integer)):
            raise InvalidParameterError(f"{what}' values must be numbers; got {values.dtype}")
    elif isinstance(x, tuple) and len(x) == 2 and _flat(x[0]) and _flat(x[1]):
        indptr, indices, values = _from_pairs([x], what)  # one item: (indices, values)
    elif isinstance(x, (list, tuple)):
        indptr, indices, values = _from_pairs(x, what)
    else:
        raise InvalidParameterError(
            f"{what} must be sparse rows: a scipy.sparse matrix, a SparseBatch, or a list of "
            f"(indices, values) pairs; got {type(x).__name__}")
    n = indptr.size - 1
    if indptr[-1] > MAX_NNZ:
        raise InvalidParameterError(f"{what} hold {int(indptr[-1])} entries; at most {MAX_NNZ}")
    indices = np.asarray(indices)
    if indices.size:
        lo, hi = int(indices.min()), int(indices.max())
        if lo < 0 or hi >= dim:
            bad = lo if lo < 0 else hi
            raise InvalidParameterError(f"{what}: term id {bad} is outside the vocabulary "
                                        f"[0, {dim})")
        rows = np.repeat(np.arange(n), np.diff(indptr))
        same_row = rows[1:] == rows[:-1]
        bad = same_row & (indices[1:].astype(np.int64) <= indices[:-1].astype(np.int64))
        if bad.any():
            r = int(rows[1:][bad][0])
            raise InvalidParameterError(
                f"{what}: row {r}'s indices must be strictly increasing (sorted, none "
                "repeated)")
    values = np.asarray(values)
    if values.size:
        if not np.isfinite(values).all():
            raise InvalidParameterError(f"{what}: weights must be finite; got NaN or inf")
        if nonnegative and (values < 0).any():
            raise InvalidParameterError(f"{what}: weights must be >= 0 for this kind; got "
                                        f"{float(values.min())}")
        if np.abs(values).max() > np.finfo(np.float32).max:
            raise InvalidParameterError(f"{what}: weights must fit float32")
    if not allow_empty_rows and n and (np.diff(indptr) == 0).any():
        r = int(np.flatnonzero(np.diff(indptr) == 0)[0])
        raise InvalidParameterError(f"{what}: row {r} is empty; this kind needs a term a row")
    return SparseBatch(np.ascontiguousarray(indptr, np.int64),
                       np.ascontiguousarray(indices, np.uint32),
                       np.ascontiguousarray(values, np.float32), int(dim))
