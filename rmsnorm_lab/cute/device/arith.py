"""Arithmetic whose rounding the compiler must keep: eager torch rounds every product, while the
GPU compiler fuses a product into the add that follows (an FMA rounds once). ``mul.rn`` and
``add.rn`` are never fused, so a sum of two ``mul_rn`` products rounds three times, as eager
torch does.

Eager torch multiplies two bf16 (or fp16) tensors in fp32 and rounds the product to bf16: the
fp32 product of two 8-bit (11-bit) significands is exact, so that is the correctly rounded bf16
product, which ``mul.rn.bf16x2`` computes two at a time. Their sum rounded to fp32 and then to
bf16 rounds twice, but fp32 carries more than twice bf16's bits plus two, where double rounding
of a sum equals one rounding: ``add.rn.bf16x2``. So ``sum_of_products_x2`` is eager torch's
``a * b + c * d`` in bf16 or fp16, bit for bit, in three instructions for two values."""

from __future__ import annotations

from cutlass import Float32, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


@dsl_user_op
def mul_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """``a * b`` in fp32, rounded to nearest even and kept apart from any add (``mul.rn.f32``)."""
    return Float32(llvm.inline_asm(
        T.f32(), [Float32(a).ir_value(loc=loc, ip=ip), Float32(b).ir_value(loc=loc, ip=ip)],
        "mul.rn.f32 $0, $1, $2;", "=f,f,f", loc=loc, ip=ip))


@dsl_user_op
def sum_of_products_x2(a: Uint32, b: Uint32, c: Uint32, d: Uint32, kind: str, *, loc=None,
                       ip=None) -> Uint32:
    """``a * b + c * d`` on two packed 16-bit values a word (``kind``: "bf16x2" or "f16x2"),
    each product and the sum rounded to nearest even (module docstring)."""
    args = [Uint32(v).ir_value(loc=loc, ip=ip) for v in (a, b, c, d)]
    return Uint32(llvm.inline_asm(
        T.i32(), args,
        "{ .reg .b32 p, q; "
        f"mul.rn.{kind} p, $1, $2; mul.rn.{kind} q, $3, $4; add.rn.{kind} $0, p, q; }}",
        "=r,r,r,r,r", loc=loc, ip=ip))
