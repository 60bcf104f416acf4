"""Leader election on etcd for the cluster's coordinators (docs/cluster.md, "Coordinators").

Built the way Milvus runs its active-standby coordinators, since etcd's own election API is not
exposed by the Python clients: each candidate holds a lease; it becomes leader by creating the
leader key with that lease in a create-if-absent transaction; the others watch the key and campaign
again when it is deleted (resignation, or etcd expiring the leader's lease).

No split brain: ``is_leader()`` is True only before the lease's local deadline, the send time of
the last keepalive etcd acknowledged plus the TTL. etcd cannot expire the lease (and so let another
candidate create the key) before that instant, so a leader that is cut off or stalled stops
calling itself leader before anyone else can win. State changes carry ``fence()`` in their ``cas``
so that a leader that missed its deadline cannot change anything either.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ...errors import InvalidParameterError
from .errors import CoordinationError, NotLeaderError
from .etcd import Compare, Etcd, Lease, WatchEvent

log = logging.getLogger(__name__)


class Election:
    """One candidate in the election held on ``key`` (relative to ``etcd``'s prefix).

    ``on_elected()`` and ``on_lost(reason)`` are called from a background thread when this
    candidate wins or stops being leader; keep them short (start work on another thread).
    """

    def __init__(
        self,
        etcd: Etcd,
        key: str = "leader",
        candidate: str = "",
        ttl: float = 3.0,
        on_elected: Callable[[], None] | None = None,
        on_lost: Callable[[str], None] | None = None,
    ):
        if not candidate:
            raise InvalidParameterError(
                "Election needs a non-empty candidate name (e.g. its address)"
            )
        if not ttl > 0:
            raise InvalidParameterError(f"election ttl must be > 0 seconds; got {ttl!r}")
        self.etcd = etcd
        self.key = key
        self.candidate = candidate
        self.ttl = float(ttl)
        self._on_elected = on_elected
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lease: Lease | None = None
        self._term: int | None = None  # create revision of the leader key while we hold it
        self._campaigning = False
        self._holdoff_until = 0.0  # no campaigning before this (monotonic) after losing a term
        self._thread: threading.Thread | None = None
        self._cancel_watch: Callable[[], None] | None = None
        self.elected_at: float | None = None  # monotonic time of the last win
        self.terms_won = 0

    # -- public
    def start(self) -> Election:
        """Start campaigning in the background (returns at once)."""
        with self._lock:
            if self._campaigning:
                return self
            self._campaigning = True
            self._stop.clear()
        if self._cancel_watch is None:
            self._cancel_watch = self.etcd.watch_prefix(self.key, self._on_events)
        self._thread = threading.Thread(
            target=self._run, name=f"election-{self.candidate}", daemon=True
        )
        self._thread.start()
        return self

    def is_leader(self) -> bool:
        with self._lock:
            lease, term = self._lease, self._term
        return term is not None and lease is not None and lease.alive()

    def term(self) -> int | None:
        """The leader key's create revision while this candidate is leader (a fencing token that
        grows with every new term), else None."""
        with self._lock:
            term = self._term
        return term if self.is_leader() else None

    def deadline(self) -> float | None:
        """Monotonic time until which this candidate may act as leader (None if it is not)."""
        with self._lock:
            lease, term = self._lease, self._term
        return lease.deadline() if (lease is not None and term is not None) else None

    @property
    def lease(self) -> Lease | None:
        return self._lease

    def leader(self) -> str | None:
        """The current leader's candidate name as etcd has it (None if there is none)."""
        value, _ = self.etcd.get(self.key)
        return value.decode() if value is not None else None

    def fence(self) -> list[Compare]:
        """Compares to add to every ``cas`` this leader makes: the leader key still holds this
        candidate at this term. Raises ``NotLeaderError`` if it is not leader by its own clock."""
        with self._lock:
            term = self._term
        if term is None or not self.is_leader():
            raise NotLeaderError(
                f"coordinator {self.candidate!r} is not the elected leader; "
                "send the change to the leader"
            )
        return [Compare.value_eq(self.key, self.candidate), Compare.create(self.key, term)]

    def wait_elected(self, timeout: float) -> bool:
        """Block until this candidate is leader or ``timeout`` seconds pass."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.is_leader():
                return True
            time.sleep(0.02)
        return self.is_leader()

    def resign(self) -> None:
        """Step down and stop campaigning (``start()`` again to rejoin). Revoking the lease
        deletes the leader key at once, so a standby takes over without waiting for the TTL."""
        with self._lock:
            self._campaigning = False
            was, self._term = self._term is not None, None
            lease, self._lease = self._lease, None
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.etcd.timeout + 1.0)
        self._thread = None
        if was:
            self._notify_lost("resigned")
        if lease is not None:
            try:
                lease.revoke()
            except CoordinationError as exc:  # the key then goes when etcd expires the lease
                log.warning(
                    "election %s: revoking the lease on resign failed: %s", self.candidate, exc
                )

    def close(self) -> None:
        self.resign()
        if self._cancel_watch is not None:
            self._cancel_watch()
            self._cancel_watch = None

    # -- internals
    def _new_lease(self) -> Lease:
        made: list[Lease] = []  # the callback needs the lease it belongs to
        lease = self.etcd.lease(
            self.ttl, on_lost=lambda reason: made and self._on_lease_lost(made[0], reason))
        made.append(lease)
        return lease

    def _notify_lost(self, reason: str) -> None:
        log.warning("election %s: no longer leader (%s)", self.candidate, reason)
        if self._on_lost is not None:
            try:
                self._on_lost(reason)
            except Exception:
                log.exception("election %s: on_lost callback failed", self.candidate)

    def _step_down(self, reason: str) -> None:
        with self._lock:
            was, self._term = self._term is not None, None
            if was:
                # a leader that stalled or was cut off does not win straight back: the standbys,
                # which saw the key go, get one TTL to take over
                self._holdoff_until = time.monotonic() + self.ttl
        if was:
            self._notify_lost(reason)
        self._wake.set()

    def _on_lease_lost(self, lease: Lease, reason: str) -> None:
        with self._lock:
            current = self._lease is lease
        if current:  # a late callback of an older lease must not end the current term
            self._step_down(f"lease lost: {reason}")

    def _on_events(self, events: list[WatchEvent]) -> None:
        for ev in events:
            if ev.key != self.key:
                continue
            with self._lock:
                term = self._term
            if ev.kind == "delete":
                if term is not None:
                    self._step_down("the leader key was deleted")
                self._wake.set()  # campaign now, do not wait for the retry interval
            elif term is not None and ev.value != self.candidate.encode():
                self._step_down(f"the leader key now names {ev.value!r}")

    def _campaign(self, lease: Lease) -> None:
        created, value, create_rev, lease_id = self.etcd.create_or_get(
            self.key, self.candidate, lease
        )
        # A create whose reply was lost and retried reads back our own key: also a win.
        won = created or (value == self.candidate.encode() and lease_id == lease.id)
        if not won:
            return
        with self._lock:
            if not self._campaigning or self._lease is not lease:
                return
            self._term = create_rev
        if not lease.alive():
            self._step_down("lease expired while campaigning")
            return
        self.elected_at = time.monotonic()
        self.terms_won += 1
        log.info(
            "election %s: elected leader of %s (term %d)",
            self.candidate,
            self.etcd.full(self.key),
            create_rev,
        )
        if self._on_elected is not None:
            try:
                self._on_elected()
            except Exception:
                log.exception("election %s: on_elected callback failed", self.candidate)

    def _run(self) -> None:
        retry = max(0.1, self.ttl / 3.0)
        backoff = 0.1
        while not self._stop.is_set():
            self._wake.clear()
            try:
                with self._lock:
                    lease = self._lease
                if lease is None or not lease.alive():
                    if lease is not None:
                        self._step_down("lease lost")
                        # etcd may still hold it (we lost contact, not the lease): revoking
                        # frees our stale leader key now instead of after the TTL
                        try:
                            lease.revoke()
                        except CoordinationError as exc:
                            log.info("election %s: old lease not revoked (%s)", self.candidate, exc)
                        with self._lock:
                            if self._lease is lease:
                                self._lease = None
                    lease = self._new_lease()
                    with self._lock:
                        if not self._campaigning:
                            lease.revoke()
                            return
                        self._lease = lease
                with self._lock:
                    leading = self._term is not None
                    holdoff = self._holdoff_until - time.monotonic()
                if not leading and holdoff <= 0:
                    self._campaign(lease)
                backoff = 0.1
                self._wake.wait(retry if holdoff <= 0 else min(retry, holdoff))
            except CoordinationError as exc:
                log.warning("election %s: %s; retrying in %.1f s", self.candidate, exc, backoff)
                self._stop.wait(backoff)
                backoff = min(2.0, backoff * 2)
