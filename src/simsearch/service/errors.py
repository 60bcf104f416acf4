"""Errors of the service layer, and how every simsearch error maps to a gRPC status code.

Importing this module does not import grpc: codes are named by string (``grpc.StatusCode`` names).
The client re-raises a server error as the same class the server raised, so code written against a
local index catches the same exceptions from a remote one. ``STATUS`` is the one table from
class to status code.

>>> from simsearch import errors
>>> from simsearch.service.errors import CollectionNotFoundError, code_for
>>> code_for(errors.UnknownIdError("id 7")), code_for(CollectionNotFoundError("docs"))
('NOT_FOUND', 'NOT_FOUND')
>>> code_for(errors.RepeatedIdError("id 3 repeats")), code_for(errors.DuplicateIdError("held"))
('INVALID_ARGUMENT', 'ALREADY_EXISTS')
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
    code's name: the one the server sent, else the class's in STATUS."""

    _code: str | None = None

    def __init__(self, message: str = "", code: str | None = None):
        super().__init__(message)
        self._code = code

    @property
    def code(self) -> str:
        return self._code or code_for(self)


class CollectionNotFoundError(ServiceError, KeyError):
    """No collection of that name."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class CollectionExistsError(ServiceError, ValueError):
    """A collection of that name exists already."""


class AuthenticationError(ServiceError, PermissionError):
    """No bearer token, or one the server does not know."""


class PermissionDeniedError(ServiceError, PermissionError):
    """A read-only token used for a write."""


class ResourceExhaustedError(ServiceError):
    """A message over the size limit, or the server at its limit of concurrent calls."""


class ServiceUnavailableError(ServiceError, ConnectionError):
    """The server cannot be reached, is shutting down, or hit a transient fault: retry."""


class DeadlineExceededError(ServiceError, core.DeadlineExceededError):
    """The call's deadline passed before it finished."""


class DataLossError(ServiceError, CorruptIndexError):
    """Stored data (a snapshot or a write-ahead log record) failed its checksum."""


class StaleTermError(ServiceError):
    """A part write or copy from a leader older than one the replica has already seen: that
    leader was deposed (docs/cluster.md, "Writes")."""


class FencedPartError(ServiceError):
    """A plain write to a Pyramid part replica, which takes fenced writes from the cluster's
    leader only."""


class NotPartReplicaError(ServiceError):
    """A fenced part write to a collection that was not created as a Pyramid part replica."""


class OpsGoneError(ServiceError):
    """A part replica's WAL no longer holds the ops asked for (a snapshot compacted them): copy
    the whole replica instead."""


class DataDirLockedError(ServiceError):
    """The data directory is held by another process (a node, or an embedded client): one
    owner per directory, or the two would cut each other's logs."""


class InternalServerError(ServiceError):
    """An unexpected server fault; details are in the server's log only."""


#: The one table from error class to gRPC status code name. code_for walks an exception's MRO,
#: so a class not listed maps like its nearest listed ancestor; the layers above add theirs with
#: register_error.
STATUS: dict[type[BaseException], str] = {
    CollectionNotFoundError: "NOT_FOUND",
    CollectionExistsError: "ALREADY_EXISTS",
    AuthenticationError: "UNAUTHENTICATED",
    PermissionDeniedError: "PERMISSION_DENIED",
    ResourceExhaustedError: "RESOURCE_EXHAUSTED",
    ServiceUnavailableError: "UNAVAILABLE",
    DeadlineExceededError: "DEADLINE_EXCEEDED",
    DataLossError: "DATA_LOSS",
    StaleTermError: "FAILED_PRECONDITION",
    FencedPartError: "FAILED_PRECONDITION",
    NotPartReplicaError: "FAILED_PRECONDITION",
    OpsGoneError: "FAILED_PRECONDITION",
    DataDirLockedError: "FAILED_PRECONDITION",
    InternalServerError: "INTERNAL",
    ServiceError: "UNKNOWN",
    core.RepeatedIdError: "INVALID_ARGUMENT",  # a bad batch, unlike a clash with a stored id
    core.UnknownIdError: "NOT_FOUND",
    core.DuplicateIdError: "ALREADY_EXISTS",
    core.NotTrainedError: "FAILED_PRECONDITION",
    core.RetrainNonEmptyError: "FAILED_PRECONDITION",
    core.UnsupportedOperationError: "UNIMPLEMENTED",
    core.CorruptIndexError: "DATA_LOSS",
    core.DeadlineExceededError: "DEADLINE_EXCEEDED",
    core.DatasetUnavailableError: "FAILED_PRECONDITION",
    ValueError: "INVALID_ARGUMENT",
    TypeError: "INVALID_ARGUMENT",
}


def code_for(exc: BaseException) -> str:
    """The status code name for an exception the servicer caught: the code a ServiceError was
    given (one a server sent, passed on by a coordinator), else its class's in STATUS."""
    given = getattr(exc, "_code", None)
    if isinstance(exc, ServiceError) and given:
        return given
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return "INTERNAL"


#: the class a client raises for a status code when the server's class is unknown to it
_BY_CODE: dict[str, type[ServiceError]] = {
    code: cls for cls, code in reversed(STATUS.items())
    if isinstance(cls, type) and issubclass(cls, ServiceError)
    and cls not in (ServiceError, StaleTermError, FencedPartError, NotPartReplicaError,
                    OpsGoneError)
}


# errors of the layers above (the cluster's control plane) that a client may raise by name
_REMOTE: dict[str, type[SimsearchError]] = {}


def register_error(status: str | None = None):
    """A class decorator: clients raise the class itself when a server reports it, and a
    server reports it with ``status`` (default: its nearest ancestor's in STATUS)."""
    def register(cls: type[SimsearchError]) -> type[SimsearchError]:
        _REMOTE[cls.__name__] = cls
        if status is not None:
            STATUS[cls] = status
        return cls
    return register


def error_class(type_name: str | None, code: str, bases: str = "") -> type[Exception]:
    """The class the client raises for a server error: the server's own class when it is one of
    simsearch's core or service errors (or one registered by register_error), else its
    nearest such ancestor (``bases``), otherwise one chosen by status code."""
    for name in [type_name or "", *bases.split(",")]:
        cls = (globals().get(name) or getattr(core, name, None) or _REMOTE.get(name)) \
            if name else None
        if isinstance(cls, type) and issubclass(cls, SimsearchError) and cls is not SimsearchError:
            return cls
    return _BY_CODE.get(code, ServiceError)


def error_bases(exc: BaseException) -> str:
    """The names of ``exc``'s simsearch ancestors, nearest first (for ERROR_BASES_KEY)."""
    return ",".join(c.__name__ for c in type(exc).__mro__[1:]
                    if issubclass(c, SimsearchError) and c is not SimsearchError)
