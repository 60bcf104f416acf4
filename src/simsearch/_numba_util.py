"""Numba helpers shared by the kernels of several indexes."""

from __future__ import annotations

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
