"""Thousands of malformed requests get the right status code; the server keeps serving."""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import unique_name
from simsearch import errors
from simsearch.service import errors as serrors
from simsearch.service.errors import ERROR_TYPE_KEY, code_for
from simsearch.service.protos.simsearch.v1 import simsearch_pb2 as pb
from simsearch.service.protos.simsearch.v1 import simsearch_pb2_grpc as pb_grpc

DIM = 8
FUZZ = settings(
    max_examples=1200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
IA, NF, AE = "INVALID_ARGUMENT", "NOT_FOUND", "ALREADY_EXISTS"


@pytest.fixture(scope="module")
def node(shared_server, shared_client):
    name = unique_name("fuzz")
    # hnsw, not flat: a search parameter of the wrong type must reach the index's type check
    # (flat takes no parameters, so it would refuse every one by name)
    col = shared_client.create_collection(name, DIM, "cosine", "hnsw", M=8, ef_construction=32)
    col.add(np.random.default_rng(0).standard_normal((50, DIM)), ids=np.arange(50))
    channel = grpc.insecure_channel(shared_server.address)
    yield pb_grpc.SimSearchStub(channel), name, shared_client
    channel.close()


def _matrix(rng_seed: int, rows: int, cols: int, poison: str | None = None) -> pb.Matrix:
    x = np.random.default_rng(rng_seed).standard_normal((rows, cols)).astype("<f4")
    if poison and rows:
        x[rows // 2, cols // 2] = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}.get(poison, 0)
        if poison == "zero":
            x[rows // 2] = 0
    return pb.Matrix(data=x.tobytes(), rows=rows, cols=cols)


rows = st.integers(1, 20)
seeds = st.integers(0, 2**16)


@st.composite
def bad_search(draw):
    kind = draw(
        st.sampled_from(
            [
                "dim",
                "poison",
                "k_low",
                "k_high",
                "bytes",
                "collection",
                "params_json",
                "unknown_param",
                "param_type",
            ]
        )
    )
    n, seed = draw(rows), draw(seeds)
    req = pb.SearchRequest(collection="", queries=_matrix(seed, n, DIM), k=draw(st.integers(1, 50)))
    if kind == "dim":
        req.queries.CopyFrom(_matrix(seed, n, draw(st.integers(0, 40).filter(lambda d: d != DIM))))
    elif kind == "poison":
        req.queries.CopyFrom(
            _matrix(seed, n, DIM, draw(st.sampled_from(["nan", "inf", "-inf", "zero"])))
        )
    elif kind == "k_low":
        req.k = 0
    elif kind == "k_high":
        req.k = draw(st.integers(100_001, 2**32 - 1))
    elif kind == "bytes":
        data = req.queries.data
        cut = draw(st.integers(0, len(data) + 64).filter(lambda c: c != len(data)))
        req.queries.data = (data + draw(st.binary(min_size=64, max_size=64)))[:cut]
    elif kind == "collection":
        req.collection = draw(
            st.text(min_size=1, max_size=20).filter(lambda s: not s.startswith("fuzz"))
        )
        return req, NF
    elif kind == "params_json":
        req.params_json = draw(st.sampled_from(["{", "[1, 2]", "3", '"ef"', "null", "{'a': 1}"]))
    elif kind == "unknown_param":
        known = {"ef", "n_threads"}  # the hnsw collection's own parameters
        name_ = draw(st.text(min_size=1, max_size=8).filter(lambda t: t not in known))
        req.params_json = json.dumps({name_: 1})
    elif kind == "param_type":
        req.params_json = json.dumps({"ef": draw(st.sampled_from([1.5, "x", [[1]], 0, -3]))})
    return req, IA


def test_a_mistyped_parameter_reaches_the_type_check(node):
    stub, name, _ = node
    req = pb.SearchRequest(collection=name, queries=_matrix(0, 2, DIM), k=3,
                           params_json=json.dumps({"ef": "x"}))
    with pytest.raises(grpc.RpcError) as ei:
        stub.Search(req, timeout=10)
    assert ei.value.code().name == IA and "ef must be an integer" in ei.value.details()


@st.composite
def bad_write(draw):
    kind = draw(
        st.sampled_from(
            [
                "dim",
                "poison",
                "bytes",
                "negative_id",
                "dup_in_batch",
                "existing_id",
                "ids_len",
                "remove_unknown",
                "remove_dup",
                "remove_negative",
                "collection",
                "create",
            ]
        )
    )
    n, seed = draw(rows), draw(seeds)
    fresh = draw(st.lists(st.integers(10**6, 10**12), min_size=n, max_size=n, unique=True))
    req = pb.AddRequest(collection="", vectors=_matrix(seed, n, DIM), ids=fresh)
    if kind == "dim":
        req.vectors.CopyFrom(_matrix(seed, n, draw(st.integers(0, 40).filter(lambda d: d != DIM))))
    elif kind == "poison":
        req.vectors.CopyFrom(_matrix(seed, n, DIM, draw(st.sampled_from(["nan", "inf", "zero"]))))
    elif kind == "bytes":
        data = req.vectors.data
        req.vectors.data = data[: draw(st.integers(0, len(data) - 1))]
    elif kind == "negative_id":
        req.ids[draw(st.integers(0, n - 1))] = draw(st.integers(-(2**63), -1))
    elif kind == "dup_in_batch":
        if n == 1:
            req.vectors.CopyFrom(_matrix(seed, 2, DIM))
            req.ids[:] = [10**6, 10**6]
        else:
            req.ids[n - 1] = req.ids[0]
    elif kind == "existing_id":
        req.ids[draw(st.integers(0, n - 1))] = draw(st.integers(0, 49))
        return "Add", req, AE
    elif kind == "ids_len":
        del req.ids[draw(st.integers(0, n - 1))]
    elif kind == "remove_unknown":
        return "Remove", pb.RemoveRequest(collection="", ids=fresh), NF
    elif kind == "remove_dup":
        return "Remove", pb.RemoveRequest(collection="", ids=[3, 3]), IA
    elif kind == "remove_negative":
        return "Remove", pb.RemoveRequest(collection="", ids=[1, -5]), IA
    elif kind == "collection":
        req.collection = draw(
            st.text(min_size=1, max_size=20).filter(lambda s: not s.startswith("fuzz"))
        )
        return "Add", req, NF
    elif kind == "create":
        good = {"name": "fz-" + str(seed), "dim": DIM, "metric": "l2", "kind": "flat"}
        field, value = draw(
            st.sampled_from(
                [
                    ("name", ""),
                    ("name", "../etc"),
                    ("name", ".hidden"),
                    ("name", "a/b"),
                    ("name", "x" * 200),
                    ("dim", 0),
                    ("dim", 70000),
                    ("metric", "hamming"),
                    ("kind", "no-such-kind"),
                    ("params_json", "{"),
                    ("params_json", "[]"),
                    ("params_json", '{"bogus": 1}'),
                ]
            )
        )
        return "CreateCollection", pb.CreateCollectionRequest(**dict(good, **{field: value})), IA
    return "Add", req, IA


def _expect(call, req, code: str, name: str):
    if getattr(req, "collection", None) == "":  # the fuzz collection, unless a case named another
        req.collection = name
    with pytest.raises(grpc.RpcError) as ei:
        call(req, timeout=10)
    err = ei.value
    assert err.code().name == code, (err.code(), err.details(), req)
    details = err.details() or ""
    assert (
        details and "Traceback" not in details and "/work" not in details and ".py" not in details
    )


@FUZZ
@given(case=bad_search())
def test_malformed_searches(node, case):
    stub, name, _ = node
    req, code = case
    _expect(stub.Search, req, code, name)


@FUZZ
@given(case=bad_write())
def test_malformed_writes(node, case):
    stub, name, _ = node
    method, req, code = case
    _expect(getattr(stub, method), req, code, name)


def test_still_serving_after_fuzz(node, shared_server):
    stub, name, client = node
    assert shared_server.proc.poll() is None
    assert client.health() == "SERVING"
    col = client.collection(name)
    assert len(col) == 50  # no malformed write changed anything
    r = col.search(np.ones(DIM), 5)
    assert r.ids.shape == (1, 5) and (r.ids >= 0).all()


def test_error_types_cross_the_wire(node):
    """The client raises the class the server raised; the metadata names it."""
    stub, name, client = node
    col = client.collection(name)
    with pytest.raises(errors.DuplicateIdError):
        col.add(np.ones((1, DIM)), ids=[3])
    with pytest.raises(errors.UnknownIdError):
        col.remove([10**9])
    with pytest.raises(serrors.CollectionNotFoundError):
        client.collection("no-such")
    with pytest.raises(errors.InvalidParameterError, match="unknown search parameter"):
        col.search(np.ones(DIM), 3, bogus=1)
    with pytest.raises(grpc.RpcError) as ei:
        stub.Search(pb.SearchRequest(collection=name, queries=_matrix(0, 1, DIM), k=0))
    assert dict(ei.value.trailing_metadata())[ERROR_TYPE_KEY] == "InvalidParameterError"


def test_bad_queries_are_typed_on_either_client_path(node):
    """An unfiltered float32 batch goes out without the client's own pass over its values
    (RemoteCollection.search's one-message path): the server's refusal must come back as the
    same class and message the client's check gives on the planned path (seen failing with the
    server's finiteness check removed: the NaN query was answered)."""
    _, name, client = node
    col = client.collection(name)
    nan = np.ones((2, DIM), np.float32)
    nan[1, 3] = np.nan
    zero = np.zeros((1, DIM), np.float32)
    for filt in ({}, {"allow": np.arange(50)}):  # the one-message path, then the plan
        with pytest.raises(errors.InvalidVectorError, match="must be finite; row 1"):
            col.search(nan, 3, **filt)
        with pytest.raises(errors.InvalidVectorError, match="non-zero under the cosine"):
            col.search(zero, 3, **filt)
        with pytest.raises(errors.DimensionMismatchError):
            col.search(np.ones((1, DIM + 1), np.float32), 3, **filt)
        with pytest.raises(errors.InvalidParameterError, match="k must be"):
            col.search(np.ones((1, DIM), np.float32), 0, **filt)


@pytest.mark.parametrize(
    "exc,code",
    [
        (errors.InvalidParameterError("x"), "INVALID_ARGUMENT"),
        (errors.DimensionMismatchError("x"), "INVALID_ARGUMENT"),
        (errors.InvalidVectorError("x"), "INVALID_ARGUMENT"),
        (errors.InvalidIdError("x"), "INVALID_ARGUMENT"),
        (errors.DuplicateIdError("x"), "ALREADY_EXISTS"),
        (errors.UnknownIdError("x"), "NOT_FOUND"),
        (errors.NotTrainedError("x"), "FAILED_PRECONDITION"),
        (errors.UnsupportedOperationError("x"), "UNIMPLEMENTED"),
        (errors.CorruptIndexError("x"), "DATA_LOSS"),
        (serrors.CollectionNotFoundError("x"), "NOT_FOUND"),
        (serrors.CollectionExistsError("x"), "ALREADY_EXISTS"),
        (serrors.ResourceExhaustedError("x"), "RESOURCE_EXHAUSTED"),
        (serrors.ServiceUnavailableError("x"), "UNAVAILABLE"),
        (serrors.DeadlineExceededError("x"), "DEADLINE_EXCEEDED"),
        (RuntimeError("secret /path"), "INTERNAL"),
    ],
)
def test_status_code_table(exc, code):
    assert code_for(exc) == code


def test_a_passed_on_status_keeps_its_code():
    """An error a client raised for a server's status its classes do not name (a ServiceError
    given the code) keeps that code when a coordinator passes it on; the one table gave
    UNKNOWN for CANCELLED here before code_for read the given code."""
    from simsearch.service.errors import ServiceError

    assert code_for(ServiceError("a shard cancelled the call", "CANCELLED")) == "CANCELLED"
    assert code_for(ServiceError("no code given")) == "UNKNOWN"
