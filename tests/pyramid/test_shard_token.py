"""A coordinator whose shard token lacks the cluster role says so (docs/service.md, "Security
model").

The defect (91334ed): given a read-write token for its shards, a coordinator started fine and
its first pyramid create answered UNAVAILABLE "no shard took the router's model", a transient
fault to retry, which no retry could fix."""

from __future__ import annotations

import logging

import pytest

from simsearch.pyramid.checkpoints import store_model
from simsearch.service.errors import PermissionDeniedError, ServiceUnavailableError


class _Refusing:
    def __init__(self, exc):
        self.exc = exc

    def put_blob(self, name, data):
        raise self.exc


class _Pool:
    def __init__(self, exc):
        self._client = _Refusing(exc)

    def client(self, sid):
        return self._client


def test_a_refused_shard_token_is_a_permission_error_naming_the_role(caplog):
    pool = _Pool(PermissionDeniedError("PutBlob needs a token of role cluster"))
    with caplog.at_level(logging.ERROR), pytest.raises(PermissionDeniedError,
                                                       match="cluster role"):
        store_model(pool, "c", "ab12", b"model", [0, 1])
    assert "refused the coordinator's shard token" in caplog.text


def test_a_shard_that_is_down_is_still_a_transient_fault():
    with pytest.raises(ServiceUnavailableError):
        store_model(_Pool(ServiceUnavailableError("down")), "c", "ab12", b"model", [0])
