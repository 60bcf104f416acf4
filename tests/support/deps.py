"""A test module's optional dependencies, checked without importing them: every worker imports
every test module to collect it, and ``pytest.importorskip("sentence_transformers")`` (or
torch) there cost each worker 2-5 s before its first test."""

from __future__ import annotations

from importlib.util import find_spec

import pytest


def requires(*modules: str) -> pytest.MarkDecorator:
    """``pytestmark = requires("torch")``: skip the module's tests where one is not installed."""
    missing = [m for m in modules if find_spec(m) is None]
    return pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)}")
