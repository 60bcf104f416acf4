"""A full disk, for real: a node whose data directory is a small tmpfs (docs/service.md,
"Durability").

The defect (read from the code before these changes): a failed append reloaded the whole
collection under the exclusive lock and answered UNAVAILABLE, so a full disk looked like a
transient fault to retry at once, and every later write paid a reload. Seen failing with a full
disk mapped back to UNAVAILABLE: the first refused add raised ServiceUnavailableError. Now a
full disk is RESOURCE_EXHAUSTED with nothing changed, searches go on, and writes resume by
themselves once space is freed; what was acknowledged survives a kill -9.
"""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

from simsearch.service.errors import ResourceExhaustedError

DIM = 32


def test_full_disk_refuses_writes_keeps_reads_and_recovers(server_factory, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    data = tmp_path / "srv" / "data"  # the mount point; the server's log and ready file sit
    data.mkdir(parents=True)  # beside it, on the ordinary disk
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(data)], check=True)
    server = None
    try:
        rng = np.random.default_rng(0)
        x = rng.standard_normal((4000, DIM)).astype(np.float32)
        server = server_factory("--snapshot-wal-bytes", str(256 << 10), data_dir=data)
        c = server.client(timeout=30)
        col = c.create_collection("c", DIM, "l2", "flat")
        col.add(x[:500])
        filler = data / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        try:  # fill the disk to the last block
            while os.write(fd, b"\1" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        refused = 0
        for i in range(500, 1500, 100):  # adds, and the snapshots their log would trigger
            try:
                col.add(x[i:i + 100], ids=np.arange(i, i + 100))
            except ResourceExhaustedError as exc:
                assert "disk is full" in str(exc)
                refused += 1
        assert refused
        held = len(col)
        assert held < 1500 and held % 100 == 0  # whole batches or none
        r = col.search(x[:5], 1)  # searches go on
        assert r.ids[:, 0].tolist() == [0, 1, 2, 3, 4]
        filler.unlink()
        col.add(x[2000:2600], ids=np.arange(2000, 2600))  # writes resume by themselves
        col.snapshot()
        server.kill()
        server.restart()
        col = server.client(timeout=30).collection("c")
        assert len(col) == held + 600
        assert col.search(x[2000:2003], 1).ids[:, 0].tolist() == [2000, 2001, 2002]
    finally:
        if server is not None:
            server.kill()
        subprocess.run(["umount", "-l", str(data)], check=False)
