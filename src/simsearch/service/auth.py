"""Bearer-token auth as a server interceptor.

Tokens file: one token per line as ``<role> <token>`` with role ``read-only`` or ``read-write``;
blank lines and lines starting with ``#`` are ignored. Clients send the metadata
``authorization: Bearer <token>``. Health checks need no token (probes carry none); every other
call needs a known token, and writes need a read-write one. Send tokens over TLS unless the
server is on loopback.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable

import grpc

from .errors import ERROR_TYPE_KEY

READ_ONLY, READ_WRITE = "read-only", "read-write"
_SERVICE = "/simsearch.v1.SimSearch/"
WRITE_METHODS = frozenset(
    _SERVICE + m
    for m in ("CreateCollection", "DropCollection", "Train", "Add", "Remove", "Snapshot",
              "ImportCollection", "PutBlob", "DeleteBlob")
)
_OPEN_PREFIXES = ("/grpc.health.v1.Health/",)


def load_tokens(path: str | os.PathLike) -> dict[str, str]:
    """Read a tokens file into {token: role}. ValueError names the first bad line."""
    tokens: dict[str, str] = {}
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) != 2 or parts[0] not in (READ_ONLY, READ_WRITE):
                raise ValueError(
                    f"tokens file line {lineno}: expected '<read-only|read-write> <token>'"
                )
            tokens[parts[1]] = parts[0]
    if not tokens:
        raise ValueError("tokens file holds no tokens")
    return tokens


def _denier(
    handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str, error_type: str
) -> grpc.RpcMethodHandler:
    def deny(request, context):
        context.set_trailing_metadata(((ERROR_TYPE_KEY, error_type),))
        context.abort(code, message)

    kw = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(deny, **kw)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(deny, **kw)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(deny, **kw)
    return grpc.stream_stream_rpc_method_handler(deny, **kw)


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
        if not auth.startswith("Bearer "):
            return _denier(
                handler,
                grpc.StatusCode.UNAUTHENTICATED,
                "this server needs a bearer token: send metadata 'authorization: Bearer <token>'",
                "AuthenticationError",
            )
        role = self._role(auth[len("Bearer ") :].strip())
        if role is None:
            return _denier(
                handler,
                grpc.StatusCode.UNAUTHENTICATED,
                "the bearer token is not valid on this server",
                "AuthenticationError",
            )
        if role == READ_ONLY and method in WRITE_METHODS:
            return _denier(
                handler,
                grpc.StatusCode.PERMISSION_DENIED,
                f"{method.rsplit('/', 1)[-1]} writes and needs a read-write token; "
                "this token is read-only",
                "PermissionDeniedError",
            )
        return handler
