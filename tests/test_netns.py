"""The network-namespace harness (tests/support/netns.py) that the cluster fault tests run on."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from netns import Net, skip_reason, tcp_probe

_reason = skip_reason()
pytestmark = pytest.mark.skipif(_reason is not None, reason=_reason or "")

ECHO_SERVER = (
    "import socket,sys\n"
    "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind((sys.argv[1], 7777)); s.listen(16); print('listening', flush=True)\n"
    "while True:\n"
    "  c,_=s.accept(); c.sendall(b'hi'); c.close()\n"
)


def _ns_exists(name: str) -> bool:
    return name in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_hosts_talk_cut_blocks_heal_restores():
    net = Net()
    try:
        a, b = net.add_host("a"), net.add_host("b")
        assert a.ip != b.ip and a.ip.startswith("10.213.")
        # loopback is up inside each namespace
        assert "UP" in a.exec(["ip", "-o", "link", "show", "lo"]).stdout
        server = b.run([sys.executable, "-c", ECHO_SERVER, b.ip], stdout=subprocess.PIPE, text=True)
        assert server.stdout.readline().startswith("listening")
        assert tcp_probe(a, b.ip, 7777)
        # the test process reaches hosts through the bridge address
        with socket.create_connection((b.ip, 7777), timeout=2) as s:
            assert s.recv(2) == b"hi"
        b.cut()
        assert b.is_cut()
        assert not tcp_probe(a, b.ip, 7777, timeout=1.0)
        assert server.poll() is None  # a cut host keeps running
        b.heal()
        assert not b.is_cut()
        deadline = time.monotonic() + 10
        while not tcp_probe(a, b.ip, 7777) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert tcp_probe(a, b.ip, 7777)
    finally:
        net.close()
    assert server.poll() is not None  # killed by close()
    assert not _ns_exists(a.ns) and not _ns_exists(b.ns)
    r = subprocess.run(["ip", "link", "show", net.bridge], capture_output=True, text=True)
    assert r.returncode != 0  # the bridge is gone


def test_two_nets_do_not_collide():
    with Net() as n1, Net() as n2:
        assert n1.subnet != n2.subnet and n1.tag != n2.tag
        h1, h2 = n1.add_host("x"), n2.add_host("x")
        assert h1.ns != h2.ns
