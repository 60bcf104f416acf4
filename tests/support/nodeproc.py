"""A search node as a real process on a free loopback port (the service and integration
tests)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from simsearch.service.client import connect


class ServerProcess:
    """``python -m simsearch.service.server`` on port 0; the port comes back through a ready
    file, so no port number is fixed or guessed."""

    def __init__(self, data_dir: Path, *args: str, start_timeout: float = 60.0):
        self.data_dir = Path(data_dir)
        self.args = list(args)
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.start()

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        ready = self.data_dir.parent / f"{self.data_dir.name}.ready"
        ready.unlink(missing_ok=True)
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"
        self._log = open(self.log_path, "ab")
        cmd = [
            sys.executable,
            "-m",
            "simsearch.service.server",
            "--data-dir",
            str(self.data_dir),
            "--port",
            "0",
            "--ready-file",
            str(ready),
            "--log-level",
            "WARNING",
            *self.args,
        ]
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        t0 = time.monotonic()
        while not ready.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() - t0 > self.start_timeout:
                self.kill()
                raise RuntimeError(f"server did not become ready:\n{self.log()}")
            time.sleep(0.05)
        self.port = json.loads(ready.read_text())["port"]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client(self, **kw):
        return connect(self.address, **kw)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
        self._log.close()

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait for the graceful exit; returns the exit code."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()
        return self.proc.returncode

    def restart(self) -> None:
        """Start again on the same data directory (stopping the running process first)."""
        if self.proc and self.proc.poll() is None:
            self.stop()
        self.start()
