"""ip-NSW+ (docs/bench/graph.md): an angular graph seeding a search on an inner-product graph.
The ip-NSW baseline is ``simsearch.HNSWIndex(metric="ip")``."""

from .ipnsw_plus import IPNSWPlus

__all__ = ["IPNSWPlus"]
