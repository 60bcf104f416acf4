"""Errors of the service layer, and how every simsearch error maps to a gRPC status code.

Importing this module does not import grpc: codes are named by string (``grpc.StatusCode`` names).
The client re-raises a server error as the same class the server raised, so code written against a
local index catches the same exceptions from a remote one.
"""

from __future__ import annotations

from .. import errors as core
from ..errors import CorruptIndexError, SimsearchError

#: trailing-metadata key carrying the name of the error class the server raised
ERROR_TYPE_KEY = "simsearch-error-type"
#: and the names of its simsearch ancestors, nearest first, comma-separated: a client that does
#: not know the class itself (one defined outside the core, e.g. in simsearch.strings) raises the
#: nearest one it knows
ERROR_BASES_KEY = "simsearch-error-bases"


class ServiceError(SimsearchError, RuntimeError):
    """A failure reported by the service (transport, auth, limits). ``code`` is the gRPC status
    code's name."""

    code = "UNKNOWN"

    def __init__(self, message: str = "", code: str | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code


class CollectionNotFoundError(ServiceError, KeyError):
    """No collection of that name."""

    code = "NOT_FOUND"

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class CollectionExistsError(ServiceError, ValueError):
    """A collection of that name exists already."""

    code = "ALREADY_EXISTS"


class AuthenticationError(ServiceError, PermissionError):
    """No bearer token, or one the server does not know."""

    code = "UNAUTHENTICATED"


class PermissionDeniedError(ServiceError, PermissionError):
    """A read-only token used for a write."""

    code = "PERMISSION_DENIED"


class ResourceExhaustedError(ServiceError):
    """A message over the size limit, or the server at its limit of concurrent calls."""

    code = "RESOURCE_EXHAUSTED"


class ServiceUnavailableError(ServiceError, ConnectionError):
    """The server cannot be reached, is shutting down, or hit a transient fault: retry."""

    code = "UNAVAILABLE"


class DeadlineExceededError(ServiceError, TimeoutError):
    """The call's deadline passed before it finished."""

    code = "DEADLINE_EXCEEDED"


class DataLossError(ServiceError, CorruptIndexError):
    """Stored data (a snapshot or a write-ahead log record) failed its checksum."""

    code = "DATA_LOSS"


class StaleTermError(ServiceError):
    """A part write or copy from a leader older than one the replica has already seen: that
    leader was deposed (docs/cluster.md, "Writes")."""

    code = "FAILED_PRECONDITION"


class FencedPartError(ServiceError):
    """A plain write to a Pyramid part replica, which takes fenced writes from the cluster's
    leader only."""

    code = "FAILED_PRECONDITION"


class NotPartReplicaError(ServiceError):
    """A fenced part write to a collection that was not created as a Pyramid part replica."""

    code = "FAILED_PRECONDITION"


class OpsGoneError(ServiceError):
    """A part replica's WAL no longer holds the ops asked for (a snapshot compacted them): copy
    the whole replica instead."""

    code = "FAILED_PRECONDITION"


class InternalServerError(ServiceError):
    """An unexpected server fault; details are in the server's log only."""

    code = "INTERNAL"


# Exact classes first; code_for walks the MRO, so subclasses defined later map like their parent.
_CORE_CODES: dict[type[BaseException], str] = {
    core.UnknownIdError: "NOT_FOUND",
    core.DuplicateIdError: "ALREADY_EXISTS",
    core.NotTrainedError: "FAILED_PRECONDITION",
    core.RetrainNonEmptyError: "FAILED_PRECONDITION",
    core.UnsupportedOperationError: "UNIMPLEMENTED",
    core.CorruptIndexError: "DATA_LOSS",
    core.DatasetUnavailableError: "FAILED_PRECONDITION",
    ValueError: "INVALID_ARGUMENT",
    TypeError: "INVALID_ARGUMENT",
}


def code_for(exc: BaseException) -> str:
    """The status code name for an exception the servicer caught."""
    explicit = getattr(exc, "grpc_code", None)
    if explicit:
        return explicit
    if isinstance(exc, ServiceError):
        return exc.code
    for cls in type(exc).__mro__:
        if cls in _CORE_CODES:
            return _CORE_CODES[cls]
    return "INTERNAL"


_BY_CODE: dict[str, type[ServiceError]] = {
    cls.code: cls
    for cls in (
        CollectionNotFoundError,
        CollectionExistsError,
        AuthenticationError,
        PermissionDeniedError,
        ResourceExhaustedError,
        ServiceUnavailableError,
        DeadlineExceededError,
        DataLossError,
        InternalServerError,
    )
}


# errors of the layers above (the cluster's control plane) that a client may raise by name
_REMOTE: dict[str, type[SimsearchError]] = {}


def register_remote_error(cls: type[SimsearchError]) -> type[SimsearchError]:
    """Let clients raise ``cls`` itself when a server reports it (a class decorator)."""
    _REMOTE[cls.__name__] = cls
    return cls


def error_class(type_name: str | None, code: str, bases: str = "") -> type[Exception]:
    """The class the client raises for a server error: the server's own class when it is one of
    simsearch's core or service errors (or one registered by register_remote_error), else its
    nearest such ancestor (``bases``), otherwise one chosen by status code."""
    for name in [type_name or "", *bases.split(",")]:
        cls = (getattr(core, name, None) or globals().get(name) or _REMOTE.get(name)) \
            if name else None
        if isinstance(cls, type) and issubclass(cls, SimsearchError) and cls is not SimsearchError:
            return cls
    return _BY_CODE.get(code, ServiceError)


def error_bases(exc: BaseException) -> str:
    """The names of ``exc``'s simsearch ancestors, nearest first (for ERROR_BASES_KEY)."""
    return ",".join(c.__name__ for c in type(exc).__mro__[1:]
                    if issubclass(c, SimsearchError) and c is not SimsearchError)
