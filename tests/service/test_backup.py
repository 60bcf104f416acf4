"""`simsearch backup` / `simsearch restore` against a running server: what an operator does with a
damaged collection (docs/service.md, "Backup and restore")."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import unique_name
from simsearch.cli import main
from simsearch.errors import CorruptIndexError
from simsearch.service.backup import read_backup

DIM = 8


def _fill(client, name, kind, x, **params):
    col = client.create_collection(name, DIM, "ip", kind, **params)
    col.add(x, ids=np.arange(100, 100 + len(x)))
    return col


def _one_flat(server_factory, seed: int, n: int):
    """A server holding one flat collection of n random items: (server, its name, the items)."""
    server = server_factory()
    x = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    name = unique_name("a")
    with server.client() as c:
        _fill(c, name, "flat", x)
    return server, name, x


def test_backup_and_restore_a_damaged_collection(server_factory, tmp_path):
    """Backs up two collections, then damages one (items removed, junk added) and drops the
    other; restore --replace brings back both exactly. Fails if restore skipped a collection or
    imported stale data: the searches would differ."""
    server = server_factory()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, DIM)).astype(np.float32)
    q = rng.standard_normal((20, DIM)).astype(np.float32)
    a, b = unique_name("a"), unique_name("b")
    with server.client() as c:
        ca = _fill(c, a, "hnsw", x, M=8)
        cb = _fill(c, b, "flat", x[:150])
        want_a, want_b = ca.search(q, 10, ef=64), cb.search(q, 10)
    path = tmp_path / "all.bak"
    assert main(["backup", server.address, str(path)]) == 0
    assert {n for n, _, _ in read_backup(path)} >= {a, b}

    with server.client() as c:
        c.collection(a).remove(np.arange(100, 200))
        c.collection(a).add(rng.standard_normal((50, DIM)).astype(np.float32),
                            ids=np.arange(5000, 5050))
        c.drop_collection(b)
        # an existing collection is not overwritten without --replace, and nothing is restored
        assert main(["restore", server.address, str(path)]) == 1
        assert b not in c.list_collections()
    assert main(["restore", server.address, str(path), "--replace"]) == 0
    with server.client() as c:
        got_a, got_b = c.collection(a).search(q, 10, ef=64), c.collection(b).search(q, 10)
        assert len(c.collection(a)) == 300 and len(c.collection(b)) == 150
    np.testing.assert_array_equal(got_a.ids, want_a.ids)
    np.testing.assert_array_equal(got_b.ids, want_b.ids)
    np.testing.assert_allclose(got_b.scores, want_b.scores, rtol=1e-6)


def test_restore_one_collection_under_a_new_name(server_factory, tmp_path):
    server, a, x = _one_flat(server_factory, 1, 60)
    path = tmp_path / "a.bak"
    assert main(["backup", server.address, str(path), "--collection", a]) == 0
    assert main(["restore", server.address, str(path), "--collection", a,
                 "--rename", a + "-copy"]) == 0
    with server.client() as c:
        r1 = c.collection(a).search(x[:5], 3)
        r2 = c.collection(a + "-copy").search(x[:5], 3)
    np.testing.assert_array_equal(r1.ids, r2.ids)


def test_a_damaged_backup_is_refused_before_anything_is_restored(server_factory, tmp_path):
    """Flips one byte of the backup: restore must fail on the checksum and leave the server's
    collections as they were (it would import a corrupted collection otherwise)."""
    server, a, _ = _one_flat(server_factory, 2, 40)
    path = tmp_path / "a.bak"
    assert main(["backup", server.address, str(path)]) == 0
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptIndexError):
        read_backup(path)
    with server.client() as c:
        c.drop_collection(a)
    assert main(["restore", server.address, str(path)]) == 1
    with server.client() as c:
        assert a not in c.list_collections()
