"""hnswlib's state inside simsearch's own file format, and the checks that keep a crafted file
away from hnswlib's C++ (docs/architecture.md, "Persistence").

hnswlib trusts the state it is handed: a link, a level or a size out of range reads or writes
out of bounds. :func:`check_state` recomputes every size from ``dim`` and ``M`` as hnswlib
does and checks every link, level and label before ``__setstate__`` sees them; files written
by hnswlib itself (kept by older simsearch files) are parsed here into the same state, so they
pass the same checks and never reach hnswlib's own loader. Also the reorder an add of a
graph index makes (``relayout``).
"""

from __future__ import annotations

import logging
import math
import struct
from collections.abc import Callable
from typing import Any

import hnswlib
import numpy as np

from ._kernels import bfs_order

log = logging.getLogger(__name__)
SPACES = ("l2", "ip", "cosine")
_MAX_DIM = 1 << 16
_MAX_M = 1 << 12
_MAX_ELEMENTS = 1 << 31
_MAX_LEVEL = 64  # hnswlib draws levels as -log(U) / log(M): beyond this the file is crafted
_NO_NODE = 0xFFFFFFFF
_LEGACY_HEAD = struct.Struct("<QQQQQQiIQQQdQ")


def hnswlib_state(h: hnswlib.Index) -> tuple[dict, dict[str, np.ndarray]]:
    """hnswlib's own state (what it pickles), split into scalars (JSON) and arrays, so it is
    kept inside a simsearch index file with no temporary file."""
    st = h.__getstate__()[0]
    return ({k: v for k, v in st.items() if not isinstance(v, np.ndarray)},
            {k: v for k, v in st.items() if isinstance(v, np.ndarray)})


def hnswlib_from_state(meta: dict, arrays: dict[str, np.ndarray],
                       positional_labels: bool = False) -> hnswlib.Index:
    """The inverse of hnswlib_state (hnswlib copies the arrays), after check_state."""
    check_state(meta, arrays, positional_labels)
    h = hnswlib.Index.__new__(hnswlib.Index)  # as pickle does: __setstate__ makes the index
    h.__setstate__(({**meta, **arrays},))
    return h


def hnswlib_in_walk_order(h: hnswlib.Index) -> hnswlib.Index:
    """A copy of ``h`` with its nodes renumbered in breadth-first order of the bottom layer
    from the entry point (docs/benchmarks.md, "HNSW in walk order")."""
    meta, arrays = hnswlib_state(h)
    n, spe, m0 = meta["cur_element_count"], meta["size_data_per_element"], meta["max_M0"]
    rows = arrays["data_level0"].view(np.uint8).reshape(n, spe)
    degree = np.ascontiguousarray(rows[:, :2]).view(np.uint16)[:, 0].astype(np.int32)
    links = np.ascontiguousarray(rows[:, 4 : 4 + 4 * m0]).view(np.int32)
    return _permuted(meta, arrays, bfs_order(links, degree, int(meta["enterpoint_node"])))


def hnswlib_permuted(h: hnswlib.Index, order: np.ndarray) -> hnswlib.Index:
    """A copy of ``h`` whose element at internal id ``order[i]`` is at internal id i: rows,
    link lists, levels, the entry point and the label lookup moved and every link renumbered.
    Labels, and so every answer, stay; only the memory layout changes."""
    return _permuted(*hnswlib_state(h), order)


def _permuted(meta: dict, arrays: dict[str, np.ndarray], order: np.ndarray) -> hnswlib.Index:
    n, spe = meta["cur_element_count"], meta["size_data_per_element"]
    o0, m0, m, spl = (meta["offset_level0"], meta["max_M0"], meta["max_M"],
                      meta["size_links_per_element"])
    order = np.asarray(order, np.int64)
    if order.shape != (n,) or not np.array_equal(np.sort(order), np.arange(n)):
        raise ValueError(f"order must be a permutation of the {n} elements")
    new_id = np.empty(n, np.uint32)
    new_id[order] = np.arange(n, dtype=np.uint32)

    def renumber(rows: np.ndarray, off: int, width: int) -> None:
        count = np.ascontiguousarray(rows[:, off : off + 2]).view(np.uint16)[:, 0]
        ids = np.ascontiguousarray(rows[:, off + 4 : off + 4 + 4 * width]).view(np.uint32)
        used = np.arange(width)[None, :] < count[:, None].astype(np.int64)
        ids = np.where(used, new_id[np.where(used, ids, 0)], ids)
        rows[:, off + 4 : off + 4 + 4 * width] = ids.view(np.uint8)

    data = arrays["data_level0"].view(np.uint8).reshape(n, spe)[order]
    renumber(data, o0, m0)
    levels = arrays["element_levels"]
    old_levels = levels[:n].astype(np.int64)
    new_levels = levels.copy()
    new_levels[:n] = levels[:n][order]
    ll = arrays["link_lists"].view(np.uint8).reshape(-1, spl)
    start = np.concatenate([[0], np.cumsum(old_levels)[:-1]]).astype(np.int64)
    counts = old_levels[order]
    first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    rows = np.repeat(start[order], counts) + np.arange(int(counts.sum())) - np.repeat(first,
                                                                                       counts)
    ll = ll[rows]
    if len(ll):
        renumber(ll, 0, m)
    ep = meta["enterpoint_node"]
    meta = {**meta, "enterpoint_node": int(new_id[ep]) if n else ep}
    arrays = {**arrays, "data_level0": data.reshape(-1).view(np.int8),
              "link_lists": ll.reshape(-1).view(np.int8), "element_levels": new_levels,
              "label_lookup_internal": new_id[arrays["label_lookup_internal"].astype(np.int64)]}
    return hnswlib_from_state(meta, arrays)


def _int(meta: dict, key: str, lo: int, hi: int) -> int:
    v = meta.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise ValueError(f"hnswlib state: {key} = {v!r:.40} is outside [{lo}, {hi}]")
    return v


def _array(arrays: dict, key: str, dtype: str, size: int) -> np.ndarray:
    a = arrays.get(key)
    if not isinstance(a, np.ndarray) or a.dtype != np.dtype(dtype) or a.ndim != 1 \
            or a.size != size:
        got = (a.dtype, a.shape) if isinstance(a, np.ndarray) else type(a).__name__
        raise ValueError(f"hnswlib state: {key} must be {dtype} of {size} elements; got {got}")
    return a


def check_state(meta: dict, arrays: dict[str, np.ndarray],
                positional_labels: bool = False) -> None:
    """ValueError unless hnswlib can take this state safely: sizes as hnswlib computes them,
    every level, link, label and the entry point in range. ``positional_labels``: the labels
    must be 0..n-1 (simsearch's graph kernels read them as positions)."""
    if meta.get("ser_version") != 1 or meta.get("space") not in SPACES:
        raise ValueError("hnswlib state: unknown version or space")
    for flag in ("index_inited", "ep_added", "normalize", "has_deletions",
                 "allow_replace_deleted"):
        if not isinstance(meta.get(flag), bool):
            raise ValueError(f"hnswlib state: {flag} must be true or false")
    if not meta["index_inited"] or meta["normalize"] != (meta["space"] == "cosine"):
        raise ValueError("hnswlib state: not initialised, or normalisation does not match space")
    dim = _int(meta, "dim", 1, _MAX_DIM)
    m = _int(meta, "M", 2, _MAX_M)
    _int(meta, "max_M", m, m)
    m0 = _int(meta, "max_M0", 2 * m, 2 * m)
    mult = meta.get("mult")
    if not isinstance(mult, float) or not math.isclose(mult, 1 / math.log(m), rel_tol=1e-9):
        raise ValueError("hnswlib state: mult must be 1 / log(M)")
    _int(meta, "ef_construction", 1, 1 << 20)
    _int(meta, "ef", 1, 1 << 20)
    _int(meta, "num_threads", 1, 1 << 12)
    _int(meta, "seed", -(1 << 63), (1 << 64) - 1)
    links0 = 4 + 4 * m0
    _int(meta, "offset_level0", 0, 0)
    _int(meta, "offset_data", links0, links0)
    _int(meta, "label_offset", links0 + 4 * dim, links0 + 4 * dim)
    spe = _int(meta, "size_data_per_element", links0 + 4 * dim + 8, links0 + 4 * dim + 8)
    spl = _int(meta, "size_links_per_element", 4 + 4 * m, 4 + 4 * m)
    cap = _int(meta, "max_elements", 0, _MAX_ELEMENTS)
    n = _int(meta, "cur_element_count", 0, cap)
    top = _int(meta, "max_level", -1 if n == 0 else 0, _MAX_LEVEL)
    all_levels = _array(arrays, "element_levels", "int32", cap)
    levels = all_levels[:n].astype(np.int64)
    if (n and (levels.min() < 0 or levels.max() != top)) or all_levels[n:].any():
        raise ValueError("hnswlib state: element levels outside [0, max_level], or set for "
                         "slots past the element count")
    data = _array(arrays, "data_level0", "int8", n * spe).view(np.uint8).reshape(n, spe)
    ll = _array(arrays, "link_lists", "int8", int(levels.sum()) * spl).view(np.uint8)
    ext = arrays.get("label_lookup_external")
    k = ext.size if isinstance(ext, np.ndarray) else -1
    if not 0 <= k <= n:
        raise ValueError("hnswlib state: label lookup larger than the element count")
    ext = _array(arrays, "label_lookup_external", "uint64", k)
    internal = _array(arrays, "label_lookup_internal", "uint32", k)
    if k and (int(internal.max()) >= n or np.unique(internal).size != k
              or np.unique(ext).size != k):
        raise ValueError("hnswlib state: label lookup out of range or not one-to-one")
    labels = np.ascontiguousarray(data[:, links0 + 4 * dim:]).view(np.uint64)[:, 0]
    if k and not np.array_equal(labels[internal], ext):
        raise ValueError("hnswlib state: label lookup disagrees with the stored labels")
    if positional_labels and n and not np.array_equal(np.sort(labels), np.arange(n)):
        raise ValueError("hnswlib state: labels must be the positions 0..n-1")
    _check_links(np.ascontiguousarray(data[:, :links0]), m0, n, levels, np.zeros(n, np.int64))
    if ll.size:  # node i's rows are its levels 1..levels[i]: a link there must reach that level
        row_level = np.concatenate([np.arange(1, v + 1) for v in levels[levels > 0].tolist()])
        _check_links(ll.reshape(-1, spl), m, n, levels, row_level)
    ep = _int(meta, "enterpoint_node", 0, _NO_NODE)
    if n and (ep >= n or levels[ep] != top or not meta["ep_added"]):
        raise ValueError("hnswlib state: the entry point is not a node of the top level")


def _check_links(rows: np.ndarray, width: int, n: int, levels: np.ndarray,
                 row_level: np.ndarray) -> None:
    """Link-list rows (u16 count, flag byte, spare byte, u32 ids) of the levels ``row_level``:
    counts in range, and every link to one of the n elements that reaches that level."""
    count = np.ascontiguousarray(rows[:, :2]).view(np.uint16)[:, 0].astype(np.int64)
    if count.size and count.max() > width:
        raise ValueError(f"hnswlib state: a link list holds more than {width} links")
    ids = np.ascontiguousarray(rows[:, 4 : 4 + 4 * width]).view(np.uint32)
    used = np.arange(width)[None, :] < count[:, None]
    if not used.any():
        return
    target = ids[used].astype(np.int64)
    if target.max() >= n:
        raise ValueError(f"hnswlib state: a link points past the {n} elements")
    if (levels[target] < np.broadcast_to(row_level[:, None], used.shape)[used]).any():
        raise ValueError("hnswlib state: a link points to a node below the link's level")


def hnswlib_from_saved(blob: np.ndarray, space: str, dim: int, capacity: int,
                       allow_replace_deleted: bool = False,
                       positional_labels: bool = False) -> hnswlib.Index:
    """An index from hnswlib's own saved bytes (only files written before simsearch kept
    hnswlib's state as arrays hold these), parsed into hnswlib's state and checked like any."""
    raw = np.ascontiguousarray(blob, np.uint8).tobytes()
    try:
        (o0, cap, n, spe, lo, od, top, ep, mm, mm0, m, mult, efc) = \
            _LEGACY_HEAD.unpack_from(raw, 0)
    except struct.error:
        raise ValueError("hnswlib file: too short for its header") from None
    if not (0 <= n <= min(cap, _MAX_ELEMENTS) and 0 < spe <= 1 << 20 and 2 <= m <= _MAX_M):
        raise ValueError("hnswlib file: header out of range")
    cap = max(cap, capacity, n)
    pos = _LEGACY_HEAD.size + n * spe
    data = raw[_LEGACY_HEAD.size : pos]
    spl = 4 + 4 * mm
    levels, lists = np.zeros(min(cap, _MAX_ELEMENTS), np.int32), []
    for i in range(n):
        if pos + 4 > len(raw):
            raise ValueError("hnswlib file: truncated link lists")
        size = struct.unpack_from("<I", raw, pos)[0]
        if size % spl or size // spl > _MAX_LEVEL or pos + 4 + size > len(raw):
            raise ValueError("hnswlib file: a link list of a bad size")
        levels[i] = size // spl
        lists.append(raw[pos + 4 : pos + 4 + size])
        pos += 4 + size
    if len(data) != n * spe or pos != len(raw):
        raise ValueError("hnswlib file: sizes do not add up")
    d = np.frombuffer(data, np.uint8).reshape(n, spe)
    labels = np.ascontiguousarray(d[:, lo : lo + 8]).view(np.uint64)[:, 0] if n else \
        np.zeros(0, np.uint64)
    deleted = (d[:, o0 + 2] & 1).astype(bool) if n else np.zeros(0, bool)
    meta: dict[str, Any] = {
        "ser_version": 1, "space": space, "dim": dim, "index_inited": True, "ep_added": n > 0,
        "normalize": space == "cosine", "num_threads": 1, "seed": 100, "offset_level0": o0,
        "max_elements": int(cap), "cur_element_count": n, "size_data_per_element": spe,
        "label_offset": lo, "offset_data": od, "max_level": top, "enterpoint_node": ep,
        "max_M": mm, "max_M0": mm0, "M": m, "mult": mult, "ef_construction": efc, "ef": 10,
        "has_deletions": bool(deleted.any()), "size_links_per_element": spl,
        "allow_replace_deleted": allow_replace_deleted,
    }
    arrays = {
        "label_lookup_external": labels.astype(np.uint64),
        "label_lookup_internal": np.arange(n, dtype=np.uint32),
        "element_levels": levels,
        "data_level0": np.frombuffer(data, np.int8).copy(),
        "link_lists": np.frombuffer(b"".join(lists), np.int8).copy(),
    }
    return hnswlib_from_state(meta, arrays, positional_labels)


def hnswlib_graph(h: hnswlib.Index) -> dict[str, Any]:
    """The graph of an hnswlib index, in label space (hnswlib labels must be 0..n-1).

    Returns ``links0`` int32 (n, maxM0) with ``degree0`` int32 (n,); ``upper_links`` int32
    (rows, maxM) with ``upper_degree``; ``upper_start`` int64 (n,): node u's level-l links
    (l >= 1) are row ``upper_start[u] + l - 1``; ``entry`` and ``max_level``.
    """
    st = h.__getstate__()[0]
    n = int(st["cur_element_count"])
    spe = int(st["size_data_per_element"])
    raw = st["data_level0"].view(np.uint8)[: n * spe].reshape(n, spe)
    m0, m = int(st["max_M0"]), int(st["max_M"])
    o0, lo = int(st["offset_level0"]), int(st["label_offset"])
    # a link list is a uint16 count (then a deleted flag byte, a spare byte) and uint32 ids
    deg0 = np.ascontiguousarray(raw[:, o0 : o0 + 2]).view(np.uint16)[:, 0].astype(np.int32)
    links0 = np.ascontiguousarray(raw[:, o0 + 4 : o0 + 4 + 4 * m0]).view(np.uint32)
    label = np.ascontiguousarray(raw[:, lo : lo + 8]).view(np.uint64)[:, 0].astype(np.int64)
    if n and (label.min() < 0 or label.max() >= n or np.unique(label).size != n):
        raise RuntimeError("hnswlib labels must be the positions 0..n-1")
    internal = np.empty(n, np.int64)
    internal[label] = np.arange(n)  # position -> hnswlib internal id

    def to_pos(ids: np.ndarray, deg: np.ndarray) -> np.ndarray:
        valid = np.arange(ids.shape[1])[None, :] < deg[:, None]
        return np.where(valid, label[np.where(valid, ids, 0)], -1).astype(np.int32)

    out_links0 = to_pos(links0[internal], deg0[internal])
    levels = np.asarray(st["element_levels"][:n], np.int64)
    size_links = int(st["size_links_per_element"])
    ll = st["link_lists"].view(np.uint8)
    rows = ll.size // size_links
    ll = ll[: rows * size_links].reshape(rows, size_links)
    udeg = np.ascontiguousarray(ll[:, :2]).view(np.uint16)[:, 0].astype(np.int32)
    ulinks = np.ascontiguousarray(ll[:, 4 : 4 + 4 * m]).view(np.uint32)
    start_internal = np.concatenate([[0], np.cumsum(levels)[:-1]]) if n else np.zeros(0, np.int64)
    upper_start = np.where(levels[internal] > 0, start_internal[internal], -1).astype(np.int64)
    return {
        "links0": np.ascontiguousarray(out_links0),
        "degree0": np.ascontiguousarray(deg0[internal]),
        "upper_links": np.ascontiguousarray(to_pos(ulinks, udeg)) if rows else
        np.full((1, max(m, 1)), -1, np.int32),
        "upper_degree": udeg if rows else np.zeros(1, np.int32),
        "upper_start": upper_start,
        "entry": int(label[int(st["enterpoint_node"])]) if n else 0,
        "max_level": max(int(st["max_level"]), 0) if n else 0,
    }


def relayout(reorder: Callable[[], None], n: int) -> None:
    """An add's automatic reorder, best effort: the items are in by then and must stay
    recorded, and a reorder that fails (out of memory) leaves the old layout whole, so the
    failure is logged and the add goes on."""
    try:
        reorder()
    except (MemoryError, RuntimeError) as e:
        log.warning("kept insertion order for %d items: the reorder failed (%s)", n, e)
