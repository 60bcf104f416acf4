"""Server errors become typed client errors: the exact class when the client knows it, else the
nearest simsearch ancestor the server named, else one chosen by the status code."""

from __future__ import annotations

from simsearch.errors import DuplicateIdError, InvalidVectorError
from simsearch.service.errors import ServiceError, error_bases, error_class
from simsearch.strings import UnknownCharacterError


def test_unknown_classes_fall_back_to_their_nearest_known_ancestor():
    bases = error_bases(UnknownCharacterError("x"))
    assert bases.split(",")[0] == "InvalidVectorError"
    assert error_class("UnknownCharacterError", "INVALID_ARGUMENT", bases) is InvalidVectorError
    assert error_class("DuplicateIdError", "ALREADY_EXISTS", "") is DuplicateIdError
    # an older server sends no bases: the status code decides, as before
    assert error_class("UnknownCharacterError", "INVALID_ARGUMENT") is ServiceError


def test_a_malformed_search_response_is_a_typed_error():
    """The client decodes a response's arrays without numpy's reshape (one call per array): a
    response whose bytes do not match its shape must still be refused, not read short or long
    (seen failing with the length check removed: 12 bytes of ids raised numpy's TypeError, 32
    were read as if they were 16)."""
    import numpy as np
    import pytest

    from simsearch.service import convert
    from simsearch.service.protos.simsearch.v1 import simsearch_pb2 as pb

    ids, scores = np.arange(2, dtype="<i8").tobytes(), np.ones(2, "<f4").tobytes()
    ok = convert.from_search_response(pb.SearchResponse(rows=1, k=2, ids=ids, scores=scores))
    assert ok.ids.tolist() == [[0, 1]] and ok.ids.flags.writeable and ok.coverage == 1.0
    for bad in ({"ids": ids[:12]}, {"ids": ids + ids}, {"scores": scores[:4]}):
        resp = pb.SearchResponse(**({"rows": 1, "k": 2, "ids": ids, "scores": scores} | bad))
        with pytest.raises(ServiceError, match="needs 16 bytes of ids and 8 of scores"):
            convert.from_search_response(resp)
