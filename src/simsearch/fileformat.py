"""The one on-disk format of simsearch (indexes, encoders, attribute tables), to and from any
file object or bytes:

    prefix   <8s I I Q   magic, format version, header length, payload length
    header   JSON: class, metric, dim, count, params, meta, and the array table
    payload  the arrays, each at a 64-byte aligned offset
    trailer  <I 8s       crc32 of header + payload, end magic

A reader checks sizes, then the checksum, before it parses anything; any damage is a
CorruptIndexError. Files are written through _durable.atomic_write: never half a file.
"""

from __future__ import annotations

import io
import json
import os
import struct
import zlib
from typing import BinaryIO

import numpy as np

from ._durable import atomic_write
from .errors import CorruptIndexError

MAGIC = b"SIMSRCH\x00"
END_MAGIC = b"SIMSEND\x00"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sIIQ")
_TRAILER = struct.Struct("<I8s")
_ALIGN = 64


def write_index(f: BinaryIO, header: dict, arrays: dict[str, np.ndarray]) -> None:
    """Write ``header`` (JSON-able) and ``arrays`` to the file object ``f``."""
    table, offset = [], 0
    for name, arr in arrays.items():
        arr = np.ascontiguousarray(arr)
        offset = -(-offset // _ALIGN) * _ALIGN
        table.append(
            {"name": name, "dtype": arr.dtype.str, "shape": list(arr.shape), "offset": offset}
        )
        offset += arr.nbytes
    hbytes = json.dumps(dict(header, arrays=table), separators=(",", ":")).encode()
    f.write(_PREFIX.pack(MAGIC, FORMAT_VERSION, len(hbytes), offset))
    f.write(hbytes)
    crc = zlib.crc32(hbytes)
    pos = 0
    for entry, arr in zip(table, arrays.values(), strict=True):
        pad = entry["offset"] - pos
        if pad:
            f.write(b"\0" * pad)
            crc = zlib.crc32(b"\0" * pad, crc)
        buf = memoryview(np.ascontiguousarray(arr).reshape(-1)).cast("B")  # (0, d) too
        f.write(buf)
        crc = zlib.crc32(buf, crc)
        pos = entry["offset"] + buf.nbytes
    f.write(_TRAILER.pack(crc, END_MAGIC))


def write_index_file(path: str | os.PathLike, header: dict, arrays: dict[str, np.ndarray]) -> None:
    atomic_write(path, lambda f: write_index(f, header, arrays))


def write_index_bytes(header: dict, arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    write_index(buf, header, arrays)
    return buf.getvalue()


def read_index_bytes(data: bytes | bytearray | memoryview, source: str = "the data"
                     ) -> tuple[dict, dict[str, np.ndarray]]:
    """Verify and parse one file's bytes (``source`` names them in errors). The arrays are
    views of ``data``: writable when it is (a bytearray)."""
    buf = memoryview(data).cast("B")
    size = buf.nbytes
    if size < _PREFIX.size + _TRAILER.size:
        raise CorruptIndexError(f"{source} is not a simsearch index file (too short: {size} bytes)")
    magic, version, hlen, plen = _PREFIX.unpack_from(buf, 0)
    if magic != MAGIC:
        raise CorruptIndexError(f"{source} is not a simsearch index file (bad magic)")
    if version > FORMAT_VERSION:
        raise CorruptIndexError(
            f"{source} has format version {version}; this simsearch reads up to {FORMAT_VERSION}"
        )
    expected = _PREFIX.size + hlen + plen + _TRAILER.size
    if size != expected:
        raise CorruptIndexError(
            f"{source} is truncated or padded: {size} bytes, header says {expected}"
        )
    crc, end = _TRAILER.unpack_from(buf, size - _TRAILER.size)
    body = buf[_PREFIX.size : size - _TRAILER.size]
    if end != END_MAGIC or zlib.crc32(body) != crc:
        raise CorruptIndexError(f"{source} failed its checksum: the file is corrupted")
    try:
        header = json.loads(bytes(body[:hlen]))
        payload = body[hlen:]
        arrays = {}
        for e in header["arrays"]:
            dt = np.dtype(e["dtype"])
            if dt.kind not in "biuf" or dt.byteorder == ">":  # plain little-endian numbers
                raise ValueError(f"array {e.get('name')!r} has dtype {dt}")
            n = int(np.prod(e["shape"], dtype=np.int64)) * dt.itemsize
            start = int(e["offset"])
            if start < 0 or start + n > plen:
                raise ValueError("array outside payload")
            arrays[e["name"]] = np.frombuffer(payload[start : start + n], dtype=dt).reshape(
                e["shape"]
            )
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptIndexError(f"{source} has a malformed header: {exc}") from None
    return header, arrays


def read_index_file(path: str | os.PathLike) -> tuple[dict, dict[str, np.ndarray]]:
    """Read and verify a file of write_index_file; CorruptIndexError on any damage."""
    try:
        with open(path, "rb") as f:
            data = bytearray(os.fstat(f.fileno()).st_size)
            data = data[: f.readinto(data)]
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise CorruptIndexError(f"cannot read index file {path}: {exc}") from None
    return read_index_bytes(data, str(path))
