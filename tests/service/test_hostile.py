"""A node that hostile input, a damaged log and a crash mid-change cannot break
(docs/service.md, "Limits" and "Durability").

Each test names the defect it was written against and how that defect showed on the code
before these changes (2026-11-27). Each of the log, snapshot, visibility and import tests was
also seen failing with its defect put back into the new code: the snapshot re-logging no
prepared ops, a header checksum failure read as a torn tail, a write applied before its append,
and the import swap's intent file written after the first fault point; so were the attribute
name test (with the old check: 5 of 8 names accepted) and the failed-snapshot test (with the
snapshot's error let through to the write)."""

from __future__ import annotations

import errno
import json
import struct
import threading
import time
import zlib

import grpc
import numpy as np
import pytest

from simsearch.errors import InvalidAttributeError, InvalidFilterError
from simsearch.fileformat import write_index_file
from simsearch.service import wal as walmod
from simsearch.service.attributes import FORMAT, AttributeTable
from simsearch.service.errors import (
    DataLossError,
    DeadlineExceededError,
    ResourceExhaustedError,
)
from simsearch.service.fenced import PartOp
from simsearch.service.limits import Limits
from simsearch.service.protos.simsearch.v1 import simsearch_pb2 as pb
from simsearch.service.shardclient import connect_shard
from simsearch.service.store import Store

DIM = 4


def _vec(n, seed=0):
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


# -- names and values ----------------------------------------------------------------------

@pytest.mark.parametrize("name", ["a\x00b", "tab\there", "", "x" * 129, "$or", ".hidden",
                                  "new\nline", "sp ace"])
def test_bad_attribute_names_are_refused_and_change_nothing(tmp_path, name):
    """The defect: an attribute name holding a NUL was acknowledged, and after the next
    snapshot and a restart the collection was DATA_LOSS (the attribute file split its array
    names on NUL). Now names follow one pattern, checked on the way in."""
    col = Store(tmp_path).create("c", DIM, "l2", "flat", {})
    col.add(_vec(2), attributes={"ok": ["a", "b"]})
    with pytest.raises(InvalidAttributeError, match="letters, digits"):
        col.add(_vec(1, 1), attributes={name: ["v"]})
    assert len(col.index) == 2 and set(col.attrs.schema) == {"ok"}


VALUES = ["nul\x00inside", "line\nbreak", "ünïcödé ✓ 漢字", "\x01\x1f ctrl", "", "a" * 5000,
          "lone \ud800 surrogate"]


def test_keyword_values_of_any_content_survive_replay_snapshot_and_copy(tmp_path):
    s = Store(tmp_path / "a")
    col = s.create("c", DIM, "l2", "flat", {})
    ids = np.arange(len(VALUES))
    col.add(_vec(len(VALUES)), ids, attributes={"k": VALUES, "ks": [[v, "x"] for v in VALUES]})
    want = col.attrs.rows_of(ids)
    assert want["k"] == VALUES

    def check(c):
        assert c.attrs.rows_of(ids) == want
        for i, v in enumerate(VALUES):  # where finds each value exactly
            assert c.attrs.where({"k": v}).tolist() == [i]

    del s  # a crash: the directory's lock goes with its owner
    s = Store(tmp_path / "a")  # a restart: the values come back from the log
    check(s.get("c"))
    s.get("c").snapshot()
    del s
    s = Store(tmp_path / "a")  # and from the snapshot
    check(s.get("c"))
    config, data = s.get("c").export()
    check(Store(tmp_path / "b").import_collection("c", config, data))


def test_attribute_files_written_before_numbered_columns_still_load(tmp_path):
    t = AttributeTable()
    t.add(np.array([1, 2]), t.check({"g": ["x", None], "n": [1, 2]}, 2))
    cols = t.file_arrays()
    arrays = {"ids": cols.pop("")["ids"]}
    for name, col in cols.items():
        for key, arr in col.items():
            arrays[f"{name}\x00{key}"] = arr
    write_index_file(tmp_path / "old.bin", {"class": FORMAT, "schema": t.schema,
                                            "words": t.words}, arrays)
    back = AttributeTable.load(tmp_path / "old.bin")
    assert back.rows_of(np.array([1, 2])) == {"g": ["x", None], "n": [1, 2]}


def test_collection_names_follow_the_same_pattern(tmp_path):
    from simsearch.errors import InvalidParameterError

    s = Store(tmp_path)
    for bad in ("a\x00", "../x", ".x", "a/b", "", "é"):
        with pytest.raises(InvalidParameterError, match="letters, digits"):
            s.create(bad, DIM, "l2", "flat", {})
    assert s.names() == []


def test_attribute_columns_are_capped(tmp_path):
    """The defect: every new attribute name allocated a column for every item, without limit."""
    col = Store(tmp_path, limits=Limits(max_attribute_columns=3)).create("c", DIM, "l2", "flat",
                                                                          {})
    col.add(_vec(2), attributes={"a": [1, 2], "b": [1, 2]})
    with pytest.raises(ResourceExhaustedError, match="max-attribute-columns"):
        col.add(_vec(1, 1), attributes={"c": [1], "d": [1]})
    assert len(col.index) == 2 and set(col.attrs.schema) == {"a", "b"}
    col.add(_vec(1, 2), attributes={"c": [1]})


# -- where ---------------------------------------------------------------------------------

def _deep(depth):
    w = {"n": 1}
    for _ in range(depth):
        w = {"$not": w}
    return w


def test_where_limits_are_typed_and_checked_before_evaluation(shared_server, shared_client):
    """The defect: a where nested 5,000 deep answered INTERNAL (a RecursionError), and one of
    200,000 $or clauses ran for 41 s under a read lock."""
    name = "where-limits"
    col = shared_client.create_collection(name, DIM, "l2", "flat")
    col.add(_vec(50), attributes={"n": list(range(50))})
    stub_req = pb.SearchRequest(collection=name, queries=pb.Matrix(
        data=_vec(1).tobytes(), rows=1, cols=DIM), k=3)
    from simsearch.service.protos.simsearch.v1 import simsearch_pb2_grpc as pb_grpc

    stub = pb_grpc.SimSearchStub(grpc.insecure_channel(shared_server.address))
    for where in ('{"$not":' * 5000 + '{"n": 1}' + "}" * 5000,  # JSON too deep to parse
                  json.dumps(_deep(40)),  # parses, deeper than the limit
                  json.dumps({"$or": [{"n": i} for i in range(200_000)]}),  # over the bytes
                  json.dumps({"$or": [{"n": i} for i in range(2_000)]})):  # over the clauses
        req = pb.SearchRequest()
        req.CopyFrom(stub_req)
        req.where_json = where
        with pytest.raises(grpc.RpcError) as ei:
            stub.Search(req, timeout=30)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT, ei.value.details()
    assert col.search(_vec(1), 3, where={"$or": [{"n": i} for i in range(500)]}).ids.shape == \
        (1, 3)
    assert shared_client.health() == "SERVING"


def test_where_evaluation_honours_the_deadline():
    t = AttributeTable()
    t.add(np.arange(20_000), t.check({"n": list(range(20_000))}, 20_000))
    where = {"$or": [{"n": i} for i in range(5_000)]}
    with pytest.raises(DeadlineExceededError):
        t.where(where, deadline=time.monotonic() + 0.01)
    assert t.where({"$or": [{"n": 3}, {"n": 7}]}, deadline=time.monotonic() + 10).tolist() == \
        [3, 7]


def test_where_shape_check_is_iterative():
    from simsearch.service.attributes import check_where

    with pytest.raises(InvalidFilterError, match="deeper"):
        check_where(_deep(100_000))  # no RecursionError however deep
    with pytest.raises(InvalidFilterError, match="conditions"):
        check_where({"$and": [{"n": {"gt": 1, "lt": 3}}] * 600})


# -- streams -------------------------------------------------------------------------------

def test_import_and_blob_streams_are_capped(server_factory):
    """The defect: Import and PutBlob streams were joined whole, without a cap."""
    from simsearch.service.errors import CollectionNotFoundError

    server = server_factory("--max-stream-bytes", str(64 << 10))
    c = server.client(timeout=30)
    col = c.create_collection("small", DIM, "l2", "flat")
    col.add(_vec(10))
    config, data = c.export_collection("small")
    with pytest.raises(ResourceExhaustedError, match="max-stream-bytes"):
        c.import_collection("big", config, data + b"\0" * (128 << 10))
    with pytest.raises(CollectionNotFoundError):
        c.collection("big")
    with pytest.raises(ResourceExhaustedError, match="max-stream-bytes"):
        connect_shard(server.address, timeout=30).put_blob("b", b"\1" * (128 << 10))
    c.import_collection("copy", config, data)
    assert len(c.collection("copy")) == 10
    assert server.stop() == 0


# -- the log -------------------------------------------------------------------------------

def _records(path):
    """(offset, length) of each record of a log file."""
    raw, out, pos = path.read_bytes(), [], len(walmod.FILE_MAGIC)
    while pos < len(raw):
        length = struct.unpack_from("<I", raw, pos)[0]
        out.append((pos, length))
        pos += 12 + length
    return out


def test_a_damaged_length_field_refuses_to_open_instead_of_truncating(tmp_path):
    """The defect: with the length field of the 2nd of 12 records set to 2^31, a restart served
    10 of 120 items with only a warning (the length sat outside the record's checksum, so the
    damage read as a torn tail, and the log was cut there)."""
    col = Store(tmp_path).create("c", DIM, "l2", "flat", {})  # a store dropped: a crash
    for i in range(12):
        col.add(_vec(10, i))
    wal = next((tmp_path / "collections" / "c").glob("wal-*.log"))
    size = wal.stat().st_size
    off = _records(wal)[1][0]
    raw = bytearray(wal.read_bytes())
    raw[off:off + 4] = struct.pack("<I", 2**31)
    wal.write_bytes(bytes(raw))
    col = Store(tmp_path).get("c")
    with pytest.raises(DataLossError, match=rf"wal-0\.log.*offset {off}.*restore it from a backup"):
        col.search(_vec(1), 1)
    assert wal.stat().st_size == size  # nothing was cut away


def test_zero_filled_and_torn_tails_are_cut(tmp_path):
    col = Store(tmp_path).create("c", DIM, "l2", "flat", {})  # a store dropped: a crash
    for i in range(3):
        col.add(_vec(5, i))
    wal = next((tmp_path / "collections" / "c").glob("wal-*.log"))
    good = wal.read_bytes()
    rec = walmod.encode(walmod.OP_ADD, {"n": 1}, (_vec(1).tobytes(), b"\7" * 8))
    for tail in (b"\0" * 4096,  # a power loss: the file grew, its data never came
                 rec[:7], rec[:20] + b"\0" * 100,  # a write torn in its header, in its payload
                 rec[:-1] + bytes([rec[-1] ^ 1])):  # the last record damaged: unacknowledged
        wal.write_bytes(good + tail)
        col = Store(tmp_path).get("c")
        assert len(col.index) == 15
        assert wal.read_bytes() == good


def test_logs_written_before_the_header_checksum_are_read_and_rewritten(tmp_path):
    col = Store(tmp_path).create("c", DIM, "l2", "flat", {})  # a store dropped: a crash
    x = _vec(3)
    col.add(x)
    wal = next((tmp_path / "collections" / "c").glob("wal-*.log"))
    recs, _, _ = walmod.scan(wal.read_bytes())
    legacy = b""
    for r in recs:  # the old layout: u32 length | u32 crc | payload
        payload = walmod.encode(r.op, r.meta, r.blobs)[12:]
        legacy += struct.pack("<II", len(payload), zlib.crc32(payload)) + payload
    wal.write_bytes(legacy)
    col = Store(tmp_path).get("c")
    assert len(col.index) == 3
    assert wal.read_bytes().startswith(walmod.FILE_MAGIC)
    col.add(_vec(2, 1))
    assert len(Store(tmp_path).get("c").index) == 5


def test_a_write_is_not_visible_before_it_is_logged(tmp_path, monkeypatch):
    """The defect: an add was applied to the index, then logged; a search meanwhile saw it,
    and when the append failed the item vanished again (a read no log backs)."""
    col = Store(tmp_path).create("c", DIM, "ip", "flat", {})
    col.add(_vec(5))
    in_append, release = threading.Event(), threading.Event()
    real = col._wal.append

    def slow_failing_append(*a, **kw):
        in_append.set()
        release.wait(10)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(col._wal, "append", slow_failing_append)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("err", _raises(
        lambda: col.add(np.full((1, DIM), 100.0, np.float32), ids=[99]))))
    t.start()
    assert in_append.wait(10)
    seen = col.search(np.ones((1, DIM), np.float32), 1).ids[0, 0]
    release.set()
    t.join(10)
    assert seen != 99
    assert isinstance(out["err"], ResourceExhaustedError)  # a full disk: typed, nothing changed
    assert not col.index.contains([99])[0]
    monkeypatch.setattr(col._wal, "append", real)
    col.add(np.full((1, DIM), 100.0, np.float32), ids=[99])  # writes resume by themselves
    assert col.search(np.ones((1, DIM), np.float32), 1).ids[0, 0] == 99


def _raises(fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - returned for the assertion
        return exc
    return None


def test_a_failed_snapshot_after_a_durable_write_keeps_it_acknowledged(tmp_path, monkeypatch):
    """The defect: an ENOSPC in the snapshot that follows a durable write was reported as
    INTERNAL, so a client retried an add that had landed (auto ids: a duplicate item)."""
    from simsearch.service import collection as storemod

    monkeypatch.setattr(storemod, "MIN_SNAPSHOT_WAL_BYTES", 0)
    col = Store(tmp_path, snapshot_wal_bytes=1).create("c", DIM, "l2", "flat", {})

    def full(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(col.index, "save", full)
    ids = col.add(_vec(3))  # the snapshot after it fails: the add stands
    assert ids.tolist() == [0, 1, 2] and col.generation == 0
    assert sorted(p.name for p in (tmp_path / "collections" / "c").iterdir()) == \
        ["collection.json", "wal-0.log"]  # nothing half-made of generation 1
    with pytest.raises(ResourceExhaustedError):
        col.snapshot()
    assert len(Store(tmp_path).get("c").index) == 3


def test_a_snapshot_between_prepare_and_sync_keeps_the_prepared_ops(tmp_path):
    """The defect: prepare, then Export (which snapshots), then sync, then SIGKILL: after the
    restart the collection was DATA_LOSS (the snapshot dropped the prepared ops, and the log's
    sync record could not replay). A new Store on the same directory is the restart."""
    col = Store(tmp_path).create("p", DIM, "l2", "flat", {}, part_replica=True)
    col.part_prepare(3, 1, [PartOp(1, False, np.array([1, 2]), _vec(2))])
    col.export()
    col.part_prepare(3, 2, [PartOp(2, True, np.array([1]))])
    col.snapshot()
    col.part_sync(3, (3, 1), 1, 1)
    col = Store(tmp_path).get("p")  # the crash: nothing closed
    assert col.damaged is None and col.fenced.applied == 1
    assert sorted(col.index.ids().tolist()) == [1, 2]
    assert col.part_sync(3, (3, 2), 2, 2)["applied"] == 2  # the other prepared op is still there
    assert col.index.ids().tolist() == [2]


# -- the import swap -------------------------------------------------------------------------

@pytest.mark.parametrize("point", ["import:intent-written", "import:old-moved-away",
                                   "import:new-in-place"])
def test_import_swap_survives_a_crash_at_every_step(server_factory, tmp_path, monkeypatch,
                                                    point):
    """The defect: the import renamed the old copy away before the new one was in place, and
    a restart deleted both (both names started with a dot): a crash between the two renames
    lost the collection. The node is killed at each step by a fault point."""
    from simsearch._faults import EXIT_CODE
    from simsearch.service.errors import ServiceUnavailableError

    monkeypatch.setenv("SIMSEARCH_FAULT", point)
    server = server_factory()
    c = server.client(timeout=30)
    c.create_collection("c", DIM, "l2", "flat").add(_vec(10))
    src = c.create_collection("src", DIM, "l2", "flat")
    src.add(_vec(20, 1))
    config, data = c.export_collection("src")
    with pytest.raises(ServiceUnavailableError):
        c.import_collection("c", config, data)
    assert server.proc.wait(30) == EXIT_CODE
    monkeypatch.delenv("SIMSEARCH_FAULT")
    server.restart()
    c = server.client(timeout=30)
    n = len(c.collection("c"))
    assert n == 20  # the intent was written first: a restart finishes the swap
    assert not [p for p in (server.data_dir / "collections").iterdir()
                if p.name.startswith(".")]


def test_an_incarnation_is_a_part_replica_id_and_bounded(tmp_path):
    """An incarnation is kept in collection.json: only part replicas carry one, and only a short
    hex id (a client cannot park megabytes in a collection's config)."""
    from simsearch.errors import InvalidParameterError

    s = Store(tmp_path)
    for part, inc in ((False, "ab12"), (True, "x" * 10), (True, "a" * 65), (True, "a\x00")):
        with pytest.raises(InvalidParameterError, match="incarnation"):
            s.create("c", DIM, "l2", "flat", {}, part_replica=part, incarnation=inc)
    assert s.names() == []
    assert s.create("c", DIM, "l2", "flat", {}, part_replica=True,
                    incarnation="ab12").describe()["incarnation"] == "ab12"


@pytest.mark.parametrize("recent", [[["x", 1, 2, 3]], [[1, 2]], "nope"])
def test_a_copy_with_a_malformed_part_state_is_refused_and_changes_nothing(tmp_path, recent):
    """A part copy's fencing state comes from the network (ImportCollection): a malformed one
    is refused, saying what is expected, and no collection is made or replaced."""
    s = Store(tmp_path)
    config, data = s.create("a", DIM, "l2", "flat", {}, part_replica=True).export()
    config = dict(config, part_state={"term": 1, "attempt": 0, "applied": 0, "recent": recent})
    with pytest.raises(ValueError, match="a part state must be"):
        s.import_collection("b", config, data)
    assert s.names() == ["a"]
    s.close()
