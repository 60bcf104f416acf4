"""Every benchmark adapter by name: the core ones (bench/adapters.py) and each algorithm family's,
registered here explicitly (a family module only defines its ``ADAPTERS``)."""

from __future__ import annotations

from typing import Any

from . import adapters, adapters_graph, adapters_lsh, adapters_quant, adapters_scann
from .adapters import Adapter

#: adapter name -> class
ADAPTERS: dict[str, type[Adapter]] = {
    **adapters.ADAPTERS,
    **adapters_graph.ADAPTERS,  # ip-NSW+
    **adapters_lsh.ADAPTERS,  # Simple-LSH, Norm-Ranging LSH, faiss IndexLSH + re-rank
    **adapters_quant.ADAPTERS,  # NEQ, faiss quantizers + re-rank
    **adapters_scann.ADAPTERS,  # ScaNN: tree + anisotropic hashing + exact re-ordering
}


def make_adapter(name: str, metric: str, **build_params: Any) -> Adapter:
    """Instantiate the adapter registered as ``name``."""
    try:
        cls = ADAPTERS[name]
    except KeyError:
        raise ValueError(f"unknown adapter {name!r}; known: {sorted(ADAPTERS)}") from None
    return cls(metric, **build_params)
