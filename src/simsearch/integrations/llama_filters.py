"""LlamaIndex's ``MetadataFilters`` with the answers of llama-index-core's own stores
(``SimpleVectorStore``): a filter on a missing key matches only ``!=``, ``nin`` and
``is_empty``; ``contains`` / ``any`` / ``all`` on a string look for substrings; ``NOT`` means
"none of". The differential test (tests/integrations/test_llamaindex_differential.py) runs
every operator and condition against ``SimpleVectorStore``.

A filter becomes a :class:`FilterPlan`: a ``where`` (docs/filters.md) that is exact for every
item outside ``check``, and ``check``, a ``where`` selecting the few items it cannot speak for:
those whose value of a filtered key is not in an attribute column of its own type (the adapter
lists those keys per item in the ``_loose`` attribute) and, for an operator the ``where``
language has no word for (a substring, a comparison of strings), the items holding that key.
Those are judged here by llama-index-core's own leaf function on their stored metadata.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from llama_index.core.vector_stores.types import (
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
)
from llama_index.core.vector_stores.utils import build_metadata_filter_fn

from ._items import KEY, LOOSE

#: the attribute holding each node's ref_doc_id ("None" without one, as LlamaIndex stores it)
REF_DOC = "ref_doc_id"
#: the metadata keys LlamaIndex fills from the node's ref_doc_id
REF_DOC_KEYS = ("ref_doc_id", "doc_id", "document_id")

#: the keys LlamaIndex adds to every node's metadata that no column holds
NODE_KEYS = frozenset({"_node_type", "_node_content"})

ALL: dict = {KEY: {"exists": True}}  # every item has its framework id
NONE: dict = {"$not": ALL}

_SIMPLE = {FilterOperator.EQ: "eq", FilterOperator.GT: "gt", FilterOperator.GTE: "gte",
           FilterOperator.LT: "lt", FilterOperator.LTE: "lte", FilterOperator.IN: "in"}
_NEGATED = {FilterOperator.NE: "eq", FilterOperator.NIN: "in"}


@dataclass(frozen=True)
class FilterPlan:
    """``where`` is exact for every item that ``check`` (None: no item) does not select."""

    where: dict | None
    check: dict | None


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _fits(t: str, v: Any) -> bool:
    """Whether ``v`` compares with a column of type ``t`` as Python compares it with a value."""
    if t == "int":
        return isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63
    if t == "float":
        return _number(v) and v == v and abs(v) != float("inf")
    if t == "bool":
        return isinstance(v, bool)
    return isinstance(v, str)


def _leaf(f: MetadataFilter, schema: Mapping[str, str]) -> dict | None:
    """The ``where`` of one filter for the items whose value of ``f.key`` is missing or in its
    column; None when the where language cannot say it."""
    col = REF_DOC if f.key in REF_DOC_KEYS else f.key
    t, op, v = schema.get(col), f.operator, f.value
    if t is None:  # no item outside check holds the key: a missing value
        return ALL if op in (FilterOperator.NE, FilterOperator.NIN,
                             FilterOperator.IS_EMPTY) else NONE
    missing = {"$not": {col: {"exists": True}}}
    if op == FilterOperator.IS_EMPTY:
        if t in ("int", "float", "bool"):
            return missing
        return {"$or": [missing, {col: {"eq": ""}}]} if t == "keyword" else None
    many = op in (FilterOperator.IN, FilterOperator.NIN, FilterOperator.ANY,
                  FilterOperator.ALL)
    values = v if many and isinstance(v, list) else [v]
    if many != isinstance(v, list):
        return None
    if t == "keywords":  # a list of strings: == and in compare the whole list
        if not all(isinstance(x, str) for x in values):
            return None
        if op in (FilterOperator.EQ, FilterOperator.IN):
            return NONE
        if op in (FilterOperator.NE, FilterOperator.NIN):
            return ALL
        if op == FilterOperator.CONTAINS:
            return {col: {"eq": v}}
        if op == FilterOperator.ANY:
            return {col: {"in": values}}
        if op == FilterOperator.ALL and values:
            return {"$and": [{col: {"eq": x}} for x in values]}
        return None
    if t == "keyword" and op in (FilterOperator.GT, FilterOperator.GTE, FilterOperator.LT,
                                 FilterOperator.LTE):
        return None  # comparisons of strings
    if not all(_fits(t, x) for x in values):
        # == and != of values of another type are plainly False and True; the rest is
        # Python's business (a TypeError, or 1 == True), judged on the stored metadata
        if op == FilterOperator.EQ and not (_number(v) and t in ("int", "float", "bool")):
            return NONE
        if op == FilterOperator.NE and not (_number(v) and t in ("int", "float", "bool")):
            return ALL
        return None
    if op in _SIMPLE:
        return {col: {_SIMPLE[op]: v}}
    if op in _NEGATED:  # a missing value is "not equal" too
        return {"$not": {col: {_NEGATED[op]: v}}}
    return None  # contains / any / all / text_match on a string or a number


def _and(parts: list[dict]) -> dict:
    return parts[0] if len(parts) == 1 else {"$and": parts}


def plan_filters(filters: MetadataFilters | None, schema: Mapping[str, str]) -> FilterPlan:
    """The plan of ``filters`` over a collection with attribute ``schema``."""
    if filters is None or not filters.filters:
        return FilterPlan(None, None)
    unsure: set[str] = set()
    keys: set[str] = set()

    def walk(fs: MetadataFilters) -> dict:
        parts = []
        for f in fs.filters:
            if isinstance(f, MetadataFilters):
                parts.append(walk(f) if f.filters else ALL)
                continue
            keys.add(f.key)
            w = _leaf(f, schema)
            if w is None:  # judged here for the items holding the key; the others lack it
                unsure.add(REF_DOC if f.key in REF_DOC_KEYS else f.key)
                w = ALL if f.operator in (FilterOperator.NE, FilterOperator.NIN,
                                          FilterOperator.IS_EMPTY) else NONE
            parts.append(w)
        if fs.condition == FilterCondition.OR:
            return {"$or": parts}
        return {"$not": {"$or": parts}} if fs.condition == FilterCondition.NOT else _and(parts)

    where = walk(filters)
    if keys & NODE_KEYS:  # held by every node, in no column
        return FilterPlan(where, ALL)
    checks = [{c: {"exists": True}} for c in sorted(unsure)]
    loose = sorted(k for k in keys if k not in REF_DOC_KEYS)
    if LOOSE in schema and loose:
        checks.append({LOOSE: {"in": loose}})
    check = None if not checks else checks[0] if len(checks) == 1 else {"$or": checks}
    return FilterPlan(where, check)


def judge(filters: MetadataFilters) -> Callable[[Mapping[str, Any]], bool]:
    """``metadata -> bool`` as llama-index-core decides it, leaf by leaf (nested filters,
    which its own function refuses, combined by their conditions)."""

    def leaf(f: MetadataFilter) -> Callable[[Mapping[str, Any]], bool]:
        one = MetadataFilters(filters=[f])
        return lambda md: build_metadata_filter_fn(lambda _: md, one)("")

    def group(fs: MetadataFilters) -> Callable[[Mapping[str, Any]], bool]:
        tests = [group(f) if isinstance(f, MetadataFilters) else leaf(f) for f in fs.filters]
        if not tests:
            return lambda md: True
        # every leaf is evaluated, as llama-index-core does: one that raises (a string
        # compared with a number) raises whatever the others said
        if fs.condition == FilterCondition.OR:
            return lambda md: any([t(md) for t in tests])
        if fs.condition == FilterCondition.NOT:
            return lambda md: not any([t(md) for t in tests])
        return lambda md: all([t(md) for t in tests])

    return group(filters)
