"""What an index can do, as one record (docs/architecture.md, "The Index contract"): the
service, the cluster and a collection's ``describe()`` read it, never a class's flags one by
one. A kind declares its record on the class; an index whose build parameters decide (a
Pyramid over a sub-index, over parts an owner keeps) gives its own instance a changed copy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Capabilities:
    """``items``: what an item is, "vectors" (float rows of ``dim``) or "strings" (``dim`` 0).
    ``search_params``: per-call search parameters it accepts. ``needs_training``: ``train``
    before ``add``. ``supports_remove``: ``remove`` works. ``train_options``: what ``train``
    takes besides the sample. ``train_logged``: a node logs a training and replays it (quick,
    deterministic); False: it snapshots the trained index at once instead. ``takes_where`` /
    ``takes_deadline``: ``search`` passes ``where`` / ``deadline`` on (parts that keep
    attributes answer the one and are given the other). ``lock_free_search``: a search reads
    only state a write replaces whole, so it takes no lock (a router whose parts an owner
    writes: its searches must not wait behind a write's network calls)."""

    items: str = "vectors"
    search_params: frozenset[str] = frozenset()
    needs_training: bool = False
    supports_remove: bool = True
    train_options: frozenset[str] = frozenset()
    train_logged: bool = True
    takes_where: bool = False
    takes_deadline: bool = False
    lock_free_search: bool = False

    def but(self, **changes) -> Capabilities:
        """A copy with ``changes``."""
        return dataclasses.replace(self, **changes)
