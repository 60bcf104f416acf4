"""etcd prefix watches that survive broken streams: re-list, deliver the differences, watch
again from the listing's revision (docs/cluster.md, "Control plane")."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from .errors import CoordinationError
from .kv import KeyValue

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WatchEvent:
    """A change under a watched prefix. ``key`` is relative to the client's prefix; ``value`` is
    None for deletes."""

    kind: str  # "put" or "delete"
    key: str
    value: bytes | None
    mod_revision: int


class PrefixWatch:
    """A prefix watch that re-lists and re-watches when its stream breaks."""

    def __init__(self, etcd: KeyValue, sub: str, callback: Callable[[list[WatchEvent]], None]):
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
                if self._etcd.is_delete(ev):
                    self._known.pop(key, None)
                    out.append(WatchEvent("delete", key, None, mr))
                else:
                    self._known[key] = mr
                    out.append(WatchEvent("put", key, bytes(ev.value), mr))
            self._deliver(out)

    def _run(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            self._wake.clear()
            try:
                rev = self._resync()
                self._watch_id = self._etcd.add_prefix_watch(self._sub, self._on_response,
                                                             start_revision=rev + 1)
                backoff = 0.1
            except CoordinationError as exc:
                log.warning("etcd watch on %r: %s; retrying in %.1f s", self._sub, exc, backoff)
                self._stop.wait(backoff)
                backoff = min(2.0, backoff * 2)
                continue
            self._wake.wait()
            if self._watch_id is not None:
                try:
                    self._etcd.cancel_watch(self._watch_id)
                except Exception as exc:  # the stream is usually gone already
                    log.debug("cancel watch %s: %s", self._watch_id, exc)
                self._watch_id = None
