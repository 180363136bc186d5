"""Arithmetic whose rounding the compiler must keep: eager torch rounds every product, while the
GPU compiler fuses a product into the add that follows (an FMA rounds once). ``mul.rn`` and
``add.rn`` are never fused, so a sum of two ``mul_rn`` products rounds three times, as eager
torch does.

Eager torch multiplies two bf16 (or fp16) tensors in fp32 and rounds the product to bf16: the
fp32 product of two 8-bit (11-bit) significands is exact, so that is the correctly rounded bf16
product, which ``mul.rn.bf16x2`` computes two at a time. Their sum rounded to fp32 and then to
bf16 rounds twice, but fp32 carries more than twice bf16's bits plus two, where double rounding
of a sum equals one rounding: ``add.rn.bf16x2``. So ``sum_of_products_x2`` is eager torch's
``a * b + c * d`` in bf16 or fp16, bit for bit, in three instructions for two values.

A row of values divided by one scale s needs ``div.rn.f32``'s quotient, not the product with 1/s
(a per-token fp8 scale: vLLM divides). ``div.rn`` spends a reciprocal, a range check and a
branch a value; ``div_rn`` takes ``r = 1/s`` rounded to nearest, computed once, and corrects the
product ``y * r`` twice by its exact remainder ``y - s * q`` (an FMA). The first correction
leaves the quotient within an ulp, and from within an ulp Markstein's step with a correctly
rounded reciprocal gives the correctly rounded quotient (Markstein's theorem on division by FMA;
Muller et al., Handbook of Floating-Point Arithmetic)."""

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


@dsl_user_op
def div_rn(y: Float32, s: Float32, r: Float32, finite: bool = False, *, loc=None,
           ip=None) -> Float32:
    """``y / s`` rounded to nearest even as ``div.rn.f32`` computes it, for ``s > 0`` and
    ``r = 1 / s`` rounded to nearest (module docstring): five FMA-pipe instructions a value where
    its remainders are finite. Where they are not (y or s infinite, the product past fp32's
    range) the product ``y * r`` is kept, the division's infinity, zero or NaN; the sign is y's
    always, which the corrections may drop from a zero (``-0 + 0 = +0``). ``finite``: s is
    finite and no finite y's quotient overflows (a scale no smaller than ``max|y| / 448``), so
    only an infinite or NaN y meets a NaN remainder, and its NaN is kept: the test for it and
    its select are left out."""
    args = [Float32(v).ir_value(loc=loc, ip=ip) for v in (y, s, r)]
    keep_product = "" if finite else "setp.nan.f32 bad, q2, q2; selp.f32 q2, q0, q2, bad; "
    return Float32(llvm.inline_asm(
        T.f32(), args,
        "{ .reg .f32 ns, q0, q1, q2, e; .reg .pred bad; "
        "neg.f32 ns, $2; mul.rn.f32 q0, $1, $3; "
        "fma.rn.f32 e, ns, q0, $1; fma.rn.f32 q1, e, $3, q0; "
        "fma.rn.f32 e, ns, q1, $1; fma.rn.f32 q2, e, $3, q1; "
        f"{keep_product}copysign.f32 $0, $1, q2; }}",
        "=f,f,f,f", loc=loc, ip=ip))
