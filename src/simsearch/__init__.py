"""simsearch: vector similarity search for MIPS, quantized, sharded and string workloads."""

from . import errors
from ._version import __version__
from .auto import AutoIndex, auto_index
from .flat import FlatIndex
from .hnsw import HNSWIndex
from .index import MAX_ID, Index, SearchResult, create_index, index_kinds, load, loads
from .normscan import NormIVFIndex, NormScanIndex
from .service.api import ClientAPI, CollectionAPI
from .service.client import connect  # imports grpc only when called
from .sparse import SeismicIndex, SparseBatch, SparseFlatIndex

__all__ = [
    "ClientAPI",
    "CollectionAPI",
    "AutoIndex",
    "auto_index",
    "FlatIndex",
    "HNSWIndex",
    "Index",
    "MAX_ID",
    "NormIVFIndex",
    "NormScanIndex",
    "SearchResult",
    "SparseBatch",
    "SeismicIndex",
    "SparseFlatIndex",
    "connect",
    "create_index",
    "errors",
    "index_kinds",
    "load",
    "loads",
    "__version__",
]
