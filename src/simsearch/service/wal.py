"""A checksummed, append-only write-ahead log.

File layout (little-endian)::

    FILE_MAGIC   8 bytes, once
    records      u32 length | u32 crc32 of the payload | u32 crc32 of the two fields before
                 | payload (u8 op | u32 meta length | meta (JSON) | blobs, sizes in meta)

The header carries its own checksum, so a damaged length is told apart from a write that did
not finish. ``append`` writes one record and fsyncs before it returns, so an acknowledged write
survives a crash. ``scan`` verifies every record: a record that fails its checks and is followed
by nothing but zeros (a torn write, or the zero-filled tail a power loss leaves on ext4 or XFS)
is cut off; damage followed by any other data is corruption and raises
:class:`WalCorruptError` naming the offset: the collection is not opened, nothing is truncated,
and an operator restores it from a backup (docs/service.md, "Durability").

Logs written before the header checksum (no FILE_MAGIC; ``u32 length | u32 crc32 | payload``)
are read as they are and rewritten in this layout on recovery.
"""

from __future__ import annotations

import json
import os
import resource
import struct
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .._durable import atomic_write
from ..errors import CorruptIndexError

FILE_MAGIC = b"SSWAL2\n\x00"
_HEAD = struct.Struct("<III")
_LEGACY_HEAD = struct.Struct("<II")
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
    fields = struct.pack("<II", len(payload), zlib.crc32(payload))
    return fields + struct.pack("<I", zlib.crc32(fields)) + payload


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


def _decoded(payload: memoryview, crc: int) -> Record | None:
    if zlib.crc32(payload) != crc:
        return None
    try:
        return decode_payload(payload)
    except (ValueError, KeyError, TypeError, struct.error):
        return None


def _zeros(buf: memoryview) -> bool:
    return not any(buf)


def _record_or_tail(buf: memoryview, pos: int, start: int, end: int, crc: int
                    ) -> Record | None:
    """The record at ``pos`` (payload ``buf[start:end]``); None when it fails its checks and
    nothing but zeros follows (a write torn by a crash); WalCorruptError when more data does."""
    rec = _decoded(buf[start:end], crc)
    if rec is None and not _zeros(buf[end:]):
        raise WalCorruptError(
            f"write-ahead log record at offset {pos} failed its checksum and is followed by "
            f"{len(buf) - end} more bytes")
    return rec


def scan(buf: bytes | memoryview) -> tuple[list[Record], int, bool]:
    """Parse the records of a log image. Returns (records, end of the last whole record, torn)
    where ``torn`` says a torn or zero-filled tail follows them. Raises WalCorruptError on
    damage that is followed by more data."""
    buf = memoryview(buf)
    size = len(buf)
    if bytes(buf[: len(FILE_MAGIC)]) != FILE_MAGIC:
        if size < len(FILE_MAGIC) and (_zeros(buf) or FILE_MAGIC.startswith(bytes(buf))):
            return [], 0, size > 0  # the magic itself was torn: an empty log
        return _scan_legacy(buf)
    records: list[Record] = []
    pos = len(FILE_MAGIC)
    while pos < size:
        if size - pos < _HEAD.size:
            return records, pos, True
        length, crc, head_crc = _HEAD.unpack_from(buf, pos)
        if zlib.crc32(buf[pos : pos + 8]) != head_crc:
            if _zeros(buf[pos:]):
                return records, pos, True
            raise WalCorruptError(
                f"write-ahead log record at offset {pos}: its header failed its checksum and "
                f"{size - pos} bytes of data follow")
        end = pos + _HEAD.size + length
        if end > size:  # a whole header, a partial payload: the write did not finish
            return records, pos, True
        rec = _record_or_tail(buf, pos, pos + _HEAD.size, end, crc)
        if rec is None:
            return records, pos, True
        records.append(rec)
        pos = end
    return records, pos, False


def _scan_legacy(buf: memoryview) -> tuple[list[Record], int, bool]:
    """A log written before the header checksum (see the module docstring)."""
    records: list[Record] = []
    pos, size = 0, len(buf)
    while pos < size:
        if size - pos < _LEGACY_HEAD.size:
            return records, pos, True
        length, crc = _LEGACY_HEAD.unpack_from(buf, pos)
        end = pos + _LEGACY_HEAD.size + length
        if end > size:
            return records, pos, True
        rec = _record_or_tail(buf, pos, pos + _LEGACY_HEAD.size, end, crc)
        if rec is None:
            return records, pos, True
        records.append(rec)
        pos = end
    return records, pos, False


def _open_log_cap() -> int:
    """How many logs may stay open between appends: half this process's open-file limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(4, (soft if soft != resource.RLIM_INFINITY else 1 << 20) // 2)


_open_logs = 0  # logs holding their file open between appends, in this process
_open_logs_lock = threading.Lock()


class WriteAheadLog:
    """One log file, appended to. Appends are serialized and fsynced.

    The file is opened at the first append, not before, and stays open while fewer logs than
    half the process's open-file limit do; past that, each append opens and closes it. A node
    with more collections than it may open files starts and serves them all (one open log per
    collection made a restart past ``ulimit -n`` fail as a whole)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.exists() or self.path.stat().st_size == 0:
            atomic_write(self.path, lambda f: f.write(FILE_MAGIC))
        self._f: BinaryIO | None = None
        self._keep = False  # whether _f counts among the logs kept open
        self._end = self.path.stat().st_size  # the end of the last whole record
        self._lock = threading.Lock()

    def _file(self) -> BinaryIO:
        global _open_logs
        if self._f is None:
            self._f = open(self.path, "ab")  # noqa: SIM115 - kept (or closed by _release)
            with _open_logs_lock:
                self._keep = _open_logs < _open_log_cap()
                _open_logs += self._keep
        return self._f

    def _release(self, force: bool = False) -> None:
        """Close the file after an append unless it is one of the logs kept open."""
        global _open_logs
        if self._f is not None and (force or not self._keep):
            self._f.close()
            self._f = None
            if self._keep:
                with _open_logs_lock:
                    _open_logs -= 1
                self._keep = False

    @staticmethod
    def recover(path: str | os.PathLike) -> tuple[list[Record], bool]:
        """Read every whole record of the log at ``path`` and cut off a torn tail on disk (a
        log in the old layout is rewritten in the current one). Returns (records, whether a
        torn tail was dropped); WalCorruptError, naming the file and offset, on damage."""
        path = Path(path)
        if not path.exists():
            return [], False
        data = path.read_bytes()
        try:
            records, end, torn = scan(data)
        except WalCorruptError as exc:
            raise WalCorruptError(f"{path.name}: {exc}") from None
        if not data.startswith(FILE_MAGIC):
            image = FILE_MAGIC + b"".join(encode(r.op, r.meta, r.blobs) for r in records)
            atomic_write(path, lambda f: f.write(image))
        elif end != len(data):
            with open(path, "r+b") as f:
                f.truncate(end)
                f.flush()
                os.fsync(f.fileno())
        return records, torn

    def size(self) -> int:
        return self._end

    def append(self, op: int, meta: dict, blobs: list[bytes] | tuple[bytes, ...] = (),
               sync: bool = True) -> None:
        """Write one record and fsync it (``sync=False``: the next synced append, or the OS,
        makes it durable; for records whose loss a replay repairs). On failure (a full disk,
        an I/O error) the partial record is cut off again and the OSError propagates: the
        caller treats the write as not made. A cut that fails too is retried before the next
        append, which fails until it succeeds."""
        rec = encode(op, meta, blobs)
        with self._lock:
            try:
                f = self._file()
                if f.tell() != self._end:  # an earlier failed append left bytes behind
                    self._cut()
                f.write(rec)
                f.flush()
                if sync:
                    os.fsync(f.fileno())
            except OSError:
                try:
                    self._cut()
                except OSError:
                    pass
                raise
            finally:
                self._release()
            self._end += len(rec)

    def cut_to(self, end: int) -> None:
        """Take the records after ``end`` (a size() read before them) out of the log again."""
        with self._lock:
            self._end = end
            try:
                self._cut()
            finally:
                self._release()

    def _cut(self) -> None:
        f = self._file()
        f.truncate(self._end)
        f.seek(self._end)
        os.fsync(f.fileno())

    def close(self) -> None:
        with self._lock:
            self._release(force=True)
