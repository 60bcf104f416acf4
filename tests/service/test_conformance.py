"""The protocol is the contract: a client in another language, written by no one here, drives
every RPC of simsearch.v1 (and health and reflection) without deadlines, with tokens, with
oversized and malformed fields, and gets what the Python side gets (docs/service.md, "Clients
in other languages").

Node.js runs tests/conformance/run_plan.js with ``@grpc/grpc-js`` and ``@grpc/proto-loader``
(pinned in tests/conformance/package.json, installed here by ``npm ci``). The same plan runs
through a Python stub against a second node started alike: the two transcripts must be equal,
call for call (status, message, answer), none INTERNAL; the Python client's own answers are
checked against the Node ones too.

The defects this was written against (91334ed): every write without a deadline answered
INTERNAL (a lock timeout of ~2^63 ns), request bytes that were not the method's message
answered INTERNAL (gRPC's own deserializer), an integer filter value past 64 bits answered
INTERNAL with a traceback in the node's log, and a lower-case ``bearer`` was refused."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.protobuf import json_format
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

import simsearch as ss
from simsearch.service.errors import code_for
from simsearch.service.protos.simsearch.v1 import simsearch_pb2 as pb

HERE = Path(__file__).resolve().parent.parent / "conformance"
PROTO = Path(pb.__file__).resolve().with_name("simsearch.proto")
TOKENS = {"read-only": "tok-read", "read-write": "tok-write", "cluster": "tok-cluster"}
MAX_MESSAGE = 1 << 20
DIM = 8
SERVICES = {
    "simsearch.v1.SimSearch": pb.DESCRIPTOR.services_by_name["SimSearch"],
    "grpc.health.v1.Health": health_pb2.DESCRIPTOR.services_by_name["Health"],
    "grpc.reflection.v1alpha.ServerReflection":
        reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"],
}


@pytest.fixture(scope="module")
def node_modules():
    """``npm ci`` of the pinned packages (from the npm registry, once per checkout)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.fail("Node.js and npm are needed for the conformance suite (node 20 is on the "
                    "machines this project runs on)")
    stamp = HERE / "node_modules" / ".simsearch-lock-sha256"
    want = hashlib.sha256((HERE / "package-lock.json").read_bytes()).hexdigest()
    if not (stamp.exists() and stamp.read_text() == want):
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"], cwd=HERE,
                       check=True, timeout=600, stdout=subprocess.DEVNULL)
        stamp.write_text(want)
    return HERE / "node_modules"


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def _matrix(x: np.ndarray) -> dict:
    x = np.ascontiguousarray(x, "<f4")
    return {"data": _b64(x.tobytes()), "rows": x.shape[0], "cols": x.shape[1]}


def _ids(ids) -> str:
    return _b64(np.asarray(ids, "<i8").tobytes())


def _bearer(role: str | None, scheme: str = "Bearer") -> str | None:
    return None if role is None else f"{scheme} {TOKENS.get(role, role)}"


def _plan(x: np.ndarray, q: np.ndarray, export: tuple[dict, bytes]) -> list[dict]:
    """(step, expected status) in order: every RPC of the proto at least once, and the ways a
    client in another language gets a request wrong."""
    S, H, R = SERVICES
    steps: list[tuple[dict, str]] = []

    def call(method, request=None, role="read-write", expect="OK", service=S, **kw):
        step = {"service": service, "method": method, "token": _bearer(role), **kw}
        if request is not None:
            step["request"] = request
        steps.append((step, expect))

    col = {"name": "docs", "dim": DIM, "metric": "l2", "kind": "flat"}
    call("ServerInfo", {}, role="read-only")
    call("Check", {}, role=None, service=H)
    call("Check", {"service": S}, role=None, service=H)
    call("ServerReflectionInfo", role="read-only", service=R,
         requests=[{"list_services": ""}, {"file_containing_symbol": S}])
    # auth: none, unknown, too weak, and the scheme in any case
    call("CreateCollection", col, role=None, expect="UNAUTHENTICATED")
    call("CreateCollection", col, role="nope", expect="UNAUTHENTICATED")
    call("CreateCollection", col, role="read-only", expect="PERMISSION_DENIED")
    call("CreateCollection", {**col, "params_json": "{"}, expect="INVALID_ARGUMENT")
    call("CreateCollection", {**col, "name": "a\u0000b"}, expect="INVALID_ARGUMENT")
    call("CreateCollection", {**col, "metric": "hamming"}, expect="INVALID_ARGUMENT")
    call("CreateCollection", {**col, "dim": 0}, expect="INVALID_ARGUMENT")
    call("CreateCollection", col)
    call("CreateCollection", col, expect="ALREADY_EXISTS")
    call("CreateCollection", {"name": "graph", "dim": DIM, "metric": "ip", "kind": "hnsw",
                              "params_json": '{"M": 8}'}, token=f"bearer {TOKENS['read-write']}")
    call("ListCollections", {}, role="read-only")
    call("DescribeCollection", {"name": "docs"}, role="read-only")
    call("DescribeCollection", {"name": "nothing"}, role="read-only", expect="NOT_FOUND")
    # writes, none with a deadline
    attrs = {"colour": ["red", "blue"] * 20, "n": list(range(40))}
    call("Add", {"collection": "docs", "vectors": _matrix(x[:40]), "ids": list(range(40)),
                 "attributes_json": json.dumps(attrs)})
    call("Add", {"collection": "docs", "vectors": _matrix(x[40:60]), "auto_ids": True})
    call("Add", {"collection": "graph", "vectors": _matrix(x), "auto_ids": True})
    call("Add", {"collection": "docs", "vectors": _matrix(x[:2, :7]), "auto_ids": True},
         expect="INVALID_ARGUMENT")
    bad = _matrix(x[:2])
    call("Add", {"collection": "docs", "vectors": {**bad, "rows": 3}, "auto_ids": True},
         expect="INVALID_ARGUMENT")
    nan = x[:1].copy()
    nan[0, 0] = np.nan
    call("Add", {"collection": "docs", "vectors": _matrix(nan), "auto_ids": True},
         expect="INVALID_ARGUMENT")
    call("Add", {"collection": "docs", "vectors": _matrix(x[:1]), "ids": [3]},
         expect="ALREADY_EXISTS")
    call("Add", {"collection": "docs", "vectors": _matrix(x[:1]), "ids": [-5]},
         expect="INVALID_ARGUMENT")
    call("Add", {"collection": "docs", "vectors": _matrix(x[:1]), "auto_ids": True},
         role="read-only", expect="PERMISSION_DENIED")
    big = np.ones((MAX_MESSAGE // (4 * DIM) + 10, DIM), np.float32)
    call("Add", {"collection": "docs", "vectors": _matrix(big), "auto_ids": True},
         expect="RESOURCE_EXHAUSTED")
    call("Add", raw=_b64(b"\xff\xff\xff\xff"), expect="INVALID_ARGUMENT")
    call("Add", {"collection": "docs", "vectors": _matrix(x[:1]), "ids": [100],
                 "attributes_json": "[1, 2"}, expect="INVALID_ARGUMENT")
    # reads
    call("Search", {"collection": "docs", "queries": _matrix(q), "k": 5}, role="read-only")
    call("Search", {"collection": "graph", "queries": _matrix(q), "k": 5,
                    "params_json": '{"ef": 32}'}, role="read-only")
    call("Search", {"collection": "docs", "queries": _matrix(q), "k": 5,
                    "where_json": '{"colour": "red", "n": {"$lt": 30}}'}, role="read-only")
    call("Search", {"collection": "docs", "queries": _matrix(q), "k": 5,
                    "allow": {"ids": _ids([1, 2, 3, 50])}, "deny": {"ids": _ids([2])}},
         role="read-only")
    for req, code in (
        ({"k": 0}, "INVALID_ARGUMENT"), ({"k": 1_000_000}, "INVALID_ARGUMENT"),
        ({"params_json": '{"ef": 10}'}, "INVALID_ARGUMENT"),
        ({"where_json": "{not json"}, "INVALID_ARGUMENT"),
        ({"where_json": json.dumps({"n": 2**70})}, "INVALID_ARGUMENT"),
        ({"where_json": json.dumps({"$and": [{}] * 5000})}, "INVALID_ARGUMENT"),
        ({"where_json": '{"nope": 1}'}, "INVALID_ARGUMENT"),
        ({"allow": {"ids": _b64(b"\1\2\3")}}, "INVALID_ARGUMENT"),
        ({"queries": _matrix(q[:, :5])}, "INVALID_ARGUMENT"),
        ({"collection": "nothing"}, "NOT_FOUND"),
    ):
        call("Search", {"collection": "docs", "queries": _matrix(q), "k": 5, **req},
             role="read-only", expect=code)
    call("Search", raw=_b64(b"\x0a\xff"), role="read-only", expect="INVALID_ARGUMENT")
    call("Get", {"collection": "docs", "ids": _ids([0, 1, 99, 45]), "vectors": True},
         role="read-only")
    call("Get", {"collection": "docs", "all": True, "where_json": '{"colour": "blue"}'},
         role="read-only")
    call("Get", {"collection": "docs", "ids": _b64(b"\0" * 5)}, role="read-only",
         expect="INVALID_ARGUMENT")
    call("Remove", {"collection": "docs", "ids": [0, 1]})
    call("Remove", {"collection": "docs", "ids": [12345]}, expect="NOT_FOUND")
    call("Remove", {"collection": "docs", "ids": [12345], "missing_ok": True})
    call("Train", {"collection": "docs", "vectors": _matrix(x)})
    call("Train", {"collection": "docs"}, expect="INVALID_ARGUMENT")
    call("Train", {"collection": "docs", "vectors": _matrix(x)}, role="read-only",
         expect="PERMISSION_DENIED")
    call("Snapshot", {"name": "docs"})
    call("Search", {"collection": "docs", "queries": _matrix(q), "k": 5}, role="read-only")
    # streams: export, import (restore) a copy, a damaged copy and a malformed config
    call("ExportCollection", {"name": "docs"})
    call("ExportCollection", {"name": "docs"}, role="read-only", expect="PERMISSION_DENIED")
    config, data = export
    chunks = [{"collection": "copy", "config_json": json.dumps(config)},
              {"data": _b64(data[: len(data) // 2])}, {"data": _b64(data[len(data) // 2:])}]
    call("ImportCollection", requests=chunks)
    call("Search", {"collection": "copy", "queries": _matrix(q), "k": 5}, role="read-only")
    damaged = bytearray(data)
    damaged[len(damaged) // 2] ^= 0xFF
    call("ImportCollection", requests=[chunks[0], {"data": _b64(bytes(damaged))}],
         expect="DATA_LOSS")
    call("ImportCollection", requests=[{**chunks[0], "config_json": '{"dim": "8"}'},
                                       *chunks[1:]], expect="INVALID_ARGUMENT")
    call("ImportCollection", requests=[{"config_json": "{}"}], expect="INVALID_ARGUMENT")
    call("DescribeCollection", {"name": "copy"}, role="read-only")
    # the cluster's calls: blobs and fenced part writes
    blob = b"router checkpoint \x00\xff" * 10
    put = [{"collection": "ckpt", "config_json": json.dumps(
        {"sha256": hashlib.sha256(blob).hexdigest()})}, {"data": _b64(blob)}]
    call("PutBlob", requests=put, role="read-write", expect="PERMISSION_DENIED")
    call("PutBlob", requests=put, role="cluster")
    call("PutBlob", requests=[{**put[0], "config_json": '{"sha256": "00"}'}, put[1]],
         role="cluster", expect="INVALID_ARGUMENT")
    call("ListBlobs", {}, role="cluster")
    call("GetBlob", {"name": "ckpt"}, role="cluster")
    call("GetBlob", {"name": "none"}, role="cluster", expect="NOT_FOUND")
    call("DeleteBlob", {"name": "ckpt"}, role="cluster")
    call("CreateCollection", {"name": "part0", "dim": DIM, "metric": "l2", "kind": "flat",
                              "part_replica": True}, role="read-write",
         expect="PERMISSION_DENIED")
    call("CreateCollection", {"name": "part0", "dim": DIM, "metric": "l2", "kind": "flat",
                              "part_replica": True}, role="cluster")
    op = {"pseq": 1, "vectors": _matrix(x[:3]), "ids": _ids([7, 8, 9])}
    call("PartPrepare", {"collection": "part0", "term": 5, "attempt": 1, "ops": [op]},
         role="cluster")
    call("PartPrepare", {"collection": "docs", "term": 5, "attempt": 1, "ops": [op]},
         role="cluster", expect="FAILED_PRECONDITION")
    call("PartSync", {"collection": "part0", "term": 5, "ballot_term": 5, "ballot_attempt": 1,
                      "first": 1, "through": 1}, role="cluster")
    call("PartSync", {"collection": "part0", "term": 4}, role="cluster",
         expect="FAILED_PRECONDITION")
    call("PartOps", {"collection": "part0", "after": 0}, role="cluster")
    call("PartOps", {"collection": "part0", "after": 0}, role="read-write",
         expect="PERMISSION_DENIED")
    call("Add", {"collection": "part0", "vectors": _matrix(x[:1]), "auto_ids": True},
         expect="FAILED_PRECONDITION")
    call("DropCollection", {"name": "copy"})
    call("DropCollection", {"name": "copy"}, expect="NOT_FOUND")
    call("ListCollections", {}, role="read-only")
    return steps


def _method(step: dict):
    return SERVICES[step["service"]].methods_by_name[step["method"]]


def _normalise(step: dict, responses: list) -> list:
    """Answers as proto3 JSON with the field names: one form for both languages."""
    cls = GetMessageClass(_method(step).output_type)
    out = []
    for r in responses:
        msg = r if isinstance(r, cls) else json_format.ParseDict(r, cls(),
                                                               ignore_unknown_fields=True)
        out.append(json_format.MessageToDict(msg, preserving_proto_field_name=True))
    return out


def _run_python(address: str, steps: list[dict]) -> list[dict]:
    """The plan through grpcio's stub, each call with a deadline, as the Python client sends."""
    out = []
    with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", -1),
                                                 ("grpc.max_receive_message_length", -1)]) as ch:
        for step in steps:
            m = _method(step)
            req_cls, resp_cls = GetMessageClass(m.input_type), GetMessageClass(m.output_type)
            kind = {(False, False): ch.unary_unary, (False, True): ch.unary_stream,
                    (True, False): ch.stream_unary, (True, True): ch.stream_stream}[
                m.client_streaming, m.server_streaming]
            raw = "raw" in step
            fn = kind(f"/{step['service']}/{step['method']}",
                      request_serializer=(lambda b: b) if raw else req_cls.SerializeToString,
                      response_deserializer=resp_cls.FromString)
            reqs = [base64.b64decode(step["raw"])] if raw else [
                json_format.ParseDict(r, req_cls()) for r in
                step.get("requests", [step.get("request")])]
            md = [("authorization", step["token"])] if step["token"] is not None else None
            try:
                arg = iter(reqs) if m.client_streaming else reqs[0]
                got = fn(arg, timeout=60, metadata=md)
                responses = list(got) if m.server_streaming else [got]
                out.append({"code": "OK", "details": "", "responses": responses})
            except grpc.RpcError as exc:
                out.append({"code": exc.code().name, "details": exc.details() or "",
                            "responses": []})
    return out


def _run_node(address: str, steps: list[dict], node_modules: Path) -> list[dict]:
    health = node_modules / "grpc-health-check" / "proto" / "health" / "v1" / "health.proto"
    refl = (node_modules / "@grpc" / "reflection" / "build" / "proto" / "grpc" / "reflection" /
            "v1alpha" / "reflection.proto")
    plan = {"address": address, "steps": steps, "protos": [str(PROTO), str(health), str(refl)]}
    proc = subprocess.run(["node", str(HERE / "run_plan.js")], input=json.dumps(plan),
                          capture_output=True, text=True, timeout=300, cwd=HERE)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def transcripts(node_modules, tmp_path_factory):
    from nodeproc import ServerProcess

    base = tmp_path_factory.mktemp("conformance")
    tokens = base / "tokens"
    tokens.write_text("".join(f"{role} {tok}\n" for role, tok in TOKENS.items()))
    tokens.chmod(0o600)
    args = ("--tokens-file", str(tokens), "--reflection", "--max-message-bytes",
            str(MAX_MESSAGE))
    rng = np.random.default_rng(7)
    x = rng.standard_normal((60, DIM)).astype(np.float32)
    q = rng.standard_normal((3, DIM)).astype(np.float32)
    with ss.connect(":memory:") as mem:  # the bytes a restore sends: another node's export
        mem.create_collection("docs", DIM, "l2", "flat").add(x[:10])
        export = mem.export_collection("docs")
    plan = _plan(x, q, export)
    steps = [s for s, _ in plan]
    servers = [ServerProcess(base / "js", *args), ServerProcess(base / "py", *args)]
    try:
        node = _run_node(servers[0].address, steps, node_modules)
        py = _run_python(servers[1].address, steps)
        with ss.connect(servers[1].address, token=TOKENS["read-write"]) as c:
            client = {"docs": c.collection("docs").search(q, 5),
                      "get": c.collection("docs").get([0, 1, 99, 45], vectors=True)}
    finally:
        for s in servers:
            s.kill()
    return plan, node, py, client, (x, q)


def test_every_rpc_of_the_proto_is_in_the_plan(transcripts):
    plan = transcripts[0]
    called = {(s["service"], s["method"]) for s, _ in plan}
    for name, service in SERVICES.items():
        missing = {m.name for m in service.methods} - {m for s, m in called if s == name}
        assert not missing or name != "simsearch.v1.SimSearch", missing
    assert ("grpc.health.v1.Health", "Check") in called


def test_node_gets_the_expected_status_for_every_call_and_never_internal(transcripts):
    plan, node, *_ = transcripts
    assert len(node) == len(plan)
    wrong = [(i, s["method"], want, got["code"], got["details"])
             for i, ((s, want), got) in enumerate(zip(plan, node, strict=True))
             if got["code"] != want]
    assert not wrong, "\n".join(map(str, wrong))
    assert all(a["code"] not in ("INTERNAL", "UNKNOWN") for a in node)


def test_node_and_python_transcripts_are_equal(transcripts):
    plan, node, py, *_ = transcripts
    for i, ((step, _), a, b) in enumerate(zip(plan, node, py, strict=True)):
        assert (a["code"], a["details"]) == (b["code"], b["details"]), (i, step["method"])
        assert _normalise(step, a["responses"]) == _normalise(step, b["responses"]), \
            (i, step["method"])


def test_the_python_client_answers_what_node_was_answered(transcripts):
    plan, node, _, client, (x, q) = transcripts
    searches = [i for i, (s, want) in enumerate(plan) if s["method"] == "Search" and
                want == "OK" and s["request"]["collection"] == "docs" and
                set(s["request"]) == {"collection", "queries", "k"}]
    last = node[searches[-1]]["responses"][0]  # after the removes and the snapshot
    ids = np.frombuffer(base64.b64decode(last["ids"]), "<i8").reshape(3, 5)
    scores = np.frombuffer(base64.b64decode(last["scores"]), "<f4").reshape(3, 5)
    np.testing.assert_array_equal(ids, client["docs"].ids)
    np.testing.assert_array_equal(scores, client["docs"].scores)
    gets = [i for i, (s, want) in enumerate(plan) if s["method"] == "Get" and want == "OK"]
    got = node[gets[0]]["responses"][0]
    want_ids = [0, 1, 45]
    assert np.frombuffer(base64.b64decode(got["ids"]), "<i8").tolist() == want_ids
    # the client ran after the removes of 0 and 1
    assert client["get"]["ids"].tolist() == [45]
    vec = np.frombuffer(base64.b64decode(got["vectors"]["data"]), "<f4").reshape(3, DIM)
    np.testing.assert_array_equal(vec, x[[0, 1, 45]])


def test_status_codes_match_the_python_clients_error_classes(transcripts):
    """Each status a call got is the one the Python client's typed error maps to."""
    plan, node, *_ = transcripts
    with ss.connect(":memory:") as mem:
        col = mem.create_collection("docs", DIM, "l2", "flat")
        col.add(np.ones((2, DIM), np.float32))
        for call, step_code in ((lambda: col.search(np.ones(DIM, np.float32), 0),
                                 "INVALID_ARGUMENT"),
                                (lambda: col.remove([12345]), "NOT_FOUND"),
                                (lambda: mem.collection("nothing"), "NOT_FOUND"),
                                (lambda: col.add(np.ones((1, DIM), np.float32), ids=[0]),
                                 "ALREADY_EXISTS")):
            with pytest.raises(Exception) as info:
                call()
            assert code_for(info.value) == step_code
            assert step_code in {a["code"] for a in node}
