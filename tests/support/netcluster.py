"""A Pyramid cluster on simulated hosts: etcd, every shard and every coordinator on its own
network namespace (tests/support/netns.py), started through the CLI (docs/cluster.md):

    simsearch cluster shard       --etcd URL --cluster NAME --host IP --port P --data-dir DIR
    simsearch cluster coordinator --etcd URL --cluster NAME --host IP --port P --lease-ttl S

Used by tests/pyramid/test_netns_faults.py and bench/pyramid/faults.py.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from netns import Host, Net
from simsearch.pyramid.control.etcd import Etcd
from simsearch.pyramid.control.etcd_server import LocalEtcd, embedded_is_safe

log = logging.getLogger(__name__)

PORT = 50051  # every host has its own address, so one port for all


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))


class NetCluster:
    """etcd + ``shards`` shard servers + ``coordinators`` coordinators, one host each."""

    def __init__(self, net: Net, data_dir: str | os.PathLike, shards: int = 3,
                 coordinators: int = 2, lease_ttl: float = 2.0, name: str = "faults",
                 start_timeout: float = 90.0):
        self.net = net
        self.dir = Path(data_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.lease_ttl = lease_ttl
        self.start_timeout = start_timeout
        self.procs: dict[str, subprocess.Popen] = {}
        self.hosts: dict[str, Host] = {}
        eh = net.add_host("etcd")
        self.hosts["etcd"] = eh
        self.etcd_server = LocalEtcd(str(self.dir / "etcd"), eh.ip, argv_prefix=eh.prefix()).start()
        self.etcd_url = self.etcd_server.url
        self.n_shards = 0
        for _ in range(shards):
            self.add_shard(wait=False)
        for i in range(coordinators):
            self.start_coordinator(f"coord-{i}", wait=False)
        self.wait_serving(list(self.procs))

    # -- processes
    def _start(self, role: str, host: Host, argv: list[str]) -> subprocess.Popen:
        if not embedded_is_safe():  # a developer's machine with only the wheel's etcd
            argv = [*argv, "--allow-unsafe-etcd"]
        logf = open(self.dir / f"{role}.log", "ab")
        p = host.run([sys.executable, "-m", "simsearch.cli", *argv], stdout=logf,
                     stderr=subprocess.STDOUT, env=_env())
        logf.close()
        self.procs[role] = p
        return p

    def _shard_argv(self, role: str) -> list[str]:
        return ["cluster", "shard", "--etcd", self.etcd_url, "--cluster", self.name,
                "--host", self.hosts[role].ip, "--port", str(PORT),
                "--data-dir", str(self.dir / role)]

    def add_shard(self, wait: bool = True) -> str:
        role = f"shard-{self.n_shards}"
        self.n_shards += 1
        host = self.hosts.get(role) or self.net.add_host(role)
        self.hosts[role] = host
        self._start(role, host, self._shard_argv(role))
        if wait:
            self.wait_serving([role])
        return role

    def start_coordinator(self, role: str, wait: bool = True) -> None:
        host = self.hosts.get(role) or self.net.add_host(role)
        self.hosts[role] = host
        self._start(role, host, ["cluster", "coordinator", "--etcd", self.etcd_url,
                                 "--cluster", self.name, "--host", host.ip, "--port", str(PORT),
                                 "--lease-ttl", str(self.lease_ttl)])
        if wait:
            self.wait_serving([role])

    def restart(self, role: str) -> None:
        if role.startswith("shard-"):
            host = self.hosts[role]
            self._start(role, host, self._shard_argv(role))
        else:
            self.start_coordinator(role, wait=False)
        self.wait_serving([role])

    def address(self, role: str) -> str:
        return f"{self.hosts[role].ip}:{PORT}"

    @property
    def coordinators(self) -> list[str]:
        return [r for r in self.procs if r.startswith("coord-")]

    @property
    def shards(self) -> list[str]:
        return [r for r in self.procs if r.startswith("shard-")]

    def coordinator_addresses(self) -> list[str]:
        return [self.address(r) for r in self.coordinators]

    def log_tail(self, role: str, n: int = 30) -> str:
        try:
            text = (self.dir / f"{role}.log").read_text(errors="replace")
            return "\n".join(text.splitlines()[-n:])
        except OSError as exc:
            return f"(no log: {exc})"

    def wait_serving(self, roles: list[str]) -> None:
        import simsearch as ss

        end = time.monotonic() + self.start_timeout
        for role in roles:
            while True:
                p = self.procs[role]
                if p.poll() is not None:
                    raise RuntimeError(f"{role} exited with {p.returncode}:\n{self.log_tail(role)}")
                try:
                    with ss.connect(self.address(role), timeout=2.0) as c:
                        if c.health() == "SERVING":
                            break
                except Exception as exc:  # noqa: BLE001 - not up yet
                    last = exc
                if time.monotonic() > end:
                    raise RuntimeError(f"{role} not serving after {self.start_timeout} s "
                                       f"({last}):\n{self.log_tail(role)}")
                time.sleep(0.2)

    def kill(self, role: str, sig: int = signal.SIGKILL) -> None:
        p = self.procs[role]
        os.killpg(p.pid, sig)
        if sig == signal.SIGKILL:
            p.wait(30)

    # -- control plane
    def etcd(self) -> Etcd:
        """A client on the cluster's key prefix (from the test process, over the bridge)."""
        return Etcd(self.etcd_url, f"simsearch/{self.name}", timeout=2.0)

    def leader(self, etcd: Etcd | None = None) -> str | None:
        """Role name of the coordinator etcd names as leader (None if none)."""
        own = etcd is None
        etcd = etcd or self.etcd()
        try:
            value, _ = etcd.get("leader")
        finally:
            if own:
                etcd.close()
        if value is None:
            return None
        text = value.decode()
        for role in self.coordinators:
            if self.hosts[role].ip in text:
                return role
        return None

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.etcd_server.stop()
