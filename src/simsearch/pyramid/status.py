"""``simsearch cluster status``: the cluster as etcd has it (processes, their roles, parts and
sync state), with the local pids a ``cluster up`` recorded."""

from __future__ import annotations

import json

from .control.etcd import Etcd


def _decode(value: bytes):
    try:
        return json.loads(value)
    except ValueError:  # the leader key holds a bare address
        return value.decode()


def cluster_status(url: str, cluster: str, up: dict | None = None, tls=None) -> dict:
    """The cluster as etcd has it, with local pids: ``{"cluster", "etcd", "processes",
    "collections"}``; each process has ``role``, ``address``, ``pid`` and, for shards,
    ``id``, ``parts`` and ``state``."""
    up = up or {}
    pids = {i.get("address"): i.get("pid") for i in up.get("processes", {}).values()}
    with Etcd(url, f"simsearch/{cluster}", timeout=3.0, tls=tls) as etcd:
        kv = {k: _decode(v) for k, (v, _) in etcd.get_prefix("").items()
              if not k.startswith("log/")}
    leader = kv.get("leader")
    procs = [{"role": "etcd", "address": url, "pid": up.get("etcd_pid")}]
    for k, v in sorted(kv.items()):
        if k.startswith("coordinators/"):
            procs.append({"role": "leader" if v["address"] == leader else "follower",
                          "address": v["address"], "pid": v.get("pid")})
    maps = {k[4:]: v for k, v in kv.items() if k.startswith("map/")}
    parts: dict[int, list[str]] = {}
    stale: dict[int, list[str]] = {}
    for m in maps.values():
        for part, e in m["parts"].items():
            for s in e["replicas"]:
                parts.setdefault(s, []).append(part)
                if s not in e["in_sync"]:
                    stale.setdefault(s, []).append(part)
    shards = {int(k.split("/")[1]): v for k, v in kv.items() if k.startswith("shards/")}
    draining = {int(k.split("/")[1]) for k in kv if k.startswith("draining/")}
    retired = {int(k.split("/")[1]) for k in kv if k.startswith("retired/")}
    for sid in sorted(set(shards) | set(parts) | retired):
        info = shards.get(sid, {})
        state = ("retired" if sid in retired else "draining" if sid in draining
                 else "serving" if sid in shards else "down")
        procs.append({"role": "shard", "id": sid, "address": info.get("address"),
                      "pid": info.get("pid", pids.get(info.get("address"))),
                      "parts": sorted(parts.get(sid, [])),
                      "out_of_sync": sorted(stale.get(sid, [])), "state": state})
    return {"cluster": cluster, "etcd": url, "leader": leader,
            "replicas": (kv.get("config") or {}).get("replicas"),
            "epoch": sum(int(m.get("epoch", 0)) for m in maps.values()),
            "collections": sorted(k.split("/", 1)[1] for k in kv if k.startswith("collections/")),
            "processes": procs}
