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
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from ...errors import InvalidParameterError, SimsearchError
from .errors import CoordinationError

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


#: etcd's own changelog: 3.5.0-3.5.2 can corrupt data under load; 3.4.22+ and 3.5.6+ are the
#: releases it recommends for production
SAFE_ETCD = "3.4.22+ in 3.4, 3.5.6+ in 3.5, or any later line"


class UnsafeEtcdError(SimsearchError, RuntimeError):
    """The etcd server is at a version its maintainers call unsafe for production."""


def parse_etcd_version(text: str) -> tuple[int, ...]:
    """``(3, 4, 23)`` from "3.4.23" or from ``etcd --version`` output ("etcd Version: 3.4.23")."""
    import re

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
        import grpc

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
        return cls(key, "value", _b(value))


@dataclass(frozen=True)
class WatchEvent:
    """A change under a watched prefix. ``key`` is relative to the client's prefix; ``value`` is
    None for deletes."""

    kind: str  # "put" or "delete"
    key: str
    value: bytes | None
    mod_revision: int


def _b(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


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
        self._watches: list[_PrefixWatch] = []
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
            f"put {key}", self._client.put, self.full(key), _b(value), lease=_lease_id(lease)
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
            success=[self._tx.put(full, _b(value), lease=_lease_id(lease)), self._tx.get(full)],
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
        lid = _lease_id(lease)
        ops = [self._tx.put(self.full(k), _b(v), lease=lid) for k, v in (puts or {}).items()]
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

    def _grant(self, ttl: int) -> tuple[int, int]:
        lease = self._call("lease grant", self._client.lease, ttl, retry=False)
        return int(lease.id), int(lease.ttl)

    def _keepalive(self, lease_id: int, budget: float) -> int:
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
                import grpc

                if isinstance(exc, grpc.RpcError):
                    self._client._manage_grpc_errors(
                        exc
                    )  # marks the endpoint failed, maps the error
                raise
            return 0

        return self._call("lease keepalive", once, retry=False)

    def _revoke(self, lease_id: int) -> None:
        self._call("lease revoke", self._client.revoke_lease, lease_id, retry=False)

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
        w = _PrefixWatch(self, sub, callback)
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


def _lease_id(lease) -> int | None:
    if lease is None:
        return None
    return int(lease.id) if hasattr(lease, "id") else int(lease)


class Lease:
    """An etcd lease kept alive by a background thread.

    ``deadline()`` is a local monotonic time before which etcd cannot have expired the lease: the
    SEND time of the last keepalive etcd acknowledged plus the TTL it granted (etcd starts its
    countdown when the request arrives, later). ``alive()`` is True only before it. The thread never
    blocks past the deadline (each call's gRPC deadline is capped by it), and calls ``on_lost``
    once when the deadline passes or etcd answers that the lease is gone.
    """

    def __init__(
        self,
        etcd: Etcd,
        ttl: float,
        on_lost: Callable[[str], None] | None = None,
        keepalive: bool = True,
    ):
        if not ttl > 0:
            raise InvalidParameterError(f"lease ttl must be > 0 seconds; got {ttl!r}")
        self._etcd = etcd
        self._on_lost = on_lost
        t_send = time.monotonic()
        self.id, self.ttl = etcd._grant(max(1, math.ceil(ttl)))
        self._deadline = t_send + self.ttl
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._suspended = threading.Event()
        self._lost_reason: str | None = None
        self._thread = None
        if keepalive:
            self._thread = threading.Thread(
                target=self._run, name=f"etcd-lease-{self.id:x}", daemon=True
            )
            self._thread.start()

    def deadline(self) -> float:
        with self._lock:
            return self._deadline

    def alive(self) -> bool:
        with self._lock:
            return self._lost_reason is None and time.monotonic() < self._deadline

    def lost_reason(self) -> str | None:
        return self._lost_reason

    def suspend_keepalive(self) -> None:
        """Stop sending keepalives without revoking (fault tests: a hung or cut-off process)."""
        self._suspended.set()

    def refresh(self) -> bool:
        """One keepalive now; True if etcd still holds the lease."""
        t_send = time.monotonic()
        budget = max(0.05, min(self._etcd.timeout, self.deadline() - t_send))
        ttl = self._etcd._keepalive(self.id, budget)
        if ttl <= 0:
            self._lose("etcd reports the lease expired")
            return False
        with self._lock:
            self._deadline = max(self._deadline, t_send + ttl)
        return True

    def _run(self) -> None:
        interval = max(0.1, self.ttl / 3.0)
        next_send = time.monotonic() + interval
        while True:
            now = time.monotonic()
            deadline = self.deadline()
            if self._stop.wait(max(0.0, min(next_send, deadline) - now)):
                return
            now = time.monotonic()
            if now >= self.deadline():
                self._lose(f"no keepalive acknowledged within the {self.ttl} s TTL")
                return
            if now < next_send or self._suspended.is_set():
                next_send = now + interval
                continue
            try:
                if not self.refresh():
                    return
                next_send = time.monotonic() + interval
            except CoordinationError as exc:
                log.warning(
                    "lease %x keepalive failed (%s); %.1f s left before it is lost",
                    self.id,
                    exc,
                    self.deadline() - time.monotonic(),
                )
                next_send = time.monotonic() + min(interval, 0.25)

    def _lose(self, reason: str) -> None:
        with self._lock:
            if self._lost_reason is not None:
                return
            self._lost_reason = reason
        log.warning("etcd lease %x lost: %s", self.id, reason)
        if self._on_lost is not None:
            try:
                self._on_lost(reason)
            except Exception:
                log.exception("lease %x on_lost callback failed", self.id)

    def _stop_thread(self) -> None:
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=self._etcd.timeout + 1.0)

    def revoke(self) -> None:
        """Stop the keepalive and revoke now (keys attached to the lease are deleted at once).
        ``on_lost`` is not called: this loss is deliberate."""
        with self._lock:
            if self._lost_reason is None:
                self._lost_reason = "revoked"
            self._deadline = min(self._deadline, time.monotonic())
        self._stop_thread()
        self._etcd._revoke(self.id)


class Registration:
    """A key kept alive under a lease and put again after the lease is lost (``Etcd.register``)."""

    def __init__(self, etcd: Etcd, key: str, value: bytes | str, ttl: float,
                 on_change: Callable[[bool], None] | None = None):
        self._etcd = etcd
        self.key = key
        self._value = _b(value)
        self.ttl = ttl
        self._on_change = on_change
        self._lock = threading.Lock()
        self._lease: Lease | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._registered = False
        self._thread = threading.Thread(target=self._run, name=f"etcd-register-{key}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        """Registered now, by the local lease deadline."""
        with self._lock:
            lease = self._lease
        return lease is not None and lease.alive()

    def wait(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end and not self.alive():
            time.sleep(0.02)
        return self.alive()

    @property
    def lease(self) -> Lease | None:
        return self._lease

    def update(self, value: bytes | str) -> None:
        """Change the registered value (e.g. a new state); applied now if registered, else at the
        next registration."""
        with self._lock:
            self._value = _b(value)
            lease = self._lease
        if lease is not None and lease.alive():
            self._etcd.put(self.key, self._value, lease=lease)

    def _set(self, registered: bool) -> None:
        if registered == self._registered:
            return
        self._registered = registered
        if self._on_change is not None:
            try:
                self._on_change(registered)
            except Exception:
                log.exception("registration %s: on_change callback failed", self.key)

    def _run(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            with self._lock:
                lease = self._lease
            if lease is not None and lease.alive():
                self._wake.wait(0.2)
                self._wake.clear()
                continue
            if lease is not None:
                self._set(False)
                try:
                    lease.revoke()  # if etcd still holds it, free the old key now
                except CoordinationError:
                    pass
            try:
                lease = self._etcd.lease(self.ttl, on_lost=lambda _r: self._wake.set())
                with self._lock:
                    value = self._value
                self._etcd.put(self.key, value, lease=lease)
                with self._lock:
                    self._lease = lease
                log.info("registered %s%s under lease %x", self._etcd.prefix, self.key, lease.id)
                self._set(True)
                backoff = 0.1
            except CoordinationError as exc:
                log.warning("registering %s: %s; retrying in %.1f s", self.key, exc, backoff)
                self._stop.wait(backoff)
                backoff = min(2.0, backoff * 2)

    def close(self, revoke: bool = True) -> None:
        """Stop; ``revoke`` deletes the key now (else it goes when the lease expires)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=self._etcd.timeout + 1.0)
        with self._lock:
            lease, self._lease = self._lease, None
        if lease is not None:
            if revoke:
                try:
                    lease.revoke()
                except CoordinationError as exc:
                    log.warning("registration %s: revoke failed (%s)", self.key, exc)
            else:
                lease._stop_thread()


class _PrefixWatch:
    """A prefix watch that re-lists and re-watches when its stream breaks."""

    def __init__(self, etcd: Etcd, sub: str, callback: Callable[[list[WatchEvent]], None]):
        self._etcd = etcd
        self._sub = sub
        self._callback = callback
        self._known: dict[str, int] = {}  # key -> mod_revision delivered
        self._deliver_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._watch_id = None
        self._thread = threading.Thread(target=self._run, name=f"etcd-watch-{sub}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def cancel(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=self._etcd.timeout + 1.0)

    def _deliver(self, events: list[WatchEvent]) -> None:
        if not events or self._stop.is_set():
            return
        try:
            self._callback(events)
        except Exception:
            log.exception("watch callback for %r failed", self._sub)

    def _resync(self) -> int:
        kvs, rev = self._etcd.get_prefix_rev(self._sub)
        with self._deliver_lock:
            events = [WatchEvent("delete", k, None, rev) for k in self._known if k not in kvs]
            events += [
                WatchEvent("put", k, v, mr)
                for k, (v, mr) in sorted(kvs.items())
                if self._known.get(k) != mr
            ]
            self._known = {k: mr for k, (_, mr) in kvs.items()}
            self._deliver(events)
        return rev

    def _on_response(self, resp) -> None:
        if resp is None or isinstance(resp, BaseException):
            if not self._stop.is_set():
                log.warning(
                    "etcd watch on %r broke (%s); re-listing and re-watching",
                    self._sub,
                    resp if resp is not None else "stream closed",
                )
            self._wake.set()
            return
        out = []
        with self._deliver_lock:
            for ev in resp.events:
                key = self._etcd.rel(ev.key)
                mr = int(ev.mod_revision)
                if isinstance(ev, self._etcd._etcd3.events.DeleteEvent):
                    self._known.pop(key, None)
                    out.append(WatchEvent("delete", key, None, mr))
                else:
                    self._known[key] = mr
                    out.append(WatchEvent("put", key, bytes(ev.value), mr))
            self._deliver(out)

    def _run(self) -> None:
        backoff = 0.1
        client = self._etcd._client
        while not self._stop.is_set():
            self._wake.clear()
            try:
                rev = self._resync()
                self._watch_id = self._etcd._call(
                    f"watch {self._sub}",
                    client.add_watch_prefix_callback,
                    self._etcd.full(self._sub),
                    self._on_response,
                    start_revision=rev + 1,
                    retry=False,
                )
                backoff = 0.1
            except CoordinationError as exc:
                log.warning("etcd watch on %r: %s; retrying in %.1f s", self._sub, exc, backoff)
                self._stop.wait(backoff)
                backoff = min(2.0, backoff * 2)
                continue
            self._wake.wait()
            if self._watch_id is not None:
                try:
                    client.cancel_watch(self._watch_id)
                except Exception as exc:  # the stream is usually gone already
                    log.debug("cancel watch %s: %s", self._watch_id, exc)
                self._watch_id = None


def _prefix_end(prefix: bytes) -> bytes:
    """The smallest key above every key starting with ``prefix`` (etcd's range_end)."""
    b = bytearray(prefix)
    while b and b[-1] == 0xFF:
        b.pop()
    if not b:
        return b"\0"
    b[-1] += 1
    return bytes(b)
