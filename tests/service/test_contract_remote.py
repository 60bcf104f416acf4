"""The Index contract suite (tests/test_contract.py) run over remote collections, plus a
congruence check: the same calls on a local index and on the node give the same answers.

Every contract check that does not touch local files runs here; save/load belongs to the node
(snapshots), tested in test_durability.py.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import simsearch as ss
import test_contract as tc
import test_filters as tf
from conftest import unique_name
from contract import Case, string_encoder
from simsearch.datasets import synthetic_longtail
from simsearch.strings import brute_force_search
from string_fixture import strings


def _remote_cases(client) -> list[Case]:
    def maker(kind, **build):
        def make(d, m, x):
            return client.create_collection(unique_name(f"ct-{kind}-"), d, m, kind, **build)

        return make

    return [
        Case("remote-flat", maker("flat"), exact=True, min_recall=1.0),
        # observed recall@10 on the fixture: 1.0 for all three metrics at ef=64
        Case(
            "remote-hnsw",
            maker("hnsw", M=16, ef_construction=100),
            search_kw={"ef": 64},
            min_recall=0.95,
        ),
        Case("remote-strings", _strings_maker(client), metrics=("edit",),
             search_kw={"n_candidates": 300}, min_recall=0.95, items="strings"),
    ]


def _strings_maker(client):
    """A string collection trained with the contract suite's encoder (its file, sent)."""
    def make(d, m, x):
        col = client.create_collection(unique_name("ct-strings-"), 0, "edit", "strings",
                                       index="hnsw", M=12)
        col.train(encoder=string_encoder())
        return col

    return make


CHECKS = [
    tc.test_recall_and_ordering,
    tc.test_single_query_and_batch_agree,
    tc.test_padding_and_empty,
    tc.test_ids_continue,
    tc.test_bad_add_is_typed_and_changes_nothing,
    tc.test_zero_vector_under_cosine,
    tc.test_bad_search,
    tc.test_remove,
]
EXTRA = {  # checks with their own parametrization run over every value
    "bad": lambda case: sorted(tc._bad_of(case)),
    "k": lambda case: [0, -1, 1.5, "3", None, True, 10**9],
}


@pytest.fixture(scope="module")
def data():  # the contract suite's fixture
    return synthetic_longtail(n=tc.N, dim=tc.DIM, n_queries=50, n_clusters=30, seed=7)


@pytest.fixture(scope="module")
def oracles(data):
    base, queries = data
    out = {}
    for m in ("ip", "cosine", "l2"):
        f = ss.FlatIndex(tc.DIM, m)
        f.add(base)
        out[m] = f.search(queries, 100)
    sb, sq = strings(tc.N, 50)
    ids, dists = brute_force_search(sq.tolist(), sb.tolist(), 100)
    out["edit"] = ss.SearchResult(ids, dists.astype(np.float32))
    return out


_RUNS = [*[(c, m) for c in ("remote-flat", "remote-hnsw") for m in ("ip", "cosine", "l2")],
         ("remote-strings", "edit")]


@pytest.mark.parametrize("check,case_id,metric", [
    pytest.param(check, c, m, id=f"{check.__name__.removeprefix('test_')}-{c}-{m}")
    for check in CHECKS for c, m in _RUNS
    # the zero vector is a vector kind's check
    if not (check is tc.test_zero_vector_under_cosine and c == "remote-strings")])
def test_contract_over_client(check, case_id, metric, shared_client, data, oracles):
    case = next(c for c in _remote_cases(shared_client) if c.id == case_id)
    params = inspect.signature(check).parameters
    kw = {"case": case, "metric": metric,
          "data": strings(tc.N, 50) if case.items == "strings" else data}
    if "oracles" in params:
        kw["oracles"] = oracles
    extra = [p for p in EXTRA if p in params]
    values = [{}] if not extra else [{extra[0]: v} for v in EXTRA[extra[0]](case)]
    for v in values:
        check(**kw, **v)


def test_congruence_local_vs_remote(shared_client, data):
    """One sequence of calls on a local index and on a remote collection: same answers."""
    base, queries = data
    for kind, build, search_kw in (
        ("flat", {}, {}),
        ("hnsw", {"M": 8, "n_threads": 1}, {"ef": 32}),
    ):
        local = ss.create_index(kind, tc.DIM, "ip", **build)
        remote = shared_client.create_collection(unique_name("cg"), tc.DIM, "ip", kind, **build)
        for idx in (local, remote):
            idx.add(base[:1000])
            idx.add(base[1000:1500], ids=np.arange(5000, 5500))
            idx.remove(np.arange(0, 1000, 7))
        assert len(local) == len(remote)
        a, b = local.search(queries, 10, **search_kw), remote.search(queries, 10, **search_kw)
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_allclose(a.scores, b.scores, rtol=1e-5, atol=1e-5)
        assert a.ids.dtype == b.ids.dtype and a.scores.dtype == b.scores.dtype
        one_a, one_b = (
            local.search(queries[0], 3, **search_kw),
            remote.search(queries[0], 3, **search_kw),
        )
        np.testing.assert_array_equal(one_a.ids, one_b.ids)


FILTER_CHECKS = [
    tf.test_shared_allow_every_selectivity,
    tf.test_per_query_allow_and_deny,
    tf.test_deny_lists_leave_out_the_best,
    tf.test_filter_correlated_against_the_query,
    tf.test_padding_unknown_ids_and_nothing_allowed,
    tf.test_filters_after_remove_and_readd,
    tf.test_bad_filters_are_typed_and_change_nothing,
]


@pytest.mark.parametrize("metric", ["ip", "l2"])
@pytest.mark.parametrize("case_id", ["remote-flat", "remote-hnsw"])
@pytest.mark.parametrize("check", FILTER_CHECKS, ids=lambda f: f.__name__.removeprefix("test_"))
def test_filters_over_client(check, case_id, metric, shared_client, data):
    """tests/test_filters.py's checks through the client: allow/deny travel in the request."""
    case = next(c for c in _remote_cases(shared_client) if c.id == case_id)
    if "bad" in inspect.signature(check).parameters:
        for bad in sorted(tf.BAD_FILTERS):
            check(case=case, metric=metric, data=data, bad=bad)
    else:
        check(case=case, metric=metric, data=data)
