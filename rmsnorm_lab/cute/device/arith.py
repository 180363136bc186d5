"""Arithmetic whose rounding the compiler must keep: eager torch rounds every product, while the
GPU compiler fuses a product into the add that follows (an FMA rounds once). ``mul.rn`` is never
fused, so a sum of two ``mul_rn`` products rounds three times, as eager torch does."""

from __future__ import annotations

from cutlass import Float32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


@dsl_user_op
def mul_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """``a * b`` in fp32, rounded to nearest even and kept apart from any add (``mul.rn.f32``)."""
    return Float32(llvm.inline_asm(
        T.f32(), [Float32(a).ir_value(loc=loc, ip=ip), Float32(b).ir_value(loc=loc, ip=ip)],
        "mul.rn.f32 $0, $1, $2;", "=f,f,f", loc=loc, ip=ip))
