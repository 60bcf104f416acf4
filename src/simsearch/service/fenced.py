"""Fenced, ordered writes to a Pyramid part replica (docs/cluster.md, "Writes").

The cluster's leader writes a part in two phases. **Prepare** stores the write's ops durably on
each replica without applying them; then the leader appends the write's routing decisions to the
router log in etcd (the commit point); then **sync** applies the prepared ops. Every call carries
a ballot (term, attempt): the term is the leader's election revision, the attempt grows with every
write the leader tries. A replica

- refuses a prepare whose ballot is below the highest it has seen, and a sync whose term is below
  the highest term it has seen (``StaleTermError``, FAILED_PRECONDITION): a deposed or paused
  leader cannot land anything once its successor has touched the replica;
- numbers its writes by part sequence (``pseq`` 1, 2, ...) and applies them strictly in order:
  a sync applies [first, through] only if the replica applied exactly first - 1 and holds every
  op of that range prepared under the write's ballot; otherwise it applies nothing and reports
  what it has (the leader then repairs it); a replay of an applied sequence is a no-op, but a
  sync of a range it applied under another ballot is refused (``DataLossError``: it holds
  another write there, and is re-copied), so replicas are compared by ballot, not only by
  sequence.

So replicas that report the same ``applied`` hold the same items, and an op that was prepared but
never committed (its leader lost the log append) is never applied: no ghosts.

This module is the pure state; ``partreplica.PartReplica`` logs each step in its write-ahead log.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .errors import DataLossError, OpsGoneError, StaleTermError  # noqa: F401


@dataclass(frozen=True)
class PartOp:
    """One op of a part write: remove ``ids`` (missing ones skipped) or upsert ``x`` as ``ids``."""

    pseq: int
    remove: bool
    ids: np.ndarray
    x: np.ndarray | None = None
    attributes: dict | None = None  # {name: one value per id} (docs/filters.md)


Ballot = tuple[int, int]

#: applied ranges remembered with their ballots (a replica checks a replayed sync against them)
RECENT = 16


@dataclass
class FencedState:
    """A part replica's fencing and ordering state (see the module docstring)."""

    term: int = 0
    attempt: int = 0  # with term: the highest ballot seen by a prepare
    applied: int = 0
    prepared: dict[int, tuple[Ballot, PartOp]] = field(default_factory=dict)
    #: the last RECENT applied ranges, (first, through, ballot term, ballot attempt)
    recent: list[tuple[int, int, int, int]] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"term": self.term, "attempt": self.attempt, "applied": self.applied,
                "recent": [list(r) for r in self.recent]}

    @classmethod
    def from_json(cls, d: dict) -> FencedState:
        """ValueError, saying what is expected, for a state that does not have this shape (a
        copy's ``part_state`` comes from the network)."""
        try:
            recent = [tuple(int(v) for v in r) for r in d.get("recent", [])][-RECENT:]
            if not isinstance(d.get("recent", []), list) or any(len(r) != 4 for r in recent):
                raise ValueError
            return cls(int(d["term"]), int(d["attempt"]), int(d["applied"]),
                       recent=recent)  # type: ignore[arg-type]
        except (TypeError, ValueError, KeyError, AttributeError):
            raise ValueError(
                "a part state must be {term, attempt, applied: integers, recent: a list of "
                f"[first, through, term, attempt] integers}}; got {str(d)[:160]}") from None

    def check_prepare(self, term: int, attempt: int) -> None:
        if (term, attempt) < (self.term, self.attempt):
            raise StaleTermError(
                f"part write from leader term {term} (attempt {attempt}) refused: this replica "
                f"has seen term {self.term} (attempt {self.attempt})")

    def check_term(self, term: int) -> None:
        if term < self.term:
            raise StaleTermError(
                f"part call from leader term {term} refused: this replica has seen term "
                f"{self.term}")

    def prepare(self, term: int, attempt: int, ops: list[PartOp]) -> None:
        # never lowers the ballot: a snapshot re-logs older prepared ops after a raised term
        self.term, self.attempt = max((self.term, self.attempt), (term, attempt))
        for op in ops:
            if op.pseq > self.applied:  # a replayed prepare of an applied op changes nothing
                self.prepared[op.pseq] = ((term, attempt), op)

    def raise_term(self, term: int) -> bool:
        """Fence at ``term``; True if that raised it (the caller makes it durable)."""
        if term <= self.term:
            return False
        self.term, self.attempt = term, 0
        return True

    def ops_to_apply(self, ballot: Ballot, first: int, through: int) -> list[PartOp] | None:
        """The prepared ops a sync applies, in order; [] if they are applied already; None if
        this replica cannot apply them (it missed a write or holds another ballot's ops).
        DataLossError if it applied exactly that range under another ballot."""
        if through <= self.applied:
            for a, b, t, at in self.recent:
                if (a, b) == (first, through) and (t, at) != tuple(ballot):
                    raise DataLossError(
                        f"this replica applied part writes [{first}, {through}] under ballot "
                        f"({t}, {at}), not ({ballot[0]}, {ballot[1]}): it holds another write "
                        "there; re-copy it from a current replica")
            return []
        if first != self.applied + 1:
            return None
        ops = []
        for s in range(first, through + 1):
            entry = self.prepared.get(s)
            if entry is None or entry[0] != ballot:
                return None
            ops.append(entry[1])
        return ops

    def pending(self) -> dict[Ballot, list[PartOp]]:
        """The prepared ops not yet applied, by ballot, in sequence order (a snapshot keeps
        them in its new log)."""
        out: dict[Ballot, list[PartOp]] = {}
        for s in sorted(self.prepared):
            ballot, op = self.prepared[s]
            out.setdefault(ballot, []).append(op)
        return out

    def mark_applied(self, through: int, first: int = 0, ballot: Ballot | None = None) -> None:
        if ballot is not None and through > self.applied:
            self.recent = [*self.recent, (first, through, *ballot)][-RECENT:]
        self.applied = max(self.applied, through)
        for s in [s for s in self.prepared if s <= self.applied]:
            del self.prepared[s]
