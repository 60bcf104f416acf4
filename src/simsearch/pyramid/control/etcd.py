"""The etcd client of the cluster's control plane (docs/cluster.md, "Control plane"); the etcd
server process (binaries, ``LocalEtcd``) is in etcd_server.py.

- ``check_server_version``: a production member (``cluster shard`` / ``cluster coordinator``)
  refuses an etcd server at an unsafe version (``SAFE_ETCD``) unless told otherwise.
- ``Etcd``: a client bound to a key prefix, over the maintained ``etcd3`` client library
  (``cslab-etcd3``): reads with revisions, ``cas`` (one transaction conditioned on the revisions
  read: the fencing primitive of every cluster-state change), leases with a keepalive thread and a
  local deadline, and prefix watches that survive reconnects.

Every failure to reach etcd surfaces as ``CoordinationError`` (gRPC UNAVAILABLE), logged where it
happens; library exceptions never leak.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from ...errors import InvalidParameterError, SimsearchError
from .errors import CoordinationError
from .etcd_settings import (  # noqa: F401  (re-exported: the members' settings of etcd)
    SAFE_ETCD,
    EtcdTLS,
    UnsafeEtcdError,
    parse_etcd_version,
    tls_from_args,
    version_is_safe,
)
from .leases import Lease, Registration, as_bytes, lease_id
from .watch import PrefixWatch, WatchEvent

log = logging.getLogger(__name__)

# gRPC keepalive on the client channel, so a watch stream over a cut link fails (and is re-made)
# instead of hanging; 6 s stays above etcd's default --grpc-keepalive-min-time of 5 s. Pings are
# sent only while a call (a watch) is open, as etcd's default enforcement requires.
_CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 6000),
    ("grpc.keepalive_timeout_ms", 3000),
    ("grpc.keepalive_permit_without_calls", 0),
    # reconnect soon after etcd comes back (gRPC's default backoff grows to 120 s)
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
# How long the library shuns an endpoint after a failure before trying it again (with several;
# a single endpoint is never shunned: there is nothing else to try).
_ENDPOINT_RETRY_S = 0.5
# How many times a call waits that long when the library shuns every endpoint at once.
_SHUNNED_WAITS = 2


# ---------------------------------------------------------------------------------------- client


@dataclass(frozen=True)
class Compare:
    """One condition of a transaction. ``target`` is "mod" / "create" / "version" (revisions,
    0 = the key is absent) or "value" (bytes equality)."""

    key: str
    target: str
    value: int | bytes

    @classmethod
    def mod(cls, key: str, revision: int) -> Compare:
        """The key's last modification is ``revision`` (0: the key is absent)."""
        return cls(key, "mod", int(revision)) if revision else cls.absent(key)

    @classmethod
    def create(cls, key: str, revision: int) -> Compare:
        """The key was created at ``revision`` (and not deleted since)."""
        return cls(key, "create", int(revision))

    @classmethod
    def absent(cls, key: str) -> Compare:
        return cls(key, "version", 0)

    @classmethod
    def value_eq(cls, key: str, value: bytes | str) -> Compare:
        return cls(key, "value", as_bytes(value))


def _parse_endpoint(ep: str, tls: bool = False) -> tuple[str, int]:
    s = ep.strip()
    if s.startswith("https://") and not tls:
        raise InvalidParameterError(
            f"etcd endpoint {ep!r} is https: give the TLS files too (--etcd-ca, --etcd-cert, "
            "--etcd-key)")
    if s.startswith("http://") and tls:
        raise InvalidParameterError(f"etcd endpoint {ep!r} is plain http, but TLS files were "
                                    "given: use https://HOST:PORT")
    s = s.removeprefix("https://").removeprefix("http://").rstrip("/")
    host, sep, port = s.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InvalidParameterError(f"etcd endpoint must look like http://HOST:PORT (https:// "
                                    f"with TLS); got {ep!r}")
    return host.strip("[]"), int(port)


class Etcd:
    """A client of one etcd cluster bound to a key prefix (every key is relative to it).

    ``endpoints``: "http://h:p", a comma-separated string or a list; with several, a call that
    fails on one is retried once on another (reads and plain puts; never a transaction, whose
    outcome is then unknown: the caller re-reads). Errors are ``CoordinationError``.
    """

    def __init__(self, endpoints: str | Sequence[str], prefix: str, timeout: float = 5.0,
                 tls: EtcdTLS | None = None):
        import etcd3  # the cluster extra

        self._etcd3 = etcd3
        if isinstance(endpoints, str):
            endpoints = [e for e in endpoints.split(",") if e.strip()]
        if not endpoints:
            raise InvalidParameterError(
                "etcd endpoints: need at least one http://HOST:PORT; got none"
            )
        hosts = [_parse_endpoint(e, tls is not None) for e in endpoints]
        self.endpoints = [f"{'https' if tls else 'http'}://{h}:{p}" for h, p in hosts]
        self.prefix = "/" + prefix.strip("/") + "/" if prefix.strip("/") else "/"
        self.timeout = float(timeout)
        shun = _ENDPOINT_RETRY_S if len(self.endpoints) > 1 else 0.0
        creds = tls.credentials() if tls else None
        eps = [
            etcd3.Endpoint(h, p, secure=tls is not None, creds=creds, time_retry=shun,
                           opts=_CHANNEL_OPTIONS)
            for h, p in hosts
        ]
        self._client = etcd3.MultiEndpointEtcd3Client(
            endpoints=eps, timeout=self.timeout, failover=True
        )
        self._all_shunned = etcd3.exceptions.NoServerAvailableError
        self._tx = self._client.transactions
        self._lock = threading.Lock()
        self._watches: list[PrefixWatch] = []
        self._leases: list[Lease] = []
        self._registrations: list[Registration] = []
        self._closed = False

    def server_version(self) -> tuple[int, ...]:
        """The version of the etcd member that answers."""
        return parse_etcd_version(self._call("status", self._client.status).version)

    def check_server_version(self, allow_unsafe: bool = False) -> None:
        """Refuse (UnsafeEtcdError) an etcd at a version its maintainers call unsafe (SAFE_ETCD),
        unless ``allow_unsafe`` (then warn)."""
        v = self.server_version()
        if version_is_safe(v):
            return
        msg = (f"the etcd at {','.join(self.endpoints)} runs {'.'.join(map(str, v))}, a version "
               f"etcd's maintainers call unsafe under load (safe: {SAFE_ETCD})")
        if not allow_unsafe:
            raise UnsafeEtcdError(msg + "; upgrade it, or pass --allow-unsafe-etcd to run anyway")
        log.warning("%s; running anyway (--allow-unsafe-etcd)", msg)

    # -- keys
    def full(self, key: str) -> str:
        return self.prefix + key.lstrip("/")

    def rel(self, full_key: bytes | str) -> str:
        k = full_key.decode() if isinstance(full_key, bytes) else full_key
        return k[len(self.prefix) :] if k.startswith(self.prefix) else k

    # -- error mapping
    def _call(self, what: str, fn: Callable, *args, retry: bool = True, **kwargs):
        attempts = len(self.endpoints) if retry else 1
        shunned = 0
        attempt = 0
        while True:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # the library raises grpc.RpcError, Etcd3Exception, ValueError
                if isinstance(exc, SimsearchError):
                    raise
                if retry and isinstance(exc, self._all_shunned) and shunned < _SHUNNED_WAITS:
                    # every endpoint failed within the shunning window (a member killed while
                    # the others elect a leader): wait it out once or twice, not an attempt
                    shunned += 1
                    time.sleep(_ENDPOINT_RETRY_S)
                    continue
                err = CoordinationError(
                    f"etcd {what} failed on {self._current_endpoint()}: {type(exc).__name__}: {exc}"
                )
                attempt += 1
                if attempt < attempts:
                    log.warning("%s; trying another endpoint", err)
                    continue
                log.warning("%s", err)
                raise err from exc

    def _current_endpoint(self) -> str:
        try:
            return str(self._client.endpoint_in_use)
        except Exception:  # the label may point at a failed endpoint; only for the message
            return ",".join(self.endpoints)

    # -- reads
    def get(self, key: str) -> tuple[bytes | None, int]:
        """``(value, mod_revision)``; ``(None, 0)`` if absent."""
        value, meta = self._call(f"get {key}", self._client.get, self.full(key))
        return (None, 0) if meta is None else (value, int(meta.mod_revision))

    def get_meta(self, key: str) -> tuple[bytes | None, int, int, int]:
        """``(value, mod_revision, create_revision, lease_id)``; ``(None, 0, 0, 0)`` if absent."""
        value, meta = self._call(f"get {key}", self._client.get, self.full(key))
        if meta is None:
            return None, 0, 0, 0
        return value, int(meta.mod_revision), int(meta.create_revision), int(meta.lease_id)

    def get_prefix_rev(self, sub: str = "") -> tuple[dict[str, tuple[bytes, int]], int]:
        """Every key under ``sub`` (keys relative to the client's prefix) and the store revision
        the read saw (watch from revision + 1 to miss nothing)."""
        resp = self._call(f"get prefix {sub}", self._client.get_prefix_response, self.full(sub))
        out = {self.rel(kv.key): (bytes(kv.value), int(kv.mod_revision)) for kv in resp.kvs}
        return out, int(resp.header.revision)

    def revision(self) -> int:
        """The store's current revision."""
        return self.get_prefix_rev("\0")[1]  # a range that holds no key: just the header

    def db_size(self) -> int:
        """Bytes of the answering member's database file (what its quota limits)."""
        return int(self._call("status", self._client.status).db_size)

    def compact(self, revision: int) -> bool:
        """Drop the history before ``revision`` (current values stay; watchers behind it are
        told and re-list), so etcd's database stops growing with every write; False when etcd
        had compacted that far already."""
        try:
            self._call(f"compact {revision}", self._client.compact, revision, retry=False)
        except CoordinationError as exc:
            if "compacted" in str(exc):
                return False
            raise
        return True

    def get_prefix(self, sub: str = "") -> dict[str, tuple[bytes, int]]:
        """``{key relative to the client's prefix: (value, mod_revision)}`` under ``sub``."""
        return self.get_prefix_rev(sub)[0]

    def get_from(self, sub: str, start: str, keys_only: bool = False
                 ) -> list[tuple[str, bytes, int]]:
        """Keys under ``sub`` from ``start`` (inclusive, relative keys) to the prefix's end, in
        key order: ``[(key, value, mod_revision)]`` (values empty with ``keys_only``)."""
        end = _prefix_end(self.full(sub).encode())
        resp = self._call(f"get range {start}", self._client.get_range_response,
                          self.full(start), end, keys_only=keys_only)
        return [(self.rel(kv.key), bytes(kv.value), int(kv.mod_revision)) for kv in resp.kvs]

    def delete_range(self, start: str, end: str) -> int:
        """Delete keys in ``[start, end)`` (relative keys); returns how many."""
        # a transaction with no compares: the library's public way to a ranged delete
        op = self._etcd3.transactions.Delete(self.full(start), range_end=self.full(end))
        _, responses = self._call(f"delete range {start}", self._client.transaction, [], [op],
                                  [])
        return int(responses[0].response_delete_range.deleted)

    # -- writes
    def put(self, key: str, value: bytes | str, lease: Lease | int | None = None) -> int:
        """Unconditional put; returns the new revision."""
        resp = self._call(
            f"put {key}", self._client.put, self.full(key), as_bytes(value), lease=lease_id(lease)
        )
        return int(resp.header.revision)

    def put_if_absent(self, key: str, value: bytes | str, lease: Lease | int | None = None) -> bool:
        """Create ``key`` only if it does not exist (one transaction); True if created."""
        return self.cas([Compare.absent(key)], {key: value}, lease=lease)

    def create_or_get(
        self, key: str, value: bytes | str, lease: Lease | int | None = None
    ) -> tuple[bool, bytes, int, int]:
        """Create ``key`` if absent and read it back in the same transaction:
        ``(created, value, create_revision, lease_id)`` of whatever the key now holds."""
        full = self.full(key)
        ok, responses = self._call(
            f"create {key}",
            self._client.transaction,
            retry=False,
            compare=[self._tx.version(full) == 0],
            success=[self._tx.put(full, as_bytes(value), lease=lease_id(lease)),
                     self._tx.get(full)],
            failure=[self._tx.get(full)],
        )
        kvs = responses[-1]
        if not kvs:  # deleted between the compare and the read: impossible inside one txn
            raise CoordinationError(f"etcd create {key}: the key vanished inside a transaction")
        val, meta = kvs[0]
        return bool(ok), bytes(val), int(meta.create_revision), int(meta.lease_id)

    def cas(
        self,
        compares: Iterable[Compare | tuple[str, int]],
        puts: Mapping[str, bytes | str] | None = None,
        deletes: Iterable[str] = (),
        lease: Lease | int | None = None,
    ) -> bool:
        """One transaction: if every compare holds, apply ``puts`` (all with ``lease`` if given) and
        ``deletes``; True if applied. A compare is a ``Compare`` or ``(key, mod_revision)`` with 0
        meaning "absent". On a transport error the outcome is unknown (``CoordinationError``):
        re-read before retrying."""
        conds = []
        for c in compares:
            if not isinstance(c, Compare):
                key, rev = c
                c = Compare.mod(key, rev)
            full = self.full(c.key)
            if c.target == "mod":
                conds.append(self._tx.mod(full) == c.value)
            elif c.target == "create":
                conds.append(self._tx.create(full) == c.value)
            elif c.target == "version":
                conds.append(self._tx.version(full) == c.value)
            elif c.target == "value":
                conds.append(self._tx.value(full) == c.value)
            else:
                raise InvalidParameterError(
                    f"compare target must be mod, create, version or value; got {c.target!r}"
                )
        lid = lease_id(lease)
        ops = [self._tx.put(self.full(k), as_bytes(v), lease=lid) for k, v in (puts or {}).items()]
        ops += [self._tx.delete(self.full(k)) for k in deletes]
        ok, _ = self._call(
            "transaction",
            self._client.transaction,
            retry=False,
            compare=conds,
            success=ops,
            failure=[],
        )
        return bool(ok)

    def delete(self, key: str) -> bool:
        """Delete ``key``; True if it existed."""
        return bool(self._call(f"delete {key}", self._client.delete, self.full(key)))

    def delete_prefix(self, sub: str) -> int:
        resp = self._call(f"delete prefix {sub}", self._client.delete_prefix, self.full(sub))
        return int(resp.deleted)

    # -- leases
    def lease(
        self, ttl: float, on_lost: Callable[[str], None] | None = None, keepalive: bool = True
    ) -> Lease:
        """Grant a lease of ``ttl`` seconds (rounded up; etcd may raise it to its minimum) kept
        alive by a background thread; ``on_lost(reason)`` is called once if it is lost."""
        lease = Lease(self, ttl, on_lost=on_lost, keepalive=keepalive)
        with self._lock:
            self._leases = [x for x in self._leases if x.alive()] + [lease]
        return lease

    def grant(self, ttl: int) -> tuple[int, int]:
        """A new lease of ``ttl`` seconds: (its id, the TTL etcd granted)."""
        lease = self._call("lease grant", self._client.lease, ttl, retry=False)
        return int(lease.id), int(lease.ttl)

    def keepalive(self, lease_id: int, budget: float) -> int:
        """One keepalive with a per-call deadline; returns the TTL etcd granted (<= 0: expired)."""

        def once():
            req = self._etcd3.etcdrpc.LeaseKeepAliveRequest(ID=lease_id)
            try:
                for resp in self._client.leasestub.LeaseKeepAlive(
                    iter([req]),
                    budget,
                    credentials=self._client.call_credentials,
                    metadata=self._client.metadata,
                ):
                    return int(resp.TTL)
            except Exception as exc:
                if isinstance(exc, grpc.RpcError):
                    self._client._manage_grpc_errors(
                        exc
                    )  # marks the endpoint failed, maps the error
                raise
            return 0

        return self._call("lease keepalive", once, retry=False)

    def revoke(self, lease_id: int) -> None:
        self._call("lease revoke", self._client.revoke_lease, lease_id, retry=False)

    # -- watches (watch.py re-lists and re-watches on these)
    def add_prefix_watch(self, sub: str, callback: Callable[[Any], None],
                         start_revision: int) -> Any:
        """Watch every key under ``sub`` from ``start_revision``: ``callback(response)`` for
        each batch of events, or with an exception / None when the stream breaks; returns the
        watch's id (for cancel_watch). No retry: the caller re-lists first."""
        return self._call(f"watch {sub}", self._client.add_watch_prefix_callback,
                          self.full(sub), callback, start_revision=start_revision, retry=False)

    def cancel_watch(self, watch_id: Any) -> None:
        self._client.cancel_watch(watch_id)

    def is_delete(self, event: Any) -> bool:
        """Whether a watch event is a deletion (else a put)."""
        return isinstance(event, self._etcd3.events.DeleteEvent)

    def register(self, key: str, value: bytes | str, ttl: float,
                 on_change: Callable[[bool], None] | None = None) -> Registration:
        """Keep ``key = value`` in etcd under a lease for as long as this process runs (membership:
        a shard or a coordinator announcing itself). When the lease is lost (a cut link, an etcd
        restart) the key is put again under a new lease as soon as etcd answers.
        ``on_change(registered)`` is called on every loss and re-registration."""
        reg = Registration(self, key, value, ttl, on_change)
        with self._lock:
            self._registrations.append(reg)
        reg.start()
        return reg

    # -- watches
    def watch_prefix(
        self, sub: str, callback: Callable[[list[WatchEvent]], None]
    ) -> Callable[[], None]:
        """Call ``callback(events)`` for every change under ``sub``, in order, from a background
        thread; returns ``cancel()``. When the stream breaks (etcd restart, failover, cut link) it
        is re-made after a fresh listing whose differences from what was delivered are delivered as
        events first, so no change is missed (intermediate values may be collapsed)."""
        w = PrefixWatch(self, sub, callback)
        with self._lock:
            self._watches.append(w)
        w.start()
        return w.cancel

    def close(self) -> None:
        """Stop watches and lease keepalives (leases then expire on their own) and the channel."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            watches, leases, regs = self._watches, self._leases, self._registrations
            self._watches, self._leases, self._registrations = [], [], []
        for r in regs:
            r.close(revoke=False)
        for w in watches:
            w.cancel()
        for lease in leases:
            lease._stop_thread()
        try:
            self._client.close()
        except Exception as exc:
            log.warning("closing the etcd client: %s", exc)

    def __enter__(self) -> Etcd:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _prefix_end(prefix: bytes) -> bytes:
    """The smallest key above every key starting with ``prefix`` (etcd's range_end)."""
    b = bytearray(prefix)
    while b and b[-1] == 0xFF:
        b.pop()
    if not b:
        return b"\0"
    b[-1] += 1
    return bytes(b)
