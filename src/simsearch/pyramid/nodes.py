"""The cluster's node roles as processes (docs/cluster.md): a shard (an ordinary search node that
registers itself in etcd under a lease, so membership and liveness come from etcd, and stops
once the leader has moved its replicas away after ``cluster drain``) and a coordinator (a
Coordinator served as a node's store, joining the election)."""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

from ..service.server import run_serve
from .control.etcd import Etcd, tls_from_args
from .control.state import shard_id
from .coordinator import Coordinator

log = logging.getLogger(__name__)


def run_shard(args) -> int:
    """``simsearch cluster shard``: serve, register, exit when retired."""
    etcd = Etcd(args.etcd, f"simsearch/{args.cluster}", timeout=max(1.0, args.lease_ttl),
                tls=tls_from_args(args))
    etcd.check_server_version(args.allow_unsafe_etcd)
    sid = shard_id(etcd, Path(args.data_dir), args.shard_id)
    if etcd.get(f"retired/{sid}")[0] is not None:
        log.error("shard %d was drained and retired; start a new one with a new --data-dir", sid)
        return 3

    def attach(running, stop: threading.Event):
        address = args.advertise or f"{args.host}:{running.port}"
        reg = etcd.register(f"shards/{sid}", json.dumps(
            {"id": sid, "address": address, "pid": os.getpid()}), args.lease_ttl)
        reg.wait(10.0)

        def on_retired(events):
            if any(ev.kind == "put" for ev in events):
                log.warning("shard %d is retired (drained): stopping", sid)
                stop.set()

        cancel = etcd.watch_prefix(f"retired/{sid}", on_retired)

        def cleanup():
            cancel()
            reg.close(revoke=True)  # leave the cluster now, not one lease later
            etcd.close()

        return cleanup, {"id": sid, "address": address, "role": "shard"}

    return run_serve(args, attach=attach)


def run_coordinator(args) -> int:
    """``simsearch cluster coordinator``: serve the cluster's collections and join the
    election (docs/cluster.md)."""
    token = open(args.shard_token_file).read().strip() if args.shard_token_file else None
    etcd = Etcd(args.etcd, f"simsearch/{args.cluster}", timeout=max(1.0, args.lease_ttl),
                tls=tls_from_args(args))
    etcd.check_server_version(args.allow_unsafe_etcd)
    coord = Coordinator(etcd, lease_ttl=args.lease_ttl, replicas=args.replicas,
                        replace_after=args.replace_after,
                        leader_tls_ca=getattr(args, "cluster_tls_ca", None) or args.shard_tls_ca
                        or args.tls_cert,
                        checkpoint_log_bytes=args.checkpoint_log_bytes,
                        min_insync_replicas=args.min_insync_replicas,
                        search_batches=args.search_batches,
                        pool_options={"health_interval": args.health_interval, "token": token,
                                      "tls_ca": args.shard_tls_ca})

    def attach(running, stop):
        coord.start(args.advertise or f"{args.host}:{running.port}")

        def cleanup():
            if coord.election is not None:
                coord.election.close()  # resign now: a standby leads within one watch event

        return cleanup, {"address": coord.address, "role": "coordinator"}

    return run_serve(args, store=coord, attach=attach)
