"""What the framework adapters share: string ids as collection ids, and documents' metadata as
attributes (docs/integrations.md)."""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any

import numpy as np

from .._validate import MAX_ID
from ..errors import InvalidParameterError
from ..index import index_class
from ..service.errors import CollectionNotFoundError

#: reserved attributes: an item's text, its metadata as JSON, its framework id, and the keys of
#: its metadata whose values no attribute column holds (of another type than the column's, a
#: key that is no attribute name, or past the adapter's column cap)
TEXT, METADATA, KEY, LOOSE = "_text", "_metadata", "_id", "_loose"
#: attribute columns an adapter makes for metadata keys at most (a node refuses writes past
#: its --max-attribute-columns, 256 by default; the reserved ones count too); keys beyond stay
#: in the metadata's JSON, listed in LOOSE
MAX_METADATA_COLUMNS = 64
_COLUMN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def item_id(doc_id: str) -> int:
    """The collection id of a framework's string id (a 62-bit hash of its UTF-8 bytes)."""
    digest = hashlib.blake2b(str(doc_id).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % (MAX_ID + 1)


def item_ids(doc_ids) -> np.ndarray:
    return np.array([item_id(str(i)) for i in doc_ids], np.int64)


def check_new(col, keys: np.ndarray, doc_ids: list[str]) -> None:
    """Refuse a batch whose ids hash to items that hold other ids (never merge them)."""
    if np.unique(keys).size != keys.size:
        raise InvalidParameterError("ids must be unique within a batch")
    got = col.get(keys)
    want = dict(zip(keys.tolist(), doc_ids, strict=True))
    for k, held in zip(got["ids"].tolist(), got["attributes"].get(KEY, []), strict=True):
        if held is not None and held != want[k]:
            raise InvalidParameterError(
                f"ids {want[k]!r} and {held!r} hash to the same item id; use another id")


def owned(got: dict, doc_ids) -> np.ndarray:
    """The item ids of a ``get`` answer that hold one of ``doc_ids`` (not a colliding id)."""
    doc_ids = {str(i) for i in doc_ids}
    held = got["attributes"].get(KEY, [None] * got["ids"].size)
    return np.array([k for k, i in zip(got["ids"].tolist(), held, strict=True)
                     if i in doc_ids], np.int64)


def _kind(v: Any) -> str | None:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int) and -(2**63) <= v < 2**63:
        return "int"
    if isinstance(v, float) and math.isfinite(v):
        return "float"
    if isinstance(v, str):
        return "keyword"
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        return "keywords"
    return None


def metadata_columns(metadatas: list[dict], schema: dict[str, str],
                     max_columns: int = MAX_METADATA_COLUMNS) -> dict[str, list]:
    """The metadata values that go into filterable attributes: per key (a valid attribute
    name, not reserved), the values of the column's type (declared, or one the batch shares);
    new columns only while the metadata columns number fewer than ``max_columns``. Every other
    value is kept in the metadata's JSON only, and its key listed in the item's ``LOOSE``
    attribute (present only when some item has such a key)."""
    out: dict[str, list] = {}
    loose: list[list[str]] = [[] for _ in metadatas]
    reserved = {TEXT, METADATA, KEY, LOOSE}
    room = max_columns - sum(1 for k in schema if k not in reserved and not k.startswith("_"))
    keys = {k for m in metadatas for k in m if isinstance(k, str)}
    for key in sorted(keys):
        kinds = [_kind(m.get(key)) for m in metadatas]
        t = None if key in reserved else schema.get(key)
        if t is None and key not in reserved and _COLUMN.fullmatch(key) and room > 0:
            found = {k for k in kinds if k is not None}
            t = "float" if found == {"int", "float"} else (found.pop() if len(found) == 1
                                                              else None)
        ok = [t is not None and (k == t or (t == "float" and k == "int")) for k in kinds]
        if any(ok):
            out[key] = [m.get(key) if o else None for m, o in zip(metadatas, ok, strict=True)]
            room -= key not in schema
        for i, (m, o) in enumerate(zip(metadatas, ok, strict=True)):
            if not o and key in m and m[key] is not None:
                loose[i].append(key)
    if any(loose) or LOOSE in schema:
        out[LOOSE] = loose
    return out


def open_client(client: Any) -> tuple[Any, bool]:
    """(the client to use, whether the adapter opened it and closes it): ``client`` itself, or
    ``simsearch.connect(client)`` for an address, or an embedded in-memory one for None."""
    from ..service.client import connect

    if client is None or isinstance(client, str):
        return connect(client or ":memory:"), True
    return client, False


def open_collection(client, name: str, dim: int | None, metric: str, kind: str,
                    index_params: dict):
    """The collection ``name``; made with ``dim`` when missing (None while it does not exist
    and ``dim`` is None). A kind that needs training must be made and trained beforehand."""
    try:
        return client.collection(name)
    except CollectionNotFoundError:
        if dim is None:
            return None
    if index_class(kind).capabilities.needs_training:
        raise InvalidParameterError(
            f"index kind {kind!r} needs training: create and train collection {name!r} first, "
            "then pass its name")
    return client.create_collection(name, dim, metric, kind, **index_params)


class HoldsCollection:
    """What an adapter does with its client (``_client``, closed by ``close`` when
    ``_owns_client``) and its collection (``_col``, opened by ``_collection``)."""

    def close(self) -> None:
        """Close the client if this store opened it."""
        if self._owns_client:
            self._client.close()

    def _collection(self, dim: int | None = None):
        """The collection; None while it does not exist and ``dim`` is not given."""
        if self._col is None:
            self._col = open_collection(self._client, self.collection_name, dim, self.metric,
                                        self.kind, self.index_params)
        return self._col
