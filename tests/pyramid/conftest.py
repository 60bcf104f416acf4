"""A local Pyramid cluster (`python -m simsearch.pyramid.cluster up`) in real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


class LocalCluster:
    def __init__(self, data_dir: Path, shards: int = 3, replicas: int = 2, *extra: str):
        self.dir = Path(data_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "processes.json").unlink(missing_ok=True)
        self.log = open(self.dir / "supervisor.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "simsearch.pyramid.cluster", "up", "--shards", str(shards),
             "--replicas", str(replicas), "--data-dir", str(self.dir), *extra],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        t0 = time.monotonic()
        while not (self.dir / "processes.json").exists():
            if self.proc.poll() is not None or time.monotonic() - t0 > 120:
                self.stop()
                raise RuntimeError((self.dir / "supervisor.log").read_text())
            time.sleep(0.1)

    @property
    def processes(self) -> dict:
        return json.loads((self.dir / "processes.json").read_text())

    @property
    def coordinator(self) -> str:
        return self.processes["coordinators"][0]["address"]

    def shard_pid(self, i: int) -> int:
        return self.processes["pids"][f"shard-{i}"]

    def signal_shard(self, i: int, sig: int) -> None:
        os.kill(self.shard_pid(i), sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


@pytest.fixture
def cluster_factory(tmp_path):
    made = []

    def make(*args, **kw):
        c = LocalCluster(tmp_path / f"cluster{len(made)}", *args, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()
