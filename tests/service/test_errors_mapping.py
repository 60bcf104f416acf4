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
