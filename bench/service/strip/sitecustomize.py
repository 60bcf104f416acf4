"""Strip a node's batch-1 search down, to see what each part of it costs beside the echo:

    SIMSEARCH_STRIP=scan PYTHONPATH=bench/service/strip python bench/service/echo_pair.py
    SIMSEARCH_STRIP=handler PYTHONPATH=bench/service/strip python bench/service/echo_pair.py

``scan``: the flat index answers fixed ids without scanning (the rest of the path runs);
``handler``: the node's Search answers a fixed 1 x 10 result without running any of simsearch's
code (what is left is gRPC and the protobuf messages). The server inherits PYTHONPATH, so the
patch applies in the node; in the calling process it changes nothing that is called.
"""

import os

_what = os.environ.get("SIMSEARCH_STRIP")
if _what == "scan":
    import numpy as np

    from simsearch.flat import FlatIndex
    from simsearch.index import SearchResult

    def _fixed_search(self, q, k, **params):
        return SearchResult(np.zeros((len(q), k), np.int64), np.zeros((len(q), k), np.float32))

    FlatIndex._search = _fixed_search
elif _what == "handler":
    from simsearch.service.protos.simsearch.v1 import simsearch_pb2 as pb
    from simsearch.service.servicer import SimSearchServicer

    _answer = pb.SearchResponse(rows=1, k=10, ids=bytes(80), scores=bytes(40))
    SimSearchServicer.Search = lambda self, request, context: _answer
elif _what:
    raise SystemExit(f"SIMSEARCH_STRIP must be scan or handler; got {_what!r}")
