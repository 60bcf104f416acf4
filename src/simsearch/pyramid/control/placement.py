"""Where part replicas live (docs/cluster.md, "Placement and rebalancing"): pure functions over
the replica map, so the leader's decisions are easy to test and to explain.

A map is ``{part_name: [shard ids]}``. Rules: no shard holds two replicas of a part; replicas are
spread so that every active shard holds the same number (within one); a draining shard holds
none once the moves are done. A rebalance moves one replica at a time, so the replication factor
never drops below its target while data moves (copy first, drop after).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ...errors import InvalidParameterError


@dataclass(frozen=True)
class Move:
    """Copy ``part``'s replica from ``source`` to ``target`` (then drop it from ``source``)."""

    part: str
    source: int
    target: int


def _load(cmap: Mapping[str, Sequence[int]], shards: Iterable[int]) -> Counter:
    load = Counter({s: 0 for s in shards})
    for sids in cmap.values():
        load.update(s for s in sids if s in load)
    return load


def place(parts: Sequence[str], replicas: int, active: Sequence[int],
          existing: Mapping[str, Sequence[int]] | None = None) -> dict[str, list[int]]:
    """Replica lists for new ``parts``: each on ``replicas`` distinct active shards, least-loaded
    first (counting ``existing`` replicas of other collections), ties by shard id."""
    active = sorted(set(active))
    if replicas < 1:
        raise InvalidParameterError(f"replicas must be >= 1; got {replicas}")
    if len(active) < replicas:
        raise InvalidParameterError(
            f"{replicas} replicas need at least {replicas} active shards; {len(active)} are "
            f"registered ({active})")
    load = _load(existing or {}, active)
    out: dict[str, list[int]] = {}
    for part in parts:
        chosen = sorted(active, key=lambda s: (load[s], s))[:replicas]
        load.update(chosen)
        out[part] = sorted(chosen)
    return out


def next_move(cmap: Mapping[str, Sequence[int]], active: Sequence[int],
              draining: Iterable[int] = ()) -> Move | None:
    """The next replica move towards balance, or None when balanced.

    Replicas on draining shards move first (to the least-loaded active shard not holding that
    part); then, while some active shard holds two more replicas than another, one moves from the
    most to the least loaded. Shards not listed (gone, or draining) receive nothing."""
    active = sorted(set(active) - set(draining))
    draining = set(draining)
    if not active:
        return None
    load = _load(cmap, active)

    def target_for(part: str, holders: Sequence[int]) -> int | None:
        free = [s for s in active if s not in holders]
        return min(free, key=lambda s: (load[s], s)) if free else None

    for part in sorted(cmap):
        for s in cmap[part]:
            if s in draining:
                t = target_for(part, cmap[part])
                if t is not None:
                    return Move(part, s, t)
    hi = max(active, key=lambda s: (load[s], -s))
    lo = min(active, key=lambda s: (load[s], s))
    if load[hi] - load[lo] < 2:
        return None
    # a part on the busiest shard that the idlest one does not hold yet (one always exists:
    # hi holds at least two more parts than lo)
    for part in sorted(cmap):
        if hi in cmap[part] and lo not in cmap[part]:
            return Move(part, hi, lo)
    return None


def balanced(cmap: Mapping[str, Sequence[int]], active: Sequence[int],
             draining: Iterable[int] = ()) -> bool:
    return next_move(cmap, active, draining) is None
