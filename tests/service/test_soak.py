"""A CI-sized run of the service soak (bench/service/soak.py): searching and writing clients, a
SIGKILL and restart of the server halfway; no call fails outside the restart and no acknowledged
write is lost. The 10-minute run and its memory plot are in docs/bench-service.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_short_soak_loses_nothing(tmp_path):
    out = tmp_path / "soak.json"
    cmd = [sys.executable, str(ROOT / "bench" / "service" / "soak.py"), "--minutes", "0.4",
           "--searchers", "2", "--writers", "2", "--window", "2000", "--json", str(out),
           "--no-progress"]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    report = json.loads(out.read_text())
    assert report["searches"] > 0 and report["writes_acked"] > 0
    assert report["restart_window_s"][0] is not None, "the server was not killed"
    assert report["failed_outside_restart"] == 0, report["errors"]
    assert report["acked_lost"] == 0, report["errors"]
    assert report["acked_live"] > 0
    assert p.returncode == 0, p.stderr[-2000:]
