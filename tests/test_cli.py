"""The `simsearch` command works with only the core and demo extras installed (the README's first
command installs no grpcio): serve and cluster are then absent, not a crash."""

from __future__ import annotations

import subprocess
import sys

BLOCK_GRPC = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "grpc" or name.startswith(("grpc.", "grpc_")):
            raise ImportError(f"no module named {name!r} (blocked by the test)")
sys.meta_path.insert(0, Block())
from simsearch.cli import build_parser
p = build_parser()
args = p.parse_args(["data", "list"])
names = sorted(p._subparsers._group_actions[0].choices)
print(" ".join(names))
"""


def test_the_cli_builds_without_grpc():
    out = subprocess.run([sys.executable, "-c", BLOCK_GRPC], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    names = out.stdout.split()
    assert "demo" in names and "data" in names
    assert "serve" not in names and "cluster" not in names
