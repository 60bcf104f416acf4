"""Regenerate the checked-in protobuf/gRPC code from protos/simsearch/v1/*.proto.

    python -m simsearch.service.codegen

Needs grpcio-tools (a dev dependency). The protos are compiled with ``src/`` as the include root,
so the generated modules land beside their .proto files and import each other as
``simsearch.service.protos.simsearch.v1``. Never edit the generated files by hand.
"""

from __future__ import annotations

import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2]
PROTO_DIR = Path(__file__).resolve().parent / "protos" / "simsearch" / "v1"


def main(argv: list[str] | None = None) -> int:
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError:
        print("grpcio-tools is needed: pip install -e '.[dev]'", file=sys.stderr)
        return 2
    protos = sorted(str(p.relative_to(SRC)) for p in PROTO_DIR.glob("*.proto"))
    include = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{SRC}",
        f"-I{include}",
        f"--python_out={SRC}",
        f"--pyi_out={SRC}",
        f"--grpc_python_out={SRC}",
        *protos,
    ]
    rc = protoc.main(args)
    if rc == 0:
        print(f"generated code for {', '.join(protos)} under {PROTO_DIR}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
