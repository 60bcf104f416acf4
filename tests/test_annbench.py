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


def test_the_bench_runner_benches_an_imported_file_and_writes_their_results(ann_file, tmp_path):
    """Import, bench through the runner, write ann-benchmarks result files: the recall their
    plotting would compute from our files (against the file's own neighbours) is the runner's."""
    from pathlib import Path

    import h5py

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench import runner

    path, truth = ann_file
    datasets.import_hdf5(path)
    cfg = {"name": "toy", "dataset": {"name": "toy-16-angular", "params": {}},
           "metric": "cosine", "k": 10,
           "timing": {"rounds": 1, "latency_queries": 10, "min_seconds": 0.01},
           "algorithms": [{"adapter": "hnswlib", "label": "hnswlib",
                           "build": {"M": 8, "ef_construction": 50, "n_threads": 1},
                           "search": {"ef": 20}},
                          {"adapter": "simsearch-flat", "label": "simsearch-flat",
                           "build": {}, "search": {}}]}
    out = runner.run(cfg, tmp_path / "out", threads=[1], progress=False,
                     ann_results=tmp_path / "ann")
    import json

    runs = {r["algorithm"]: r for r in json.loads((out / "results.json").read_text())["runs"]}
    files = sorted((tmp_path / "ann" / "toy-16-angular" / "10").glob("*/*.hdf5"))
    assert {f.parent.name for f in files} == {"hnswlib", "simsearch-flat"}
    for f in files:
        with h5py.File(f) as h:
            assert h.attrs["distance"] == "angular" and h.attrs["count"] == 10
            got = h["neighbors"][:]
            assert h.attrs["best_search_time"] > 0 and h["distances"].shape == got.shape
            assert (np.diff(h["distances"][:], axis=1) >= -1e-5).all()  # nearest first
        recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, truth, strict=True)])
        assert recall == pytest.approx(runs[f.parent.name]["recall"], abs=1e-9)
    assert runs["simsearch-flat"]["recall"] == 1.0


def test_not_an_ann_file_is_typed(tmp_path):
    bad = tmp_path / "x.hdf5"
    bad.write_bytes(b"not hdf5")
    with pytest.raises(ss.errors.CorruptIndexError):
        annbench.read_dataset(bad)
