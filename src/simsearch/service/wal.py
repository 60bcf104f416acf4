"""A checksummed, append-only write-ahead log.

Record layout (little-endian)::

    u32 length   length of the payload
    u32 crc32    zlib.crc32 of the payload
    payload      u8 op | u32 meta length | meta (JSON) | blobs (raw bytes, sizes in meta)

``append`` writes one record and fsyncs before it returns, so an acknowledged write survives a
crash. ``read_records`` verifies every record: a damaged or incomplete *last* record is a write
torn by a crash and is dropped (the file is cut back to the last whole record); damage followed
by more data is corruption and raises :class:`WalCorruptError`.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path

from .._durable import fsync_dir
from ..errors import CorruptIndexError

_HEAD = struct.Struct("<II")
_PAYLOAD_HEAD = struct.Struct("<BI")

OP_ADD = 1
OP_REMOVE = 2
OP_UPSERT = 3
OP_TRAIN = 4
#: fenced part writes (fenced.py): ops stored before the leader's commit, then applied by a sync
OP_PART_PREPARE = 5
OP_PART_SYNC = 6


class WalCorruptError(CorruptIndexError):
    """A write-ahead log record in the middle of the log failed its checksum."""


@dataclass(frozen=True)
class Record:
    op: int
    meta: dict
    blobs: list[bytes]


def encode(op: int, meta: dict, blobs: list[bytes] | tuple[bytes, ...] = ()) -> bytes:
    meta = dict(meta, blob_sizes=[len(b) for b in blobs])
    mbytes = json.dumps(meta, separators=(",", ":")).encode()
    payload = b"".join([_PAYLOAD_HEAD.pack(op, len(mbytes)), mbytes, *blobs])
    return _HEAD.pack(len(payload), zlib.crc32(payload)) + payload


def decode_payload(payload: bytes | memoryview) -> Record:
    op, mlen = _PAYLOAD_HEAD.unpack_from(payload, 0)
    start = _PAYLOAD_HEAD.size
    meta = json.loads(bytes(payload[start : start + mlen]))
    pos = start + mlen
    blobs = []
    for size in meta.pop("blob_sizes"):
        blobs.append(bytes(payload[pos : pos + size]))
        pos += size
    if pos != len(payload):
        raise ValueError("payload size does not match its blob table")
    return Record(op, meta, blobs)


def scan(buf: bytes | memoryview) -> tuple[list[Record], int, bool]:
    """Parse records from a log image. Returns (records, end of the last whole record, torn)
    where ``torn`` says a partial last record was found. Raises WalCorruptError on damage that
    is followed by more data."""
    buf = memoryview(buf)
    records: list[Record] = []
    pos, size = 0, len(buf)
    while pos < size:
        if size - pos < _HEAD.size:
            return records, pos, True
        length, crc = _HEAD.unpack_from(buf, pos)
        end = pos + _HEAD.size + length
        if end > size:  # the write did not finish (or its length field was torn)
            return records, pos, True
        payload = buf[pos + _HEAD.size : end]
        ok = zlib.crc32(payload) == crc
        if ok:
            try:
                rec = decode_payload(payload)
            except (ValueError, KeyError, TypeError, struct.error):
                ok = False
        if not ok:
            if end == size:  # the last record: a write torn by a crash
                return records, pos, True
            raise WalCorruptError(
                f"write-ahead log record at offset {pos} failed its checksum and is followed by "
                f"{size - end} more bytes"
            )
        records.append(rec)
        pos = end
    return records, pos, False



class WriteAheadLog:
    """One log file, opened for appending. Appends are serialized and fsynced."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        existed = self.path.exists()
        self._f = open(self.path, "ab")
        self._lock = threading.Lock()
        if not existed:
            os.fsync(self._f.fileno())
            fsync_dir(self.path.parent)

    @staticmethod
    def recover(path: str | os.PathLike) -> tuple[list[Record], bool]:
        """Read every whole record of the log at ``path`` and cut off a torn tail on disk.
        Returns (records, whether a torn tail was dropped)."""
        path = Path(path)
        if not path.exists():
            return [], False
        data = path.read_bytes()
        records, end, torn = scan(data)
        if end != len(data):
            with open(path, "r+b") as f:
                f.truncate(end)
                f.flush()
                os.fsync(f.fileno())
        return records, torn

    def size(self) -> int:
        return self._f.tell()

    def append(self, op: int, meta: dict, blobs: list[bytes] | tuple[bytes, ...] = (),
               sync: bool = True) -> None:
        """Write one record and fsync it (``sync=False``: the next synced append, or the OS,
        makes it durable; for records whose loss a replay repairs). On failure the partial
        record is cut off again and the OSError propagates (the caller must treat the write as
        not made)."""
        rec = encode(op, meta, blobs)
        with self._lock:
            start = self._f.tell()
            try:
                self._f.write(rec)
                self._f.flush()
                if sync:
                    os.fsync(self._f.fileno())
            except OSError:
                try:
                    self._f.truncate(start)
                    self._f.seek(start)
                except OSError:
                    pass
                raise

    def close(self) -> None:
        with self._lock:
            if not self._f.closed:
                self._f.close()
