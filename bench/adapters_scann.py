"""ScaNN (Guo et al., ICML 2020) beside the peers: a partitioning tree, anisotropic vector
quantization (AH) scoring, and an exact re-ordering of the best candidates, the configuration
ScaNN recommends for maximum inner product search. Search knobs: ``leaves`` (leaves searched)
and ``reorder`` (candidates re-scored exactly)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .adapters import Adapter

_DISTANCE = {"ip": "dot_product", "cosine": "dot_product", "l2": "squared_l2"}


class ScaNN(Adapter):
    """Build params: ``n_leaves`` (default ~sqrt(n)), ``dims_per_block`` (2), ``threshold``
    (anisotropic quantization threshold, 0.2), ``training_sample`` (250,000)."""

    name = "scann"

    def fit(self, base: np.ndarray) -> None:
        import scann

        x = self.prep(base)
        n = x.shape[0]
        p = self.build_params
        leaves = int(p.get("n_leaves", max(2, round(math.sqrt(n)))))
        builder = scann.scann_ops_pybind.builder(x, 10, _DISTANCE[self.metric])
        builder = builder.tree(num_leaves=leaves, num_leaves_to_search=max(1, leaves // 10),
                               training_sample_size=min(n, int(p.get("training_sample", 250_000))))
        if self.metric == "l2":
            builder = builder.score_ah(int(p.get("dims_per_block", 2)))
        else:
            builder = builder.score_ah(int(p.get("dims_per_block", 2)),
                                       anisotropic_quantization_threshold=p.get("threshold", 0.2))
        self.searcher = builder.reorder(100).build()
        self.n_leaves = leaves
        self.nbytes = x.nbytes  # the re-ordering keeps the vectors; the codes add ~n*dim/4

    def query(self, q: np.ndarray, k: int, leaves: int = 10, reorder: int = 100,
              **_: Any) -> np.ndarray:
        ids, _ = self.searcher.search_batched(
            self.prep(q), final_num_neighbors=k, leaves_to_search=min(leaves, self.n_leaves),
            pre_reorder_num_neighbors=max(k, reorder))
        ids = np.asarray(ids, np.int64)
        if ids.shape[1] < k:
            ids = np.pad(ids, ((0, 0), (0, k - ids.shape[1])), constant_values=-1)
        return ids

    def index_bytes(self) -> int:
        return int(self.nbytes * 1.25)


ADAPTERS = {"scann": ScaNN}
