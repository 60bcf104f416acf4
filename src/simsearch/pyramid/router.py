"""The Pyramid router as an immutable value (docs/cluster.md, "The router").

A ``Router`` is the trained model (centres, the part of each centre, the meta-HNSW over them)
and the placement of every held id: its home part (the part of its nearest centre, or of its
id's hash) and the parts holding a copy: for MIPS because one of their centres lists the id
among its top-r items, with ``spill`` because the id lies near the border of that part.
A write is first planned (``plan_add`` / ``plan_remove`` return a ``Decision``: the record the
router log keeps and the jobs the parts must do; the router is unchanged), then applied
(``apply(record)`` returns a new Router). Whoever holds a router replaces it by reference, so
a search that read one router reads that router from its start to its end, whatever is
applied meanwhile.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import faiss
import numpy as np

from ..filters import IdFilter
from ..hnsw import HNSWIndex
from ..index import as_id_array, as_matrix, check_held, check_int, new_ids, normalize_rows
from .frozenmap import FrozenMap

#: rows of a batch scored against all centres at once while updating the MIPS lists
_MIPS_CHUNK = 4096
#: nearest centres searched for one outside an item's home part (``Router.spill``)
_SPILL_CANDIDATES = 32


@dataclass(frozen=True)
class Decision:
    """One write's routing decisions: ``record`` (what the router log keeps, routerlog.py, and
    what ``Router.apply`` applies) and ``jobs``, ``(part, "add" | "remove", args)`` the parts
    must take before it is applied."""

    record: dict
    jobs: list = field(default_factory=list)


@dataclass(frozen=True)
class Router:
    """The model and the placement (module docstring). ``spherical``: centres and items are
    compared by direction (metrics "ip" and "cosine"); ``mips``: MIPS copies are kept (metric
    "ip" with ``mips_replicas`` > 0), per centre in ``topr_ids`` / ``topr_scores`` (m, r)."""

    centres: np.ndarray
    part_of_centre: np.ndarray
    meta: HNSWIndex
    n_parts: int
    spherical: bool
    mips: bool
    topr_ids: np.ndarray
    topr_scores: np.ndarray
    home: FrozenMap = field(default_factory=FrozenMap)
    #: id -> parts holding a copy of it, MIPS or spilled (each a frozenset)
    copies: FrozenMap = field(default_factory=FrozenMap)
    #: id -> ((part, centres of that part listing the id), ...): a copy lives while > 0
    refs: FrozenMap = field(default_factory=FrozenMap)
    counts: np.ndarray | None = None  # items stored per part, copies included
    #: placement by a hash of the id, every query asking every part (``partition="hash"``)
    hashed: bool = False
    #: an item is also copied to the part of its nearest centre outside its home part when
    #: that centre is at most ``spill`` times as far as its nearest (0: never; PyramidIndex)
    spill: float = 0.0

    def __post_init__(self):
        for a in (self.centres, self.part_of_centre, self.topr_ids, self.topr_scores):
            a.flags.writeable = False  # shared by the routers a write derives
        if self.counts is None:
            object.__setattr__(self, "counts", self.part_sizes())
        self.counts.flags.writeable = False

    # -- reading ----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.home)

    def part_sizes(self) -> np.ndarray:
        """Items stored per part, MIPS copies included, counted from the placement."""
        out = np.bincount(np.fromiter(self.home.values(), np.int64, len(self.home)),
                          minlength=self.n_parts)
        for ps in self.copies.values():
            for p in ps:
                out[p] += 1
        return out

    def parts_holding(self, ids: Iterable[int]) -> dict[int, list[int]]:
        """{part: the given ids it holds} (homes and copies)."""
        by_part: dict[int, list[int]] = {}
        for i in ids:
            by_part.setdefault(self.home.get(i), []).append(i)
            for p in self.copies.get(i, ()):
                by_part.setdefault(p, []).append(i)
        return by_part

    def members(self) -> list[np.ndarray]:
        """Per part, the sorted ids it must hold."""
        by: list[list[int]] = [[] for _ in range(self.n_parts)]
        for i, p in self.home.items():
            by[p].append(i)
        for i, ps in self.copies.items():
            for p in ps:
                by[p].append(i)
        return [np.unique(np.asarray(v, np.int64)) for v in by]

    def centre_space(self, x: np.ndarray) -> np.ndarray:
        return normalize_rows(x) if self.spherical else x

    def nearest_centre(self, x: np.ndarray) -> np.ndarray:
        return nearest_centre(x, self.centres, self.spherical)

    def _spill(self, x: np.ndarray) -> tuple[np.ndarray, list[tuple[int, list[int]]]]:
        """Each row's home part, and the rows also copied to another part [(part, rows)]: the
        part of the row's nearest centre outside its home part, when that centre is at most
        ``spill`` times as far as the nearest (distances 1 - cosine for unit centres, squared
        L2 else; among the nearest _SPILL_CANDIDATES centres)."""
        d, c = nearest_centres(x, self.centres, self.spherical,
                               min(_SPILL_CANDIDATES, self.centres.shape[0]))
        parts = self.part_of_centre[c]
        home = parts[:, 0]
        other = parts != home[:, None]
        j = other.argmax(1)
        rows = np.arange(x.shape[0])
        near = other[rows, j] & (d[rows, j] <= self.spill * np.maximum(d[:, 0], 0.0))
        spilled = np.flatnonzero(near)
        to = parts[spilled, j[spilled]]
        return home, [(p, spilled[to == p].tolist()) for p in np.unique(to).tolist()]

    def route_shares(self, q: np.ndarray, branching: int,
                     meta_ef: int | None = None) -> np.ndarray:
        """(nq, n_parts) float32: how many of each query's ``branching`` nearest centres each
        part holds (0: the part is not asked), plus 0.5 for the part of the nearest centre so
        that it wins ties for primary. Hashed: 1 for every part holding items."""
        kk = min(branching, self.centres.shape[0])
        ef = max(2 * kk, 32) if meta_ef is None else check_int("meta_ef", meta_ef, 1, 1 << 20)
        if self.hashed:
            return np.repeat((self.counts > 0)[None].astype(np.float32), q.shape[0], axis=0)
        r = self.meta.search(q, kk, ef=ef)
        nq = q.shape[0]
        shares = np.zeros((nq, self.n_parts), np.float32)
        ok = r.ids >= 0
        rows = np.broadcast_to(np.arange(nq)[:, None], r.ids.shape)
        np.add.at(shares, (rows[ok], self.part_of_centre[r.ids[ok]]), 1.0)
        first = ok[:, 0]
        shares[np.flatnonzero(first), self.part_of_centre[r.ids[first, 0]]] += 0.5
        return shares

    def allowed_count(self, allow: np.ndarray | None, deny: np.ndarray | None) -> int:
        """How many of the ids this router places an allow and a deny list leave (the
        router's own id set: a search that took this router counts what it routes)."""
        home = self.home
        gone = {i for i in deny.tolist() if i in home} if deny is not None else set()
        if allow is None:
            return len(home) - len(gone)
        return sum(1 for i in set(allow.tolist()) if i in home and i not in gone)

    def allowed_per_part(self, filt: IdFilter, nq: int) -> list[list[np.ndarray]] | None:
        """[query][part] the allowed ids each part holds (homes and MIPS copies), or None
        without an allow list."""
        if filt.allow is None:
            return None
        home, copies, P = self.home, self.copies, self.n_parts

        def split(a: np.ndarray) -> list[np.ndarray]:
            parts: list[list[int]] = [[] for _ in range(P)]
            for i in a.tolist():
                p = home.get(i)
                if p is None:
                    continue  # not held: ignored
                parts[p].append(i)
                for c in copies.get(i, ()):
                    parts[c].append(i)
            return [np.array(v, np.int64) for v in parts]

        if not isinstance(filt.allow, list):
            return [split(filt.allow)] * nq
        return [split(a) for a in filt.allow]

    # -- planning ---------------------------------------------------------------------------

    def plan_add(self, x: np.ndarray, ids: np.ndarray) -> Decision:
        """Where a batch of new ids goes: each to the part of its nearest centre, plus the MIPS
        copies the changed top-r lists add or drop (hashed: to the part its id hashes to)."""
        copy_adds: list[tuple[int, list[int]]] = []
        copy_drops: list[tuple[int, list[int]]] = []
        if self.hashed:
            home = hash_parts(ids, self.n_parts)
        elif self.spill:
            home, copy_adds = self._spill(self.centre_space(x))
        else:
            home = self.part_of_centre[self.nearest_centre(self.centre_space(x))]
        rec: dict[str, Any] = {"op": "add", "ids": ids.astype(np.int64),
                               "home": home.astype(np.int64)}
        if self.mips:
            copy_adds, copy_drops = self._plan_lists(x, ids, home, rec)
        jobs: list[tuple[int, str, tuple]] = []
        extra = dict(copy_adds)
        for p in range(self.n_parts):
            rows = np.flatnonzero(home == p)
            if extra.get(p):
                rows = np.concatenate([rows, np.asarray(extra[p], np.int64)])
            if rows.size:
                jobs.append((p, "add", (x[rows], ids[rows])))
        for p, drop in copy_drops:
            jobs.append((p, "remove", (np.asarray(drop, np.int64),)))
        rec["copy_add"] = np.asarray([(p, int(ids[r])) for p, rows in copy_adds for r in rows],
                                     np.int64).reshape(-1, 2)
        rec["copy_drop"] = np.asarray([(p, int(i)) for p, drop in copy_drops for i in drop],
                                      np.int64).reshape(-1, 2)
        return Decision(rec, jobs)

    def _plan_lists(self, x: np.ndarray, ids: np.ndarray, home: np.ndarray, rec: dict):
        """The new MIPS lists (changed rows into ``rec``) and the copies they add [(part, batch
        rows)] and drop [(part, ids)]."""
        r = self.topr_ids.shape[1]
        t_ids, t_scores = self.topr_ids, self.topr_scores
        for s in range(0, x.shape[0], _MIPS_CHUNK):
            xs, ids_s = x[s : s + _MIPS_CHUNK], ids[s : s + _MIPS_CHUNK]
            sc = (xs @ self.centres.T).T  # (m, n): inner product with each centre's direction
            all_s = np.concatenate([t_scores, sc.astype(np.float32)], axis=1)
            all_i = np.concatenate([t_ids, np.broadcast_to(ids_s, sc.shape)], axis=1)
            if all_s.shape[1] > r:
                sel = np.argpartition(-all_s, r - 1, axis=1)[:, :r]
                t_scores = np.take_along_axis(all_s, sel, 1)
                t_ids = np.take_along_axis(all_i, sel, 1)
            else:
                t_scores, t_ids = all_s, all_i
        row_of = {int(i): j for j, i in enumerate(ids.tolist())}
        new_home = dict(zip(ids.tolist(), home.tolist(), strict=True))
        # only the lists that changed can change the copies: count, per (item, part), how many
        # of the part's centres list the item (a copy lives while the count is > 0)
        old = self.topr_ids
        changed = np.flatnonzero((np.sort(old, 1) != np.sort(t_ids, 1)).any(1))
        delta: dict[tuple[int, int], int] = {}
        for c in changed.tolist():
            p = int(self.part_of_centre[c])
            o, n = set(old[c].tolist()), set(t_ids[c].tolist())
            for i, d in [(i, 1) for i in n - o] + [(i, -1) for i in o - n]:
                if i >= 0 and new_home.get(i, self.home.get(i)) != p:
                    delta[(i, p)] = delta.get((i, p), 0) + d
        adds: dict[int, list[int]] = {}
        drops: dict[int, list[int]] = {}
        for (i, p), d in sorted(delta.items()):
            before = dict(self.refs.get(i, ())).get(p, 0)
            if before == 0 and before + d > 0:  # only batch items can newly enter a list
                adds.setdefault(p, []).append(row_of[i])
            elif before > 0 and before + d == 0:
                drops.setdefault(p, []).append(i)
        rows = np.flatnonzero((t_ids != self.topr_ids).any(1)
                              | (t_scores != self.topr_scores).any(1))
        rec.update(topr_rows=rows, topr_ids=t_ids[rows], topr_scores=t_scores[rows],
                   refs=np.asarray([(i, p, d) for (i, p), d in delta.items()],
                                   np.int64).reshape(-1, 3))
        return sorted(adds.items()), sorted(drops.items())

    def plan_remove(self, ids: np.ndarray) -> Decision:
        """Remove held ids from every part holding them (their home, their copies)."""
        jobs = [(p, "remove", (np.asarray(v, np.int64),))
                for p, v in sorted(self.parts_holding(ids.tolist()).items())]
        return Decision({"op": "remove", "ids": ids.astype(np.int64)}, jobs)

    # -- applying ---------------------------------------------------------------------------

    def apply(self, rec: dict) -> Router:
        """The router after a planned write (a record of ``plan_add`` / ``plan_remove``, here or
        on another coordinator); this one is unchanged."""
        if rec["op"] == "remove":
            return self._apply_remove(np.asarray(rec["ids"], np.int64))
        ids, home = np.asarray(rec["ids"], np.int64), np.asarray(rec["home"], np.int64)
        counts = self.counts + np.bincount(home, minlength=self.n_parts)
        changed: dict[int, frozenset] = {}
        for p, i in np.asarray(rec["copy_add"]).reshape(-1, 2).tolist():
            counts[p] += 1
            changed[i] = changed.get(i, self.copies.get(i, frozenset())) | {p}
        for p, i in np.asarray(rec["copy_drop"]).reshape(-1, 2).tolist():
            counts[p] -= 1
            changed[i] = changed.get(i, self.copies.get(i, frozenset())) - {p}
        copies = self.copies.updated({i: s for i, s in changed.items() if s},
                                     [i for i, s in changed.items() if not s])
        topr_ids, topr_scores, refs = self.topr_ids, self.topr_scores, self.refs
        if "topr_rows" in rec:
            rows = np.asarray(rec["topr_rows"], np.int64)
            topr_ids, topr_scores = topr_ids.copy(), topr_scores.copy()
            topr_ids[rows] = rec["topr_ids"]
            topr_scores[rows] = rec["topr_scores"]
            new_refs: dict[int, dict[int, int]] = {}
            for i, p, d in np.asarray(rec["refs"]).reshape(-1, 3).tolist():
                r = new_refs.setdefault(i, dict(refs.get(i, ())))
                r[p] = r.get(p, 0) + d
                if r[p] == 0:
                    del r[p]
            refs = refs.updated({i: tuple(sorted(r.items())) for i, r in new_refs.items() if r},
                                [i for i, r in new_refs.items() if not r])
        return self._replace(home=self.home.updated(zip(ids.tolist(), home.tolist(),
                                                        strict=True)),
                             copies=copies, refs=refs, counts=counts, topr_ids=topr_ids,
                             topr_scores=topr_scores)

    def _apply_remove(self, ids: np.ndarray) -> Router:
        counts = self.counts.copy()
        listed = ids.tolist()
        for p, v in self.parts_holding(listed).items():
            counts[p] -= len(v)
        topr_ids, topr_scores = self.topr_ids, self.topr_scores
        if topr_ids.size:
            gone = np.isin(topr_ids, ids)
            if gone.any():
                topr_ids, topr_scores = topr_ids.copy(), topr_scores.copy()
                topr_ids[gone] = -1
                topr_scores[gone] = -np.inf
        return self._replace(home=self.home.updated(deletes=listed),
                             copies=self.copies.updated(deletes=listed),
                             refs=self.refs.updated(deletes=listed), counts=counts,
                             topr_ids=topr_ids, topr_scores=topr_scores)

    def _replace(self, **changes: Any) -> Router:
        return dataclasses.replace(self, **changes)

    # -- persistence ------------------------------------------------------------------------

    def to_arrays(self) -> tuple[dict, dict[str, np.ndarray]]:
        """(meta, arrays) of the placement and the MIPS lists, as PyramidIndex files hold
        them."""
        arrays = {"centres": self.centres, "part_of_centre": self.part_of_centre,
                  "topr_ids": self.topr_ids.ravel(),  # flat: a (m, 0) array cannot be written
                  "topr_scores": self.topr_scores.ravel()}
        n = len(self.home)
        arrays["home_ids"] = np.fromiter(self.home.keys(), np.int64, n)
        arrays["home_parts"] = np.fromiter(self.home.values(), np.int64, n)
        pairs = [(i, p) for i, ps in self.copies.items() for p in sorted(ps)]
        arrays["copies"] = np.asarray(pairs, np.int64).ravel()  # (id, part) pairs
        return {"topr_shape": list(self.topr_ids.shape)}, arrays

    @classmethod
    def from_arrays(cls, meta_index: HNSWIndex, meta: dict, arrays: dict, *, n_parts: int,
                    spherical: bool, mips: bool, hashed: bool = False,
                    spill: float = 0.0) -> Router:
        """A router from ``to_arrays``' output, trusting nothing (a file may be crafted): shapes
        from the parameters, parts in range, every id homed once, lists and copies naming held
        ids; ValueError otherwise."""
        centres, poc = arrays["centres"], arrays["part_of_centre"]
        c = centres.shape[0] if centres.ndim == 2 else -1
        if poc.shape != (c,) or centres.dtype != np.float32 or poc.dtype.kind not in "iu" \
                or (c and (poc.min() < 0 or poc.max() >= n_parts)):
            raise ValueError("router centres or their parts do not match the parameters")
        if len(meta_index) != c or not np.array_equal(meta_index.ids(), np.arange(c)):
            raise ValueError("the meta-HNSW does not index the centres")
        hid, hp = arrays["home_ids"], arrays["home_parts"]
        ids = np.unique(hid)
        if hid.shape != hp.shape or ids.size != hid.size or \
                (hp.size and (hp.min() < 0 or hp.max() >= n_parts)):
            raise ValueError("router homes do not place every held id once in a part")
        shape = meta.get("topr_shape")
        topr, scores = arrays["topr_ids"], arrays["topr_scores"]
        if not (isinstance(shape, list) and len(shape) == 2 and shape[0] == c) or \
                topr.size != c * shape[1] or scores.size != topr.size:
            raise ValueError("router MIPS lists do not match the parameters")
        listed = topr[topr >= 0]
        if (topr < -1).any() or not np.isin(listed, ids).all():
            raise ValueError("router MIPS lists name ids the index does not hold")
        pairs = arrays["copies"]
        if pairs.size % 2:
            raise ValueError("router copies are not (id, part) pairs")
        pairs = pairs.reshape(-1, 2)
        if pairs.size and (not np.isin(pairs[:, 0], ids).all() or pairs[:, 1].min() < 0
                           or pairs[:, 1].max() >= n_parts):
            raise ValueError("router copies name ids it does not hold or parts it does not have")
        copies: dict[int, frozenset] = {}
        for i, p in pairs.tolist():
            copies[i] = copies.get(i, frozenset()) | {p}
        out = cls(centres.copy(), poc.astype(np.int64), meta_index, n_parts, spherical, mips,
                  topr.reshape(shape).astype(np.int64), scores.reshape(shape).copy(),
                  FrozenMap(dict(zip(hid.tolist(), hp.tolist(), strict=True))),
                  FrozenMap(copies), hashed=hashed, spill=spill)
        if hashed and hid.size and not np.array_equal(hp, hash_parts(hid, n_parts)):
            raise ValueError("router homes are not where the ids hash to")
        return out._replace(refs=out.recount_refs())

    def recount_refs(self) -> FrozenMap:
        """(item, part) list memberships counted from the MIPS lists."""
        refs: dict[int, dict[int, int]] = {}
        r = self.topr_ids.shape[1]
        for p, i in zip(np.repeat(self.part_of_centre, r).tolist(), self.topr_ids.ravel().tolist(),
                        strict=True):
            if i >= 0 and self.home.get(i) != p:
                d = refs.setdefault(i, {})
                d[p] = d.get(p, 0) + 1
        return FrozenMap({i: tuple(sorted(d.items())) for i, d in refs.items()})


def hash_parts(ids: np.ndarray, n_parts: int) -> np.ndarray:
    """The part each id hashes to (splitmix64's finaliser, so runs of ids spread evenly)."""
    z = ids.astype(np.uint64)
    with np.errstate(over="ignore"):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(n_parts)).astype(np.int64)


def nearest_centre(x: np.ndarray, centres: np.ndarray, spherical: bool) -> np.ndarray:
    return nearest_centres(x, centres, spherical, 1)[1][:, 0]


def nearest_centres(x: np.ndarray, centres: np.ndarray, spherical: bool,
                    k: int) -> tuple[np.ndarray, np.ndarray]:
    """(distances, centres) of each row's ``k`` nearest centres, nearest first: 1 - inner
    product for unit centres (``spherical``), squared L2 else."""
    flat = faiss.IndexFlatIP(centres.shape[1]) if spherical else faiss.IndexFlatL2(
        centres.shape[1])
    flat.add(centres)
    d, idx = flat.search(np.ascontiguousarray(x, np.float32), k)
    return (1.0 - d if spherical else d), idx.astype(np.int64)


class Draft:
    """A write planned on a PyramidIndex's router without changing it (a cluster's leader plans,
    has the parts take the jobs, commits, then ``install``s). ``add`` and ``remove`` check
    their input as ``Index.add`` / ``remove`` do and plan on the router the earlier steps
    made; ``decisions`` are in order."""

    def __init__(self, index):
        self.index = index
        self.base = self.router = index.router
        self.next_id = index.next_id
        self.decisions: list[Decision] = []

    def contains(self, ids: np.ndarray) -> np.ndarray:
        home = self.router.home
        return np.fromiter((i in home for i in ids.tolist()), bool, ids.size)

    def add(self, x: Any, ids: Any = None) -> np.ndarray:
        x = as_matrix(x, self.index.dim, self.index.metric)
        ids = new_ids(ids, x.shape[0], self.next_id, self.contains)
        if ids.size:
            self.take(self.router.plan_add(x, ids))
            self.next_id = max(self.next_id, int(ids.max()) + 1)
        return ids

    def remove(self, ids: Any) -> int:
        ids = as_id_array(ids)
        check_held(ids, self.contains)
        if ids.size:
            self.take(self.router.plan_remove(ids))
        return int(ids.size)

    def take(self, decision: Decision) -> None:
        """Add a planned decision (``plan_add`` / ``plan_remove`` on ``router``) to the write."""
        self.decisions.append(decision)
        self.router = self.router.apply(decision.record)

    @property
    def records(self) -> list[dict]:
        return [d.record for d in self.decisions]

    @property
    def jobs(self) -> list:
        return [j for d in self.decisions for j in d.jobs]
