"""The LlamaIndex store answers filters as llama-index-core's own ``SimpleVectorStore`` does:
every ``FilterOperator`` and ``FilterCondition`` over nodes with missing keys, empty values,
lists, strings, numbers, booleans and keys whose values differ in type from node to node.

The defects this was written against (91334ed): ``!=`` and ``nin`` skipped nodes missing the
key, ``NOT`` meant "not all" (LlamaIndex: "none"), ``is_empty`` ignored ``""`` and ``[]``,
``contains`` / ``any`` on strings were equality, and a filter on a key no node has raised
instead of matching nothing. On that code 357 of the 410 single filters below differed from
``SimpleVectorStore`` (most by raising on a key without a column), 56 to 60 of each
condition's 60 pairs, and deleting a document from nodes without parents raised."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

pytest.importorskip("llama_index.core")

from llama_index.core.schema import NodeRelationship, RelatedNodeInfo, TextNode  # noqa: E402
from llama_index.core.vector_stores import SimpleVectorStore  # noqa: E402
from llama_index.core.vector_stores.types import (  # noqa: E402
    FilterCondition,
    FilterOperator,
    MetadataFilter,
    MetadataFilters,
    VectorStoreQuery,
)

from simsearch.integrations.llamaindex import SimsearchVectorStore  # noqa: E402

DIM = 6
N = 24


def _nodes() -> list[TextNode]:
    rng = np.random.default_rng(11)
    out = []
    for i in range(N):
        md: dict = {}
        if i % 4 != 3:
            md["n"] = i if i % 5 else float(i) + 0.5  # ints and floats
        if i % 3 != 2:
            md["s"] = ["red", "blue", "", "dark red"][i % 4]
        if i % 2 == 0:
            md["tags"] = [["a", "b"], [], ["b"], ["ab", "c"]][(i // 2) % 4]
        if i % 6 != 5:
            md["flag"] = bool(i % 2)
        md["mixed"] = i if i % 3 else f"v{i}"  # a key whose type differs between nodes
        if i % 7 == 0:
            md["bad key"] = "x"  # no attribute name: kept in the JSON only
        if i % 8 == 0:
            md["none"] = None
        node = TextNode(text=f"t{i}", id_=f"n{i}", metadata=md,
                        embedding=rng.standard_normal(DIM).tolist())
        if i % 3 == 0:
            node.relationships = {NodeRelationship.SOURCE: RelatedNodeInfo(node_id=f"d{i % 2}")}
        out.append(node)
    return out


F, OP = MetadataFilter, FilterOperator
VALUES = {
    OP.EQ: [3, 3.0, 4.5, "red", "", "v3", ["a", "b"]],
    OP.NE: [3, "red", "", "v3", 1],
    OP.GT: [5, 5.5], OP.GTE: [6], OP.LT: [10, 10.5], OP.LTE: [9],
    OP.IN: [[1, 2, 3], ["red", ""], ["v0", "v3"], [], [3.5, 1.0]],
    OP.NIN: [[1, 2, 3], ["red", ""], ["v0"], [], [3.5, 1.0]],
    OP.CONTAINS: ["b", "re", "a"],
    OP.ANY: [["a", "c"], ["re", "zz"], []],
    OP.ALL: [["a", "b"], ["r", "e"], []],
    OP.TEXT_MATCH: ["re", "dark"],
    OP.TEXT_MATCH_INSENSITIVE: ["RE"],
    OP.IS_EMPTY: [None],
}
KEYS = ["n", "s", "tags", "flag", "mixed", "absent", "bad key", "none", "doc_id", "ref_doc_id"]


def _leaves():
    for op, values in VALUES.items():
        for key, v in itertools.product(KEYS, values):
            yield F(key=key, value=v, operator=op)


def _answer(store, filters):
    q = VectorStoreQuery(query_embedding=[1.0] * DIM, similarity_top_k=N, filters=filters)
    try:
        return sorted(store.query(q).ids)
    except (TypeError, ValueError) as exc:  # Python's own comparison errors
        return type(exc).__name__


@pytest.fixture(scope="module")
def stores():
    nodes = _nodes()
    simple = SimpleVectorStore()
    simple.add([n.model_copy() for n in nodes])
    ours = SimsearchVectorStore(kind="flat", collection_name="differential")
    ours.add([n.model_copy() for n in nodes])
    yield simple, ours
    ours.close()


def test_every_operator_on_every_kind_of_value(stores):
    simple, ours = stores
    differ = []
    for leaf in _leaves():
        want = _answer(simple, MetadataFilters(filters=[leaf]))
        got = _answer(ours, MetadataFilters(filters=[leaf]))
        if got != want:
            differ.append((leaf.key, leaf.operator.value, leaf.value, want, got))
    assert not differ, "\n".join(map(str, differ[:20])) + f"\n({len(differ)} cases differ)"


@pytest.mark.parametrize("condition", list(FilterCondition))
def test_every_condition_over_pairs_of_filters(stores, condition):
    simple, ours = stores
    leaves = [lf for lf in _leaves() if lf.operator in (OP.EQ, OP.NE, OP.IN, OP.CONTAINS,
                                                         OP.IS_EMPTY, OP.GT)]
    rng = np.random.default_rng(5)
    differ = []
    for i, j in rng.integers(0, len(leaves), (60, 2)):
        filters = MetadataFilters(filters=[leaves[i], leaves[j]], condition=condition)
        want, got = _answer(simple, filters), _answer(ours, filters)
        if got != want:
            differ.append((str(filters), want, got))
    assert not differ, "\n".join(map(str, differ[:10])) + f"\n({len(differ)} cases differ)"


def test_get_nodes_and_delete_select_what_query_selects(stores):
    _, ours = stores
    filters = MetadataFilters(filters=[F(key="s", value="re", operator=OP.CONTAINS),
                                       F(key="mixed", value=4, operator=OP.NE)])
    want = _answer(ours, filters)
    assert sorted(n.node_id for n in ours.get_nodes(filters=filters)) == want
    assert [n.node_id for n in ours.get_nodes(["n1", "n0", "n5"], filters=filters)] == \
        [i for i in ["n1", "n0", "n5"] if i in want]


def test_delete_of_a_document_without_parents_deletes_nothing_and_does_not_raise():
    store = SimsearchVectorStore(kind="flat", collection_name="orphans")
    store.add([TextNode(text="x", id_="x", embedding=[1.0, 0.0])])
    store.delete("some-doc")
    assert [n.node_id for n in store.get_nodes()] == ["x"]
    store.close()


def test_metadata_keys_past_the_column_cap_stay_filterable():
    """The defect: a column per metadata key; past the node's 256 columns every add with a
    new key failed (RESOURCE_EXHAUSTED), though the docs said such metadata is kept. Keys past
    the adapter's cap now stay in the JSON, and a filter on them is still answered exactly."""
    store = SimsearchVectorStore(kind="flat", collection_name="wide")
    rng = np.random.default_rng(0)
    for batch in range(6):  # 300 distinct keys, over several adds
        store.add([TextNode(text=f"t{i}", id_=f"n{i}", metadata={f"k{i}": i, "all": 1},
                            embedding=rng.standard_normal(4).tolist())
                   for i in range(batch * 50, batch * 50 + 50)])
    schema = store.client.collection("wide").describe()["schema"]
    assert len(schema) < 100
    q = VectorStoreQuery(query_embedding=[1.0] * 4, similarity_top_k=5, filters=MetadataFilters(
        filters=[F(key="k290", value=290), F(key="all", value=1)]))
    assert store.query(q).ids == ["n290"]
    store.close()
