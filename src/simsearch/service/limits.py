"""The node's request limits (docs/service.md, "Limits"): one value each, a server flag each,
checked on the way in before anything large is allocated or anything changes.

Names, of collections and of attributes, follow one pattern (:data:`NAME_PATTERN`): 1-128
letters, digits, ``_``, ``.`` or ``-``, starting with a letter, a digit or ``_``: no NUL, no
control characters, nothing a file system or the on-disk formats treat specially. Values
(keywords, strings) may hold anything.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, fields
from typing import Any

from ..errors import InvalidParameterError

NAME_PATTERN = r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}"
_NAME_RE = re.compile(NAME_PATTERN)


def check_name(name: Any, what: str = "collection name") -> str:
    """``name`` if it follows NAME_PATTERN; otherwise InvalidParameterError (or ``error``)
    saying what is allowed."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise InvalidParameterError(
            f"{what} must be 1-128 characters of letters, digits, '_', '.' or '-', starting "
            f"with a letter, a digit or '_'; got {name!r:.160}")
    return name


@dataclass(frozen=True)
class Limits:
    """What one request may ask of a node."""

    #: deepest nesting of $and / $or / $not in a ``where`` filter
    max_where_depth: int = 32
    #: conditions and operators in one ``where`` filter, counted over the whole tree
    max_where_clauses: int = 1024
    #: bytes of one ``where`` filter's JSON (values of $in lists included)
    max_where_bytes: int = 1 << 20
    #: attribute columns one collection may hold
    max_attribute_columns: int = 256
    #: bytes one ImportCollection or PutBlob stream may carry in all
    max_stream_bytes: int = 4 << 30

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        for f in fields(self):
            p.add_argument("--" + f.name.replace("_", "-"), type=int, default=getattr(self, f.name),
                           help=f"(docs/service.md, Limits; default {getattr(self, f.name)})")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Limits:
        return cls(**{f.name: getattr(args, f.name, f.default) for f in fields(cls)})
DEFAULT_LIMITS = Limits()
