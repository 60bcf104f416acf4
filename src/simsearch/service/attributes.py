"""Typed item attributes of a collection and the ``where`` filter language over them
(docs/filters.md, "Attributes and where").

Columns are numpy arrays aligned with the sorted ids of every item the collection holds: int64,
float64 and bool with a "present" mask, keywords as int32 codes into a per-column dictionary,
lists of keywords as flat (id, code) pairs. A filter becomes a boolean mask over the rows in a
few vectorized passes, then the allowed ids the index's planner takes.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from .._grow import Grow
from ..errors import InvalidAttributeError, InvalidFilterError, InvalidParameterError
from ..fileformat import read_index_file, write_index_file
from .errors import DeadlineExceededError, ResourceExhaustedError
from .limits import DEFAULT_LIMITS, Limits, check_name

TYPES = ("int", "float", "bool", "keyword", "keywords")
_NUMERIC_OPS = ("eq", "ne", "in", "nin", "lt", "lte", "gt", "gte", "exists")
_EQUALITY_OPS = ("eq", "ne", "in", "nin", "exists")
OPS = {"int": _NUMERIC_OPS, "float": _NUMERIC_OPS, "bool": _EQUALITY_OPS,
       "keyword": _EQUALITY_OPS, "keywords": _EQUALITY_OPS}
FORMAT = "simsearch-attributes"


def check_schema(schema: Any) -> dict[str, str]:
    """A declared schema: {attribute name: one of TYPES}."""
    if schema is None:
        return {}
    if not isinstance(schema, dict):
        raise InvalidAttributeError(f"schema must map attribute names to types {list(TYPES)}; "
                                    f"got {type(schema).__name__}")
    for name, t in schema.items():
        _check_name(name)
        if t not in TYPES:
            raise InvalidAttributeError(
                f"attribute {name!r}: type must be one of {list(TYPES)}; got {t!r}")
    return dict(schema)


def _check_name(name: Any) -> None:
    try:
        check_name(name, "an attribute name")
    except InvalidParameterError as exc:
        raise InvalidAttributeError(str(exc)) from None


def check_where(expr: Any, limits: Limits = DEFAULT_LIMITS) -> None:
    """Refuse a ``where`` filter nested deeper than ``limits.max_where_depth`` or holding more
    than ``limits.max_where_clauses`` conditions and operators, before anything evaluates it
    (iteratively: a hostile depth costs no recursion). Every member of an ``$and`` / ``$or``
    list and every ``$not`` counts as a clause, whatever it holds, and an empty object inside
    them is refused: ``{"$and": [{}] * 200_000}`` must not pass as zero clauses."""
    clauses, stack = 0, [(expr, 1)]
    while stack:
        e, depth = stack.pop()
        if depth > limits.max_where_depth:
            raise InvalidFilterError(
                f"where is nested deeper than {limits.max_where_depth} levels of $and / $or / "
                "$not (the server's --max-where-depth)")
        if not isinstance(e, dict):
            continue
        if not e and depth > 1:
            raise InvalidFilterError(
                "where: an empty object inside $and / $or / $not matches nothing in particular; "
                "give each member at least one condition")
        clauses += len(e)
        for key, val in e.items():
            if key in ("$and", "$or") and isinstance(val, list):
                clauses += len(val)
                stack.extend((x, depth + 1) for x in val)
            elif key == "$not":
                clauses += 1
                stack.append((val, depth + 1))
            elif isinstance(val, dict):
                clauses += len(val)
        if clauses > limits.max_where_clauses:
            raise InvalidFilterError(
                f"where holds more than {limits.max_where_clauses} conditions and operators "
                "(the server's --max-where-clauses); match on fewer, or use $in lists")


def _value_type(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, (bool, np.bool_)):
        return "bool"
    if isinstance(v, (int, np.integer)):
        return "int"
    if isinstance(v, (float, np.floating)):
        return "float"
    if isinstance(v, str):
        return "keyword"
    if isinstance(v, (list, tuple)):
        return "keywords"
    return "?"


def infer_type(name: str, values: list) -> str | None:
    """The type of a new column from its values: None when every value is missing."""
    types = {_value_type(v) for v in values} - {None}
    if not types:
        return None
    if types == {"int", "float"}:
        return "float"
    if len(types) > 1 or "?" in types:
        raise InvalidAttributeError(
            f"attribute {name!r} mixes value types {sorted(types)}; a column holds one of "
            f"{list(TYPES)} (None for a missing value)")
    return types.pop()


def _column_values(name: str, t: str, values: list) -> list:
    """Values checked against type t (None: missing), in their canonical Python form."""
    out = []
    for v in values:
        vt = _value_type(v)
        ok = vt is None or vt == t or (t == "float" and vt == "int")
        if ok and t == "keywords" and v is not None:
            ok = all(isinstance(s, str) for s in v)
        if not ok:
            raise InvalidAttributeError(
                f"attribute {name!r} holds {t} values; got {v!r} ({type(v).__name__})")
        if v is None:
            out.append(None)
        elif t == "float":
            if not math.isfinite(float(v)):
                raise InvalidAttributeError(f"attribute {name!r} must be finite; got {v!r}")
            out.append(float(v))
        elif t == "int":
            if not -(2**63) <= int(v) < 2**63:
                raise InvalidAttributeError(f"attribute {name!r} must fit int64; got {v!r}")
            out.append(int(v))
        elif t == "bool":
            out.append(bool(v))
        elif t == "keywords":
            out.append(list(v))
        else:
            out.append(v)
    return out


#: new rows wait in an unsorted tail of the id index until it holds this many (or sqrt(n))
_TAIL_ROWS = 1024


class AttributeTable:
    """The attributes of every item a collection holds, one typed column per name.

    Rows are kept in the order items were added (removed ones marked dead until a compaction),
    so a write costs O(batch) per column, amortized, not a re-sort of every column: a one-item
    add at 100,000 items x 64 columns took 11 ms when columns were kept sorted by id
    (docs/bench/service.md, "Attribute writes"). Ids find their rows through a sorted index
    with a small unsorted tail of recent rows, merged once it grows."""

    def __init__(self, schema: dict[str, str] | None = None):
        self.max_columns = Limits.max_attribute_columns  # a node sets its own limit
        self.schema: dict[str, str] = dict(schema or {})
        self._rid = Grow(np.int64)  # row -> id
        self._alive = Grow(np.bool_)
        self._n = 0  # rows, dead ones included
        self._dead = 0
        # id -> row: sorted (ids, rows) of the rows before the tail, and the tail's rows
        self._skeys = np.empty(0, np.int64)
        self._srows = np.empty(0, np.int64)
        self._tail = 0  # rows [_tail, _n) are not in the sorted index yet
        self.cols: dict[str, dict[str, Grow]] = {}
        self.words: dict[str, list[str]] = {}  # keyword dictionaries
        self._code: dict[str, dict[str, int]] = {}
        for name, t in self.schema.items():
            self._new_column(name, t)

    def __len__(self) -> int:
        return self._n - self._dead

    @property
    def ids(self) -> np.ndarray:
        """Every id held, sorted."""
        return np.sort(self._rid.view()[self._alive.view()])

    def _new_column(self, name: str, t: str) -> None:
        n = self._n
        if t in ("int", "float", "bool"):
            dt = {"int": np.int64, "float": np.float64, "bool": np.bool_}[t]
            self.cols[name] = {"values": Grow(dt, np.zeros(n, dt)),
                               "present": Grow(np.bool_, np.zeros(n, bool))}
        elif t == "keyword":
            self.cols[name] = {"codes": Grow(np.int32, np.full(n, -1, np.int32))}
        else:  # (row, code) pairs, rows non-decreasing: in the order rows were added
            self.cols[name] = {"present": Grow(np.bool_, np.zeros(n, bool)),
                               "flat_rows": Grow(np.int64), "flat_codes": Grow(np.int32)}
        if t in ("keyword", "keywords"):
            self.words.setdefault(name, [])
            self._code[name] = {w: i for i, w in enumerate(self.words[name])}

    # -- rows -----------------------------------------------------------------------------------

    def _rows(self, ids: np.ndarray) -> np.ndarray:
        """The live row of each id (held ids only: the caller asks for those)."""
        ids = np.asarray(ids, np.int64)
        rows = np.full(ids.size, -1, np.int64)
        if self._skeys.size:
            pos = np.minimum(np.searchsorted(self._skeys, ids), self._skeys.size - 1)
            found = self._skeys[pos] == ids
            rows[found] = self._srows[pos[found]]
        if self._tail < self._n:  # recent rows: newer than any in the sorted index
            tail_ids = self._rid.arr[self._tail : self._n]
            order = np.argsort(tail_ids, kind="stable")
            st = tail_ids[order]
            pos = np.minimum(np.searchsorted(st, ids, "right") - 1, st.size - 1)
            found = (pos >= 0) & (st[np.maximum(pos, 0)] == ids)
            rows[found] = self._tail + order[pos[found]]
        alive = self._alive.arr
        ok = rows >= 0
        ok[ok] = alive[rows[ok]]
        rows[~ok] = -1
        return rows

    def _merge_tail(self) -> None:
        """Fold the tail into the sorted index: the tail sorted, then inserted (O(n) moves,
        once per _TAIL_ROWS rows or more)."""
        rows = np.arange(self._tail, self._n, dtype=np.int64)
        live = self._alive.arr[self._tail : self._n]
        keys, rows = self._rid.arr[self._tail : self._n][live], rows[live]
        order = np.argsort(keys, kind="stable")
        keys, rows = keys[order], rows[order]
        sk, sr = self._skeys, self._srows
        if sr.size and not self._alive.arr[sr].all():  # entries removed since: dropped
            keep = self._alive.arr[sr]
            sk, sr = sk[keep], sr[keep]
        pos = np.searchsorted(sk, keys)
        self._skeys, self._srows = np.insert(sk, pos, keys), np.insert(sr, pos, rows)
        self._tail = self._n

    # -- writes -------------------------------------------------------------------------------

    def check(self, attributes: Any, n: int) -> dict[str, tuple[str, list]]:
        """Validate a batch's attributes ({name: n values}) before anything changes: returns
        {name: (type, canonical values)}; raises InvalidAttributeError naming the attribute."""
        if attributes is None:
            return {}
        if not isinstance(attributes, dict):
            raise InvalidAttributeError(
                f"attributes must map names to one value per item; got "
                f"{type(attributes).__name__}")
        new = [name for name in attributes if name not in self.schema]
        if new and len(self.schema) + len(new) > self.max_columns:
            raise ResourceExhaustedError(
                f"a collection holds at most {self.max_columns} attribute columns (the "
                f"server's --max-attribute-columns); it has {len(self.schema)}, this write "
                f"adds {len(new)}")
        out = {}
        for name, values in attributes.items():
            _check_name(name)
            if isinstance(values, np.ndarray):
                values = values.tolist()
            if not isinstance(values, (list, tuple)) or len(values) != n:
                got = len(values) if isinstance(values, (list, tuple)) else type(values).__name__
                raise InvalidAttributeError(
                    f"attribute {name!r} needs one value per item ({n}); got {got}")
            t = self.schema.get(name) or infer_type(name, list(values))
            if t is None:
                continue  # all missing in a new column: nothing to store
            out[name] = (t, _column_values(name, t, list(values)))
        return out

    def add(self, ids: np.ndarray, checked: dict[str, tuple[str, list]]) -> None:
        """Rows for new ids (not held) with ``check``ed attributes; other columns missing."""
        for name, (t, _) in checked.items():
            if name not in self.schema:
                self.schema[name] = t
                self._new_column(name, t)
        ids = np.asarray(ids, np.int64)
        m, first = ids.size, self._n
        for name, col in self.cols.items():
            t = self.schema[name]
            vals = checked.get(name, (t, [None] * m))[1]
            if t in ("int", "float", "bool"):
                col["values"].append(np.array([0 if v is None else v for v in vals],
                                              col["values"].arr.dtype))
                col["present"].append(np.array([v is not None for v in vals], bool))
            elif t == "keyword":
                col["codes"].append(np.array(
                    [-1 if v is None else self._intern(name, v) for v in vals], np.int32))
            else:
                col["flat_rows"].append(np.array(
                    [first + j for j, v in enumerate(vals) if v for _ in v], np.int64))
                col["flat_codes"].append(np.array(
                    [self._intern(name, w) for v in vals if v for w in v], np.int32))
                col["present"].append(np.array([v is not None for v in vals], bool))
        self._rid.append(ids)
        self._alive.extend_with(True, m)
        self._n += m
        if self._n - self._tail > max(_TAIL_ROWS, int(np.sqrt(self._n))):
            self._merge_tail()

    def _intern(self, name: str, word: str) -> int:
        code = self._code[name].get(word)
        if code is None:
            code = self._code[name][word] = len(self.words[name])
            self.words[name].append(word)
        return code

    def remove(self, ids: np.ndarray) -> None:
        rows = self._rows(np.unique(np.asarray(ids, np.int64)))
        rows = rows[rows >= 0]
        self._alive.arr[rows] = False
        self._dead += rows.size
        if self._dead > max(_TAIL_ROWS, len(self)):  # more dead rows than live: compact
            self._compact()

    def _compact(self) -> None:
        """Drop the dead rows (O(n) per column, once per n removed)."""
        live = self._alive.view().copy()
        new_row = np.cumsum(live) - 1
        for col in self.cols.values():
            for key in ("values", "present", "codes"):
                if key in col:
                    col[key].keep(live)
            if "flat_rows" in col:
                fr = col["flat_rows"].view()
                k = live[fr]
                col["flat_codes"].keep(k)
                col["flat_rows"] = Grow(np.int64, new_row[fr[k]])
        self._rid.keep(live)
        self._alive = Grow(np.bool_, np.ones(self._rid.n, bool))
        self._n, self._dead = self._rid.n, 0
        self._skeys, self._srows, self._tail = np.empty(0, np.int64), np.empty(0, np.int64), 0
        self._merge_tail()

    def rows_of(self, ids: np.ndarray) -> dict[str, list]:
        """The attributes of ids (held), as ``check`` takes them (``get``, tests, export)."""
        rows = self._rows(ids)
        out: dict[str, list] = {}
        for name, col in self.cols.items():
            t = self.schema[name]
            if t in ("int", "float", "bool"):
                vals, pres = col["values"].view()[rows], col["present"].view()[rows]
                out[name] = [v.item() if p else None for v, p in zip(vals, pres, strict=True)]
            elif t == "keyword":
                out[name] = [self.words[name][c] if c >= 0 else None
                             for c in col["codes"].view()[rows]]
            else:  # each row's run of the flat pairs, in the order they were added
                fr, fc = col["flat_rows"].view(), col["flat_codes"].view().tolist()
                lo, hi = np.searchsorted(fr, rows, "left"), np.searchsorted(fr, rows, "right")
                words = self.words[name]
                out[name] = [[words[c] for c in fc[a:b]] if p else None
                             for a, b, p in zip(lo.tolist(), hi.tolist(),
                                                col["present"].view()[rows].tolist(),
                                                strict=True)]
        return out

    # -- persistence ----------------------------------------------------------------------------

    def file_arrays(self) -> dict[str, dict[str, np.ndarray]]:
        """The columns as the file keeps them: ``{"": {"ids": sorted ids}, name: {key:
        array}}``, aligned with the sorted ids (a list column as (id, code) pairs)."""
        live = np.flatnonzero(self._alive.view())
        rids = self._rid.view()[live]
        order = np.argsort(rids, kind="stable")
        rows = live[order]
        out: dict[str, dict[str, np.ndarray]] = {"": {"ids": rids[order]}}
        for name, col in self.cols.items():
            out[name] = {}
            for key in ("values", "present", "codes"):
                if key in col:
                    out[name][key] = col[key].view()[rows]
            if "flat_rows" in col:
                fr = col["flat_rows"].view()
                k = self._alive.view()[fr]
                out[name]["flat_ids"] = self._rid.view()[fr[k]]
                out[name]["flat_codes"] = col["flat_codes"].view()[k]
        return out

    def save(self, path: Path) -> None:
        # arrays are named by column number: names and words live in the JSON header, which
        # holds any string
        cols = self.file_arrays()
        arrays, columns = {"ids": cols.pop("")["ids"]}, []
        for i, (name, col) in enumerate(cols.items()):
            columns.append([name, list(col)])
            for key, arr in col.items():
                arrays[f"c{i}.{key}"] = arr
        write_index_file(path, {"class": FORMAT, "schema": self.schema, "words": self.words,
                                "columns": columns}, arrays)

    @classmethod
    def load(cls, path: Path) -> AttributeTable:
        header, arrays = read_index_file(path)
        if header.get("class") != FORMAT:
            raise ValueError(f"{path} is not an attribute table")
        t = cls()
        t.schema = dict(header["schema"])
        t.words = {k: list(v) for k, v in header["words"].items()}
        t._code = {k: {w: i for i, w in enumerate(v)} for k, v in t.words.items()}
        ids = np.array(arrays.pop("ids"), np.int64)
        cols: dict[str, dict[str, np.ndarray]] = {}
        if "columns" in header:
            for i, (name, keys) in enumerate(header["columns"]):
                cols[name] = {k: np.array(arrays[f"c{i}.{k}"]) for k in keys}
        else:  # written before columns were numbered: "<name>\0<key>"
            for key, arr in arrays.items():
                name, part = key.split("\x00")
                cols.setdefault(name, {})[part] = np.array(arr)
        # rows in id order (the file's); list pairs from ids to rows, in row order
        t._rid, t._alive, t._n = Grow(np.int64, ids), Grow(np.bool_, np.ones(ids.size, bool)), \
            ids.size
        for name, col in cols.items():
            g = {k: Grow(a.dtype, a) for k, a in col.items() if k != "flat_ids"}
            if "flat_ids" in col:
                rows = np.searchsorted(ids, col["flat_ids"])
                order = np.argsort(rows, kind="stable")
                g["flat_rows"] = Grow(np.int64, rows[order])
                g["flat_codes"] = Grow(np.int32, col["flat_codes"][order])
            t.cols[name] = g
        t._skeys, t._srows, t._tail = ids.copy(), np.arange(ids.size, dtype=np.int64), ids.size
        return t

    # -- the filter language --------------------------------------------------------------------

    def where(self, expr: Any, deadline: float | None = None) -> np.ndarray:
        """The ids (sorted) of the items matching a ``where`` filter; DeadlineExceededError
        once ``deadline`` (time.monotonic()) passes during the evaluation."""
        mask = self._eval(expr, "where", deadline) & self._alive.view()
        count = int(np.count_nonzero(mask))
        if count * 16 < self._n:  # few: sorting them is cheaper than walking the index
            return np.sort(self._rid.view()[mask])
        # many: the sorted index in order, then the tail's few merged in
        out = self._skeys[mask[self._srows]]
        if self._tail < self._n:
            tail = np.sort(self._rid.arr[self._tail : self._n][mask[self._tail : self._n]])
            out = np.insert(out, np.searchsorted(out, tail), tail)
        return out

    def _eval(self, expr: Any, at: str, deadline: float | None = None) -> np.ndarray:
        if deadline is not None and time.monotonic() > deadline:
            raise DeadlineExceededError("the call's deadline passed while evaluating where")
        if not isinstance(expr, dict):
            raise InvalidFilterError(
                f"{at} must be an object of attribute conditions and $and/$or/$not; got "
                f"{type(expr).__name__} {expr!r:.80}")
        mask = np.ones(self._n, bool)
        for key, val in expr.items():
            if key in ("$and", "$or"):
                if not isinstance(val, list) or not val:
                    raise InvalidFilterError(f"{at}.{key} must be a non-empty list of filters")
                m = None  # folded clause by clause: one mask alive, however many clauses
                for i, e in enumerate(val):
                    part = self._eval(e, f"{at}.{key}[{i}]", deadline)
                    m = part if m is None else (m & part if key == "$and" else m | part)
            elif key == "$not":
                m = ~self._eval(val, f"{at}.$not", deadline)
            elif key.startswith("$"):
                raise InvalidFilterError(
                    f"{at}: unknown operator {key!r}; allowed: $and, $or, $not, or an attribute "
                    f"name ({self._names()})")
            else:
                m = self._condition(key, val, f"{at}.{key}")
            mask &= m
        return mask

    def _names(self) -> str:
        return ", ".join(f"{n}: {t}" for n, t in sorted(self.schema.items())) or "none yet"

    def _condition(self, name: str, cond: Any, at: str) -> np.ndarray:
        t = self.schema.get(name)
        if t is None:
            raise InvalidFilterError(
                f"{at}: unknown attribute {name!r}; this collection has {self._names()}")
        if not isinstance(cond, dict):
            cond = {"eq": cond}  # {"genre": "jazz"} is {"genre": {"eq": "jazz"}}
        mask = np.ones(self._n, bool)
        for op, v in cond.items():
            op_ = op[1:] if isinstance(op, str) and op.startswith("$") else op
            if op_ not in OPS[t]:
                raise InvalidFilterError(
                    f"{at}: operator {op!r} does not apply to {t} attribute {name!r}; allowed: "
                    f"{', '.join(OPS[t])}")
            mask &= self._op(name, t, op_, v, f"{at}.{op}")
        return mask

    def _op(self, name: str, t: str, op: str, v: Any, at: str) -> np.ndarray:
        col = {k: b.view() for k, b in self.cols[name].items()}
        present = col["present"] if "present" in col else col["codes"] >= 0
        if op == "exists":
            if not isinstance(v, bool):
                raise InvalidFilterError(f"{at} takes true or false; got {v!r}")
            return present.copy() if v else ~present
        many = op in ("in", "nin")
        if many and not isinstance(v, list):
            raise InvalidFilterError(f"{at} takes a list of {t} values; got {v!r:.80}")
        vals = v if many else [v]
        for x in vals:
            vt = _value_type(x)
            scalar_t = "keyword" if t == "keywords" else t
            if not (vt == scalar_t or (t == "float" and vt == "int")):
                raise InvalidFilterError(
                    f"{at}: attribute {name!r} holds {t} values; got {x!r} "
                    f"({type(x).__name__})")
            if vt == "int" and not -(1 << 63) <= x < (1 << 63):
                raise InvalidFilterError(
                    f"{at}: {x} is outside the 64-bit integers that attributes hold "
                    f"[-2^63, 2^63)")
        if t in ("int", "float", "bool"):
            values = col["values"]
            if op in ("eq", "in", "ne", "nin"):
                hit = np.isin(values, np.array(vals, values.dtype))
                hit = hit if op in ("eq", "in") else ~hit
            else:
                cmp = {"lt": np.less, "lte": np.less_equal, "gt": np.greater,
                       "gte": np.greater_equal}[op]
                hit = cmp(values, v)
            return hit & present
        codes = [self._code[name].get(x, -2) for x in vals]  # -2: a word never stored
        if t == "keyword":
            hit = np.isin(col["codes"], codes)
        else:  # a list matches when it holds any of the values
            hit = np.zeros(present.size, bool)
            hit[col["flat_rows"][np.isin(col["flat_codes"], codes)]] = True
        return (hit if op in ("eq", "in") else ~hit) & present
