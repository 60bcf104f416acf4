"""Replication of a cluster collection's parts (docs/cluster.md, "Writes"), apart from the
algorithm: the parts' committed write sequences, and the leader's fenced two-phase writes.

Every part numbers its writes (part sequence 1, 2, ...). The leader prepares a write's ops on
every in-sync replica of each part it touches, under its ballot (term, attempt); commits by
appending the write's routing decisions and a sequence record to the router log; then has the
replicas apply (sync) what they prepared. ``PartSequences`` is what the log committed: per part,
the last sequence and the last ``PART_HISTORY`` writes with their ballots, from which a replica
that missed a commit applies the ops it holds prepared (parts.py, catch-up). The replica's side
is service/fenced.py.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .. import _faults
from ..service.errors import ServiceUnavailableError, StaleTermError
from ..service.fenced import PartOp
from .control.errors import NotLeaderError

log = logging.getLogger(__name__)

#: committed part writes remembered per part (first, through, ballot term, ballot attempt): a
#: replica that missed the commits of up to this many writes applies them from its prepared ops
PART_HISTORY = 16


@dataclass(frozen=True)
class PartSequences:
    """Per part, the last committed write sequence (``seq``, (P,)) and the last PART_HISTORY
    committed writes (``history``, (P, PART_HISTORY, 4): first, through, ballot term, ballot
    attempt; oldest first, zeros before the first). An immutable value, like the router it is
    kept beside: ``committed`` returns the sequences after a write."""

    seq: np.ndarray
    history: np.ndarray

    @classmethod
    def empty(cls, n_parts: int) -> PartSequences:
        return cls(np.zeros(n_parts, np.int64), np.zeros((n_parts, PART_HISTORY, 4), np.int64))

    @classmethod
    def from_annex(cls, annex: dict, n_parts: int) -> PartSequences:
        """From a router file's annex (``to_annex``); empty when it has none (a new router)."""
        if "part_seq" not in annex:
            return cls.empty(n_parts)
        seq, hist = annex["part_seq"], annex["part_history"]
        if seq.shape != (n_parts,) or hist.size % (4 * n_parts) or hist.dtype.kind not in "iu":
            raise ValueError("router part sequences do not match the parts")
        return cls(seq.astype(np.int64), hist.reshape(n_parts, -1, 4).astype(np.int64))

    def to_annex(self) -> dict[str, np.ndarray]:
        return {"part_seq": self.seq, "part_history": self.history.ravel()}

    def committed(self, rec: dict) -> PartSequences:
        """The sequences once a write's sequence record (``record``) is committed."""
        seq, hist = self.seq.copy(), self.history.copy()
        term, attempt = (int(v) for v in rec["ballot"])
        for p, a, b in zip(*(np.asarray(rec[k]).tolist() for k in ("parts", "first", "through")),
                           strict=True):
            seq[p] = max(seq[p], b)
            hist[p, :-1] = hist[p, 1:].copy()
            hist[p, -1] = (a, b, term, attempt)
        return PartSequences(seq, hist)

    def committed_writes(self, part: int) -> list[tuple[int, int, tuple[int, int]]]:
        """Part ``part``'s remembered committed writes ``(first, through, ballot)``, oldest
        first."""
        return [(a, b, (t, at)) for a, b, t, at in self.history[part].tolist() if b]

    def number(self, jobs: list, attributes_of: Callable | None = None) -> dict[int, list]:
        """A write's part jobs ``(part, "add" | "remove", args)`` as PartOps numbered after each
        part's committed sequence: ``{part: [PartOp, ...]}``."""
        by_part: dict[int, list] = {}
        for p, op, args in jobs:
            ops = by_part.setdefault(p, [])
            seq = int(self.seq[p]) + len(ops) + 1
            ops.append(PartOp(seq, True, args[0]) if op == "remove" else PartOp(
                seq, False, args[1], args[0],
                attributes_of(args[1]) if attributes_of is not None else None))
        return by_part


def sequence_record(by_part: dict[int, list], ballot: tuple[int, int]) -> dict:
    """The router log's record of a write's part sequences, committed with its decisions."""
    parts = sorted(by_part)
    return {"op": "seq", "parts": np.asarray(parts, np.int64),
            "first": np.asarray([by_part[p][0].pseq for p in parts], np.int64),
            "through": np.asarray([by_part[p][-1].pseq for p in parts], np.int64),
            "ballot": np.asarray(ballot, np.int64)}


def replicate(coord, parts: dict, by_part: dict[int, list], deadline: float | None,
              commit: Callable[[dict], None]) -> None:
    """One write's two phases around its commit. Phase one: every in-sync replica of each part
    prepares the part's ops under this leader's ballot; a part that fewer than
    ``--min-insync-replicas`` replicas prepared aborts the write (nothing applied anywhere).
    ``commit(sequence_record)`` appends to the router log (the commit point). Phase two: the
    replicas that prepared apply; one that missed either phase is marked out of sync before the
    write is acknowledged, and caught up in the background."""
    pool = coord.pool
    term, attempt = coord.term(), coord.next_attempt()
    timeout = pool.timeout if deadline is None else max(
        0.05, min(pool.timeout, deadline - time.monotonic()))
    with contextlib.ExitStack() as locks:
        for p in sorted(parts):  # in part order: no two writers wait on each other
            locks.enter_context(parts[p].write_lock)
        targets = {p: [s for s in part.shards if pool.in_sync(part.name, s)]
                   for p, part in parts.items()}
        prepared = on_replicas(coord, parts, targets, lambda p, part, sid: part.prepare(
            sid, term, attempt, by_part[p], timeout))
        need = coord.min_insync_replicas()
        for p, part in parts.items():
            if len(prepared[p]) < need:  # nothing committed: the prepares never apply
                raise ServiceUnavailableError(
                    f"{len(prepared[p])} replica(s) of part {part.name} took the write "
                    f"(shards {sorted(prepared[p])} of the in-sync {targets[p]}), fewer than "
                    f"--min-insync-replicas {need}; nothing was applied; retry")
        ballot = (term, attempt)
        commit(sequence_record(by_part, ballot))
        _faults.point("write:committed")
        synced = on_replicas(coord, parts, prepared, lambda p, part, sid: part.sync(
            sid, term, ballot, by_part[p][0].pseq, by_part[p][-1].pseq, timeout))
        for p, part in parts.items():
            through = by_part[p][-1].pseq
            current = [s for s, st in synced[p].items() if st["applied"] == through]
            for sid in targets[p]:
                if sid not in current:  # missed a phase: no reads until it caught up
                    if sid in synced[p]:
                        log.warning("%s on shard %d applied %d after the sync of [%d, %d]",
                                    part.name, sid, synced[p][sid]["applied"],
                                    by_part[p][0].pseq, through)
                    # recorded before the answer, or no answer: a leader deposed meanwhile
                    # cannot record it and must not acknowledge (the write is committed; the
                    # new leader's take-over repairs the replica)
                    pool.mark_out_of_sync(part.name, sid, strict=True)
                    pool.mark_down(sid)


def on_replicas(coord, parts: dict, targets: dict, call) -> dict[int, dict[int, dict]]:
    """``call(p, part, sid)`` on every target replica at once; ``{p: {sid: answer}}`` of those
    that answered. A replica that refuses the leader's term means a newer leader exists:
    NotLeaderError; so does this leader losing its lease meanwhile."""
    pool = coord.pool
    futs = {(p, sid): pool.executor.submit(contextvars.copy_context().run, call, p, part, sid)
            for p, part in parts.items() for sid in targets[p]}
    pending = set(futs.values())
    while pending:  # a leader that loses its lease meanwhile abandons the write at once
        _, pending = concurrent.futures.wait(pending, timeout=0.1)
        if pending and not coord.is_leader():
            for f in pending:
                f.cancel()
            raise NotLeaderError("this coordinator lost its lease with part writes in flight; "
                                 "they were abandoned (none can commit); retry")
    out: dict[int, dict[int, dict]] = {p: {} for p in parts}
    stale = None
    for (p, sid), f in futs.items():
        try:
            out[p][sid] = f.result()
        except StaleTermError as exc:
            stale = exc
        except Exception as exc:  # a replica that did not answer: judged by the caller
            log.warning("part write to %s on shard %d failed: %r", parts[p].name, sid, exc)
    if stale is not None:
        raise NotLeaderError(f"a shard refused this leader's term: {stale}")
    return out
