"""The compiled SIMD kernels (``simsearch._simd``, built from csrc/ at install): which instruction
set they run, and a switch that forces one.

The module picks the best path the CPU reports at import (AVX-512, else AVX2 + FMA, else a scalar
path that is correct everywhere). ``SIMSEARCH_SIMD=scalar|avx2|avx512`` in the environment forces
one at start-up; :func:`use_isa` forces one for a block of code (tests compare every path on one
machine; the setting is process-wide, so not for use beside concurrent searches). The extension is
required: it is built by the package's own build (docs/kernels.md).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from . import _simd
from .errors import InvalidParameterError

ISAS = ("scalar", "avx2", "avx512")


def isa() -> str:
    """The instruction set the compiled kernels use now."""
    return _simd.isa()


def supported() -> list[str]:
    """The instruction sets this CPU can run, slowest first."""
    return list(_simd.supported())


def set_isa(name: str) -> str:
    """Force ``name`` ("auto", "scalar", "avx2" or "avx512") for every later call; returns the
    previous setting."""
    if name not in ("auto", *ISAS):
        raise InvalidParameterError(f"isa must be one of {['auto', *ISAS]}; got {name!r}")
    if name != "auto" and name not in supported():
        raise InvalidParameterError(
            f"this CPU cannot run the {name!r} kernels; it supports {supported()}"
        )
    return _simd.set_isa(name)


@contextlib.contextmanager
def use_isa(name: str) -> Iterator[None]:
    """Run the block with the ``name`` kernels, then restore the previous choice."""
    prev = set_isa(name)
    try:
        yield
    finally:
        _simd.set_isa(prev)


if os.environ.get("SIMSEARCH_SIMD"):
    set_isa(os.environ["SIMSEARCH_SIMD"])
