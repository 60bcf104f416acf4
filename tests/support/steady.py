"""Searches that overlap a write: readers on threads keep asking while the test's thread writes,
and every answer must equal the one expected (docs/architecture.md, "Concurrency")."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np


def assert_steady_during(search: Callable[[], np.ndarray], want: np.ndarray,
                         write: Callable[[], object], rounds: int, readers: int = 2) -> None:
    """Run ``write`` ``rounds`` times while ``readers`` threads call ``search`` (it returns the
    ids) in a loop; fail on the first answer that differs from ``want`` or on any error."""
    errs, stop = [], threading.Event()

    def reader():
        while not stop.is_set():
            try:
                np.testing.assert_array_equal(search(), want)
            except Exception as e:  # noqa: BLE001 - reported below
                errs.append(e)
                return

    threads = [threading.Thread(target=reader) for _ in range(readers)]
    for t in threads:
        t.start()
    try:
        for _ in range(rounds):
            write()
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not errs, errs[0]
