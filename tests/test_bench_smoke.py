"""End-to-end smoke run of the benchmark runner (bench/configs/smoke.yaml, every adapter)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("yaml")
pytest.importorskip("matplotlib")


def test_smoke_config_end_to_end(tmp_path):
    out = tmp_path / "smoke"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    cmd = [sys.executable, "-m", "bench", "run", "smoke", "--out", str(out), "--no-progress"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]

    doc = json.loads((out / "results.json").read_text())
    runs = doc["runs"]
    core = {"faiss-flat", "faiss-hnsw", "faiss-ivfpq", "hnswlib", "norm-scan"}
    core |= {"simsearch-flat", "simsearch-hnsw"}
    assert {r["adapter"] for r in runs} == core  # every configured adapter ran
    for r in runs:
        assert 0.0 <= r["recall"] <= 1.0
        assert set(r["qps"]) == {"1", str(os.cpu_count())} and min(r["qps"].values()) > 0
        assert r["qps_cpu_1t"] > 0
        assert r["latency"]["p99_ms"] >= r["latency"]["p50_ms"] > 0
        assert r["index_bytes"] > 0 and r["build_s"] >= 0
    exact = [r for r in runs if r["exact"]]
    assert {r["adapter"] for r in exact} == {"faiss-flat", "simsearch-flat"}
    assert all(r["recall"] == 1.0 for r in exact), [(r["adapter"], r["recall"]) for r in exact]
    # same seed, single-threaded build: the wrapper and raw hnswlib hold the same graph
    rec = {(r["adapter"], r["search"]["ef"]): r["recall"] for r in runs if "ef" in r["search"]}
    for (name, ef), value in rec.items():
        if name == "simsearch-hnsw":
            assert value == rec[("hnswlib", ef)]
    assert max(v for (n, _), v in rec.items() if n == "hnswlib") >= 0.9  # observed 0.989

    md = (out / "results.md").read_text()
    assert "| algorithm |" in md and "## simsearch-hnsw vs hnswlib" in md
    for png in ("recall_qps_1t.png", "recall_qps_1t-cpu.png", f"recall_qps_{os.cpu_count()}t.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # the report is derived from the JSON alone and can be rebuilt
    (out / "results.md").unlink()
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "report", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "results.md").exists()
