"""The Pyramid cluster (design §6): shard servers host parts, coordinators route and merge.

Roles
    shard server   an ordinary ``simsearch serve`` node; part j of collection C is its
                   collection ``C.p<j>`` (same WAL, snapshots and durability as any collection).
    coordinator    a node (same gRPC service, so ``simsearch.connect(coordinator)`` gives the usual
                   client) whose collections are :class:`PyramidIndex` objects with remote parts:
                   it keeps the router (centres, meta-HNSW, partition, id -> part, MIPS lists) in
                   its own store (log + snapshots) and fans searches and writes out to replicas.
    cluster map    ``<dir>/cluster.json``: shards, replication factor, which replicas are out of
                   sync, and an epoch bumped on every change. Part j lives on shards
                   ``(j + i) % n_shards`` for i < replicas, so no two replicas share a server.

Writes go to every in-sync replica of the item's part (and of its MIPS copies' parts), with
upsert / missing-ok semantics so a replayed write is harmless, and are acknowledged once every
in-sync replica has logged them; a replica that fails a write is marked out of sync (epoch + 1)
and gets no reads until it has been re-copied. A health watcher checks every shard; reads skip a
shard at once when a call to it fails, hedge to another replica after the part's p95 latency
(bounded to ~10% extra calls) and carry the client's deadline. When a shard comes back, each of
its parts is checked (present, same count as an in-sync peer) and re-copied from a surviving
replica (ExportCollection / ImportCollection) under the part's write lock before it serves.
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

from ..errors import SimsearchError
from .datapath import (  # noqa: F401  (re-exported)
    DEADLINE,
    RemotePart,
    ShardPool,
    _atomic_json,
    load_router,
    open_router,
    placement,
)

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# the coordinator: the node service over a store of clustered PyramidIndex collections

def _coordinator_store_classes(pool: ShardPool):
    """The node's Store whose pyramid collections keep their parts on ``pool``'s shards."""
    from ..index import load
    from ..service.store import Collection, Store
    from .index import PyramidIndex

    class ClusterCollection(Collection):
        def _new_index(self):
            c = self.config
            if c["kind"] != "pyramid":
                raise SimsearchError(f"a coordinator holds pyramid collections; got {c['kind']!r}")
            idx = PyramidIndex(c["dim"], c["metric"], **c["params"])
            idx.part_prefix = self.name
            idx.parts_factory = pool.make_parts
            return idx

        def _load_index(self, path):
            return load(path, setup=lambda idx: setattr(idx, "parts_factory", pool.make_parts))

        def train(self, x, deadline=None):
            super().train(x, deadline)
            self.snapshot(deadline)  # the model is durable as trained, never re-trained

        def search(self, q, k, params, deadline=None):
            token = DEADLINE.set(deadline)
            try:
                return super().search(q, k, params, deadline)
            finally:
                DEADLINE.reset(token)

    class ClusterStore(Store):
        collection_class = ClusterCollection

        def create(self, name, dim, metric, kind, params):
            if kind != "pyramid":
                from ..errors import InvalidParameterError

                raise InvalidParameterError(
                    f"a Pyramid coordinator creates kind 'pyramid' collections; got {kind!r}")
            return super().create(name, dim, metric, kind, params)

        def drop(self, name):
            col = self.get(name)
            parts = list(getattr(col.index, "parts", []) or [])
            super().drop(name)
            for part in parts:  # best effort: a shard that is down keeps an orphan collection
                for sid in part.shards:
                    try:
                        part.pool.clients[sid].drop_collection(part.name)
                    except Exception as exc:
                        log.warning("could not drop %s on shard %d: %s", part.name, sid, exc)
                part.pool.parts.pop(part.name, None)

    return ClusterStore


def run_coordinator(args: argparse.Namespace) -> int:
    from ..eval import thread_limit
    from ..service.server import _write_ready_file, create_server
    if not args.follow and not args.data_dir:
        print("a leader coordinator needs --data-dir (its router store); "
              "a follower needs --follow LEADER", file=sys.stderr)
        return 2
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with thread_limit(args.threads):
        token = Path(args.shard_token_file).read_text().strip() if args.shard_token_file \
            else None
        pool = ShardPool(args.cluster_dir, health_interval=args.health_interval, token=token,
                         tls_ca=args.shard_tls_ca, read_only=bool(args.follow))
        if args.follow:  # reads from a copy of the leader's routers, writes forwarded
            from .follower import FollowerStore

            leader_token = Path(args.follow_token_file).read_text().strip() \
                if args.follow_token_file else None
            store = FollowerStore(args.follow, pool, refresh_interval=args.refresh_interval,
                                  token=leader_token, tls_ca=args.follow_tls_ca)
        else:
            store = _coordinator_store_classes(pool)(args.data_dir)
        from ..service.auth import load_tokens

        running = create_server(
            args.data_dir, args.port, args.host, store=store, workers=args.workers,
            max_concurrent_rpcs=None, tls_cert=args.tls_cert, tls_key=args.tls_key,
            tokens=load_tokens(args.tokens_file) if args.tokens_file else None)
        print(f"simsearch coordinator: serving on {args.host}:{running.port}", flush=True)
        if args.ready_file:
            _write_ready_file(args.ready_file, {"port": running.port, "pid": os.getpid()})
        while not stop.wait(1.0):
            pass
        running.stop(5.0)
        pool.close()
    return 0


# ---------------------------------------------------------------------------------------------
# `simsearch cluster up | status | coordinator`


def _spawn(cmd: list[str], ready: Path, log_path: Path, timeout: float = 120.0):
    ready.unlink(missing_ok=True)
    logf = open(log_path, "ab")
    proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    t0 = time.monotonic()
    while not ready.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[2]} exited with {proc.returncode}; see {log_path}")
        if time.monotonic() - t0 > timeout:
            proc.kill()
            raise RuntimeError(f"{cmd[2]} did not become ready; see {log_path}")
        time.sleep(0.05)
    return proc, json.loads(ready.read_text())["port"]


def _shard_cmd(d: Path, i: int, port: int, threads: int) -> list[str]:
    return [sys.executable, "-m", "simsearch.service.server", "--data-dir", str(d / f"shard-{i}"),
            "--port", str(port), "--ready-file", str(d / f"shard-{i}.ready"), "--log-level",
            "WARNING", "--threads", str(threads), "--workers", "8"]


def run_up(args: argparse.Namespace) -> int:
    """Start shard servers and coordinators on loopback; supervise them until SIGTERM/SIGINT
    (restarting a shard that dies unless --no-restart)."""
    d = Path(args.data_dir).resolve()
    d.mkdir(parents=True, exist_ok=True)
    map_path = d / "cluster.json"
    old = json.loads(map_path.read_text()) if map_path.exists() else None
    if old and (len(old["shards"]) != args.shards or old["replicas"] != args.replicas):
        print(f"{map_path} describes {len(old['shards'])} shards x {old['replicas']} replicas; "
              "use the same --shards/--replicas or a new --data-dir", file=sys.stderr)
        return 2
    if args.coordinators < 1:
        print("--coordinators must be at least 1", file=sys.stderr)
        return 2
    if args.replicas > args.shards or args.replicas < 1:
        print("--replicas must be in [1, --shards]", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    shards: list[dict] = []
    procs: dict[str, subprocess.Popen] = {}
    try:
        for i in range(args.shards):
            port = old["shards"][i]["port"] if old else 0
            proc, port = _spawn(_shard_cmd(d, i, port, args.threads), d / f"shard-{i}.ready",
                                d / f"shard-{i}.log")
            procs[f"shard-{i}"] = proc
            shards.append({"id": i, "address": f"127.0.0.1:{port}", "port": port,
                           "data_dir": str(d / f"shard-{i}")})
        cmap = old or {"epoch": 0, "replicas": args.replicas, "out_of_sync": {}}
        cmap.update(shards=shards, epoch=int(cmap.get("epoch", 0)) + 1)
        _atomic_json(map_path, cmap)
        coords = []
        for i in range(args.coordinators):  # coord-0 leads; the others follow it
            cmd = [sys.executable, "-m", "simsearch.pyramid.cluster", "coordinator",
                   "--cluster-dir", str(d), "--data-dir", str(d / f"coord-{i}"),
                   "--port", str(args.port + i if args.port else 0),
                   "--ready-file", str(d / f"coord-{i}.ready"), "--log-level", "WARNING",
                   "--threads", str(args.threads)]
            if i:
                cmd += ["--follow", coords[0]["address"]]
            proc, port = _spawn(cmd, d / f"coord-{i}.ready", d / f"coord-{i}.log")
            procs[f"coord-{i}"] = proc
            coords.append({"id": i, "address": f"127.0.0.1:{port}",
                           "role": "follower" if i else "leader"})

        def write_procs():
            _atomic_json(d / "processes.json", {
                "supervisor": os.getpid(), "coordinators": coords,
                "pids": {n: p.pid for n, p in procs.items()}})

        write_procs()
        print(f"simsearch cluster: {args.shards} shards x {args.replicas} replicas; "
              f"coordinator(s) {', '.join(c['address'] for c in coords)}", flush=True)
        while not stop.wait(0.5):
            for i in range(args.shards):
                p = procs[f"shard-{i}"]
                if p.poll() is not None and args.restart:
                    time.sleep(args.restart_delay)
                    if stop.is_set():
                        break
                    log.warning("shard %d exited (%s); restarting", i, p.returncode)
                    try:
                        procs[f"shard-{i}"], _ = _spawn(
                            _shard_cmd(d, i, shards[i]["port"], args.threads),
                            d / f"shard-{i}.ready", d / f"shard-{i}.log")
                    except RuntimeError as exc:
                        log.error("%s", exc)
                    write_procs()
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.terminate()
        for p in procs.values():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
    return 0


def run_status(args: argparse.Namespace) -> int:
    from ..service.client import connect

    d = Path(args.data_dir)
    try:
        cmap = json.loads((d / "cluster.json").read_text())
    except FileNotFoundError:
        print(f"no cluster under {d} (run `simsearch cluster up` first)", file=sys.stderr)
        return 1
    procs = json.loads((d / "processes.json").read_text()) if (d / "processes.json").exists() \
        else {"coordinators": [], "pids": {}}
    print(f"epoch {cmap['epoch']}, {len(cmap['shards'])} shards, replicas {cmap['replicas']}")
    for c in procs["coordinators"]:
        try:
            h = connect(c["address"], timeout=2).health()
        except Exception as exc:
            h = type(exc).__name__
        print(f"coordinator {c['id']}  {c['address']:22s} {c.get('role', 'leader'):8s} {h}")
    bad = 0
    for s in cmap["shards"]:
        try:
            cli = connect(s["address"], timeout=2)
            h = cli.health()
            cols = {n: len(cli.collection(n)) for n in cli.list_collections()}
        except Exception as exc:
            h, cols = type(exc).__name__, {}
            bad += 1
        pid = procs["pids"].get(f"shard-{s['id']}", "-")
        print(f"shard {s['id']}  {s['address']:22s} pid {pid!s:7s} {h:12s} "
              + " ".join(f"{n}={c}" for n, c in sorted(cols.items())))
    for name, sids in sorted(cmap.get("out_of_sync", {}).items()):
        print(f"out of sync: {name} on shards {sids}")
    return 1 if bad else 0


class LocalCluster:
    """``simsearch cluster up`` in a child process, for tests, benchmarks and notebooks: waits
    until every process is serving, then exposes the addresses and pids it wrote.

        with LocalCluster(tmp_dir, shards=3, replicas=2) as cl:
            client = simsearch.connect(cl.coordinator)
    """

    def __init__(self, data_dir: str | os.PathLike, shards: int = 3, replicas: int = 2,
                 *extra: str, timeout: float = 120.0):
        self.dir = Path(data_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "processes.json").unlink(missing_ok=True)  # written afresh once all serve
        self._log = open(self.dir / "supervisor.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "simsearch.pyramid.cluster", "up", "--shards", str(shards),
             "--replicas", str(replicas), "--data-dir", str(self.dir), *extra],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        t0 = time.monotonic()
        while not (self.dir / "processes.json").exists():
            if self.proc.poll() is not None or time.monotonic() - t0 > timeout:
                self.stop()
                raise SimsearchError("the local cluster did not start:\n"
                                     + (self.dir / "supervisor.log").read_text()[-4000:])
            time.sleep(0.1)

    @property
    def processes(self) -> dict:
        """The supervisor's ``processes.json``: coordinators and the pid of every process."""
        return json.loads((self.dir / "processes.json").read_text())

    @property
    def coordinator(self) -> str:
        return self.processes["coordinators"][0]["address"]

    @property
    def shard_addresses(self) -> list[str]:
        return [s["address"] for s in json.loads((self.dir / "cluster.json").read_text())["shards"]]

    def pid(self, name: str) -> int:
        """Pid of ``shard-<i>`` or ``coord-<i>`` (a restarted shard gets a new one)."""
        return self.processes["pids"][name]

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


def add_cluster_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``cluster up | status | coordinator`` on a CLI's subparsers."""
    p = subparsers.add_parser("cluster", help="a local Pyramid cluster (shards + coordinators)")
    sub = p.add_subparsers(dest="cluster_command", required=True)
    up = sub.add_parser("up", help="start shard servers and coordinators on loopback")
    up.add_argument("--shards", type=int, default=3)
    up.add_argument("--replicas", type=int, default=2)
    up.add_argument("--coordinators", type=int, default=1,
                    help="coordinator processes: the first leads (owns the routers and the map), "
                         "the others follow it (local reads, writes forwarded)")
    up.add_argument("--data-dir", required=True)
    up.add_argument("--port", type=int, default=0, help="first coordinator port (0: free port)")
    up.add_argument("--threads", type=int, default=1, help="search threads per process")
    up.add_argument("--no-restart", dest="restart", action="store_false",
                    help="do not restart shard servers that exit")
    up.add_argument("--restart-delay", type=float, default=1.0)
    up.set_defaults(func=run_up)
    st = sub.add_parser("status", help="health, parts and sync state of a local cluster")
    st.add_argument("--data-dir", required=True)
    st.set_defaults(func=run_status)
    co = sub.add_parser("coordinator", help="run one coordinator (started by `cluster up`)")
    co.add_argument("--cluster-dir", required=True, help="directory holding cluster.json")
    co.add_argument("--data-dir", help="the leader's router store (a follower keeps none)")
    co.add_argument("--follow", metavar="LEADER",
                    help="run as a follower of the leader coordinator at this address")
    co.add_argument("--refresh-interval", type=float, default=2.0,
                    help="a follower re-checks the leader's routers at most this often (s)")
    co.add_argument("--follow-token-file", help="a file holding a token for the leader")
    co.add_argument("--follow-tls-ca", help="PEM CA of the leader's TLS certificate")
    co.add_argument("--port", type=int, default=0)
    co.add_argument("--host", default="127.0.0.1")
    co.add_argument("--ready-file")
    co.add_argument("--workers", type=int, default=16)
    co.add_argument("--threads", type=int, default=1)
    co.add_argument("--health-interval", type=float, default=0.2)
    co.add_argument("--log-level", default="INFO")
    co.add_argument("--tokens-file", help="bearer tokens for clients (as `simsearch serve`)")
    co.add_argument("--tls-cert", help="PEM certificate chain; with --tls-key serves TLS only")
    co.add_argument("--tls-key")
    co.add_argument("--shard-token-file", help="a file holding the read-write token for shards")
    co.add_argument("--shard-tls-ca", help="PEM CA of the shards' TLS certificates")
    co.set_defaults(func=run_coordinator)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="simsearch")
    sub = parser.add_subparsers(dest="command", required=True)
    add_cluster_parser(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] != "cluster":
        argv = ["cluster", *argv]
    return _dispatch(parser.parse_args(argv))


def _dispatch(args: argparse.Namespace) -> int:
    if args.func is not run_coordinator and not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
