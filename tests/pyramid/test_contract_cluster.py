"""The Index contract checks over a Pyramid coordinator: ``simsearch.connect(coordinator)``
behaves like a single node's client (a subset of tests/test_contract.py, to stay fast)."""

from __future__ import annotations

import inspect
import itertools

import numpy as np
import pytest

pytest.importorskip("grpc")

import simsearch as ss  # noqa: E402
import test_contract as tc  # noqa: E402
from contract import Case  # noqa: E402
from simsearch.datasets import synthetic_longtail  # noqa: E402
from simsearch.pyramid.coordinator import MAX_CLUSTER_NAME  # noqa: E402
from simsearch.pyramid.launcher import LocalCluster  # noqa: E402

_names = itertools.count()
CHECKS = [tc.test_recall_and_ordering, tc.test_padding_and_empty, tc.test_ids_continue,
          tc.test_remove, tc.test_single_query_and_batch_agree]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    cl = LocalCluster(tmp_path_factory.mktemp("contract-cluster"), 3, 2)
    yield ss.connect(cl.coordinator, timeout=60)
    cl.stop()


@pytest.fixture(scope="module")
def data():
    return synthetic_longtail(n=tc.N, dim=tc.DIM, n_queries=50, n_clusters=30, seed=7)


@pytest.fixture(scope="module")
def oracles(data):
    base, queries = data
    out = {}
    for m in ("ip", "l2"):
        f = ss.FlatIndex(tc.DIM, m)
        f.add(base)
        out[m] = f.search(queries, 100)
    return out


def case(client) -> Case:
    def make(d, m, x):
        col = client.create_collection(f"ct{next(_names)}", d, m, "pyramid", n_centers=48,
                                       n_partitions=3, mips_replicas=40, sub_index="hnsw",
                                       M=12, ef_construction=80)
        col.train(x)
        return col

    # observed recall@10 on the fixture: 1.0 (ip), 0.99 (l2), as in-process
    return Case("cluster-pyramid", make, search_kw={"branching": 6, "ef": 64}, min_recall=0.95)


# every check over "ip" (MIPS copies on); recall and ordering over "l2" too
PAIRS = [(c, "ip") for c in CHECKS] + [(tc.test_recall_and_ordering, "l2")]


@pytest.mark.parametrize("check,metric", PAIRS,
                         ids=[f"{c.__name__.removeprefix('test_')}-{m}" for c, m in PAIRS])
def test_contract_over_coordinator(check, metric, client, data, oracles):
    kw = {"case": case(client), "metric": metric, "data": data}
    if "oracles" in inspect.signature(check).parameters:
        kw["oracles"] = oracles
    check(**kw)


def test_a_cluster_name_leaves_room_for_its_parts_and_checkpoints(client):
    """A cluster collection's parts (``<name>.p<j>``) and router checkpoints
    (``<name>.router.<seq>.<i>``) are named after it, and a shard takes names of at most 128
    characters. Seen failing before: a 128-character name was created, then its parts could not
    be made on any shard and training it failed. Now the create is refused, saying why, and
    nothing is made."""
    from simsearch.errors import InvalidParameterError

    long = "n" * (MAX_CLUSTER_NAME + 1)
    with pytest.raises(InvalidParameterError, match="at most"):
        client.create_collection(long, tc.DIM, "l2", "pyramid", n_centers=8, n_partitions=2)
    assert long not in client.list_collections()
    ok = client.create_collection("n" * MAX_CLUSTER_NAME, tc.DIM, "l2", "pyramid", n_centers=8,
                                  n_partitions=2, sub_index="flat")
    ok.train(np.random.default_rng(0).standard_normal((200, tc.DIM)).astype(np.float32))
    ok.add(np.ones((3, tc.DIM), np.float32), ids=[1, 2, 3])
    assert len(ok) == 3
    client.drop_collection("n" * MAX_CLUSTER_NAME)
