"""Simulated hosts for fault tests: one Linux network namespace per host, on a bridge.

    net = Net()                      # a bridge with 10.213.X.1/24 in this namespace
    a, b = net.add_host("a"), net.add_host("b")
    p = a.run(["python", "-m", ...])  # a Popen inside a's namespace, reachable at a.ip
    a.cut(); ...; a.heal()           # link down / up: a partition of that host
    net.close()                      # kills what it started, deletes namespaces and the bridge

Each host gets a veth pair: one end (``eth0``, address 10.213.X.<n>) inside its namespace, the
other on the bridge. The bridge holds .1, so the test process itself reaches every host directly.
Names carry a per-run tag and the subnet's third octet is one no local interface uses, so runs
(and other sessions' runs) do not collide. Cleanup also runs at exit. Needs root and iproute2;
``skip_reason()`` says why not otherwise. Used by tests/pyramid/test_netns_faults.py and
bench/pyramid/faults.py.
"""

from __future__ import annotations

import atexit
import ipaddress
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
import weakref

log = logging.getLogger(__name__)

_SKIP: list[str | None] = []  # cached skip_reason()
_LIVE: weakref.WeakSet = weakref.WeakSet()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def skip_reason() -> str | None:
    """Why network namespaces cannot be made here (None if they can): not root, no ``ip``, or
    creating a namespace / bridge fails (e.g. an unprivileged container)."""
    if _SKIP:
        return _SKIP[0]
    reason = None
    if sys.platform != "linux":
        reason = f"network namespaces need Linux (this is {sys.platform})"
    elif os.geteuid() != 0:
        reason = "network namespaces need root (CI runs as root; run as root to include these)"
    elif shutil.which("ip") is None:
        reason = "the `ip` command (iproute2) is not installed"
    else:
        tag = f"sp{uuid.uuid4().hex[:6]}"
        try:
            _ip("netns", "add", tag)
            _ip("link", "add", f"{tag}br", "type", "bridge")
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            reason = f"cannot create a network namespace and a bridge: {exc}"
        finally:
            _ip("link", "del", f"{tag}br", check=False)
            _ip("netns", "del", tag, check=False)
    _SKIP.append(reason)
    return reason


def _used_octets() -> set[int]:
    used = set()
    out = _ip("-4", "-o", "addr", "show", check=False).stdout
    for line in out.splitlines():
        for tok in line.split():
            if tok.startswith("10.213."):
                try:
                    used.add(int(tok.split(".")[2]))
                except (ValueError, IndexError):
                    pass
    return used


class Host:
    """One simulated host: a namespace with loopback up and ``eth0`` at ``ip`` on the bridge."""

    def __init__(self, net: Net, name: str, index: int, ip: str):
        self.net = net
        self.name = name
        self.index = index
        self.ip = ip
        self.ns = f"{net.tag}-{name}"
        self.veth = f"{net.tag}v{index}"  # the bridge-side end, in the test's namespace
        self.procs: list[subprocess.Popen] = []

    def prefix(self) -> list[str]:
        """argv prefix that runs a command inside this host's namespace."""
        return ["ip", "netns", "exec", self.ns]

    def run(self, argv: list[str], **popen_kw) -> subprocess.Popen:
        """Start ``argv`` inside the namespace (its own session, so it and its children can be
        signalled as a group); the Net kills it on close."""
        popen_kw.setdefault("stdin", subprocess.DEVNULL)
        popen_kw.setdefault("start_new_session", True)
        p = subprocess.Popen([*self.prefix(), *argv], **popen_kw)
        self.procs.append(p)
        self.net._procs.append(p)
        return p

    def exec(self, argv: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess:
        """Run ``argv`` inside the namespace to completion."""
        argv = [*self.prefix(), *argv]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)

    def cut(self) -> None:
        """Take this host's link down: nothing in or out (its processes keep running)."""
        _ip("link", "set", self.veth, "down")
        log.info("netns: cut %s (%s)", self.name, self.ip)

    def heal(self) -> None:
        _ip("link", "set", self.veth, "up")
        log.info("netns: healed %s (%s)", self.name, self.ip)

    def is_cut(self) -> bool:
        flags = _ip("-o", "link", "show", self.veth).stdout.split(">")[0]
        return ",UP" not in flags and "<UP" not in flags

    def __repr__(self) -> str:
        return f"Host({self.name!r}, ip={self.ip})"


class Net:
    """A bridge plus any number of ``Host``s; ``close()`` (also at exit) undoes everything."""

    def __init__(self, tag: str | None = None):
        reason = skip_reason()
        if reason:
            raise RuntimeError(reason)
        # interface names are limited to 15 characters: tag (8) + "v" + index
        self.tag = tag or f"ss{uuid.uuid4().hex[:6]}"
        self.bridge = f"{self.tag}br"
        self.hosts: dict[str, Host] = {}
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        self._closed = False
        used = _used_octets()
        start = int(self.tag.encode().hex(), 16) % 200 + 20
        octet = next(o for o in list(range(start, 250)) + list(range(20, start)) if o not in used)
        self.subnet = ipaddress.ip_network(f"10.213.{octet}.0/24")
        self.gateway = str(self.subnet[1])
        self._made_ns: list[str] = []
        _LIVE.add(self)
        atexit.register(self.close)
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except Exception:
            self.close()
            raise

    def add_host(self, name: str) -> Host:
        with self._lock:
            if name in self.hosts:
                raise ValueError(f"host {name!r} exists already")
            index = len(self.hosts) + 1
            host = Host(self, name, index, str(self.subnet[index + 1]))
            self.hosts[name] = host
        peer = f"{self.tag}p{index}"
        try:
            _ip("netns", "add", host.ns)
            self._made_ns.append(host.ns)
            _ip("-n", host.ns, "link", "set", "lo", "up")
            _ip("link", "add", host.veth, "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", host.ns)
            _ip("-n", host.ns, "link", "set", peer, "name", "eth0")
            _ip("-n", host.ns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
            _ip("-n", host.ns, "link", "set", "eth0", "up")
            _ip("link", "set", host.veth, "master", self.bridge)
            _ip("link", "set", host.veth, "up")
        except Exception:
            self.close()
            raise
        return host

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        # processes we started, by pid (their session: children too), TERM then KILL
        for p in self._procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass
        end = time.monotonic() + 3.0
        for p in self._procs:
            try:
                p.wait(max(0.05, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                p.wait()
        # anything else still inside our namespaces was started from them
        for ns in self._made_ns:
            for pid in _ip("netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
        for ns in self._made_ns:
            r = _ip("netns", "del", ns, check=False)
            if r.returncode != 0:
                log.warning("netns: could not delete namespace %s: %s", ns, r.stderr.strip())
        _ip("link", "del", self.bridge, check=False)
        for h in self.hosts.values():  # normally gone with their peers
            _ip("link", "del", h.veth, check=False)

    def __enter__(self) -> Net:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def tcp_probe(host: Host, ip: str, port: int, timeout: float = 1.0) -> bool:
    """Whether a TCP connection from inside ``host`` to ``ip:port`` succeeds."""
    code = (
        "import socket,sys\n"
        "s=socket.socket(); s.settimeout(float(sys.argv[3]))\n"
        "try:\n s.connect((sys.argv[1], int(sys.argv[2]))); print('ok')\n"
        "except OSError as e:\n print('fail', e)\n"
    )
    r = host.exec([sys.executable, "-c", code, ip, str(port), str(timeout)], timeout=timeout + 20)
    return r.stdout.startswith("ok")


def wait_for(pred, timeout: float = 15.0, every: float = 0.02) -> bool:
    """Poll ``pred`` until it is true or ``timeout`` seconds pass; its last value."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(every)
    return pred()
