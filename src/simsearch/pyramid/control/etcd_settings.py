"""How members reach etcd: TLS with client certificates, and which etcd server versions are
safe for production (docs/cluster-hosts.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import grpc

from ...errors import InvalidParameterError, SimsearchError

#: etcd's own changelog: 3.5.0-3.5.2 can corrupt data under load; 3.4.22+ and 3.5.6+ are the
#: releases it recommends for production
SAFE_ETCD = "3.4.22+ in 3.4, 3.5.6+ in 3.5, or any later line"


class UnsafeEtcdError(SimsearchError, RuntimeError):
    """The etcd server is at a version its maintainers call unsafe for production."""


def parse_etcd_version(text: str) -> tuple[int, ...]:
    """``(3, 4, 23)`` from "3.4.23" or from ``etcd --version`` output ("etcd Version: 3.4.23")."""
    m = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
    if m is None:
        raise ValueError(f"no etcd version in {text[:200]!r}")
    return tuple(int(g) for g in m.groups())


def version_is_safe(v: tuple[int, ...]) -> bool:
    """See SAFE_ETCD."""
    return (3, 4, 22) <= v < (3, 5, 0) or v >= (3, 5, 6)


@dataclass(frozen=True)
class EtcdTLS:
    """TLS to etcd with client certificates (PEM file paths). For a client: ``ca`` signed the
    server's certificate, ``cert``/``key`` are this member's client certificate. For
    ``LocalEtcd``: ``cert``/``key`` are the server's (also used for its own health check, so give
    them client-auth use too), ``ca`` signs the certificates of the clients it accepts."""

    ca: str
    cert: str
    key: str

    def credentials(self):
        def read(path: str) -> bytes:
            with open(path, "rb") as f:
                return f.read()

        return grpc.ssl_channel_credentials(read(self.ca), read(self.key), read(self.cert))


def tls_from_args(args) -> EtcdTLS | None:
    """The ``--etcd-ca/--etcd-cert/--etcd-key`` of a command line (all three, or none)."""
    files = [getattr(args, k, None) for k in ("etcd_ca", "etcd_cert", "etcd_key")]
    if not any(files):
        return None
    if not all(files):
        raise InvalidParameterError("TLS to etcd needs all of --etcd-ca, --etcd-cert and "
                                    "--etcd-key")
    return EtcdTLS(*files)
