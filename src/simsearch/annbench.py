"""ann-benchmarks files in and out (h5py, the ``bench`` extra).

A dataset file holds ``train`` (the base vectors), ``test`` (queries), ``neighbors`` (true top-k
row ids of ``train``) and ``distances``, with the attribute ``distance`` naming the measure. A
result file, one per run, holds ``neighbors``, ``distances`` and ``times`` per query with the
attributes ann-benchmarks' plotting reads (algo, dataset, count, distance, build_time, index_size,
best_search_time, name, run_count, batch_mode, expect_extra).

    simsearch data import glove-100-angular.hdf5      # then: datasets.load("glove-100-angular")
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import CorruptIndexError, InvalidParameterError

#: ann-benchmarks' distance names -> our metrics (angular is cosine: the same order)
METRIC_OF = {"angular": "cosine", "cosine": "cosine", "euclidean": "l2", "l2": "l2",
             "dot": "ip", "ip": "ip", "inner_product": "ip"}
DISTANCE_OF = {"cosine": "angular", "l2": "euclidean", "ip": "dot"}


@dataclass
class AnnFile:
    name: str
    train: np.ndarray
    test: np.ndarray
    neighbors: np.ndarray
    distances: np.ndarray
    metric: str


def read_dataset(path: str | os.PathLike) -> AnnFile:
    """Read an ann-benchmarks dataset file; CorruptIndexError if it is not one."""
    import h5py

    path = Path(path)
    try:
        with h5py.File(path, "r") as f:
            missing = {"train", "test", "neighbors"} - set(f)
            if missing:
                raise CorruptIndexError(
                    f"{path} is not an ann-benchmarks file: no {sorted(missing)}")
            dist = f.attrs.get("distance", "euclidean")
            dist = dist.decode() if isinstance(dist, bytes) else str(dist)
            if dist not in METRIC_OF:
                raise InvalidParameterError(
                    f"{path}: distance {dist!r} has no simsearch metric; "
                    f"known: {sorted(METRIC_OF)}")
            train = np.ascontiguousarray(f["train"][:], np.float32)
            test = np.ascontiguousarray(f["test"][:], np.float32)
            neighbors = np.asarray(f["neighbors"][:], np.int64)
            distances = np.asarray(f["distances"][:], np.float32) if "distances" in f else \
                np.full(neighbors.shape, np.nan, np.float32)
    except OSError as exc:
        raise CorruptIndexError(f"cannot read {path} as HDF5: {exc}") from None
    if train.ndim != 2 or test.ndim != 2 or train.shape[1] != test.shape[1]:
        raise CorruptIndexError(f"{path}: train {train.shape} and test {test.shape} do not match")
    if neighbors.shape[0] != test.shape[0]:
        raise CorruptIndexError(f"{path}: {neighbors.shape[0]} neighbour rows for "
                                f"{test.shape[0]} queries")
    return AnnFile(path.stem, train, test, neighbors, distances, METRIC_OF[dist])


def write_dataset(path: str | os.PathLike, train: np.ndarray, test: np.ndarray,
                  neighbors: np.ndarray, distances: np.ndarray, metric: str) -> None:
    """Write a dataset file in ann-benchmarks' layout."""
    import h5py

    if metric not in DISTANCE_OF:
        raise InvalidParameterError(f"metric must be one of {sorted(DISTANCE_OF)}; got {metric!r}")
    with h5py.File(path, "w") as f:
        f.attrs["distance"] = DISTANCE_OF[metric]
        f.attrs["dimension"] = int(train.shape[1])
        f.attrs["point_type"] = "float"
        f.create_dataset("train", data=np.asarray(train, np.float32))
        f.create_dataset("test", data=np.asarray(test, np.float32))
        f.create_dataset("neighbors", data=np.asarray(neighbors, np.int32))
        f.create_dataset("distances", data=np.asarray(distances, np.float32))


def write_result(path: str | os.PathLike, *, algo: str, dataset: str, metric: str, k: int,
                 neighbors: np.ndarray, distances: np.ndarray, times: np.ndarray,
                 build_time: float, index_size: float, name: str) -> None:
    """One run's result in the layout ann-benchmarks' plotting reads (results/<ds>/<k>/<algo>/)."""
    import h5py

    with h5py.File(path, "w") as f:
        f.attrs.update({
            "algo": algo, "dataset": dataset, "count": int(k), "distance": DISTANCE_OF[metric],
            "build_time": float(build_time), "index_size": float(index_size),
            "best_search_time": float(np.mean(times)), "name": name, "run_count": 1,
            "batch_mode": False, "expect_extra": False, "candidates": float(k),
        })
        f.create_dataset("neighbors", data=np.asarray(neighbors, np.int32))
        f.create_dataset("distances", data=np.asarray(distances, np.float32))
        f.create_dataset("times", data=np.asarray(times, np.float32))
