"""The Pyramid cluster's control plane on etcd (docs/cluster.md).

``etcd``: a local etcd server (``LocalEtcd``) and a client bound to a key prefix (``Etcd``: reads,
fenced transactions, leases with keepalive, watches that survive reconnects). ``election``: a
lease-based leader election with a local deadline, so a cut-off leader stops before another can win.
Importing this package does not import the etcd client library; the modules do.
"""
