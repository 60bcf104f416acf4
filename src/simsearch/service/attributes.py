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

from ..errors import InvalidAttributeError, InvalidFilterError, InvalidParameterError
from ..fileformat import read_index_file, write_index_file
from ..filters import in_sorted
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


class AttributeTable:
    """The attributes of every item a collection holds, one typed column per name."""

    def __init__(self, schema: dict[str, str] | None = None):
        self.max_columns = Limits.max_attribute_columns  # a node sets its own limit
        self.schema: dict[str, str] = dict(schema or {})
        self.ids = np.empty(0, np.int64)  # sorted: every item held
        self.cols: dict[str, dict[str, np.ndarray]] = {}
        self.words: dict[str, list[str]] = {}  # keyword dictionaries
        self._code: dict[str, dict[str, int]] = {}
        for name, t in self.schema.items():
            self._new_column(name, t)

    def __len__(self) -> int:
        return int(self.ids.size)

    def _new_column(self, name: str, t: str) -> None:
        n = self.ids.size
        if t in ("int", "float", "bool"):
            dt = {"int": np.int64, "float": np.float64, "bool": np.bool_}[t]
            self.cols[name] = {"values": np.zeros(n, dt), "present": np.zeros(n, bool)}
        elif t == "keyword":
            self.cols[name] = {"codes": np.full(n, -1, np.int32)}
        else:
            self.cols[name] = {"present": np.zeros(n, bool), "flat_ids": np.empty(0, np.int64),
                               "flat_codes": np.empty(0, np.int32)}
        if t in ("keyword", "keywords"):
            self.words.setdefault(name, [])
            self._code[name] = {w: i for i, w in enumerate(self.words[name])}

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
        all_ids = np.concatenate([self.ids, ids])
        order = np.argsort(all_ids, kind="stable")
        m = ids.size
        for name, col in self.cols.items():
            t = self.schema[name]
            vals = checked.get(name, (t, [None] * m))[1]
            if t in ("int", "float", "bool"):
                new_v = np.array([0 if v is None else v for v in vals], col["values"].dtype)
                new_p = np.array([v is not None for v in vals], bool)
                col["values"] = np.concatenate([col["values"], new_v])[order]
                col["present"] = np.concatenate([col["present"], new_p])[order]
            elif t == "keyword":
                codes = np.array([-1 if v is None else self._intern(name, v) for v in vals],
                                 np.int32)
                col["codes"] = np.concatenate([col["codes"], codes])[order]
            else:
                fi = [i for i, v in zip(ids.tolist(), vals, strict=True) if v for _ in v]
                fc = [self._intern(name, w) for v in vals if v for w in v]
                col["flat_ids"] = np.concatenate([col["flat_ids"], np.array(fi, np.int64)])
                col["flat_codes"] = np.concatenate([col["flat_codes"], np.array(fc, np.int32)])
                new_p = np.array([v is not None for v in vals], bool)
                col["present"] = np.concatenate([col["present"], new_p])[order]
        self.ids = all_ids[order]

    def _intern(self, name: str, word: str) -> int:
        code = self._code[name].get(word)
        if code is None:
            code = self._code[name][word] = len(self.words[name])
            self.words[name].append(word)
        return code

    def remove(self, ids: np.ndarray) -> None:
        gone = np.unique(ids)
        keep = ~in_sorted(gone, self.ids)
        self.ids = self.ids[keep]
        for col in self.cols.values():
            for key in ("values", "present", "codes"):
                if key in col:
                    col[key] = col[key][keep]
            if "flat_ids" in col:
                k2 = ~in_sorted(gone, col["flat_ids"])
                col["flat_ids"], col["flat_codes"] = col["flat_ids"][k2], col["flat_codes"][k2]

    def rows_of(self, ids: np.ndarray) -> dict[str, list]:
        """The attributes of ids (held), as ``check`` takes them (``get``, tests, export)."""
        pos = np.searchsorted(self.ids, ids)
        out: dict[str, list] = {}
        for name, col in self.cols.items():
            t = self.schema[name]
            if t in ("int", "float", "bool"):
                out[name] = [v.item() if p else None
                             for v, p in zip(col["values"][pos], col["present"][pos], strict=True)]
            elif t == "keyword":
                out[name] = [self.words[name][c] if c >= 0 else None for c in col["codes"][pos]]
            else:  # each id's run of the flat pairs, in the order they were added
                order = np.argsort(col["flat_ids"], kind="stable")
                fi, fc = col["flat_ids"][order], col["flat_codes"][order].tolist()
                lo, hi = np.searchsorted(fi, ids, "left"), np.searchsorted(fi, ids, "right")
                words = self.words[name]
                out[name] = [[words[c] for c in fc[a:b]] if p else None
                             for a, b, p in zip(lo.tolist(), hi.tolist(),
                                                col["present"][pos].tolist(), strict=True)]
        return out

    # -- persistence ----------------------------------------------------------------------------

    def save(self, path: Path) -> None:
        # arrays are named by column number: names and words live in the JSON header, which
        # holds any string
        arrays, columns = {"ids": self.ids}, []
        for i, (name, col) in enumerate(self.cols.items()):
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
        t.ids = np.array(arrays.pop("ids"))
        if "columns" in header:
            for i, (name, keys) in enumerate(header["columns"]):
                t.cols[name] = {k: np.array(arrays[f"c{i}.{k}"]) for k in keys}
        else:  # written before columns were numbered: "<name>\0<key>"
            for key, arr in arrays.items():
                name, part = key.split("\x00")
                t.cols.setdefault(name, {})[part] = np.array(arr)
        return t

    # -- the filter language --------------------------------------------------------------------

    def where(self, expr: Any, deadline: float | None = None) -> np.ndarray:
        """The ids (sorted) of the items matching a ``where`` filter; DeadlineExceededError
        once ``deadline`` (time.monotonic()) passes during the evaluation."""
        return self.ids[self._eval(expr, "where", deadline)]

    def _eval(self, expr: Any, at: str, deadline: float | None = None) -> np.ndarray:
        if deadline is not None and time.monotonic() > deadline:
            raise DeadlineExceededError("the call's deadline passed while evaluating where")
        if not isinstance(expr, dict):
            raise InvalidFilterError(
                f"{at} must be an object of attribute conditions and $and/$or/$not; got "
                f"{type(expr).__name__} {expr!r:.80}")
        mask = np.ones(self.ids.size, bool)
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
        mask = np.ones(self.ids.size, bool)
        for op, v in cond.items():
            op_ = op[1:] if isinstance(op, str) and op.startswith("$") else op
            if op_ not in OPS[t]:
                raise InvalidFilterError(
                    f"{at}: operator {op!r} does not apply to {t} attribute {name!r}; allowed: "
                    f"{', '.join(OPS[t])}")
            mask &= self._op(name, t, op_, v, f"{at}.{op}")
        return mask

    def _op(self, name: str, t: str, op: str, v: Any, at: str) -> np.ndarray:
        col = self.cols[name]
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
            holders = np.unique(col["flat_ids"][np.isin(col["flat_codes"], codes)])
            hit = in_sorted(holders, self.ids)
        return (hit if op in ("eq", "in") else ~hit) & present
