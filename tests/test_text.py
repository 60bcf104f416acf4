"""simsearch.text.SparseEncoder (SPLADE through sentence-transformers) against the framework's
own output, and through a sparse index."""

from __future__ import annotations

import numpy as np
import pytest

import simsearch as ss
from deps import requires
from simsearch.errors import InvalidParameterError
from simsearch.text import SparseEncoder

pytestmark = requires("sentence_transformers")

PASSAGES = ["A weir is a dam in a river to stop and raise the water.",
            "A cockle is a bivalve mollusk with a ribbed shell.",
            "To retreat is to withdraw from any position or place."]


@pytest.fixture(scope="module")
def encoder():
    return SparseEncoder(max_length=64, batch_size=2)


def test_rows_equal_sentence_transformers_own(encoder):
    """The same vectors the framework's SparseEncoder gives, as sorted non-negative rows."""
    from sentence_transformers import SparseEncoder as Reference

    ref = Reference(str(encoder.path), device="cpu", local_files_only=True)
    ref.max_seq_length = 64
    for ours, theirs in ((encoder.encode_documents(PASSAGES), ref.encode_document(PASSAGES)),
                         (encoder.encode_queries(["dam in a river"]),
                          ref.encode_query(["dam in a river"]))):
        assert ours.dim == encoder.dim == 30522 and (ours.values > 0).all()
        for r in range(len(ours)):
            t, _ = ours.row(r)
            assert (np.diff(t.astype(np.int64)) > 0).all()
        np.testing.assert_allclose(ours.to_scipy().toarray(), theirs.to_dense().numpy(),
                                   rtol=1e-5, atol=1e-6)


def test_a_query_finds_its_passage_through_an_index(encoder):
    idx = ss.SparseFlatIndex(encoder.dim)
    idx.add(encoder.encode_documents(PASSAGES))
    got = idx.search(encoder.encode_queries(["a dam on a river", "shellfish with ribs"]), 1)
    assert got.ids[:, 0].tolist() == [0, 1]


def test_bad_input_is_a_typed_error(encoder, tmp_path):
    with pytest.raises(InvalidParameterError, match="sequence of str"):
        encoder.encode_documents("one text")
    with pytest.raises(InvalidParameterError, match="must be str"):
        encoder.encode_queries(["fine", 3])
    with pytest.raises(InvalidParameterError, match="model directory"):
        SparseEncoder(tmp_path)
    assert len(encoder.encode_documents([])) == 0
