"""Answers of ``get`` in message-sized pages (docs/service.md, "Reading items"): a page's size
counts its ids, vectors and attributes' JSON, and is known before the message is built."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .errors import ResourceExhaustedError


def fit_rows(n: int, row_bytes: int, attributes_of: Callable[[int], dict[str, list]],
             max_bytes: int | None) -> tuple[int, dict[str, list]]:
    """How many of ``n`` rows (``row_bytes`` of ids and vectors each, and the attributes
    ``attributes_of(m)`` gives for the first m) fit ``max_bytes``, and their attributes: at
    least one, or ResourceExhaustedError when one alone is too large."""
    if max_bytes is None or n == 0:
        return n, attributes_of(n)
    m = min(n, max(1, max_bytes // max(1, row_bytes)))
    while True:
        attrs = attributes_of(m)
        size = m * row_bytes + len(json.dumps(attrs, default=str))
        if size <= max_bytes:
            return m, attrs
        if m == 1:
            raise ResourceExhaustedError(
                f"one item's answer is {size} bytes, over the {max_bytes} one message carries "
                "(the server's --max-message-bytes); ask without vectors, or raise the limit")
        m = max(1, min(m - 1, int(m * max_bytes / size * 0.9)))


def page(got: dict[str, Any], offset: int, row_bytes: int,
         max_bytes: int | None) -> dict[str, Any]:
    """A page of a whole ``get`` answer (a cluster's, gathered from its parts), from row
    ``offset``; ``next`` is the offset of the page after it, 0 after the last."""
    ids = got["ids"][offset:]
    n, attrs = fit_rows(ids.size, row_bytes,
                        lambda m: {k: v[offset:offset + m] for k, v in got["attributes"].items()},
                        max_bytes)
    x = got["vectors"]
    return {"ids": ids[:n], "attributes": attrs,
            "vectors": None if x is None else x[offset:offset + n],
            "next": offset + n if n < ids.size else 0}
