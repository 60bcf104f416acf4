"""The planner of filtered searches (docs/filters.md, "The planner"), a mixin of the Index kinds
that answer allow and deny lists with it: per query (once for a filter the batch shares) it
counts the allowed items, then answers by the exact scan of them or by the kind's own search
widened by 1/selectivity and filtered after.

A kind mixes ``FilterPlanner`` in before ``Index`` and gives its hooks: ``_stored`` (ids and
stored vectors by position) or ``_vectors_of``; where it can, ``_exact_under`` (is ``_search``
exact with these parameters?), ``_traversal_reads`` and ``_widen`` (``BeamFilterHooks`` for a
graph searched by a beam), ``_filtered_traversal`` and ``filter_read_cost``. It reads the
host Index's id set (``_idset``), its write ``_version`` and its ``_search``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from ._exact import exact_topk
from ._validate import normalize_rows
from .filters import IdFilter, compact, in_sorted
from .ids import IdSet
from .results import SearchResult, empty_result, pad_score


def allowed_ids(held: IdSet, allow: np.ndarray | None, deny: np.ndarray | None):
    """(the allowed ids of ``held``, sorted, or None when only a deny list applies; their
    count)."""
    if allow is not None:
        a = allow[held.contains(allow)]
        if deny is not None and deny.size:
            a = a[~in_sorted(deny, a)]
        return a, int(a.size)
    if deny.size * 4 < len(held):  # a short deny list: at least this many are allowed
        return None, len(held) - int(deny.size)
    return None, len(held) - (int(held.contains(deny).sum()) if deny.size else 0)


class FilterPlanner:
    """Filtered search by plan (module docstring); ``Index._search_filtered`` for its kind."""

    #: how much dearer one vector read of the index's own search is than one of the exact scan
    #: of gathered rows (random access and graph bookkeeping against one matrix product)
    filter_read_cost: ClassVar[float] = 1.0
    _lookup: tuple | None = None  # (version, position ids sorted, their order)

    def _exact_under(self, params: dict) -> bool:
        return False

    def _stored(self) -> tuple[np.ndarray, np.ndarray]:
        """(external id of each position, -1 where the slot is dead; the stored vectors)."""
        raise NotImplementedError

    def _positions_of(self, ids: np.ndarray) -> np.ndarray:
        """The positions of ids (all present) in :meth:`_stored`'s arrays."""
        cache = self._lookup
        if cache is None or cache[0] != self._version:  # two readers may both build it: benign
            pos_ids = self._stored()[0]
            order = np.argsort(pos_ids, kind="stable")
            cache = self._lookup = (self._version, pos_ids[order], order)
        return cache[2][np.searchsorted(cache[1], ids)]

    def _vectors_of(self, ids: np.ndarray) -> np.ndarray:
        """The stored vectors (unit rows under cosine) of ids, all present, float32."""
        return self._stored()[1][self._positions_of(ids)]

    def _traversal_reads(self, k: int, params: dict) -> float:
        """About how many vectors (or their equivalent in codes) one unfiltered query reads."""
        return float(len(self))

    def _widen(self, k: int, w: float, params: dict) -> tuple[int, dict]:
        """(k', params') that return about as many allowed items at selectivity 1/w as
        (k, params) returns items without a filter."""
        return min(len(self), int(np.ceil(2 * k * w))), params

    def _filtered_traversal(self, q: np.ndarray, k: int, filt: IdFilter, params: dict,
                            w: float) -> tuple[np.ndarray, np.ndarray] | None:
        """(ids, scores) padded, from a search that applies ``filt`` inside the index's own
        traversal at selectivity about 1/w; None (the default) to be searched widened and
        filtered after."""
        return None

    def _exact_allowed(self, q: np.ndarray, k: int, ids: np.ndarray) -> tuple:
        """Exact top-k over the items ids (sorted, present): the scan of the allowed rows."""
        x = self._vectors_of(ids)
        if self.metric == "cosine":
            q = normalize_rows(q)
        return exact_topk(q, x, ids, min(k, ids.size), self.metric)

    def _allowed_ids(self, allow: np.ndarray | None, deny: np.ndarray | None):
        return allowed_ids(self._idset, allow, deny)

    def _search_filtered(self, q: np.ndarray, k: int, filt: IdFilter,
                         **params: Any) -> SearchResult:
        """The planner: per query (once for a shared filter) count the allowed items, then
        answer by the exact scan of them or by the index's own search widened by 1/selectivity
        and filtered (docs/filters.md, "The planner")."""
        nq, n = q.shape[0], len(self)
        out = empty_result(nq, k, self.metric)
        counts = np.zeros(nq, np.int64)  # allowed items per query
        exact_kind = self._exact_under(params)
        reads = 0.0 if exact_kind else self._traversal_reads(k, params)
        # the scan of rows shared by the batch is one matrix product; per query, a gather each
        cost = self.filter_read_cost if filt.shared and nq > 1 else self.filter_read_cost / 4
        scans: list[tuple[np.ndarray, np.ndarray | None]] = []  # (rows, allowed ids or None)
        wide: dict[float, list] = {}  # widening factor -> [rows]
        deny_only: list[np.ndarray] = []  # an exact kind's rows with only a deny list
        everyone = np.arange(nq)
        for i in [0] if filt.shared else range(nq):
            rows = everyone if filt.shared else everyone[i : i + 1]
            allowed, count = self._allowed_ids(filt.allow_of(i), filt.deny_of(i))
            counts[rows] = count
            if count == 0:
                continue  # nothing allowed: padding
            if exact_kind and allowed is None:
                deny_only.append(rows)
            elif exact_kind or count <= k or count * count <= cost * reads * n:
                scans.append((rows, allowed))
            else:  # widening factors rounded up to 2^(1/16): a batch per factor
                w = float(2.0 ** (np.ceil(np.log2(n / count) * 16) / 16))
                wide.setdefault(w, []).append(rows)
        if deny_only:
            rows = np.concatenate(deny_only)
            out.ids[rows], out.scores[rows] = self._exact_denied(q[rows], k, filt.take(rows))
        retry: dict[float, list] = {}
        for w, groups in wide.items():
            self._run_widened(q, k, np.concatenate(groups), w, filt, params, out, scans, retry)
        # answers that sat deeper in the index's ranking than the widening allowed for (a
        # filter correlated with the query: a deny list of its own neighbours, an allow list
        # away from it) are searched once more, as deep as they were found
        for w, groups in retry.items():
            rows = np.concatenate(groups)
            scan = cost * reads * w >= counts[rows]  # cheaper: the exact scan
            scans.extend((rows[j : j + 1], None) for j in np.flatnonzero(scan).tolist())
            if not scan.all():
                self._run_widened(q, k, rows[~scan], w, filt, params, out, scans, None)
        if filt.shared and len(scans) > 1:  # one gather and one product for all of them
            known = [a for _, a in scans if a is not None]
            scans = [(np.concatenate([r for r, _ in scans]), known[0] if known else None)]
        for rows, allowed in scans:
            if allowed is None:  # a deny list only (or a short answer): every allowed id
                i = int(rows[0])
                allowed = self._allowed_ids(filt.allow_of(i), filt.deny_of(i))[0]
                if allowed is None:
                    allowed = self._idset.sorted
                    d = filt.deny_of(i)
                    if d is not None and d.size:
                        allowed = allowed[~in_sorted(d, allowed)]
                if not allowed.size:
                    continue
            ids, scores = self._exact_allowed(q[rows], k, allowed)
            out.ids[rows], out.scores[rows] = -1, pad_score(self.metric)  # a short try's too
            out.ids[rows, : ids.shape[1]], out.scores[rows, : ids.shape[1]] = ids, scores
        return out

    def _exact_denied(self, q: np.ndarray, k: int, filt: IdFilter) -> tuple:
        """An exact kind's answer to deny lists (no allow list): the exact top k + |deny|
        hold the k best allowed items."""
        extra = max(int(self._idset.contains(filt.deny_of(i)).sum()) for i in range(len(q)))
        r = self._search(q, min(len(self), k + extra))
        ok = filt.allowed(r.ids) if filt.shared else np.stack(
            [filt.allowed(r.ids[i], i) for i in range(len(q))])
        return compact(r.ids, r.scores, ok, k, pad_score(self.metric))[:2]

    def _run_widened(self, q, k, rows, w, filt, params, out, scans, retry) -> None:
        """Search rows widened by w, keep the allowed answers in ``out``; queue for one more,
        deeper search (``retry``, a dict) the answers found deeper than 1.25 k w, and for the
        exact scan what comes back without an allowed answer (or short from the second)."""
        own = self._filtered_traversal(q[rows], k, filt.take(rows), params, w)
        if own is not None:  # the index filtered inside its own search
            out.ids[rows], out.scores[rows] = own
            kept = (own[0] >= 0).sum(1)
            scans.extend((rows[j : j + 1], None) for j in np.flatnonzero(kept < k).tolist())
            return
        kk, p = self._widen(k, w, params)
        r = self._search(q[rows], max(kk, k), **p)
        if filt.shared:
            ok = filt.allowed(r.ids)
        else:
            ok = np.stack([filt.allowed(r.ids[j], int(i)) for j, i in enumerate(rows)])
        ids, scores, kept = compact(r.ids, r.scores, ok, k, pad_score(self.metric))
        out.ids[rows], out.scores[rows] = ids, scores
        short = kept < k
        if retry is None:  # the second search: what is still short takes the exact scan
            scans.extend((rows[j : j + 1], None) for j in np.flatnonzero(short).tolist())
            return
        # the depth the k-th allowed answer sat at; for a short answer, the depth the allowed
        # density seen so far puts it at (no allowed answer at all: the exact scan)
        seen = np.maximum((r.ids >= 0).sum(1), 1)
        depth = np.where(short, k * seen / np.maximum(ok.sum(1), 1e-9),
                         np.argmax(np.cumsum(ok, axis=1) >= k, axis=1) + 1)
        for j in np.flatnonzero(short & (ok.sum(1) == 0)).tolist():
            scans.append((rows[j : j + 1], None))
        for j in np.flatnonzero((depth > 1.25 * k * w) & ~(short & (ok.sum(1) == 0))).tolist():
            w2 = float(2.0 ** (np.ceil(np.log2(1.25 * depth[j] / k) * 4) / 4))
            retry.setdefault(w2, []).append(rows[j : j + 1])


class BeamFilterHooks:
    """The planner's hooks (``_traversal_reads``, ``_widen``) for a kind searched
    by a beam ``ef`` (default max(k, 64)) over a graph of ``M`` links per node: a query reads
    about ef * M vectors, and widening multiplies the beam."""

    def _traversal_reads(self, k: int, params: dict) -> float:
        ef = params.get("ef") or max(k, 64)
        return float(max(ef, k) * self._params["M"])

    def _widen(self, k: int, w: float, params: dict) -> tuple[int, dict]:
        ef = params.get("ef") or max(k, 64)
        ef = min(len(self), int(np.ceil(max(ef, k) * w)))
        return ef, {**params, "ef": ef}
