"""The Index contract suite's cases. A new index joins every contract test by adding one
``Case`` line to ``CASES``; tests/test_contract.py runs the checks over all of them."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

import simsearch as ss


@dataclass(frozen=True)
class Case:
    """How to make one index kind for the contract suite.

    make(dim, metric, train_x) returns an index ready for add() (trained where needed).
    min_recall: recall@10 against the exact oracle on the fixture with ``search_kw``.
    exact: results must equal the oracle's (ids by score, scores to float tolerance).
    items: what the kind holds ("vectors"; "strings": the string fixture, dim 0; "sparse":
    topic-clustered sparse rows of counts over SPARSE_DIM terms).
    """

    id: str
    make: Callable[[int, str, np.ndarray], ss.Index]
    metrics: tuple[str, ...] = ("ip", "cosine", "l2")
    search_kw: dict = field(default_factory=dict)
    min_recall: float = 0.9
    exact: bool = False
    supports_remove: bool = True
    items: str = "vectors"


SPARSE_DIM = 512


def dim_of(case: Case, dim: int) -> int:
    """The dim a case's index is made with: 0 for strings, the vocabulary for sparse rows."""
    return {"strings": 0, "sparse": SPARSE_DIM}.get(case.items, dim)


def sparse_rows(n: int, seed: int):
    """Rows of term counts drawn from 20 topics of 40 terms (as text and learned sparse vectors
    cluster), a scipy CSR matrix."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    topics = np.random.default_rng(99).choice(SPARSE_DIM, (20, 40))
    indptr, indices, values = [0], [], []
    for _ in range(n):
        terms = np.unique(np.concatenate([rng.choice(topics[rng.integers(20)], 12),
                                          rng.choice(SPARSE_DIM, 3)]))
        indices.append(terms)
        values.append(rng.integers(1, 5, terms.size).astype(np.float32))
        indptr.append(indptr[-1] + terms.size)
    return sp.csr_matrix((np.concatenate(values), np.concatenate(indices), indptr),
                         shape=(n, SPARSE_DIM))


def items_of(case: Case, n: int, n_queries: int, dim: int, seed: int):
    """(base, queries) of the case's items: long-tailed vectors, or strings (object arrays)."""
    from simsearch.datasets import synthetic_longtail
    from string_fixture import strings

    if case.items == "strings":
        return strings(n, n_queries, seed)
    if case.items == "sparse":
        from simsearch.sparse import sparse_batch

        return (sparse_batch(sparse_rows(n, seed), SPARSE_DIM),
                sparse_batch(sparse_rows(n_queries, seed + 1000), SPARSE_DIM))
    return synthetic_longtail(n=n, dim=dim, n_queries=n_queries, n_clusters=30, seed=seed)


def tie_data(case: Case, queries, base) -> dict:
    """What recall_at_k needs to count ties (the dense rows); sparse rows are scored exactly
    by their oracle, so ties count by its scores alone."""
    return {} if case.items == "sparse" else {"queries": queries, "base": base}


def exact_search(case: Case, metric: str, dim: int, base, ids, queries, k: int):
    """The exact top-k of ``queries`` among ``base`` (with ``ids``): FlatIndex, or for strings
    every item re-ranked by edit distance (a flat embedding index asked for all of them)."""
    if case.items == "strings":
        idx = ss.create_index("strings", 0, "edit", index="flat", encoder=string_encoder())
        idx.add(base, ids)
        return idx.search(queries, k, n_candidates=len(ids))
    if case.items == "sparse":  # the exact scan; BM25's own scoring is exact by construction
        idx = ss.create_index("bm25" if case.id == "bm25" else "sparse-flat", SPARSE_DIM, "ip")
        idx.add(base, ids)
        return idx.search(queries, k)
    idx = ss.FlatIndex(dim, metric)
    idx.add(base, ids)
    return idx.search(queries, k)


@functools.cache
def string_encoder():
    """One small CNN-ED encoder for the string cases (trained once per session)."""
    from simsearch.strings import CNNEDEncoder
    from string_fixture import strings

    base, _ = strings()
    return CNNEDEncoder(alphabet="acgt", max_len=16, embed_dim=32, seed=0).fit(
        base[:600].tolist(), epochs=2, n_train=600, n_neighbors=20, progress=False)


CASES = [
    Case("flat", lambda d, m, x: ss.FlatIndex(d, m), exact=True, min_recall=1.0),
    Case(
        "auto",  # measures its candidates on the first add (here: 3,000 items)
        lambda d, m, x: ss.create_index(
            "auto", d, m, target_recall=0.95, sample_size=2000, n_eval=50,
            candidates=("flat", "hnsw", "norm-scan") if m == "ip" else ("flat", "hnsw"),
        ),
        min_recall=0.9,
    ),
    Case("norm-scan", lambda d, m, x: ss.NormScanIndex(d, m), metrics=("ip",), exact=True,
         min_recall=1.0),
    # every list visited by default: exact
    Case("norm-ivf", lambda d, m, x: (i := ss.NormIVFIndex(d, m, n_lists=16)).train(x) or i,
         metrics=("ip",), exact=True, min_recall=1.0),
    # observed recall@10 on the fixture: 1.0 for all three metrics at ef=64
    Case(
        "hnsw",
        lambda d, m, x: ss.HNSWIndex(d, m, M=16, ef_construction=100),
        search_kw={"ef": 64},
        min_recall=0.95,
    ),
    Case(
        "nr-lsh",
        lambda d, m, x: ss.create_index("nr-lsh", d, m, n_bits=16, n_ranges=8),
        metrics=("ip",),
        search_kw={"n_probe_items": 600},
        min_recall=0.95,
    ),  # observed 0.99
    Case(
        "simple-lsh",
        lambda d, m, x: ss.create_index("simple-lsh", d, m, n_bits=16),
        metrics=("ip",),
        search_kw={"n_probe_items": 1200},
        min_recall=0.9,
    ),  # Simple-LSH needs more probes than NR-LSH on long-tailed norms: 0.87 at 600
    Case(
        "ipnsw-plus",  # the default: the compiled walk on 8-bit codes, beam re-ranked exactly
        lambda d, m, x: ss.create_index("ipnsw-plus", d, m, M=16, n_threads=1, progress=False),
        metrics=("ip",),
        search_kw={"ef": 64},
        min_recall=0.97,
    ),
    Case(
        "neq",
        lambda d, m, x: (
            (
                i := ss.create_index(
                    "neq",
                    d,
                    m,
                    base="pq",
                    n_codebooks=5,
                    nbits=6,
                    keep_vectors=True,
                    progress=False,
                )
            ).train(x)
            or i
        ),
        metrics=("ip",),
        search_kw={"rerank": 100},
        min_recall=0.95,
    ),  # observed 1.0 (0.87 from the 30-bit scan alone)
    Case(
        "ipnsw-plus-float",  # the walk on the float vectors
        lambda d, m, x: ss.create_index("ipnsw-plus", d, m, M=16, n_threads=1, progress=False,
                                        sq8=False),
        metrics=("ip",),
        search_kw={"ef": 64},
        min_recall=0.95,
    ),  # observed 1.0
    Case(
        "ipnsw-plus-quantized",  # the quantized graph: neighbours' 4-bit codes in node blocks
        lambda d, m, x: ss.create_index("ipnsw-plus", d, m, M=16, n_threads=1, progress=False,
                                        fast_scan=True),
        metrics=("ip",),
        search_kw={"ef": 64},
        min_recall=0.95,
    ),
    Case(
        "neq-fast-scan",  # 4-bit codes in the compiled fast-scan, coarse lists, re-ranked
        lambda d, m, x: (
            (i := ss.create_index("neq", d, m, base="pq", n_codebooks=9, nbits=4, n_lists=8,
                                  keep_vectors=True, fast_scan=True, progress=False)).train(x)
            or i
        ),
        metrics=("ip",),
        search_kw={"rerank": 100},
        min_recall=0.97,
    ),
    Case(
        "pyramid",
        lambda d, m, x: (
            (
                i := ss.create_index(
                    "pyramid",
                    d,
                    m,
                    n_centers=48,
                    n_partitions=4,
                    mips_replicas=40,
                    sub_index="hnsw",
                    M=12,
                    ef_construction=80,
                )
            ).train(x)
            or i
        ),
        search_kw={"branching": 6, "ef": 64},
        min_recall=0.95,
    ),  # observed 1.0 / 1.0 / 0.99 (ip/cosine/l2)
    Case(
        "strings",  # CNN-ED candidates from HNSW, re-ranked by exact edit distance
        lambda d, m, x: ss.create_index("strings", 0, "edit", index="hnsw", M=12,
                                        encoder=string_encoder()),
        metrics=("edit",),
        search_kw={"n_candidates": 300},
        min_recall=0.95,
        items="strings",
    ),
    Case("sparse-flat", lambda d, m, x: ss.SparseFlatIndex(d, m), metrics=("ip",), exact=True,
         min_recall=1.0, items="sparse"),
    Case("bm25", lambda d, m, x: ss.create_index("bm25", d, m), metrics=("ip",), exact=True,
         min_recall=1.0, items="sparse"),
    # blocks from 64 items on (4,096 by default): the suites reach the walk, not only the
    # exactly scanned tail
    Case("sparse-seismic", lambda d, m, x: ss.create_index("sparse-seismic", d, m,
                                                             n_postings=200, rebuild_after=64),
         metrics=("ip",), min_recall=0.9, items="sparse"),
]
