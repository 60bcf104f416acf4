"""``simsearch cluster ...`` (docs/cluster.md): the roles (``shard``, ``coordinator``) and the
local launcher's commands (``up``, ``add-shard``, ``drain``, ``status``)."""

from __future__ import annotations

import argparse
import logging
import sys

from ..service.server import add_serve_arguments
from . import launcher
from .control.etcd_server import DEFAULT_QUOTA_BYTES
from .coordinator import CHECKPOINT_LOG_BYTES, REPLACE_AFTER, SEARCH_BATCHES
from .launcher import DEFAULT_CLUSTER
from .nodes import run_coordinator, run_shard


def _etcd_args(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument("--etcd", required=required,
                   help="etcd endpoints, http://HOST:PORT[,http://HOST:PORT...]")
    p.add_argument("--cluster", default=DEFAULT_CLUSTER,
                   help=f"the cluster's name: its keys live under /simsearch/NAME/ "
                        f"(default {DEFAULT_CLUSTER})")
    p.add_argument("--etcd-ca", help="PEM CA of etcd's certificate (TLS to etcd: https:// "
                                     "endpoints, with --etcd-cert and --etcd-key)")
    p.add_argument("--etcd-cert", help="PEM client certificate for etcd (--client-cert-auth)")
    p.add_argument("--etcd-key", help="PEM key of --etcd-cert")


def _role_args(p: argparse.ArgumentParser) -> None:

    _etcd_args(p, required=True)
    p.add_argument("--lease-ttl", type=float, default=3.0,
                   help="seconds of silence before etcd drops this process (default 3)")
    p.add_argument("--advertise", help="HOST:PORT others reach this process at "
                                       "(default --host:--port)")
    p.add_argument("--allow-unsafe-etcd", action="store_true",
                   help="run against an etcd at a version its maintainers call unsafe "
                        "(3.5.0-3.5.5, below 3.4.22); refused otherwise")


def add_cluster_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``cluster up | add-shard | drain | status | shard | coordinator``."""
    p = subparsers.add_parser("cluster", help="a Pyramid cluster: shards, coordinators, etcd")
    sub = p.add_subparsers(dest="cluster_command", required=True)

    up = sub.add_parser("up", help="start etcd, shard servers and coordinators on loopback")
    up.add_argument("--shards", type=int, default=3)
    up.add_argument("--replicas", type=int, default=2)
    up.add_argument("--coordinators", type=int, default=1,
                    help="coordinator processes; one is elected leader, the others follow")
    up.add_argument("--data-dir", required=True)
    _etcd_args(up, required=False)
    up.add_argument("--lease-ttl", type=float, default=3.0)
    up.add_argument("--port", type=int, default=0, help="first coordinator port (0: free port)")
    up.add_argument("--threads", type=int, default=1, help="search threads per process")
    up.add_argument("--no-restart", dest="restart", action="store_false",
                    help="do not restart processes that exit")
    up.add_argument("--restart-delay", type=float, default=1.0)
    up.add_argument("--replace-after", type=float, default=REPLACE_AFTER,
                    help="the coordinators' --replace-after")
    up.add_argument("--checkpoint-log-bytes", type=int, default=CHECKPOINT_LOG_BYTES,
                    help="the coordinators' --checkpoint-log-bytes")
    up.add_argument("--min-insync-replicas", type=int,
                    help="the coordinators' --min-insync-replicas")
    up.add_argument("--search-batches", type=int, default=SEARCH_BATCHES,
                    help="the coordinators' --search-batches")
    up.add_argument("--etcd-quota-bytes", type=int, default=DEFAULT_QUOTA_BYTES,
                    help="the embedded etcd's --quota-backend-bytes (with --etcd: not used)")
    up.add_argument("--tokens-file",
                    help="bearer tokens for every member (docs/service.md, \"Security model\"); "
                         "its first 'cluster' token is what coordinators send to shards")
    up.add_argument("--metrics", action="store_true",
                    help="coordinators serve Prometheus metrics on free loopback ports "
                         "(in up.json as metrics_port)")
    up.set_defaults(func=launcher.run_up)

    for name, fn, text in (("status", launcher.run_status, "processes, parts and sync state"),
                           ("add-shard", launcher.run_add_shard,
                            "start one more shard of a `cluster up`"),
                           ("drain", launcher.run_drain,
                            "move a shard's replicas away, then stop it")):
        sp = sub.add_parser(name, help=text)
        if name == "drain":
            sp.add_argument("id", type=int, help="the shard's id (see `cluster status`)")
        sp.add_argument("--data-dir", help="the directory of a `cluster up`")
        _etcd_args(sp, required=False)
        if name == "status":
            sp.add_argument("--json", action="store_true", help="one JSON object")
        else:
            sp.add_argument("--timeout", type=float, default=600.0)
        sp.set_defaults(func=fn)

    sh = sub.add_parser("shard", help="run one shard server that registers in etcd")
    add_serve_arguments(sh)
    _role_args(sh)
    sh.add_argument("--shard-id", type=int,
                    help="take this id if --data-dir has none (a shard replacing a lost disk)")
    sh.set_defaults(func=run_shard)

    co = sub.add_parser("coordinator", help="run one coordinator (elected leader or follower)")
    add_serve_arguments(co, data_dir=False)
    _role_args(co)
    co.add_argument("--replicas", type=int, default=2,
                    help="replicas per part, if the cluster has no setting yet")
    co.add_argument("--health-interval", type=float, default=0.2)
    co.add_argument("--replace-after", type=float, default=REPLACE_AFTER,
                    help="seconds a shard may stay unregistered before the leader re-makes its "
                         f"replicas elsewhere (default {REPLACE_AFTER:g})")
    co.add_argument("--checkpoint-log-bytes", type=int, default=CHECKPOINT_LOG_BYTES,
                    help="checkpoint a router once this many bytes of log records follow its "
                         "last checkpoint (then etcd is compacted; keep it well below etcd's "
                         f"quota; default {CHECKPOINT_LOG_BYTES})")
    co.add_argument("--min-insync-replicas", type=int,
                    help="replicas of a part that must hold a write durably before it is "
                         "acknowledged (default: 2 when parts have two replicas or more, else 1)")
    co.add_argument("--search-batches", type=int, default=SEARCH_BATCHES,
                    help="batches of one collection's searches in flight at once; searches "
                         "arriving meanwhile wait and go out merged into the next batch "
                         f"(default {SEARCH_BATCHES}; 0: every search alone)")
    co.add_argument("--shard-token-file",
                    help="a file holding the token for shards (role 'cluster' in their tokens "
                         "file, docs/service.md \"Security model\")")
    co.add_argument("--shard-tls-ca", help="PEM CA of the shards' TLS certificates")
    co.add_argument("--cluster-tls-ca",
                    help="PEM CA of the coordinators' TLS certificates, for a follower forwarding "
                         "writes to its leader (default: --shard-tls-ca, else --tls-cert)")
    co.set_defaults(func=run_coordinator)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="simsearch")
    sub = parser.add_subparsers(dest="command", required=True)
    add_cluster_parser(sub)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] != "cluster":
        argv = ["cluster", *argv]
    args = parser.parse_args(argv)
    if not logging.getLogger().handlers and args.func.__name__ not in ("run_shard",
                                                                        "run_coordinator"):
        logging.basicConfig(level=logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
