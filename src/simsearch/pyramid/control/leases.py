"""etcd leases kept alive by a background thread, and registrations (a key kept under a
lease, put again under a new one when it is lost): the membership of the cluster's processes
(docs/cluster.md, "Control plane")."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from ...errors import InvalidParameterError
from .errors import CoordinationError
from .kv import KeyValue

log = logging.getLogger(__name__)


def as_bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def lease_id(lease) -> int | None:
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
        etcd: KeyValue,
        ttl: float,
        on_lost: Callable[[str], None] | None = None,
        keepalive: bool = True,
    ):
        if not ttl > 0:
            raise InvalidParameterError(f"lease ttl must be > 0 seconds; got {ttl!r}")
        self._etcd = etcd
        self._on_lost = on_lost
        t_send = time.monotonic()
        self.id, self.ttl = etcd.grant(max(1, math.ceil(ttl)))
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
        ttl = self._etcd.keepalive(self.id, budget)
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
        self._etcd.revoke(self.id)


class Registration:
    """A key kept alive under a lease and put again after the lease is lost (``Etcd.register``)."""

    def __init__(self, etcd: KeyValue, key: str, value: bytes | str, ttl: float,
                 on_change: Callable[[bool], None] | None = None):
        self._etcd = etcd
        self.key = key
        self._value = as_bytes(value)
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
            self._value = as_bytes(value)
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
