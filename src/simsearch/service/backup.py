"""Backups of collections from a running server (a node or a cluster coordinator) into one
checksummed file, and restores (``simsearch backup`` / ``simsearch restore``; docs/service.md,
"Backup and restore"). The file is simsearch's file format (fileformat.py): a header listing each
collection's name and config, and each collection's exported bytes as one array. A damaged or
truncated backup is a CorruptIndexError before anything is restored."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import CorruptIndexError, InvalidParameterError
from ..fileformat import read_index_file, write_index_file
from .errors import CollectionExistsError

FORMAT = "simsearch-backup"


def backup(client: Any, path: str | os.PathLike, names: Sequence[str] | None = None) -> list[str]:
    """Export ``names`` (default: every collection) through ``client`` (simsearch.connect) into
    ``path``, written atomically. Returns the names backed up."""
    names = client.list_collections() if names is None else list(names)
    header: dict[str, Any] = {"class": FORMAT, "collections": []}
    arrays = {}
    for i, name in enumerate(names):
        config, data = client.export_collection(name)
        header["collections"].append({"name": name, "config": config})
        arrays[f"c{i}"] = np.frombuffer(data, np.uint8)
    write_index_file(path, header, arrays)
    return names


def read_backup(path: str | os.PathLike) -> list[tuple[str, dict, bytes]]:
    """(name, config, data) of each collection in a backup file, verified."""
    header, arrays = read_index_file(path)
    if header.get("class") != FORMAT:
        raise CorruptIndexError(f"{path} is not a simsearch backup (it holds a "
                                f"{header.get('class')!r})")
    try:
        return [(c["name"], dict(c["config"]), arrays[f"c{i}"].tobytes())
                for i, c in enumerate(header["collections"])]
    except (KeyError, TypeError) as exc:
        raise CorruptIndexError(f"{path} has a malformed backup header: {exc}") from None


def restore(client: Any, path: str | os.PathLike, names: Sequence[str] | None = None,
            rename: str | None = None, replace: bool = False) -> list[str]:
    """Import the collections of a backup (``names``: some of them) through ``client``.
    ``rename``: restore the one collection chosen under this name. An existing collection is
    replaced only with ``replace`` (else CollectionExistsError, and nothing is restored).
    Returns the names restored."""
    entries = read_backup(path)
    if names is not None:
        missing = set(names) - {n for n, _, _ in entries}
        if missing:
            raise InvalidParameterError(f"{path} holds no collection {sorted(missing)}; it holds "
                                        f"{[n for n, _, _ in entries]}")
        entries = [e for e in entries if e[0] in set(names)]
    if rename is not None:
        if len(entries) != 1:
            raise InvalidParameterError("rename restores one collection: choose it with names")
        entries = [(rename, entries[0][1], entries[0][2])]
    existing = set(client.list_collections())
    clash = sorted(n for n, _, _ in entries if n in existing)
    if clash and not replace:
        raise CollectionExistsError(f"collections {clash} exist; restore with replace=True "
                                    "(--replace) to overwrite them")
    for name, config, data in entries:
        client.import_collection(name, config, data)
    return [n for n, _, _ in entries]
