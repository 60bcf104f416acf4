"""The attribute table against a plain dict of rows under random adds, removes, re-adds,
snapshots and filters (docs/filters.md). The table keeps rows in the order they came, with a
sorted id index, an unsorted tail of recent rows and compactions of removed ones; the tail and
compaction thresholds are made tiny here so that every path runs often."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simsearch.service import attributes as attrmod
from simsearch.service.attributes import AttributeTable

WORDS = ["a", "b", "c", "dd", "é"]


def _value(rng, name):
    if rng.random() < 0.2:
        return None
    if name == "n":
        return int(rng.integers(-5, 5))
    if name == "f":
        return float(rng.integers(0, 4)) / 2
    if name == "k":
        return WORDS[int(rng.integers(len(WORDS)))]
    if name == "b":
        return bool(rng.integers(2))
    return [WORDS[int(i)] for i in rng.integers(0, len(WORDS), int(rng.integers(0, 3)))]


def _matches(row: dict, where: dict) -> bool:
    (name, cond), = where.items()
    v = row.get(name)
    op, x = next(iter(cond.items()))
    if op == "exists":
        return (v is not None) == x
    if v is None:
        return False
    if name == "l":
        return (x in v) if op == "eq" else (x not in v)
    return {"eq": v == x, "ne": v != x, "lt": v is not None and v < x}[op]


WHERES = [{"n": {"lt": 1}}, {"n": {"eq": -2}}, {"f": {"ne": 0.5}}, {"k": {"eq": "dd"}},
          {"k": {"ne": "a"}}, {"b": {"eq": True}}, {"l": {"eq": "c"}}, {"l": {"exists": False}},
          {"k": {"exists": True}}]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_random_writes_answer_like_a_dict(seed):
    rng = np.random.default_rng(seed)
    mp = pytest.MonkeyPatch()
    mp.setattr(attrmod, "_TAIL_ROWS", int(rng.integers(1, 6)))
    try:
        t, oracle = AttributeTable(), {}
        for step in range(int(rng.integers(5, 40))):
            r = rng.random()
            if r < 0.55 or not oracle:
                pool = np.arange(60)
                free = np.setdiff1d(pool, list(oracle))
                if not free.size:
                    continue
                ids = rng.choice(free, min(free.size, int(rng.integers(1, 6))), replace=False)
                names = [n for n in ("n", "f", "k", "b", "l") if rng.random() < 0.7]
                batch = {n: [_value(rng, n) for _ in ids] for n in names}
                if not names or all(all(v is None for v in vs) for vs in batch.values()):
                    batch = {}
                try:
                    checked = t.check(batch, ids.size)
                except Exception:  # noqa: BLE001 - a type clash with the column: skipped
                    continue
                t.add(ids, checked)
                for j, i in enumerate(ids.tolist()):
                    oracle[i] = {n: batch[n][j] for n in batch if batch[n][j] is not None}
            elif r < 0.85:
                gone = rng.choice(list(oracle), int(rng.integers(1, 4)))
                t.remove(gone)
                for i in gone.tolist():
                    oracle.pop(i, None)
            else:  # a snapshot and a restart
                with tempfile.TemporaryDirectory() as d:
                    t.save(Path(d) / "a.bin")
                    t = AttributeTable.load(Path(d) / "a.bin")
            held = np.array(sorted(oracle), np.int64)
            assert t.ids.tolist() == held.tolist() and len(t) == held.size
            got = t.rows_of(held)
            for name, vals in got.items():
                assert vals == [oracle[i].get(name) for i in held.tolist()], (step, name)
            for w in WHERES:
                name = next(iter(w))
                if name not in t.schema:
                    continue
                want = [i for i in held.tolist() if _matches(oracle[i], w)]
                assert t.where(w).tolist() == want, (step, w)
    finally:
        mp.undo()
