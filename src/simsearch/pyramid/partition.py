"""The Pyramid's partition of its centres (docs/cluster.md, "The router"): the meta-HNSW's
level-0 graph as an undirected graph, edge weights by centre similarity, and METIS's balanced
k-way cut of it (the paper's partition of the meta-HNSW into w sub-HNSWs)."""

from __future__ import annotations

import faiss
import numpy as np
import pymetis

from ..hnsw import HNSWIndex
from ..index import normalize_rows
from .router import nearest_centre


def hnsw_level0_graph(meta: HNSWIndex) -> np.ndarray:
    """The level-0 graph of an hnswlib-backed HNSWIndex as (n, max_m0) int64 neighbour labels,
    -1 padded, rows ordered by label (labels must be 0..n-1)."""
    g = meta.graph()
    if len(g["links0"]) != len(meta):
        raise RuntimeError("unexpected hnswlib layout: labels are not 0..n-1")
    return g["links0"].astype(np.int64)


def undirected_csr(nbrs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A directed neighbour table (n, deg), -1 padded, as an undirected simple graph in CSR form
    (xadj (n+1,), adjncy), both directions stored, no self-loops or repeated edges."""
    n = nbrs.shape[0]
    src = np.repeat(np.arange(n), nbrs.shape[1])
    dst = nbrs.ravel()
    keep = (dst >= 0) & (dst != src)
    src, dst = src[keep], dst[keep]
    a = np.concatenate([src, dst])
    b = np.concatenate([dst, src])
    key = np.unique(a * n + b)
    a, b = key // n, key % n
    xadj = np.zeros(n + 1, np.int64)
    np.add.at(xadj, a + 1, 1)
    return np.cumsum(xadj), b.astype(np.int64)


def similarity_edge_weights(xadj: np.ndarray, adjncy: np.ndarray, centres: np.ndarray,
                            tau: float) -> np.ndarray:
    """Integer METIS edge weights exp((s - s_max) / tau) * 1000 (at least 1) for the inner
    product s of unit centres: cutting between very close centres costs most."""
    src = np.repeat(np.arange(xadj.shape[0] - 1), np.diff(xadj))
    sim = np.einsum("ij,ij->i", centres[src], centres[adjncy])
    return np.maximum(1, np.round(1000 * np.exp((sim - sim.max()) / tau))).astype(np.int64)


def partition_graph(
    xadj: np.ndarray, adjncy: np.ndarray, weights: np.ndarray, n_parts: int, seed: int = 0,
    edge_weights: np.ndarray | None = None,
) -> np.ndarray:
    """Balanced k-way partition with METIS (pymetis): parts of near-equal total vertex weight,
    few cut edges (or little cut edge weight). Returns int64 (n,) part per vertex."""
    n = xadj.shape[0] - 1
    if n_parts == 1:
        return np.zeros(n, np.int64)
    opts = pymetis.Options(seed=seed)
    _, parts = pymetis.part_graph(
        n_parts, pymetis.CSRAdjacency(xadj.tolist(), adjncy.tolist()),
        vweights=[int(w) for w in weights], options=opts,
        eweights=None if edge_weights is None else edge_weights.tolist(),
    )
    return np.asarray(parts, np.int64)


def build_meta(centres: np.ndarray, spherical: bool, M: int, seed: int) -> HNSWIndex:
    """The meta-HNSW over the centres (inner product for unit centres, else L2)."""
    meta = HNSWIndex(centres.shape[1], "ip" if spherical else "l2", M=M, ef_construction=200,
                     seed=seed, n_threads=1, capacity=max(1, centres.shape[0]))
    meta.add(centres)
    return meta


def fit_partition(sample: np.ndarray, n_centers: int, n_parts: int, spherical: bool,
                  seed: int, meta_M: int, edge_tau: float):
    """k-means centres of ``sample`` (spherical: unit centres of the directions), the meta-HNSW
    over them, and its balanced partition, weighted by the sample's cluster sizes so parts are
    balanced by items, not centres. Returns (centres, part of each centre, meta-HNSW, sizes)."""
    if spherical:
        sample = normalize_rows(sample)
    sample = np.ascontiguousarray(sample, np.float32)
    km = faiss.Kmeans(sample.shape[1], n_centers, niter=20, seed=seed, spherical=spherical,
                      verbose=False, min_points_per_centroid=1)
    km.train(sample)
    centres = np.ascontiguousarray(km.centroids, np.float32)
    if spherical:
        norms = np.linalg.norm(centres, axis=1, keepdims=True)
        centres = np.where(norms > 0, centres / np.maximum(norms, 1e-30), centres)
    sizes = np.bincount(nearest_centre(sample, centres, spherical), minlength=n_centers)
    meta = build_meta(centres, spherical, meta_M, seed)
    xadj, adjncy = undirected_csr(hnsw_level0_graph(meta))
    ew = similarity_edge_weights(xadj, adjncy, centres, edge_tau) if edge_tau and spherical \
        else None
    poc = partition_graph(xadj, adjncy, sizes + 1, n_parts, seed, ew)
    return centres, poc.astype(np.int64), meta, sizes
