"""Message-size limit (client splits, raw oversized refused), load shedding, deadlines, and
graceful shutdown."""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest

import simsearch as ss
from simsearch.service import convert
from simsearch.service.errors import (
    DeadlineExceededError,
    ResourceExhaustedError,
    ServiceUnavailableError,
)
from simsearch.service.protos.simsearch.v1 import simsearch_pb2 as pb
from simsearch.service.protos.simsearch.v1 import simsearch_pb2_grpc as pb_grpc

DIM = 64
LIMIT = 256 << 10


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(5)
    return rng.standard_normal((6000, DIM)).astype(np.float32)


def test_size_limit_load_shedding_deadline_shutdown(server_factory, data):
    server = server_factory(
        "--max-message-bytes", str(LIMIT), "--max-concurrent-rpcs", "2", "--workers", "8"
    )
    client = server.client(timeout=30)
    col = client.create_collection("big", DIM, "l2", "flat")

    # a 1.5 MB batch goes through in several calls under the 256 KiB limit
    assert data.nbytes > 5 * LIMIT
    ids = col.add(data)
    np.testing.assert_array_equal(ids, np.arange(len(data)))
    assert len(col) == len(data)
    local = ss.FlatIndex(DIM, "l2")
    local.add(data)
    q = data[:3000] + 0.01
    r, e = col.search(q, 8), local.search(q, 8)  # queries and results both split
    np.testing.assert_array_equal(r.ids, e.ids)
    np.testing.assert_allclose(r.scores, e.scores, rtol=1e-4, atol=1e-4)

    # the same batch sent raw is refused cleanly, and nothing is half-written
    channel = grpc.insecure_channel(server.address, options=[("grpc.max_send_message_length", -1)])
    stub = pb_grpc.SimSearchStub(channel)
    big = pb.AddRequest(
        collection="big", vectors=convert.to_matrix(data[:2000] * 2), ids=range(10**6, 10**6 + 2000)
    )
    with pytest.raises(grpc.RpcError) as ei:
        stub.Add(big, timeout=30)
    assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    rows = (LIMIT - 4096) // (DIM * 4)  # a request that fits but whose answer would not
    with pytest.raises(grpc.RpcError) as ei:
        stub.Search(
            pb.SearchRequest(collection="big", queries=convert.to_matrix(q[:rows]), k=100),
            timeout=30,
        )
    assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "message limit" in ei.value.details()
    unsplit = server.client(timeout=30, max_message_bytes=64 << 20)  # a client that does not split
    with pytest.raises(ResourceExhaustedError):
        unsplit.collection("big").add(data[:2000] * 3)
    assert len(col) == len(data)

    # beyond --max-concurrent-rpcs calls are shed with RESOURCE_EXHAUSTED, the rest succeed
    heavy = pb.SearchRequest(collection="big", queries=convert.to_matrix(q[:rows]), k=10)
    outcomes: list[str] = []

    def hammer():
        for _ in range(4):
            try:
                stub.Search(heavy, timeout=60)
                outcomes.append("OK")
            except grpc.RpcError as err:
                outcomes.append(err.code().name)

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(outcomes) <= {"OK", "RESOURCE_EXHAUSTED"}, outcomes
    assert outcomes.count("OK") >= 2 and "RESOURCE_EXHAUSTED" in outcomes, outcomes

    # a deadline the call cannot meet
    hurried = server.client(timeout=0.001)
    for _ in range(100):  # the server may still count the shed calls as running for a moment
        try:
            hurried._call("Search", heavy)
        except ResourceExhaustedError:
            time.sleep(0.05)
        except DeadlineExceededError:
            break
    else:
        pytest.fail("a call with a 1 ms deadline did not fail with DEADLINE_EXCEEDED")
    # calls whose deadline passed may still run on the server for a moment and hold the
    # concurrency slots; the server sheds until they finish, then serves again
    for _ in range(200):
        try:
            assert client.health() == "SERVING"
            break
        except ResourceExhaustedError:
            time.sleep(0.05)
    else:
        pytest.fail("the server kept shedding after the abandoned calls should have finished")

    # SIGTERM: calls in flight finish (or are refused as UNAVAILABLE), the process exits 0
    results: list[str] = []

    def busy():
        for _ in range(6):
            try:
                stub.Search(heavy, timeout=60)
                results.append("OK")
            except grpc.RpcError as err:
                results.append(err.code().name)

    t = threading.Thread(target=busy)
    t.start()
    while not results:
        t.join(0.005)
    assert server.stop() == 0
    t.join()
    # the call running at SIGTERM completes; later ones are refused (UNAVAILABLE while the
    # server drains, CANCELLED once its transport is closing)
    assert results[0] == "OK" and set(results) <= {"OK", "UNAVAILABLE", "CANCELLED"}, results
    channel.close()
    with pytest.raises(ServiceUnavailableError):
        server.client(timeout=2).list_collections()

    server.restart()  # everything acknowledged is back
    assert len(server.client(timeout=30).collection("big")) == len(data)


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:")) / 1024


def test_a_small_request_cannot_ask_for_a_huge_answer(server_factory):
    """The issue's case: 5,000 queries x k = 100,000 on a 100-item collection, a request of
    ~1 MB whose padded answer would be ~6 GB. Refused before anything is allocated."""
    server = server_factory()
    client = server.client(timeout=30)
    col = client.create_collection("small", 16, "l2", "hnsw")
    col.add(np.random.default_rng(0).standard_normal((100, 16)).astype(np.float32))
    stub = pb_grpc.SimSearchStub(grpc.insecure_channel(server.address))
    q = np.random.default_rng(1).standard_normal((5000, 16)).astype(np.float32)
    before = _rss_mib(server.proc.pid)
    for k in (100_000, 50_000):
        with pytest.raises(grpc.RpcError) as ei:
            stub.Search(pb.SearchRequest(collection="small", queries=convert.to_matrix(q), k=k),
                        timeout=30)
        assert ei.value.code() in (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                   grpc.StatusCode.INVALID_ARGUMENT), ei.value.details()
    assert _rss_mib(server.proc.pid) - before < 100  # a padded answer would be gigabytes
    assert server.proc.poll() is None
    # in process the same search is an InvalidParameterError naming the limit
    local = ss.HNSWIndex(16, "l2")
    local.add(np.zeros((100, 16), np.float32) + np.arange(100)[:, None])
    with pytest.raises(ss.errors.InvalidParameterError, match="SIMSEARCH_MAX_RESULT_ENTRIES"):
        local.search(q, 100_000)


def test_id_lists_are_bounded_by_their_decoded_size(server_factory):
    """Small ids pack to 1 byte each but decode to 8: an add or remove whose ids would decode
    past the message limit is RESOURCE_EXHAUSTED before the copy, and nothing changes."""
    limit = 256 << 10
    server = server_factory("--max-message-bytes", str(limit))
    client = server.client(timeout=30)
    col = client.create_collection("ids", 4, "l2", "flat")
    col.add(np.eye(4, dtype=np.float32), ids=[1, 2, 3, 4])
    stub = pb_grpc.SimSearchStub(grpc.insecure_channel(server.address))
    many = [1] * (limit // 8 + 1)  # ~33 KB on the wire, ~256 KiB decoded
    with pytest.raises(grpc.RpcError) as ei:
        stub.Remove(pb.RemoveRequest(collection="ids", ids=many, missing_ok=True), timeout=30)
    assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, ei.value.details()
    assert "message limit" in ei.value.details()
    add = pb.AddRequest(collection="ids", vectors=convert.to_matrix(np.ones((1, 4), np.float32)),
                        ids=many)
    with pytest.raises(grpc.RpcError) as ei:
        stub.Add(add, timeout=30)
    assert ei.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, ei.value.details()
    assert len(col) == 4  # nothing removed or added
    assert col.remove([1, 2]) == 2  # a normal remove still works


def test_a_get_of_more_items_than_an_answer_carries_is_refused_before_it_is_read(
        server_factory):
    """The defect: ``Get`` with ``all`` (or a broad ``where``) built the whole answer (every
    id, attribute and vector of the collection) in the server's memory, then refused it for
    its size. Now an answer is cut into message-sized pages before it is built (the client
    asks page after page; one that does not page is refused, test_every_client.py), and the
    node serves on. Bad input to ``get`` is refused with a typed error too."""
    import simsearch as ss

    server = server_factory("--max-message-bytes", str(64 << 10))
    c = server.client(timeout=30)
    col = c.create_collection("g", 64, "l2", "flat")
    n = 2_000  # 2,000 x (64 x 4 + 8) bytes of vectors: over 64 KiB
    col.add(np.ones((n, 64), np.float32), attributes={"k": ["a"] * n})
    assert col.get(vectors=True)["vectors"].shape == (n, 64)
    assert col.get(where={"k": "a"}, vectors=True)["attributes"]["k"] == ["a"] * n
    assert col.get(where={"k": "a"})["ids"].size == n  # ids alone fit
    got = col.get(np.arange(n), vectors=True)  # a list of ids is split by the client
    assert got["ids"].size == n and got["vectors"].shape == (n, 64)
    with pytest.raises(ss.errors.InvalidIdError):
        col.get([-1])
    with pytest.raises(ss.errors.InvalidFilterError):
        col.get(where={"missing": 1})
    assert col.get([])["ids"].size == 0 and len(col) == n
