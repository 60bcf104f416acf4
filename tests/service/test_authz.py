"""Authorization by method (docs/service.md, "Security model"): every RPC of the proto is
classified, and every role gets exactly what its classes allow, on a node and on a coordinator.

Defects these tests were written against (each seen failing on the code before, 2026-11-27):
- a read-only token called PartPrepare and PartSync on an ordinary collection: its planted item
  came back in searches and the owner's next add failed with FencedPartError
  (``test_read_only_token_cannot_plant_part_writes``);
- ExportCollection answered a read-only token (the role x method matrix);
- a follower coordinator forwarded a write with no token, so a read-write caller got
  AuthenticationError (``test_matrix_on_a_coordinator_and_forwarded_writes``).
"""

from __future__ import annotations

import numpy as np
import pytest

from simsearch.service import auth
from simsearch.service.errors import (
    FencedPartError,
    NotPartReplicaError,
    PermissionDeniedError,
)
from simsearch.service.protos.simsearch.v1 import simsearch_pb2 as pb
from simsearch.service.shardclient import connect_shard

grpc = pytest.importorskip("grpc")

DIM = 4
TOKENS = {"read-only": "ro-" + "a" * 30, "read-write": "rw-" + "b" * 30,
          "cluster": "cl-" + "c" * 30}
SERVICE = pb.DESCRIPTOR.services_by_name["SimSearch"]


def _tokens_file(tmp_path):
    path = tmp_path / "tokens"
    path.write_text("".join(f"{role} {tok}\n" for role, tok in TOKENS.items()))
    return path


def test_every_rpc_of_the_proto_is_classified():
    """A new RPC added to the proto without a line in auth.METHOD_CLASS fails here (and is
    refused to every role by the server: deny by default)."""
    methods = {f"/{SERVICE.full_name}/{m.name}" for m in SERVICE.methods}
    assert methods - set(auth.METHOD_CLASS) == set()
    assert all(auth.METHOD_CLASS[m] in (auth.READ, auth.WRITE, auth.ADMIN, auth.INTERNAL)
               for m in methods)
    assert not auth.allowed(auth.CLUSTER, "/simsearch.v1.SimSearch/NotAMethod")


def _request(method: str, col: str):
    """A small, well-formed request for ``method`` on collection ``col`` (for streams: an
    iterator of chunks)."""
    x = np.ones((1, DIM), np.float32)
    m = pb.Matrix(data=x.tobytes(), rows=1, cols=DIM)
    return {
        "ServerInfo": lambda: pb.ServerInfoRequest(),
        "ListCollections": lambda: pb.ListCollectionsRequest(),
        "DescribeCollection": lambda: pb.CollectionRequest(name=col),
        "Search": lambda: pb.SearchRequest(collection=col, queries=m, k=1),
        "Get": lambda: pb.GetRequest(collection=col, all=True),
        "Train": lambda: pb.TrainRequest(collection=col, vectors=m),
        "Add": lambda: pb.AddRequest(collection=col, vectors=m, auto_ids=True),
        "Remove": lambda: pb.RemoveRequest(collection=col, ids=[10**9], missing_ok=True),
        "CreateCollection": lambda: pb.CreateCollectionRequest(name=col + "-new", dim=DIM,
                                                              metric="l2", kind="flat"),
        "DropCollection": lambda: pb.CollectionRequest(name=col + "-absent"),
        "Snapshot": lambda: pb.CollectionRequest(name=col),
        "ExportCollection": lambda: pb.CollectionRequest(name=col),
        "ImportCollection": lambda: iter([pb.SnapshotChunk(collection=col + "-imp",
                                                           config_json="{}")]),
        "PartPrepare": lambda: pb.PartPrepareRequest(collection=col, term=1, attempt=1),
        "PartSync": lambda: pb.PartSyncRequest(collection=col, term=1),
        "PartOps": lambda: pb.PartOpsRequest(collection=col),
        "PutBlob": lambda: iter([pb.SnapshotChunk(collection="b1", config_json="{}")]),
        "GetBlob": lambda: pb.CollectionRequest(name="b1"),
        "DeleteBlob": lambda: pb.CollectionRequest(name="b1"),
        "ListBlobs": lambda: pb.ListCollectionsRequest(),
    }[method]()


def _call(channel, method, col: str, token: str | None):
    """The status code of one call (OK or the error's)."""
    desc = SERVICE.methods_by_name[method]
    path = f"/{SERVICE.full_name}/{method}"
    kw = {"request_serializer": lambda r: r.SerializeToString(),
          "response_deserializer": lambda b: b}
    if desc.client_streaming:
        fn = channel.stream_unary(path, **kw)
    elif desc.server_streaming:
        fn = channel.unary_stream(path, **kw)
    else:
        fn = channel.unary_unary(path, **kw)
    meta = (("authorization", f"Bearer {token}"),) if token else ()
    try:
        out = fn(_request(method, col), timeout=20, metadata=meta)
        if desc.server_streaming:
            list(out)
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


def _check_matrix(address: str, col: str) -> dict:
    """Every role x every method: refused with PERMISSION_DENIED exactly when the role lacks
    the method's class; a call without a token is UNAUTHENTICATED."""
    seen = {}
    with grpc.insecure_channel(address) as channel:
        for m in SERVICE.methods:
            path = f"/{SERVICE.full_name}/{m.name}"
            assert _call(channel, m.name, col, None) == grpc.StatusCode.UNAUTHENTICATED
            for role, token in TOKENS.items():
                code = _call(channel, m.name, col, token)
                seen[(role, m.name)] = code
                if auth.allowed(role, path):
                    assert code not in (grpc.StatusCode.PERMISSION_DENIED,
                                        grpc.StatusCode.UNAUTHENTICATED), (role, m.name, code)
                else:
                    assert code == grpc.StatusCode.PERMISSION_DENIED, (role, m.name, code)
    return seen


def test_role_method_matrix_on_a_node(server_factory, tmp_path):
    server = server_factory("--tokens-file", str(_tokens_file(tmp_path)))
    rw = server.client(token=TOKENS["read-write"], timeout=20)
    rw.create_collection("m", DIM, "l2", "flat").add(np.eye(DIM))
    seen = _check_matrix(server.address, "m")
    # the internal calls the cluster role may make still refuse an ordinary collection
    assert seen[("cluster", "PartPrepare")] == grpc.StatusCode.FAILED_PRECONDITION
    assert seen[("read-only", "ExportCollection")] == grpc.StatusCode.PERMISSION_DENIED
    assert seen[("read-write", "ExportCollection")] == grpc.StatusCode.OK


def test_read_only_token_cannot_plant_part_writes(server_factory, tmp_path):
    """The defect: PartPrepare / PartSync were open to read-only tokens, and any collection
    turned into a part replica on its first part write."""
    from simsearch.service.fenced import PartOp

    server = server_factory("--tokens-file", str(_tokens_file(tmp_path)))
    rw = server.client(token=TOKENS["read-write"], timeout=20)
    col = rw.create_collection("docs", DIM, "ip", "flat")
    col.add(np.eye(DIM))
    planted = PartOp(1, False, np.array([77]), np.full((1, DIM), 9.0, np.float32))
    for role in ("read-only", "read-write"):
        c = connect_shard(server.address, token=TOKENS[role], timeout=20)
        with pytest.raises(PermissionDeniedError):
            c.part_prepare("docs", 10**12, 1, [planted])
        with pytest.raises(PermissionDeniedError):
            c.part_sync("docs", 10**12, (10**12, 1), 1, 1)
    # the cluster role may call them, but an ordinary collection is not a part replica
    cl = connect_shard(server.address, token=TOKENS["cluster"], timeout=20)
    with pytest.raises(NotPartReplicaError):
        cl.part_prepare("docs", 1, 1, [planted])
    with pytest.raises(PermissionDeniedError):  # nor can read-write create one
        rw.create_collection("part", DIM, "ip", "flat", part_replica=True)
    config, data = rw.export_collection("docs")
    with pytest.raises(PermissionDeniedError):  # or import one (a replica's fencing state)
        rw.import_collection("docs2", {**config, "part_state": {"term": 10**12, "attempt": 1,
                                                                "applied": 0}}, data)
    rw.import_collection("docs2", config, data)  # a plain restore is read-write's to make
    col.add(np.ones((1, DIM)), ids=[5])  # the owner still writes
    assert 77 not in col.search(np.full((1, DIM), 9.0), 5).ids
    # a part created as one takes part writes only
    part = cl.create_collection("part", DIM, "ip", "flat", part_replica=True)
    assert cl.part_prepare("part", 1, 1, [planted])["applied"] == 0
    with pytest.raises(FencedPartError):
        part.add(np.ones((1, DIM)))
    assert server.stop() == 0


def test_matrix_on_a_coordinator_and_forwarded_writes(tmp_path):
    """A cluster whose every member checks tokens: the matrix holds on the leader and on a
    follower, and a follower forwards a read-write caller's writes with its token (the defect:
    it forwarded them with none, so the leader answered UNAUTHENTICATED)."""
    import simsearch as ss
    from simsearch.pyramid.launcher import LocalCluster

    tokens = _tokens_file(tmp_path)
    with LocalCluster(tmp_path / "cl", 2, 2, "--coordinators", "2", "--no-restart",
                      "--tokens-file", str(tokens)) as cl:
        leader = cl.coordinator
        follower = next(a for a in cl.coordinators if a != leader)
        rng = np.random.default_rng(0)
        base = rng.standard_normal((300, DIM)).astype(np.float32)
        with ss.connect(follower, token=TOKENS["read-write"], timeout=60) as c:
            col = c.create_collection("docs", DIM, "ip", "pyramid", n_centers=8,
                                      n_partitions=2, mips_replicas=4,
                                      sub_index="flat")  # forwarded
            col.train(base)
            col.add(base)  # forwarded with the caller's token
            assert len(col) == 300
            ro = ss.connect(follower, token=TOKENS["read-only"], timeout=60).collection("docs")
            with pytest.raises(PermissionDeniedError):
                ro.add(base[:1])
            assert len(ro) == 300
        for address in (leader, follower):
            _check_matrix(address, "docs")
