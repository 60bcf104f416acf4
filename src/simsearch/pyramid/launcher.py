"""A local cluster on one machine (docs/cluster.md, "Running a cluster"): ``simsearch cluster up``
starts etcd (unless ``--etcd`` names one), shard servers and coordinators, and supervises them;
``add-shard``, ``drain`` and ``status`` act on it. Every process is an ordinary cluster member:
the launcher only starts and restarts processes. ``DIR/up.json`` records what it started (pids,
addresses, where etcd is) for ``status`` and tests; the cluster's truth is in etcd.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .._durable import atomic_write
from ..errors import SimsearchError
from ..service.auth import CLUSTER, load_tokens
from .batching import MAX_IN_FLIGHT as SEARCH_BATCHES
from .control.errors import CoordinationError
from .control.etcd import Etcd, tls_from_args
from .control.etcd_server import DEFAULT_QUOTA_BYTES, LocalEtcd, embedded_is_safe, tls_argv
from .control.state import shard_id
from .status import cluster_status

log = logging.getLogger(__name__)

DEFAULT_CLUSTER = "pyramid"


def _atomic_json(path: Path, obj) -> None:
    atomic_write(path, lambda f: f.write(json.dumps(obj, indent=1).encode()))


def _spawn(cmd: list[str], ready: Path, log_path: Path) -> subprocess.Popen:
    ready.unlink(missing_ok=True)
    with open(log_path, "ab") as logf:
        return subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)


def _await_ready(proc: subprocess.Popen, ready: Path, log_path: Path,
                 timeout: float = 120.0) -> dict:
    t0 = time.monotonic()
    what = " ".join(proc.args[3:5])
    while not ready.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; see {log_path}")
        if time.monotonic() - t0 > timeout:
            proc.kill()
            raise RuntimeError(f"{what} did not become ready; see {log_path}")
        time.sleep(0.05)
    return json.loads(ready.read_text())


class _Supervisor:
    """The processes of ``cluster up``: start, restart, add a shard, write ``up.json``."""

    def __init__(self, args: argparse.Namespace, d: Path, etcd: Etcd, etcd_url: str,
                 etcd_pid: int | None):
        self.args, self.d, self.etcd = args, d, etcd
        self.etcd_url, self.etcd_pid = etcd_url, etcd_pid
        self.procs: dict[str, subprocess.Popen] = {}
        self.info: dict[str, dict] = {}
        #: the members accept the etcd this launcher embedded for local use, whatever its version
        #: (etcd_binary() warned); an --etcd URL is checked by each member
        self.allow_unsafe_etcd = etcd_pid is not None and not embedded_is_safe()
        self.lock = threading.Lock()

    def _common(self, role: str) -> list[str]:
        a = self.args
        return ["--etcd", self.etcd_url, "--cluster", a.cluster, "--host", "127.0.0.1",
                "--ready-file", str(self.d / f"{role}.ready"), "--log-level", "WARNING",
                "--threads", str(a.threads), "--lease-ttl", str(a.lease_ttl),
                *(["--allow-unsafe-etcd"] if self.allow_unsafe_etcd else []),
                *(["--tokens-file", str(Path(a.tokens_file).resolve())]
                  if getattr(a, "tokens_file", None) else []),
                *tls_argv(tls_from_args(a))]

    def cmd(self, role: str) -> list[str]:
        base = [sys.executable, "-m", "simsearch.pyramid.cli", "cluster"]
        port = self.info.get(role, {}).get("port", 0)
        if role.startswith("shard-"):
            sid = self.info.get(role, {}).get("id")  # a restart keeps its id if its disk is lost
            return [*base, "shard", *self._common(role), "--port", str(port), "--data-dir",
                    str(self.d / role), "--workers", "8",
                    *(["--shard-id", str(sid)] if sid is not None else [])]
        i = int(role.split("-")[1])
        if not port and self.args.port:
            port = self.args.port + i
        return [*base, "coordinator", *self._common(role), "--port", str(port),
                "--replicas", str(self.args.replicas), "--workers", "16",
                "--replace-after", str(self.args.replace_after),
                *(["--checkpoint-log-bytes", str(self.args.checkpoint_log_bytes)]
                  if getattr(self.args, "checkpoint_log_bytes", None) else []),
                *(["--min-insync-replicas", str(self.args.min_insync_replicas)]
                  if getattr(self.args, "min_insync_replicas", None) else []),
                "--search-batches", str(getattr(self.args, "search_batches", SEARCH_BATCHES)),
                *(["--shard-token-file", str(self.d / "shard-token")]
                  if getattr(self.args, "tokens_file", None) else []),
                *(["--metrics-port", "0"] if self.args.metrics else [])]

    def start(self, *roles: str) -> None:
        """Start ``roles`` together and wait until each serves. A new shard's id is allocated
        here first, in role order, so ``shard-i`` is shard ``i`` of a new cluster."""
        for role in roles:
            if role.startswith("shard-") and self.info.get(role, {}).get("id") is None:
                shard_id(self.etcd, self.d / role)
        started = {role: _spawn(self.cmd(role), self.d / f"{role}.ready",
                                self.d / f"{role}.log") for role in roles}
        with self.lock:
            self.procs.update(started)
        for role, proc in started.items():
            ready = _await_ready(proc, self.d / f"{role}.ready", self.d / f"{role}.log")
            with self.lock:
                self.info[role] = {"pid": proc.pid, "port": ready["port"],
                                   "address": ready["address"],
                                   **{k: ready[k] for k in ("id", "metrics_port")
                                      if ready.get(k) is not None}}
            self.write()

    def next_shard(self) -> str:
        n = sum(r.startswith("shard-") for r in self.info)
        return f"shard-{n}"

    def write(self) -> None:
        with self.lock:
            _atomic_json(self.d / "up.json", {
                "etcd": self.etcd_url, "etcd_pid": self.etcd_pid, "cluster": self.args.cluster,
                "supervisor": os.getpid(), "processes": self.info})

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()


def run_up(args: argparse.Namespace) -> int:
    """Start etcd (or use --etcd), shards and coordinators on loopback; supervise them until
    SIGTERM/SIGINT (restarting a process that dies unless --no-restart; a retired shard stays
    stopped). SIGUSR1 starts one more shard (``cluster add-shard``)."""
    d = Path(args.data_dir).resolve()
    d.mkdir(parents=True, exist_ok=True)
    if args.coordinators < 1 or args.shards < 1:
        print("--coordinators and --shards must be at least 1", file=sys.stderr)
        return 2
    if not 1 <= args.replicas <= args.shards:
        print("--replicas must be in [1, --shards]", file=sys.stderr)
        return 2
    if getattr(args, "tokens_file", None):
        try:
            token = next(t for t, r in load_tokens(args.tokens_file).items() if r == CLUSTER)
        except (OSError, ValueError, StopIteration) as exc:
            print(f"--tokens-file: {exc or 'it holds no token of role cluster'}",
                  file=sys.stderr)
            return 2
        secret = d / "shard-token"
        secret.unlink(missing_ok=True)
        fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token)
    stop = threading.Event()
    add = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, lambda *_: add.set())
    local_etcd = None
    if args.etcd:
        url = args.etcd
    else:
        local_etcd = LocalEtcd(str(d / "etcd"),
                               quota_bytes=getattr(args, "etcd_quota_bytes", None)
                               or DEFAULT_QUOTA_BYTES).start()
        url = local_etcd.url
    etcd = Etcd(url, f"simsearch/{args.cluster}", tls=tls_from_args(args))
    sup = _Supervisor(args, d, etcd, url, local_etcd.pid if local_etcd else None)
    try:
        cfg = etcd.get("config")[0]
        if cfg and json.loads(cfg)["replicas"] != args.replicas:
            print(f"cluster {args.cluster!r} has {json.loads(cfg)['replicas']} replicas; use "
                  "the same --replicas or a new --data-dir", file=sys.stderr)
            return 2
        etcd.put_if_absent("config", json.dumps({"replicas": args.replicas}))
        old = json.loads((d / "up.json").read_text()) if (d / "up.json").exists() else {}
        sup.info = {r: {k: i[k] for k in ("port", "id") if k in i}
                    for r, i in old.get("processes", {}).items()}
        retired = {int(k.split("/")[1]) for k in etcd.get_prefix("retired/")}
        n_old = sum(r.startswith("shard-") for r in sup.info)
        shards = []
        for i in range(max(args.shards, n_old)):
            role = f"shard-{i}"
            if (d / role / "shard_id").exists() and \
                    int((d / role / "shard_id").read_text()) in retired:
                sup.info.pop(role, None)
                continue
            shards.append(role)
        sup.start(*shards)
        sup.start(*(f"coord-{i}" for i in range(args.coordinators)))
        print(f"simsearch cluster {args.cluster!r}: etcd {url}; shards "
              f"{', '.join(i['address'] for r, i in sup.info.items() if r.startswith('shard'))}; "
              f"coordinators "
              f"{', '.join(i['address'] for r, i in sup.info.items() if r.startswith('coord'))}",
              flush=True)
        while not stop.wait(0.5):
            if add.is_set():
                add.clear()
                try:
                    sup.start(sup.next_shard())
                except RuntimeError as exc:
                    log.error("add-shard: %s", exc)
            retired = {int(k.split("/")[1]) for k in etcd.get_prefix("retired/")} \
                if any(p.poll() is not None for p in sup.procs.values()) else set()
            for role, p in list(sup.procs.items()):
                if p.poll() is None or stop.is_set():
                    continue
                if sup.info[role].get("id") in retired:
                    if not sup.info[role].get("retired"):
                        sup.info[role]["retired"] = True
                        sup.write()
                    continue
                if not args.restart:
                    continue
                time.sleep(args.restart_delay)
                log.warning("%s exited (%s); restarting", role, p.returncode)
                try:
                    sup.start(role)
                except RuntimeError as exc:
                    log.error("%s", exc)
    finally:
        sup.stop_all()
        etcd.close()
        if local_etcd is not None:
            local_etcd.stop()
    return 0


# ---------------------------------------------------------------------------------------------
# add-shard, drain, status


def _target(args) -> tuple[str, str, dict]:
    """(etcd url, cluster name, up.json or {}) from --data-dir or --etcd/--cluster."""
    if getattr(args, "etcd", None):
        return args.etcd, args.cluster, {}
    if not args.data_dir:
        raise SimsearchError("give --data-dir of a `cluster up`, or --etcd URL --cluster NAME")
    path = Path(args.data_dir) / "up.json"
    if not path.exists():
        raise SimsearchError(f"no cluster under {args.data_dir} (run `simsearch cluster up`)")
    up = json.loads(path.read_text())
    return up["etcd"], up["cluster"], up


def run_add_shard(args: argparse.Namespace) -> int:
    url, cluster, up = _target(args)
    if not up:
        print("add-shard starts a local shard of a `cluster up --data-dir DIR`; elsewhere start "
              "`simsearch cluster shard --etcd URL --cluster NAME ...` on the new host",
              file=sys.stderr)
        return 2
    with Etcd(url, f"simsearch/{cluster}", tls=tls_from_args(args)) as etcd:
        before = set(etcd.get_prefix("shards/"))
        os.kill(up["supervisor"], signal.SIGUSR1)
        end = time.monotonic() + args.timeout
        while time.monotonic() < end:
            new = set(etcd.get_prefix("shards/")) - before
            if new:
                print(f"shard {new.pop().split('/')[1]} joined; the leader moves replicas onto it")
                return 0
            time.sleep(0.2)
    print("no new shard registered in time; see the supervisor's log", file=sys.stderr)
    return 1


def run_drain(args: argparse.Namespace) -> int:
    """Ask the leader to move shard ID's replicas away; wait until it is retired."""
    url, cluster, _ = _target(args)
    with Etcd(url, f"simsearch/{cluster}", tls=tls_from_args(args)) as etcd:
        if etcd.get(f"shards/{args.id}")[0] is None and etcd.get(f"retired/{args.id}")[0] is None:
            print(f"shard {args.id} is not registered", file=sys.stderr)
            return 2
        etcd.put(f"draining/{args.id}", "1")
        end = time.monotonic() + args.timeout
        while time.monotonic() < end:
            if etcd.get(f"retired/{args.id}")[0] is not None:
                print(f"shard {args.id} drained: its replicas moved, it stops")
                return 0
            time.sleep(0.2)
    print(f"shard {args.id} not drained within {args.timeout} s (it keeps draining)",
          file=sys.stderr)
    return 1


def run_status(args: argparse.Namespace) -> int:
    try:
        url, cluster, up = _target(args)
        st = cluster_status(url, cluster, up, tls_from_args(args))
    except Exception as exc:
        print(f"cluster status: {exc}", file=sys.stderr)
        return 1
    down = [p for p in st["processes"] if p["role"] == "shard" and p["state"] == "down"]
    if args.json:
        print(json.dumps(st, indent=1))
        return 1 if down else 0
    print(f"cluster {st['cluster']!r} on etcd {st['etcd']}: leader {st['leader']}, "
          f"replicas {st['replicas']}, epoch {st['epoch']}, collections {st['collections']}")
    for p in st["processes"]:
        if p["role"] == "shard":
            extra = f"{p['state']:9s} parts {' '.join(p['parts'])}"
            if p["out_of_sync"]:
                extra += f"  out of sync: {' '.join(p['out_of_sync'])}"
            print(f"shard {p['id']:<3d} {p['address'] or '-':22s} pid {p['pid']!s:8s} {extra}")
        else:
            print(f"{p['role']:9s} {p['address']:22s} pid {p['pid']!s:8s}")
    return 1 if down else 0


class LocalCluster:
    """``simsearch cluster up`` in a child process, for tests, benchmarks and notebooks: waits
    until every process serves and a leader is elected.

        with LocalCluster(tmp_dir, shards=3, replicas=2) as cl:
            client = simsearch.connect(cl.coordinators)
    """

    def __init__(self, data_dir: str | os.PathLike, shards: int = 3, replicas: int = 2,
                 *extra: str, timeout: float = 120.0):
        self.dir = Path(data_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "up.json").unlink(missing_ok=True)
        self._log = open(self.dir / "supervisor.log", "ab")
        coords = int(extra[extra.index("--coordinators") + 1]) if "--coordinators" in extra \
            else 1
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "simsearch.pyramid.cli", "cluster", "up", "--shards",
             str(shards), "--replicas", str(replicas), "--data-dir", str(self.dir), *extra],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        t0 = time.monotonic()
        try:  # whatever ends the wait, the processes started here are stopped with it
            while not self._ready(shards, coords):
                if self.proc.poll() is not None or time.monotonic() - t0 > timeout:
                    raise SimsearchError("the local cluster did not start:\n"
                                         + (self.dir / "supervisor.log").read_text()[-4000:])
                time.sleep(0.1)
        except BaseException:
            self.stop()
            raise

    def _ready(self, shards: int, coords: int) -> bool:
        try:
            up = self.up
        except (OSError, ValueError):
            return False
        roles = up["processes"]
        if sum(r.startswith("coord-") for r in roles) < coords:
            return False
        try:
            st = cluster_status(up["etcd"], up["cluster"], up)
        except CoordinationError:  # etcd not answering yet (a loaded machine): ask again
            return False
        return st["leader"] is not None and \
            sum(p["role"] == "shard" and p["state"] == "serving" for p in st["processes"]) >= shards

    @property
    def up(self) -> dict:
        """The supervisor's ``up.json``: etcd, cluster name, and every process it started."""
        return json.loads((self.dir / "up.json").read_text())

    def status(self) -> dict:
        up = self.up
        return cluster_status(up["etcd"], up["cluster"], up)

    @property
    def coordinators(self) -> list[str]:
        return [i["address"] for r, i in sorted(self.up["processes"].items())
                if r.startswith("coord-")]

    @property
    def coordinator(self) -> str:
        """The elected leader's address."""
        return self.status()["leader"] or self.coordinators[0]

    @property
    def shard_addresses(self) -> list[str]:
        return [i["address"] for r, i in sorted(self.up["processes"].items(),
                                                key=lambda kv: int(kv[0].split("-")[1]))
                if r.startswith("shard-")]

    def pid(self, name: str) -> int:
        """Pid of ``shard-<i>`` or ``coord-<i>`` (a restarted process gets a new one)."""
        return self.up["processes"][name]["pid"]

    def signal_shard(self, i: int, sig: int) -> None:
        os.kill(self.pid(f"shard-{i}"), sig)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._log.close()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
