"""Local Pyramid clusters (`simsearch cluster up`) in real processes."""

from __future__ import annotations

import pytest

pytest.importorskip("grpc")

from simsearch.pyramid.launcher import LocalCluster  # noqa: E402


@pytest.fixture
def cluster_factory(tmp_path):
    made = []

    def make(*args, **kw):
        c = LocalCluster(tmp_path / f"cluster{len(made)}", *args, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()
