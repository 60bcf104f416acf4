"""Typed exceptions. Every message says what was received and what is allowed, and a refused
call changes nothing. Each class also derives from the builtin a caller would catch
(``ValueError``, ``KeyError``, ``TimeoutError``...); over gRPC the client raises the class the
server raised (simsearch.service.errors maps each to a status code).

>>> import numpy as np, simsearch as ss
>>> idx = ss.FlatIndex(4)
>>> try:
...     idx.add(np.ones((2, 3)))
... except ss.errors.DimensionMismatchError as exc:
...     print(exc)
vectors must have shape (n, 4) or (4,); got shape (2, 3)
>>> try:
...     idx.search(np.ones(4), k=0)
... except ValueError as exc:               # InvalidParameterError is a ValueError
...     print(type(exc).__name__, "-", exc)
InvalidParameterError - k must be in [1, 100000]; got k=0
>>> len(idx)                                 # nothing changed
0
"""

from __future__ import annotations


class SimsearchError(Exception):
    """Base class of every error simsearch raises on purpose."""


class InvalidParameterError(SimsearchError, ValueError):
    """A parameter (k, ef, metric, a build setting) is outside its allowed range."""


class DimensionMismatchError(SimsearchError, ValueError):
    """Vectors whose dimension or shape does not match the index."""


class InvalidVectorError(SimsearchError, ValueError):
    """Vectors with NaN/Inf, or zero vectors under the cosine metric."""


class DuplicateIdError(SimsearchError, ValueError):
    """Ids that repeat within a batch or already exist in the index."""


class RepeatedIdError(DuplicateIdError):
    """A batch that names one id twice."""


class InvalidIdError(SimsearchError, ValueError):
    """Ids that are negative, of the wrong shape, or not integers."""


class UnknownIdError(SimsearchError, KeyError):
    """Ids that are not in the index (for remove)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class NotTrainedError(SimsearchError, RuntimeError):
    """add/search on an index that must be trained first."""


class RetrainNonEmptyError(SimsearchError, RuntimeError):
    """train() on a trained index that holds items: its codes or partition would no longer match
    what it holds, so it refuses instead of dropping data (remove the items or build anew)."""


class UnsupportedOperationError(SimsearchError, NotImplementedError):
    """The index kind does not support this operation (e.g. remove)."""


class DeadlineExceededError(SimsearchError, TimeoutError):
    """The call's deadline passed before it finished."""


class CorruptIndexError(SimsearchError, OSError):
    """A saved index file that is truncated, corrupted, or not an index file."""


class DatasetUnavailableError(SimsearchError, RuntimeError):
    """A dataset that cannot be fetched here; the message names the command that would fetch it."""


class InvalidFilterError(SimsearchError, ValueError):
    """A malformed filter: allow/deny lists of the wrong shape or type, or a ``where`` expression
    with an unknown attribute or operator, or a value of the wrong type."""


class InvalidAttributeError(SimsearchError, ValueError):
    """Item attributes of the wrong type or length for the collection's schema."""
