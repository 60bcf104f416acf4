"""The registry of index kinds: a kind registers its class under its name on import
(``register``); ``create_index`` and ``load`` find it by that name, importing its module when
needed (docs/architecture.md, "The Index contract")."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from .errors import InvalidParameterError

_REGISTRY: dict[str, type] = {}
# Kinds that register on import; later index modules add one line here so load() can find them.
_KIND_MODULES = {
    "flat": "simsearch.flat",
    "norm-scan": "simsearch.normscan",
    "auto": "simsearch.auto",
    "hnsw": "simsearch.hnsw",
    "nr-lsh": "simsearch.lsh",
    "simple-lsh": "simsearch.lsh",
    "ipnsw-plus": "simsearch.graph.ipnsw_plus",
    "neq": "simsearch.quant",
    "pyramid": "simsearch.pyramid",
    "strings": "simsearch.strings.string_index",
    "sparse-flat": "simsearch.sparse",
    "bm25": "simsearch.sparse",
    "sparse-seismic": "simsearch.sparse",
}


def register(kind: str) -> Callable[[type], type]:
    """Class decorator: make an Index kind loadable by :func:`load` and creatable by name."""

    def deco(cls: type) -> type:
        cls.kind = kind
        _REGISTRY[kind] = cls
        return cls

    return deco


def index_class(kind: str) -> type:
    if kind not in _REGISTRY and kind in _KIND_MODULES:
        importlib.import_module(_KIND_MODULES[kind])
    if kind not in _REGISTRY:
        raise InvalidParameterError(
            f"unknown index kind {kind!r}; known kinds: {index_kinds()}"
        )
    return _REGISTRY[kind]


def index_kinds() -> list[str]:
    return sorted(set(_KIND_MODULES) | set(_REGISTRY))


def create_index(kind: str, dim: int, metric: str = "l2", **params: Any) -> Any:
    """Make an index by registry name, e.g. ``create_index("hnsw", 64, "ip", M=32)``."""
    return index_class(kind)(dim, metric=metric, **params)
