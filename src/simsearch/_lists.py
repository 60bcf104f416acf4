"""Inverted lists over directions for inner-product search, shared by NEQIndex and NormIVFIndex.

Lists are spherical k-means cells of the items' directions. A query ranks them by R·(q·c): the
list's largest norm R times its inner product with the centroid c, an estimate of the best q·x
in the list that, as NR-LSH's ranking across norm ranges does, lets a list of large vectors a
little off the query's direction outrank a list of small ones right on it (docs/architecture.md,
"MIPS"; measured against q·c alone in docs/bench/quant.md).
"""

from __future__ import annotations

import faiss
import numpy as np

from ._kernels import topk_rows
from .errors import InvalidParameterError

_TINY = 1e-30


def train_centroids(x: np.ndarray, n_lists: int, seed: int) -> np.ndarray:
    """Spherical k-means centroids of x's directions: float32 (n_lists, dim)."""
    if x.shape[0] < n_lists:
        raise InvalidParameterError(
            f"n_lists={n_lists} needs at least that many training vectors; got {x.shape[0]}"
        )
    u = x / np.maximum(np.linalg.norm(x, axis=1), _TINY)[:, None]
    km = faiss.Kmeans(x.shape[1], n_lists, niter=20, spherical=True, seed=seed)
    km.train(np.ascontiguousarray(u, np.float32))
    return np.ascontiguousarray(km.centroids, np.float32)


def assign(x: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """The list of each row: the centroid with the largest inner product (int64 (n,))."""
    flat = faiss.IndexFlatIP(centroids.shape[1])
    flat.add(centroids)
    return flat.search(np.ascontiguousarray(x, np.float32), 1)[1][:, 0].astype(np.int64)


def check_ranking(ranking: str) -> None:
    """A list ranking is "norm" (the list's largest norm times q·c) or "centroid" (q·c alone)."""
    if ranking not in ("norm", "centroid"):
        raise InvalidParameterError(f"list_ranking must be 'norm' or 'centroid'; got {ranking!r}")


def rank(q: np.ndarray, centroids: np.ndarray, list_norm: np.ndarray, n_probe: int,
         ranking: str = "norm") -> np.ndarray:
    """The n_probe lists to visit per query, best first: int64 (nq, n_probe).
    ``ranking="centroid"`` ranks by q·c alone."""
    check_ranking(ranking)
    s = q @ centroids.T
    if ranking == "norm":
        s = s * list_norm[None, :]
    n_probe = min(n_probe, centroids.shape[0])
    if n_probe == centroids.shape[0]:
        return np.ascontiguousarray(np.broadcast_to(np.arange(n_probe), s.shape), np.int64)
    if n_probe >= 16 and q.shape[0] >= 16:
        # many lists for many queries: numpy's selection then a sort of the selected is 2x the
        # heap's pass (whose pushes and pops grow with n_probe: 9 of a 97 ms NEQ batch on
        # fi-300 probing 88 of 220 lists); ties among equal scores are numpy's to break
        top = np.argpartition(-s, n_probe - 1, axis=1)[:, :n_probe]
        order = np.argsort(-np.take_along_axis(s, top, 1), axis=1, kind="stable")
        return np.ascontiguousarray(np.take_along_axis(top, order, 1), np.int64)
    # one heap pass per row, best first: numpy's argpartition took a third of a one-list NEQ
    # search (docs/benchmarks.md, "NEQ against ScaNN as the tail gets lighter")
    return topk_rows(np.ascontiguousarray(s, np.float32), n_probe, 1.0,
                     np.arange(s.shape[1], dtype=np.int64))[0]
