"""Mutated index files never crash the process (docs/architecture.md, "Persistence").

The defect: imported index bytes reached hnswlib's ``__setstate__``, faiss and numba kernels
built without bounds checks. Run on the code before these checks (2026-11-27), 300 mutated
files per kind crashed the child process 48 times for hnsw (segfaults in hnswlib), 8-9 times
for ip-NSW+ and once for Pyramid (an abort), and 22 more cases failed with untyped errors
(IndexError, ValueError) instead of CorruptIndexError. The harness is tests/support/filefuzz.py.
"""

from __future__ import annotations

import os

import pytest

from filefuzz import KINDS, run

#: mutated files per kind (12 kinds, strings among them: 6,000 files)
PER_KIND = int(os.environ.get("SIMSEARCH_FILE_FUZZ", "500"))


@pytest.mark.parametrize("kind", list(KINDS))
def test_mutated_files_give_corrupt_index_error_or_a_working_index(kind):
    r = run(kind, PER_KIND, seed=1)
    assert r["crashes"] == [] and r["errors"] == [], r
    assert sum(r["outcomes"].values()) == PER_KIND
    assert r["outcomes"].get("corrupt", 0) > PER_KIND // 4  # the validators did refuse files


@pytest.mark.parametrize("space", ["ip", "cosine", "l2"])
def test_hnswlib_own_files_load_through_the_checks(tmp_path, space):
    """Files written before simsearch kept hnswlib's state as arrays hold hnswlib's own saved
    bytes; they are parsed into hnswlib's state and checked like any (never handed to
    hnswlib's loader), and answer as the index that wrote them."""
    import hnswlib
    import numpy as np

    from simsearch._hnswlib import hnswlib_from_saved

    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 8)).astype(np.float32)
    h = hnswlib.Index(space, 8)
    h.init_index(500, M=8, ef_construction=40)
    h.add_items(x, np.arange(300))
    h.mark_deleted(5)
    h.save_index(str(tmp_path / "h.bin"))
    blob = np.fromfile(tmp_path / "h.bin", np.uint8)
    g = hnswlib_from_saved(blob, space, 8, 500)
    np.testing.assert_array_equal(g.knn_query(x[:20], 5)[0], h.knn_query(x[:20], 5)[0])
    with pytest.raises(ValueError):
        hnswlib_from_saved(blob[:-1], space, 8, 500)  # truncated: refused, not read past


def test_a_crafted_encoder_header_is_refused_before_its_network_is_allocated(monkeypatch):
    """The defect: a 1.6 KB CNN-ED encoder file whose header asked for a huge network was
    built (``CNNEDEncoder.loads`` peaked at 1.5 GB, a node grew by 0.7-1 GB per Train or
    restore) before its arrays were compared with it. Now the network is sized on torch's
    meta device first; here no network may be built in memory for such a file (on the code
    before, this 2 KB file built a network of 537 million weights, 2.1 GB, before
    load_state_dict refused it)."""
    import json

    from filefuzz import _PREFIX, _seal
    from simsearch.errors import CorruptIndexError
    from simsearch.strings import CNNEDEncoder

    enc = CNNEDEncoder(alphabet="acgt", max_len=16, embed_dim=8, seed=0)
    enc._build()
    enc.mean_distance = 1.0  # weights as initialised: a valid file to craft from
    data = enc.to_bytes()
    _, _, hlen, plen = _PREFIX.unpack_from(data, 0)
    body = bytearray(data[_PREFIX.size:_PREFIX.size + hlen + plen])
    header = json.loads(bytes(body[:hlen]))
    header["params"].update(max_len=1 << 16, channels=512)  # ~ 10^9 weights asked for
    text = json.dumps(header).encode()
    crafted = _seal(bytearray(text) + body[hlen:], len(text))
    assert len(crafted) < 64 << 10
    built = []
    real = CNNEDEncoder._build
    monkeypatch.setattr(CNNEDEncoder, "_build",
                        lambda self, *a: built.append(a[0] if a else None) or real(self, *a))
    with pytest.raises(CorruptIndexError, match="do not match"):
        CNNEDEncoder.loads(crafted)
    assert None not in built  # sized on the meta device only
