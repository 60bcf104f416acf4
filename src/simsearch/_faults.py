"""Fault points for crash tests: ``point(name)`` ends the process at once (exit code 86, no
cleanup, like a kill -9) when the environment variable SIMSEARCH_FAULT names it. Tests start a
server with it set to prove that a multi-step change is safe to interrupt at each step."""

from __future__ import annotations

import os

EXIT_CODE = 86


def point(name: str) -> None:
    if os.environ.get("SIMSEARCH_FAULT") == name:
        os._exit(EXIT_CODE)
