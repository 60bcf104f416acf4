"""String collections over gRPC (docs/service.md, "String collections"): the same answers as the
in-process StringIndex, the encoder fit by a call or given, and kill -9 loses nothing
acknowledged."""

from __future__ import annotations

import numpy as np
import pytest

from deps import requires
from simsearch.errors import (
    InvalidParameterError,
    InvalidVectorError,
    NotTrainedError,
)
from simsearch.strings import CNNEDEncoder, StringIndex

pytestmark = requires("torch")

ACGT = "acgt"
ENC = dict(alphabet=ACGT, max_len=20, embed_dim=32, seed=1)
FIT = dict(epochs=3, n_train=200, n_neighbors=20, n_threads=1)


def words(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return sorted({"".join(rng.choice(list(ACGT), int(rng.integers(6, 15)))) for _ in range(n)})


@pytest.fixture(scope="module")
def data():
    base = words(700, 1)
    return base, words(40, 2)


def test_string_collection_fit_by_a_call_equals_in_process(server_factory, data):
    base, queries = data
    srv = server_factory()
    c = srv.client(timeout=120)
    col = c.create_collection("words", 0, "edit", "strings", index="flat", encoder=ENC)
    assert col.items == "strings" and not col.is_trained
    with pytest.raises(NotTrainedError):
        col.add(base[:3])
    col.train(base, **FIT)
    ids = col.add(base)
    assert len(col) == len(base) and (ids == np.arange(len(base))).all()
    res = col.search(queries, 5, n_candidates=64)
    # the same encoder fit in process answers the same
    enc = CNNEDEncoder(**ENC).fit(base, progress=False, **FIT)
    ref = StringIndex(encoder=enc, index="flat")
    ref.add(base)
    want = ref.search(queries, 5, n_candidates=64)
    np.testing.assert_array_equal(res.ids, want.ids)
    np.testing.assert_array_equal(res.scores, want.scores)
    assert res.scores.dtype == np.float32 and (res.scores[:, 0] >= 0).all()
    with pytest.raises(InvalidParameterError, match="edit"):
        c.create_collection("bad", 0, "l2", "strings")
    with pytest.raises(InvalidParameterError, match="search parameter"):
        col.search(queries[:1], 5, branching=3)


def test_string_collection_with_a_given_encoder_survives_kill_9(server_factory, data):
    base, queries = data
    enc = CNNEDEncoder(**ENC).fit(base, progress=False, **FIT)
    srv = server_factory()
    c = srv.client(timeout=120)
    col = c.create_collection("words", 0, "edit", "strings", index="hnsw", M=8)
    with pytest.raises(InvalidParameterError, match="CNNEDEncoder.save"):
        col.train(encoder=b"not an encoder")
    col.train(encoder=enc)  # a trained encoder given: no fitting on the server
    # a character outside the encoder's alphabet: the server's UnknownCharacterError arrives as
    # its nearest core ancestor, typed, and nothing is added
    with pytest.raises(InvalidVectorError, match="alphabet"):
        col.add(["acgx"])
    assert len(col) == 0
    acked = {}
    for start in range(0, 400, 50):  # acknowledged batches, an upsert and a remove among them
        ids = np.arange(start, start + 50)
        col.add(base[start : start + 50], ids=ids)
        acked.update(zip(ids.tolist(), base[start : start + 50], strict=True))
    col.add(["acgtacgt"], ids=[7], upsert=True)
    acked[7] = "acgtacgt"
    col.remove([3, 4])
    del acked[3], acked[4]
    srv.kill()  # SIGKILL: no snapshot since training, everything after it is in the log
    srv.restart()
    col = srv.client(timeout=120).collection("words")
    assert len(col) == len(acked)
    # every acknowledged string is found as its own nearest (distance 0)
    ids = np.array(sorted(acked))
    res = col.search([acked[i] for i in ids.tolist()], 1, n_candidates=len(acked))
    assert (res.scores[:, 0] == 0).all()
    ref = StringIndex(encoder=enc, index="hnsw", M=8)
    ref.add([acked[i] for i in ids.tolist()], ids=ids)
    got, want = col.search(queries, 3, n_candidates=400), ref.search(queries, 3, n_candidates=400)
    np.testing.assert_array_equal(got.scores, want.scores)


def test_string_filters_and_attributes_reach_the_collection_over_grpc_and_embedded(
        server_factory, data):
    """The defect: over gRPC a string collection silently dropped ``allow``, ``deny`` and
    ``where`` (and the attributes of an add), while the node and the in-process index honour
    them; seen failing on the code before (the filtered answers equalled the unfiltered ones).
    Now the node, an embedded collection and the in-process index answer alike."""
    import simsearch as ss

    base, queries = data
    enc = CNNEDEncoder(**ENC).fit(base, progress=False, **FIT)
    ref = StringIndex(encoder=enc, index="flat")
    ref.add(base)
    group = [["x", "y", "z"][i % 3] for i in range(len(base))]
    allow = np.arange(0, len(base), 2)
    deny = [np.arange(i, i + 40) for i in range(len(queries))]
    where_ids = np.array([i for i, g in enumerate(group) if g == "y"])
    want = [ref.search(queries, 5, allow=allow, n_candidates=64),
            ref.search(queries, 5, deny=deny, n_candidates=64),
            ref.search(queries, 5, allow=where_ids, n_candidates=64)]
    srv = server_factory()
    for c in (srv.client(timeout=120), ss.connect(":memory:")):
        col = c.create_collection(f"w{id(c)}", 0, "edit", "strings", index="flat",
                                  encoder=ENC)
        col.train(encoder=enc)
        col.add(base, attributes={"group": group})
        got = [col.search(queries, 5, allow=allow, n_candidates=64),
               col.search(queries, 5, deny=deny, n_candidates=64),
               col.search(queries, 5, where={"group": "y"}, n_candidates=64)]
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g.ids, w.ids)
            np.testing.assert_array_equal(g.scores, w.scores)
        assert col.get([1, 2])["attributes"]["group"] == ["y", "z"]
        c.close()
