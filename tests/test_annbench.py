"""ann-benchmarks HDF5 files: a file made here in their layout imports, benches, and its own
neighbours are what exact search finds; results come back out in their result layout."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("h5py")

import simsearch as ss  # noqa: E402
from simsearch import annbench, datasets  # noqa: E402


@pytest.fixture
def ann_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SIMSEARCH_DATA", str(tmp_path / "cache"))
    rng = np.random.default_rng(4)
    train = rng.standard_normal((2000, 16)).astype(np.float32)
    test = rng.standard_normal((50, 16)).astype(np.float32)
    flat = ss.FlatIndex(16, "cosine")
    flat.add(train)
    r = flat.search(test, 10)
    path = tmp_path / "toy-16-angular.hdf5"
    annbench.write_dataset(path, train, test, r.ids, 1 - r.scores, "cosine")
    return path, r.ids


def test_import_and_bench_match_the_files_neighbours(ann_file, tmp_path):
    path, truth = ann_file
    out = subprocess.run([sys.executable, "-m", "simsearch.cli", "data", "import", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "imported as 'toy-16-angular' (metric cosine)" in out.stdout
    assert "toy-16-angular" in datasets.imported()
    ds = datasets.load("toy-16-angular")
    f = annbench.read_dataset(path)
    assert f.metric == "cosine" and ds.base.shape == (2000, 16)
    hnsw = ss.HNSWIndex(16, f.metric, M=16, ef_construction=100)
    hnsw.add(ds.base)
    got = hnsw.search(ds.queries, 10, ef=100).ids
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, f.neighbors, strict=True)])
    assert recall >= 0.95
    gt_ids, _ = ds.ground_truth("cosine", k=10)
    np.testing.assert_array_equal(gt_ids, f.neighbors)  # our exact search agrees with the file
    res = tmp_path / "result.hdf5"
    annbench.write_result(res, algo="simsearch-hnsw", dataset=ds.name, metric="cosine", k=10,
                          neighbors=got, distances=np.zeros(got.shape), times=np.full(50, 1e-4),
                          build_time=1.0, index_size=1.0, name="simsearch-hnsw(ef=100)")
    import h5py

    with h5py.File(res) as h:
        assert h.attrs["algo"] == "simsearch-hnsw" and h.attrs["distance"] == "angular"
        assert h["neighbors"].shape == (50, 10) and h["times"].shape == (50,)


def test_not_an_ann_file_is_typed(tmp_path):
    bad = tmp_path / "x.hdf5"
    bad.write_bytes(b"not hdf5")
    with pytest.raises(ss.errors.CorruptIndexError):
        annbench.read_dataset(bad)
