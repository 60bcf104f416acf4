"""Strip a node's batch-1 search down, to see what each part of it costs beside the echo:

    SIMSEARCH_STRIP=scan PYTHONPATH=bench/service/strip python bench/service/echo_pair.py
    SIMSEARCH_STRIP=handler PYTHONPATH=bench/service/strip python bench/service/echo_pair.py
    SIMSEARCH_STRIP=lean PYTHONPATH=bench/service/strip python bench/service/echo_pair.py

``scan``: the flat index answers fixed ids without scanning (the rest of the path runs);
``handler``: the node's Search answers a fixed 1 x 10 result without running any of simsearch's
code (what is left is gRPC and the protobuf messages); ``lean``: the node's Search does only
what a correct unfiltered flat search cannot skip (decode, the collection's and the index's
read locks, the finiteness check, the compiled scan, encode), reaching past the layers'
interfaces as no product code may: the floor for a search written in Python; ``wrapper``:
the servicer's ``_rpc`` wrapper (in-flight count, deadline, metrics) left out; ``checks``: the
collection calls the index's ``_search`` under both read locks, without ``Index.search``'s
checks; ``wrapper+checks``: both. The server inherits PYTHONPATH, so the patch applies in the
node; in the calling process it changes nothing that is called.
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
elif _what == "lean":
    import numpy as np
    from simsearch._simd import all_finite, flat_topk

    from simsearch.errors import InvalidVectorError
    from simsearch.service.protos.simsearch.v1 import simsearch_pb2 as pb
    from simsearch.service.servicer import SimSearchServicer

    _f32 = np.dtype("<f4")

    def _lean_search(self, request, context):
        col = self.store.get(request.collection)
        m = request.queries
        q = np.ndarray((m.rows, m.cols), _f32, m.data)
        if not all_finite(q):
            raise InvalidVectorError("queries must be finite")
        col._rw.acquire_read(None)
        try:
            index = col._index()
            index._lock.acquire_read()
            try:
                x, ids, _ = index._live
                got_ids, got_scores = flat_topk(q, x, ids, None, request.k)
            finally:
                index._lock.release_read()
        finally:
            col._rw.release_read()
        return pb.SearchResponse(rows=m.rows, k=request.k, ids=got_ids.tobytes(),
                                 scores=got_scores.tobytes())

    SimSearchServicer.Search = _lean_search
elif _what in ("wrapper", "checks", "wrapper+checks"):
    if "wrapper" in _what:
        from simsearch.service.servicer import SimSearchServicer

        _body = SimSearchServicer.Search.__wrapped__
        SimSearchServicer.Search = lambda self, request, context: _body(self, request, context,
                                                                          None)
    if "checks" in _what:
        from simsearch.service.collection import Collection

        def _unchecked_search(self, q, k, **unused):
            self._rw.acquire_read(None)
            try:
                index = self._index()
                index._lock.acquire_read()
                try:
                    return index._search(q, k)
                finally:
                    index._lock.release_read()
            finally:
                self._rw.release_read()

        Collection.search = _unchecked_search
elif _what:
    raise SystemExit("SIMSEARCH_STRIP must be scan, handler, lean, wrapper, checks or "
                     f"wrapper+checks; got {_what!r}")
