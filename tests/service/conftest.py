"""Real server processes on free loopback ports for the service tests."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

grpc = pytest.importorskip("grpc")

from nodeproc import ServerProcess  # noqa: E402

_names = itertools.count()


def unique_name(prefix: str = "c") -> str:
    return f"{prefix}{next(_names)}-{os.getpid()}"


@pytest.fixture
def server_factory(tmp_path):
    started: list[ServerProcess] = []

    def make(*args: str, data_dir: Path | None = None) -> ServerProcess:
        s = ServerProcess(data_dir or tmp_path / f"data{len(started)}", *args)
        started.append(s)
        return s

    yield make
    for s in started:
        s.kill()


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory):
    """One plain server for the tests that only need a node to talk to."""
    s = ServerProcess(tmp_path_factory.mktemp("shared") / "data")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def shared_client(shared_server):
    c = shared_server.client()
    yield c
    c.close()
