"""A bare gRPC echo server in Python: the floor a search call over loopback can reach
(bench/service/bench.py times it beside the node). Each request's first 4 bytes say how many
bytes to answer with, so the echo moves the same bytes as the search it stands for.

    python bench/service/echo_server.py READY_FILE [WORKERS]
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from concurrent import futures

import grpc


def main(argv: list[str]) -> int:
    ready, workers = argv[0], int(argv[1]) if len(argv) > 1 else 8

    def call(request: bytes, context) -> bytes:
        return bytes(int.from_bytes(request[:4], "little"))

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "echo.Echo", {"Call": grpc.unary_unary_rpc_method_handler(call)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    tmp = f"{ready}.tmp"
    with open(tmp, "w") as f:
        json.dump({"port": port, "pid": os.getpid()}, f)
    os.replace(tmp, ready)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    server.stop(1).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
