"""The node server: ``simsearch serve --data-dir DIR --port P`` (or ``python -m
simsearch.service.server ...``).

:func:`create_server` builds and starts a server and returns it with its bound port (port 0 picks
a free one); :func:`serve` runs one until SIGTERM/SIGINT, then shuts down gracefully: health turns
NOT_SERVING, new calls are refused, calls in flight get ``--grace`` seconds, logs are closed.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from .._durable import write_json
from .auth import TokenAuthInterceptor, load_tokens
from .limits import DEFAULT_LIMITS, Limits
from .protocols import CollectionStore
from .protos.simsearch.v1 import simsearch_pb2 as pb
from .servicer import SimSearchServicer, add_to_server
from .store import DEFAULT_SNAPSHOT_WAL_BYTES, Store

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["SimSearch"].full_name
DEFAULT_PORT = 50051
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20


@dataclass
class RunningServer:
    server: grpc.Server
    port: int
    servicer: SimSearchServicer
    health: health.HealthServicer
    store: CollectionStore
    metrics_port: int | None = None

    def stop(self, grace: float = 10.0) -> None:
        """Refuse new calls, let calls in flight finish within ``grace`` seconds, close logs."""
        t0 = time.monotonic()
        self.health.enter_graceful_shutdown()
        self.servicer.drain(grace)  # new calls get UNAVAILABLE, calls in flight finish
        self.server.stop(max(0.0, grace - (time.monotonic() - t0))).wait()
        if self.servicer.metrics is not None:
            self.servicer.metrics.close()
        self.store.close()


def _fixed_mmap_threshold(nbytes: int = 1 << 20) -> None:
    """Serve large allocations from mmap, returned to the OS when freed. glibc otherwise raises
    its mmap threshold after the first large free, and a snapshot's copy of an index, freed while
    searches allocate in other threads, stays in the heap: the soak saw resident memory step up
    at each snapshot of an HNSW collection under search load (docs/bench/service.md, "Soak")."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-3, nbytes)  # M_MMAP_THRESHOLD; fixes it in place
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def _limit_openmp(n: int | None) -> None:
    if n is not None:
        import faiss

        faiss.omp_set_num_threads(n)


def create_server(
    data_dir: str | os.PathLike,
    port: int = 0,
    host: str = "127.0.0.1",
    *,
    reflection: bool = False,
    tls_cert: str | os.PathLike | None = None,
    tls_key: str | os.PathLike | None = None,
    tokens: dict[str, str] | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    max_concurrent_rpcs: int | None = 64,
    workers: int = 8,
    threads: int | None = None,
    snapshot_wal_bytes: int = DEFAULT_SNAPSHOT_WAL_BYTES,
    store: CollectionStore | None = None,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    limits: Limits = DEFAULT_LIMITS,
) -> RunningServer:
    """Open the store under ``data_dir`` (replaying logs), bind and start. Returns the running
    server and the port it bound. ``threads``: faiss's OpenMP limit in every worker thread (its
    limit is per thread; the process-wide limits are set once by run_serve)."""
    _fixed_mmap_threshold()
    if store is None:  # a caller may bring its own (the Pyramid coordinator does)
        store = Store(data_dir, snapshot_wal_bytes=snapshot_wal_bytes, limits=limits)
    metrics = None
    if metrics_port is not None:  # off by default: prometheus_client is imported only here
        from .metrics import ServiceMetrics

        metrics = ServiceMetrics(store)
        metrics_port = metrics.serve(metrics_port, metrics_host)
    servicer = SimSearchServicer(store, max_message_bytes, metrics, limits)
    options = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),
    ]
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="simsearch-rpc",
                                   initializer=_limit_openmp, initargs=(threads,)),
        interceptors=[TokenAuthInterceptor(tokens)] if tokens else None,
        options=options,
        maximum_concurrent_rpcs=max_concurrent_rpcs,
    )
    add_to_server(servicer, server)
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if reflection:
        from grpc_reflection.v1alpha import reflection as refl

        refl.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, refl.SERVICE_NAME), server
        )
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if (tls_cert is None) != (tls_key is None):
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    if tls_cert is not None:
        creds = grpc.ssl_server_credentials(
            [(Path(tls_key).read_bytes(), Path(tls_cert).read_bytes())]
        )
        bound = server.add_secure_port(address, creds)
    else:
        bound = server.add_insecure_port(address)
    if not bound:
        store.close()
        raise OSError(f"could not bind {address}")
    server.start()
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info(
        "serving on %s:%d (%s, %d collections)",
        host,
        bound,
        "TLS" if tls_cert else "plaintext",
        len(store.names()),
    )
    return RunningServer(server, bound, servicer, health_servicer, store, metrics_port)


# ---------------------------------------------------------------------------------------------
# command line


def add_serve_arguments(p: argparse.ArgumentParser, data_dir: bool = True
                        ) -> argparse.ArgumentParser:
    """The server's flags (shared by ``serve`` and the cluster's shard and coordinator roles;
    ``data_dir=False`` leaves ``--data-dir`` to the caller)."""
    if data_dir:
        p.add_argument("--data-dir", required=True,
                       help="where collections, snapshots and logs live")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="0 picks a free port")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="interface to bind (default loopback only; 0.0.0.0 for all)",
    )
    p.add_argument("--reflection", action="store_true", help="enable gRPC server reflection")
    p.add_argument("--tls-cert", help="PEM certificate chain; with --tls-key serves TLS only")
    p.add_argument("--tls-key", help="PEM private key for --tls-cert")
    p.add_argument(
        "--tokens-file", help="bearer tokens, one '<read-only|read-write> <token>' per line"
    )
    p.add_argument(
        "--max-message-bytes",
        type=int,
        default=DEFAULT_MAX_MESSAGE_BYTES,
        help="largest request or response (default 64 MiB)",
    )
    p.add_argument(
        "--max-concurrent-rpcs",
        type=int,
        default=64,
        help="calls beyond this are refused with RESOURCE_EXHAUSTED",
    )
    p.add_argument("--workers", type=int, default=8, help="threads serving calls")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="BLAS/faiss/numba threads per search (default 1; calls run in parallel)",
    )
    p.add_argument(
        "--snapshot-wal-bytes",
        type=int,
        default=DEFAULT_SNAPSHOT_WAL_BYTES,
        help="snapshot a collection automatically when its log exceeds this",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=10.0,
        help="seconds calls in flight get to finish on shutdown",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        help="serve Prometheus metrics over HTTP on this port (0: a free one; default off)",
    )
    p.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="interface for --metrics-port (default loopback only)",
    )
    p.add_argument(
        "--ready-file",
        help="write {'port', 'pid'} as JSON here once serving (for scripts and tests)",
    )
    p.add_argument("--log-level", default="INFO")
    Limits().add_arguments(p)
    return p


def add_serve_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``serve`` on a CLI's subparsers; dispatch to :func:`run_serve`."""
    p = subparsers.add_parser("serve", help="run a search node (gRPC)")
    add_serve_arguments(p)
    p.set_defaults(func=run_serve)
    return p


def _write_ready_file(path: str, info: dict) -> None:
    write_json(path, info)  # atomic: a reader sees no file or the whole one


def run_serve(args: argparse.Namespace, store: CollectionStore | None = None,
              attach=None) -> int:
    """Run a server until SIGTERM or SIGINT. Returns the process exit code.

    ``store``: serve this store instead of one under ``--data-dir``. ``attach(running, stop)``,
    called once serving and before the ready file is written, returns ``(cleanup, extra)``:
    ``cleanup()`` runs first at shutdown, ``extra`` is merged into the ready file; it may set
    ``stop`` to end the process (the cluster's shard and coordinator roles use it)."""
    from ..eval import thread_limit

    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=getattr(logging, str(args.log_level).upper(), logging.INFO),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        logging.getLogger("faiss").setLevel(logging.WARNING)
    try:
        tokens = load_tokens(args.tokens_file) if args.tokens_file else None
    except (OSError, ValueError) as exc:
        print(f"simsearch serve: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with thread_limit(args.threads):
        try:
            running = create_server(
                getattr(args, "data_dir", None),
                args.port,
                args.host,
                reflection=args.reflection,
                tls_cert=args.tls_cert,
                tls_key=args.tls_key,
                tokens=tokens,
                max_message_bytes=args.max_message_bytes,
                max_concurrent_rpcs=args.max_concurrent_rpcs or None,
                workers=args.workers,
                threads=args.threads,
                snapshot_wal_bytes=args.snapshot_wal_bytes,
                metrics_port=getattr(args, "metrics_port", None),
                metrics_host=getattr(args, "metrics_host", "127.0.0.1"),
                store=store,
                limits=Limits.from_args(args),
            )
        except (OSError, ValueError) as exc:
            print(f"simsearch serve: {exc}", file=sys.stderr)
            return 1
        print(f"simsearch: serving on {args.host}:{running.port}", flush=True)
        cleanup, extra = attach(running, stop) if attach else (None, {})
        if args.ready_file:
            _write_ready_file(args.ready_file, {"port": running.port, "pid": os.getpid(),
                                                "metrics_port": running.metrics_port, **extra})
        while not stop.wait(0.2):
            pass
        log.info("shutting down (grace %.1f s)", args.grace)
        if cleanup is not None:
            cleanup()
        running.stop(args.grace)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="simsearch serve", description=__doc__.splitlines()[0])
    add_serve_arguments(parser)
    return run_serve(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
