"""A node that a client other than simsearch's own, a second process on the same directory, or
a hostile filter cannot break (docs/service.md, "The protocol is the contract").

Each test names the defect it was written against, as found on 91334ed (2026-11-28), and how
it showed there: every one of them failed on that code and passes now."""

from __future__ import annotations

import subprocess
import sys
import threading

import grpc
import numpy as np
import pytest

import simsearch as ss
from conftest import unique_name
from simsearch.errors import InvalidFilterError, InvalidParameterError
from simsearch.service.attributes import check_where
from simsearch.service.errors import DataDirLockedError
from simsearch.service.protos.simsearch.v1 import simsearch_pb2 as pb
from simsearch.service.protos.simsearch.v1 import simsearch_pb2_grpc as pb_grpc
from simsearch.service.store import Store

DIM = 8


def _vec(n, seed=0):
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


def _matrix(x):
    return pb.Matrix(data=x.tobytes(), rows=x.shape[0], cols=x.shape[1])


# -- a client without a deadline ------------------------------------------------------------

def test_a_raw_stub_without_a_deadline_gets_answers_not_internal(shared_server):
    """The defect: gRPC reports a call sent without a deadline (the default of grpcurl and of
    the Go, Java and JS clients) as due in ~2^63 ns; the servicer passed that on as a lock
    timeout and ``Lock.acquire`` raised OverflowError: Add, Remove and Snapshot answered
    INTERNAL, and so did a search that waited behind a write. Here a raw stub, no timeout,
    writes while searches run beside it; every call must be OK."""
    name = unique_name("nodeadline")
    with grpc.insecure_channel(shared_server.address) as ch:
        stub = pb_grpc.SimSearchStub(ch)
        stub.CreateCollection(pb.CreateCollectionRequest(name=name, dim=DIM, metric="l2",
                                                         kind="flat"))
        big = _vec(20_000, 1)  # long enough exclusive holds that searches wait behind them
        errors: list[BaseException] = []
        stop = threading.Event()

        def search():
            q = _matrix(_vec(1, 2))
            while not stop.is_set():
                try:
                    stub.Search(pb.SearchRequest(collection=name, queries=q, k=3))
                except grpc.RpcError as exc:
                    errors.append(exc)
                    return

        t = threading.Thread(target=search)
        t.start()
        try:
            for i in range(4):
                ids = np.arange(i * 20_000, (i + 1) * 20_000)
                stub.Add(pb.AddRequest(collection=name, vectors=_matrix(big), ids=ids.tolist()))
                stub.Remove(pb.RemoveRequest(collection=name, ids=ids[:10].tolist()))
            stub.Snapshot(pb.CollectionRequest(name=name))
        finally:
            stop.set()
            t.join()
        assert not errors, errors[0]
        info = stub.DescribeCollection(pb.CollectionRequest(name=name))
        assert info.count == 4 * (20_000 - 10)


def test_a_deadline_past_any_lock_timeout_waits_like_none():
    """The same defect at the lock: a read deadline further off than threading.TIMEOUT_MAX
    raised OverflowError from the condition wait while a writer held the lock."""
    import time

    from simsearch._rwlock import RWLock

    lock = RWLock()
    got = []
    with lock.write():
        t = threading.Thread(target=lambda: (lock.acquire_read(time.monotonic() + 1e12),
                                             got.append(1), lock.release_read()))
        t.start()
        time.sleep(0.05)
    t.join(5)
    assert got == [1]


# -- one owner per data directory ---------------------------------------------------------

def test_a_second_store_on_one_directory_is_refused_and_names_the_holder(tmp_path):
    """The defect: nothing locked the data directory; two ``connect(path=...)`` alternating
    acknowledged adds 0,1,2 and 100,101,102, and reopened the collection held [0, 2, 100, 102]
    (each process's log end went stale and its next append cut the other's record)."""
    first = ss.connect(path=tmp_path)
    col = first.create_collection("c", DIM, "l2", "flat")
    col.add(_vec(3), ids=[0, 1, 2])
    with pytest.raises(DataDirLockedError, match=rf"process {__import__('os').getpid()}"):
        ss.connect(path=tmp_path)
    with pytest.raises(DataDirLockedError):
        Store(tmp_path)
    first.close()
    with ss.connect(path=tmp_path) as again:  # the lock went with the first owner
        assert sorted(again.collection("c").get()["ids"].tolist()) == [0, 1, 2]


def test_an_embedded_client_beside_a_node_is_refused_and_no_acknowledged_write_is_lost(
        server_factory, tmp_path):
    """The same defect across processes: a node and an embedded client on one directory,
    1,000 writes interleaved between them. The embedded side must be refused every time (it
    used to be accepted and to cut the node's log); after the node is killed -9, every write
    the node acknowledged is there."""
    data = tmp_path / "data"
    node = server_factory(data_dir=data)
    acked: list[int] = []
    refused = 0
    with node.client() as c:
        col = c.create_collection("c", DIM, "l2", "flat")
        x = _vec(500, 3)
        for i in range(1000):
            if i % 2:
                try:
                    ss.connect(path=data)
                except DataDirLockedError:
                    refused += 1
                continue
            col.add(x[i // 2:i // 2 + 1], ids=[i])
            acked.append(i)
    node.kill()
    assert refused == 500
    with ss.connect(path=data) as c:
        assert sorted(c.collection("c").get()["ids"].tolist()) == acked


def test_a_killed_owner_leaves_no_lock_behind(tmp_path):
    """SIGKILL runs no cleanup: the lock must be the kernel's (flock), not a file whose
    presence means "held", or a crash would lock the directory for good."""
    code = ("import simsearch as ss, sys, os, signal; c = ss.connect(path=sys.argv[1]); "
            "c.create_collection('c', 4, 'l2', 'flat'); os.kill(os.getpid(), signal.SIGKILL)")
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=False, timeout=120)
    with ss.connect(path=tmp_path) as c:
        assert c.list_collections() == ["c"]


# -- a filter that cannot walk around its limits --------------------------------------------

@pytest.mark.parametrize("where", [
    {"$and": [{}] * 200_000},
    {"$or": [{"$and": [{}]}] * 3},
    {"$not": {}},
    {"$and": [{"a": 1}] * 2000},
])
def test_every_member_of_a_boolean_clause_counts(where):
    """The defect: empty members counted as no clause, so ``{"$and": [{}] * 200_000}`` passed
    the clause limit from a read-only token and held the read lock for 5.9 s on 50,000
    items (every write, and every search behind it, waited)."""
    with pytest.raises(InvalidFilterError):
        check_where(where)


def test_an_ordinary_filter_still_passes():
    check_where({})  # the whole filter empty: matches every item, as before
    check_where({"$and": [{"a": 1}, {"$not": {"b": {"$in": [1, 2]}}}]})


# -- restore validates before it replaces --------------------------------------------------

def test_a_restore_with_a_malformed_config_keeps_the_collection_it_would_replace(tmp_path):
    """The defect: the swap happened before the config was read; a backup whose header said
    ``"dim": "4"`` replaced the good collection, the restore reported failure, and the
    collection answered DATA_LOSS from then on."""
    with ss.connect(path=tmp_path) as c:
        col = c.create_collection("c", DIM, "l2", "flat")
        col.add(_vec(5))
        config, data = c.export_collection("c")
        for bad in ({**config, "dim": str(DIM)}, {**config, "dim": DIM + 1},
                    {**config, "metric": "ip"}):
            with pytest.raises(InvalidParameterError):
                c.import_collection("c", bad, data)
            assert len(c.collection("c")) == 5
        np.testing.assert_array_equal(c.collection("c").search(_vec(1), 1).ids, [[0]])
    with ss.connect(path=tmp_path) as c:  # and after a restart
        assert len(c.collection("c")) == 5


# -- answers bounded by what they carry ------------------------------------------------------

def test_get_answers_in_pages_counted_with_their_attributes(server_factory):
    """The defect: ``get`` sized its answer by ids and vectors only; with texts of ~10 KB,
    ``get`` of 300 ids built the whole answer and then failed RESOURCE_EXHAUSTED (and so did
    LangChain's ``get_by_ids`` and LlamaIndex's ``get_nodes`` once documents passed ~1 KiB at
    the default message size). Now pages are cut by bytes, attributes included."""
    node = server_factory("--max-message-bytes", str(1 << 20))
    texts = [f"{i:05d}" + "x" * 10_000 for i in range(300)]
    with node.client() as c:
        col = c.create_collection("docs", DIM, "l2", "flat")
        col.add(_vec(300), attributes={"text": texts})
        for ids in (None, np.arange(299, -1, -1)):
            got = col.get(ids, vectors=True)
            want = np.arange(300) if ids is None else ids
            assert got["ids"].tolist() == want.tolist()
            assert got["attributes"]["text"] == [texts[i] for i in want]
            np.testing.assert_array_equal(got["vectors"], _vec(300)[want])
        with grpc.insecure_channel(node.address) as ch:  # a client that does not page
            with pytest.raises(grpc.RpcError) as info:
                pb_grpc.SimSearchStub(ch).Get(pb.GetRequest(collection="docs", all=True),
                                              timeout=30)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "pages" in info.value.details()
        assert len(col) == 300


# -- embedded mode ---------------------------------------------------------------------------

def test_an_embedded_handle_of_a_dropped_collection_answers_not_found():
    """The defect: a handle to a dropped collection kept serving it in process (a node's
    handle answers NOT_FOUND)."""
    from simsearch.service.errors import CollectionNotFoundError

    with ss.connect(":memory:") as c:
        col = c.create_collection("c", DIM, "l2", "flat")
        col.add(_vec(3))
        c.drop_collection("c")
        for call in (lambda: col.search(_vec(1), 1), lambda: col.add(_vec(1)), lambda: len(col)):
            with pytest.raises(CollectionNotFoundError):
                call()


def test_an_embedded_collection_outlives_the_client_object_that_made_it():
    """The defect: ``connect(":memory:").create_collection(...)`` lost its store as soon as
    the client object was collected (its directory was deleted under the collection)."""
    import gc

    col = ss.connect(":memory:").create_collection("c", DIM, "l2", "flat")
    gc.collect()
    col.add(_vec(5))
    assert col.search(_vec(1), 1).ids.tolist() == [[0]]


def test_path_memory_is_memory_and_leaves_no_folder(tmp_path, monkeypatch):
    """The defect: ``connect(path=":memory:")`` wrote a folder named ``:memory:`` in the
    working directory."""
    monkeypatch.chdir(tmp_path)
    with ss.connect(path=":memory:") as c:
        c.create_collection("c", DIM, "l2", "flat").add(_vec(2))
    assert list(tmp_path.iterdir()) == []


def test_memory_stores_of_killed_processes_are_swept(tmp_path):
    """The defect: ``:memory:`` kept its log in /dev/shm (capped at 64 MiB in a container)
    and a SIGKILL or SIGTERM left it there for good. Now it is in the temporary directory, and
    the next ``:memory:`` store removes those whose process is gone."""
    import os
    import tempfile

    env = {**os.environ, "TMPDIR": str(tmp_path)}
    code = ("import simsearch as ss, os, signal; c = ss.connect(':memory:'); "
            "c.create_collection('c', 4, 'l2', 'flat'); os.kill(os.getpid(), signal.SIGKILL)")
    subprocess.run([sys.executable, "-c", code], env=env, check=False, timeout=120)
    assert len(list(tmp_path.glob("simsearch-memory-*"))) == 1
    old = tempfile.tempdir
    tempfile.tempdir = str(tmp_path)
    try:
        with ss.connect(":memory:"):
            assert len(list(tmp_path.glob("simsearch-memory-*"))) == 1  # its own only
        assert list(tmp_path.glob("simsearch-memory-*")) == []
    finally:
        tempfile.tempdir = old


def test_a_tokens_file_others_can_read_is_warned_about(tmp_path, caplog):
    """The defect: a world-readable tokens file (its tokens are secrets) was read silently."""
    import logging

    from simsearch.service.auth import load_tokens

    f = tmp_path / "tokens"
    f.write_text("read-only abc\n")
    f.chmod(0o600)
    with caplog.at_level(logging.WARNING):
        load_tokens(f)
    assert "chmod 600" not in caplog.text
    f.chmod(0o644)
    with caplog.at_level(logging.WARNING):
        assert load_tokens(f) == {"abc": "read-only"}
    assert "chmod 600" in caplog.text


def test_more_collections_than_open_files_do_not_stop_the_node(tmp_path):
    """The defect: one open log per collection and no cap: past ``ulimit -n`` a restart failed
    as a whole (OSError EMFILE out of the store). Now a log opens its file at its first append
    and keeps it open only while fewer than half the open-file limit's logs do: 80 collections
    under a limit of 72 files all open, take writes and read them back."""
    with ss.connect(path=tmp_path) as c:
        for i in range(80):
            c.create_collection(f"c{i:02d}", 4, "l2", "flat").add(np.ones((1, 4), np.float32))
    code = '''
import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (72, 72))
import numpy as np
import simsearch as ss
with ss.connect(path=sys.argv[1]) as c:
    for name in c.list_collections():
        c.collection(name).add(np.ones((2, 4), np.float32))
with ss.connect(path=sys.argv[1]) as c:
    print(sum(len(c.collection(name)) for name in c.list_collections()))
'''
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.split()[-1]) == 80 * 3


def test_a_pyramid_collection_advertises_its_sub_indexes_search_parameters(tmp_path):
    """The defect: a node reported a collection's search parameters from the index's class,
    and PyramidIndex widens them per instance with its sub-index's: a node's pyramid collection
    of HNSW parts did not advertise ``ef``."""
    with ss.connect(path=tmp_path) as c:
        col = c.create_collection("p", DIM, "l2", "pyramid", n_centers=4, n_partitions=2,
                                  sub_index="hnsw")
        assert {"ef", "branching"} <= set(col.describe()["search_params"])


def test_the_public_client_has_no_cluster_internal_call():
    """The cluster's calls on its shards (fenced part writes, blobs, the fan-out's one-call
    searches and handles) are on ShardClient, not on what ``simsearch.connect`` returns."""
    from simsearch.service.client import Client
    from simsearch.service.shardclient import ShardClient

    internal = {"part_prepare", "part_sync", "part_ops", "put_blob", "get_blob", "delete_blob",
                "list_blobs", "search_once", "collection_handle"}
    assert not internal & set(dir(Client))
    assert internal <= set(dir(ShardClient))
