"""Numba helpers shared by the kernels of several indexes, and the one place that sets how many
threads a parallel kernel uses."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def prefetch(typingctx, arr, i, j):
    """Ask the CPU to start loading the cache line of arr[i, j] (2-D) or arr[i] (1-D; j unused).
    Graph walks and NR-LSH probing are streams of random row reads whose latency only overlaps
    when loads are issued ahead, as hnswlib does."""
    if not (isinstance(arr, types.Array) and arr.ndim in (1, 2)
            and isinstance(i, types.Integer) and isinstance(j, types.Integer)):  # fmt: skip
        return None

    def codegen(context, builder, sig, args):
        aty = sig.args[0]
        ary = context.make_array(aty)(context, builder, args[0])
        idx = [context.cast(builder, args[1], sig.args[1], types.intp)]
        if aty.ndim == 2:
            idx.append(context.cast(builder, args[2], sig.args[2], types.intp))
        ptr = cgutils.get_item_pointer2(
            context, builder, data=ary.data, shape=cgutils.unpack_tuple(builder, ary.shape),
            strides=cgutils.unpack_tuple(builder, ary.strides), layout=aty.layout, inds=idx,
            wraparound=False, boundscheck=False,
        )  # fmt: skip
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
            "llvm.prefetch.p0i8",
        )  # fmt: skip
        # (address, read, high locality, data cache)
        builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, 3),
                          ir.Constant(i32, 1)])  # fmt: skip
        return context.get_dummy_value()

    return types.void(arr, i, j), codegen


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; a container's or taskset's limit),
    which sizes every thread pool here; os.cpu_count() counts the machine's."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


_CPUS = available_cpus()

# numba's thread count is per thread: a limit set on the main thread does not reach a server's
# worker threads. So the process-wide width lives here and every parallel kernel call applies it
# in its own thread through kernel_threads(). SIMSEARCH_NUM_THREADS sets it at start-up.
_width: int | None = int(os.environ["SIMSEARCH_NUM_THREADS"]) if os.environ.get(
    "SIMSEARCH_NUM_THREADS") else None


def set_kernel_threads(n: int | None) -> int | None:
    """Set the process-wide width of parallel kernels (None: all of numba's threads); returns
    the previous setting."""
    global _width
    old, _width = _width, (None if n is None else max(1, int(n)))
    return old


def kernel_width(n_threads: int | None = None) -> int:
    """Threads a parallel kernel may use: ``n_threads`` (-1 or None: as many as allowed),
    capped by the process-wide width and by numba's pool."""
    pool = min(numba.config.NUMBA_NUM_THREADS, _CPUS)  # numba sizes its pool by the machine
    cap = pool if _width is None else min(_width, pool)
    if n_threads is None or n_threads == -1:
        return cap
    return max(1, min(int(n_threads), cap))


@contextlib.contextmanager
def kernel_threads(n_threads: int | None = None) -> Iterator[int]:
    """Run parallel kernels in this thread at ``kernel_width(n_threads)``; yields the width.
    BLAS is not touched here: its limit is process-wide, so it is set once where a process
    starts (eval.thread_limit: the server, the demo, the benches), never per search."""
    width = kernel_width(n_threads)
    old = numba.get_num_threads()
    numba.set_num_threads(width)
    try:
        yield width
    finally:
        numba.set_num_threads(old)
