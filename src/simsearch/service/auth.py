"""Bearer-token auth and authorization by method (docs/service.md, "Security model").

Tokens file: one token per line as ``<role> <token>``, role one of ``read-only``,
``read-write`` or ``cluster``; blank lines and lines starting with ``#`` are ignored. Clients
send the metadata ``authorization: Bearer <token>``. Health checks need no token (probes carry
none); every other call needs a known token whose role holds the method's class in
:data:`METHOD_CLASS`. A method missing from that table is refused to everyone (deny by
default): a new RPC cannot slip through unclassified. Send tokens over TLS unless the server is
on loopback.
"""

from __future__ import annotations

import contextvars
import hmac
import logging
import os
import stat
from collections.abc import Callable

import grpc

from .errors import ERROR_TYPE_KEY, PermissionDeniedError

log = logging.getLogger(__name__)

READ_ONLY, READ_WRITE, CLUSTER = "read-only", "read-write", "cluster"
ROLES = (READ_ONLY, READ_WRITE, CLUSTER)

#: method classes: what a call may do
READ, WRITE, ADMIN, INTERNAL = "read", "write", "admin", "cluster-internal"

#: every RPC the server serves (tests/service/test_authz.py checks this against the proto)
METHOD_CLASS: dict[str, str] = {
    "/simsearch.v1.SimSearch/ServerInfo": READ,
    "/simsearch.v1.SimSearch/ListCollections": READ,
    "/simsearch.v1.SimSearch/DescribeCollection": READ,
    "/simsearch.v1.SimSearch/Search": READ,
    "/simsearch.v1.SimSearch/Get": READ,
    "/simsearch.v1.SimSearch/Train": WRITE,
    "/simsearch.v1.SimSearch/Add": WRITE,
    "/simsearch.v1.SimSearch/Remove": WRITE,
    # whole collections: create, drop, persist, and a full copy out or in (backup / restore)
    "/simsearch.v1.SimSearch/CreateCollection": ADMIN,
    "/simsearch.v1.SimSearch/DropCollection": ADMIN,
    "/simsearch.v1.SimSearch/Snapshot": ADMIN,
    "/simsearch.v1.SimSearch/ExportCollection": ADMIN,
    "/simsearch.v1.SimSearch/ImportCollection": ADMIN,
    # what only a cluster's coordinators call on shards: fenced part writes, router checkpoints
    "/simsearch.v1.SimSearch/PartPrepare": INTERNAL,
    "/simsearch.v1.SimSearch/PartSync": INTERNAL,
    "/simsearch.v1.SimSearch/PartOps": INTERNAL,
    "/simsearch.v1.SimSearch/PutBlob": INTERNAL,
    "/simsearch.v1.SimSearch/GetBlob": INTERNAL,
    "/simsearch.v1.SimSearch/DeleteBlob": INTERNAL,
    "/simsearch.v1.SimSearch/ListBlobs": INTERNAL,
    # reflection (served with --reflection) describes the services: a read
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": READ,
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo": READ,
}
#: the classes each role may call
ROLE_CLASSES: dict[str, frozenset[str]] = {
    READ_ONLY: frozenset({READ}),
    READ_WRITE: frozenset({READ, WRITE, ADMIN}),
    CLUSTER: frozenset({READ, WRITE, ADMIN, INTERNAL}),
}
_OPEN_PREFIXES = ("/grpc.health.v1.Health/",)

#: (role, token) of the call being served, when the server checks tokens; None otherwise
CALLER: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "simsearch_caller", default=None)


def allowed(role: str, method: str) -> bool:
    """Whether ``role`` may call ``method`` (a full gRPC method name)."""
    cls = METHOD_CLASS.get(method)
    return cls is not None and cls in ROLE_CLASSES.get(role, frozenset())


def require_cluster_role(what: str) -> None:
    """Refuse ``what`` unless the caller holds the cluster role (a no-op without tokens)."""
    caller = CALLER.get()
    if caller is not None and caller[0] != CLUSTER:
        raise PermissionDeniedError(f"{what} needs a token of role 'cluster'; this token is "
                                    f"{caller[0]}")


def caller_token() -> str | None:
    """The bearer token of the call being served (a follower forwards writes with it)."""
    caller = CALLER.get()
    return caller[1] if caller is not None else None


def load_tokens(path: str | os.PathLike) -> dict[str, str]:
    """Read a tokens file into {token: role}. ValueError names the first bad line; a file
    that others than its owner may read is logged as a warning (its tokens are secrets)."""
    tokens: dict[str, str] = {}
    mode = os.stat(path).st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("tokens file %s can be read or written by others than its owner (mode "
                    "%o); chmod 600 it", path, mode & 0o777)
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) != 2 or parts[0] not in ROLES:
                raise ValueError(
                    f"tokens file line {lineno}: expected '<{'|'.join(ROLES)}> <token>'"
                )
            tokens[parts[1]] = parts[0]
    if not tokens:
        raise ValueError("tokens file holds no tokens")
    return tokens


def _rewrap(handler: grpc.RpcMethodHandler, behaviour: Callable[[Callable], Callable]
            ) -> grpc.RpcMethodHandler:
    """``handler`` of the same streaming kind with its behaviour replaced by
    ``behaviour(original behaviour)``."""
    kw = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    for kind, make in (("unary_unary", grpc.unary_unary_rpc_method_handler),
                       ("unary_stream", grpc.unary_stream_rpc_method_handler),
                       ("stream_unary", grpc.stream_unary_rpc_method_handler),
                       ("stream_stream", grpc.stream_stream_rpc_method_handler)):
        fn = getattr(handler, kind)
        if fn:
            return make(behaviour(fn), **kw)
    raise ValueError("a method handler without a behaviour")


def _denier(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str,
            error_type: str) -> grpc.RpcMethodHandler:
    def deny(_fn):
        def call(request, context):
            context.set_trailing_metadata(((ERROR_TYPE_KEY, error_type),))
            context.abort(code, message)
        return call

    return _rewrap(handler, deny)


def _as_caller(handler: grpc.RpcMethodHandler, caller: tuple[str, str]
               ) -> grpc.RpcMethodHandler:
    """Run the handler with CALLER set (in the worker thread that serves the call)."""
    def bind(fn):
        def call(request, context):
            token = CALLER.set(caller)
            try:
                return fn(request, context)
            finally:
                CALLER.reset(token)
        return call

    return _rewrap(handler, bind)


class TokenAuthInterceptor(grpc.ServerInterceptor):
    def __init__(self, tokens: dict[str, str]):
        self._tokens = [(t.encode(), role) for t, role in tokens.items()]

    def _role(self, token: str) -> str | None:
        given, found = token.encode(), None
        for t, role in self._tokens:  # compare against all: timing says nothing about which
            if hmac.compare_digest(given, t):
                found = role
        return found

    def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails):
        method = details.method
        if method.startswith(_OPEN_PREFIXES):
            return continuation(details)
        handler = continuation(details)
        if handler is None:
            return None
        auth = ""
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                auth = value if isinstance(value, str) else value.decode("latin-1")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer":  # the scheme is case-insensitive (RFC 9110, 11.1)
            return _denier(
                handler,
                grpc.StatusCode.UNAUTHENTICATED,
                "this server needs a bearer token: send metadata 'authorization: Bearer <token>'",
                "AuthenticationError",
            )
        role = self._role(token.strip())
        if role is None:
            return _denier(
                handler,
                grpc.StatusCode.UNAUTHENTICATED,
                "the bearer token is not valid on this server",
                "AuthenticationError",
            )
        if not allowed(role, method):
            cls = METHOD_CLASS.get(method)
            need = [r for r in ROLES if cls in ROLE_CLASSES[r]] if cls else []
            return _denier(
                handler,
                grpc.StatusCode.PERMISSION_DENIED,
                f"{method.rsplit('/', 1)[-1]} needs a token of role "
                f"{' or '.join(need) or '(none: the method is not classified)'}; this token is "
                f"{role}",
                "PermissionDeniedError",
            )
        return _as_caller(handler, (role, token))
