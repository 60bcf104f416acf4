"""Input validation shared by every index and the service: typed errors that say what was
wrong and what is allowed (docs/architecture.md, "Errors"), before anything changes."""

from __future__ import annotations

import math
import numbers
import os
import time
from typing import Any

import numpy as np

from ._simd import all_finite
from .errors import (
    DeadlineExceededError,
    DimensionMismatchError,
    InvalidIdError,
    InvalidParameterError,
    InvalidVectorError,
    RepeatedIdError,
)

METRICS = ("ip", "cosine", "l2")
#: metrics whose scores are distances (smaller is better): squared L2, edit distance
DISTANCE_METRICS = frozenset({"l2", "edit"})


def higher_is_better(metric: str) -> bool:
    return metric not in DISTANCE_METRICS
MAX_K = 100_000
#: The most result entries (queries x k) one search may return: above it the search is refused
#: before anything is allocated (a 12-byte entry: 2**25 entries are 400 MB). Set
#: SIMSEARCH_MAX_RESULT_ENTRIES to change it; compare Milvus's nq and topk limits.
MAX_RESULT_ENTRIES = int(os.environ.get("SIMSEARCH_MAX_RESULT_ENTRIES", 1 << 25))



def check_metric(metric: str, allowed: tuple[str, ...] = METRICS) -> str:
    if metric not in allowed:
        raise InvalidParameterError(f"metric must be one of {list(allowed)}; got {metric!r}")
    return metric


def check_int(name: str, value: Any, lo: int, hi: int | None = None) -> int:
    """An integer parameter in [lo, hi]."""
    if type(value) is int and value >= lo and (hi is None or value <= hi):
        return value  # fast path: search parameters are checked on every call
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidParameterError(
            f"{name} must be an integer; got {value!r} of type {type(value).__name__}"
        )
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        allowed = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise InvalidParameterError(f"{name} must be in {allowed}; got {name}={value}")
    return value


def check_threads(n_threads: Any) -> int:
    """A per-call thread count: -1 (all the kernels may use) or 1 to 1024."""
    if type(n_threads) is int and (n_threads == -1 or 1 <= n_threads <= 1024):
        return n_threads
    n_threads = check_int("n_threads", n_threads, -1, 1024)
    if n_threads == 0:
        raise InvalidParameterError("n_threads must be -1 (all cores) or in [1, 1024]; got 0")
    return n_threads


def check_k(k: Any) -> int:
    return check_int("k", k, 1, MAX_K)


def check_deadline(deadline: float | None) -> None:
    """A call's deadline (absolute ``time.monotonic()``): DeadlineExceededError once passed."""
    if deadline is None:
        return
    if type(deadline) is not float and (  # a float needs no ABC check: every call passes here
            not isinstance(deadline, numbers.Real) or isinstance(deadline, bool)) or \
            not math.isfinite(deadline):
        raise InvalidParameterError(
            f"deadline must be a time.monotonic() value (seconds) or None; got {deadline!r:.80}")
    if time.monotonic() >= deadline:
        raise DeadlineExceededError("the call's deadline passed before it could start")


def check_result_size(nq: int, k: int, what: str = "k") -> None:
    """Refuse a search whose (nq, k) result, or (nq, candidates) working set, exceeds
    MAX_RESULT_ENTRIES, before allocating it. ``what`` names the per-query count."""
    if nq * k > MAX_RESULT_ENTRIES:
        raise InvalidParameterError(
            f"a search may hold at most {MAX_RESULT_ENTRIES} entries (queries x {what}); got "
            f"{nq} queries x {what}={k} = {nq * k}: lower {what} or send fewer queries per call "
            "(limit: SIMSEARCH_MAX_RESULT_ENTRIES)"
        )


def as_matrix(x: Any, dim: int, metric: str | None = None, what: str = "vectors") -> np.ndarray:
    """Convert to C-contiguous float32 (n, dim), checking shape, finiteness and (for cosine)
    non-zero norm over the whole batch. A 1-D input of length ``dim`` becomes one row."""
    if (
        type(x) is np.ndarray
        and x.dtype == np.float32
        and x.ndim == 2
        and x.shape[1] == dim
        and x.flags.c_contiguous
        and metric != "cosine"
        and all_finite(x)  # one compiled pass: numpy's isfinite + all costs 7x at batch 1
    ):
        return x  # fast path for the common, already well-formed batch
    try:
        arr = np.asarray(x)
    except Exception as exc:  # ragged lists and the like
        raise DimensionMismatchError(f"{what} must be a (n, {dim}) array; got {exc}") from None
    if arr.dtype == object or not (
        np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)
    ):
        raise InvalidVectorError(
            f"{what} must be a numeric (n, {dim}) array; got dtype {arr.dtype}"
        )
    if arr.ndim == 1 and arr.shape[0] == dim:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] != dim:
        raise DimensionMismatchError(
            f"{what} must have shape (n, {dim}) or ({dim},); got shape {arr.shape}"
        )
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    if not all_finite(arr):
        finite = np.isfinite(arr).all(axis=1)
        row = int(np.flatnonzero(~finite)[0])
        raise InvalidVectorError(
            f"{what} must be finite; row {row} holds NaN or Inf ({int((~finite).sum())} bad rows)"
        )
    if metric == "cosine" and arr.shape[0]:
        zero = ~(np.abs(arr).max(axis=1) > 0)
        if zero.any():
            raise InvalidVectorError(
                f"{what} must be non-zero under the cosine metric; row "
                f"{int(np.flatnonzero(zero)[0])} is all zeros"
            )
    return arr


def as_id_array(ids: Any, what: str = "ids") -> np.ndarray:
    """A 1-D int64 array of non-negative ids."""
    arr = np.asarray(ids)
    if arr.ndim == 0:
        arr = arr[None]
    if arr.ndim != 1:
        raise InvalidIdError(f"{what} must be a 1-D sequence of integers; got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise InvalidIdError(f"{what} must be integers; got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and arr.min() < 0:
        raise InvalidIdError(f"{what} must be >= 0; got {int(arr.min())}")
    return arr


#: the largest id an item may take: a saved index keeps its next free id below 2**62
MAX_ID = (1 << 62) - 2


def check_batch_ids(ids: Any, n: int) -> np.ndarray:
    """Ids for a batch of n vectors: integers in [0, MAX_ID], one per vector, unique."""
    ids = as_id_array(ids)
    if ids.size and ids.max() > MAX_ID:
        raise InvalidIdError(f"ids must be at most {MAX_ID} (2**62 - 2); got {int(ids.max())}")
    if ids.shape[0] != n:
        raise InvalidIdError(
            f"ids must have one entry per vector: got {ids.shape[0]} ids for {n} vectors"
        )
    uniq, counts = np.unique(ids, return_counts=True)
    if uniq.size != ids.size:
        raise RepeatedIdError(
            f"ids must be unique within a batch; id {int(uniq[counts > 1][0])} repeats"
        )
    return ids


def normalize_rows(x: np.ndarray) -> np.ndarray:
    """Unit rows; all-zero rows (allowed under "ip") stay zero instead of turning into NaN."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return np.ascontiguousarray(x / norms, dtype=np.float32)
