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
branch a value; ``div_rn`` spends four FMA-pipe instructions, from ``reciprocals(s)`` computed
once a row: 1/s rounded down (``d``) with its tail ``t = (1 - s d) d`` (``1 - s d`` is exact and
not negative), and 1/s rounded to nearest (``r``). ``y d + y t`` is y/s within 2^-45 of its size
before it rounds, so within an ulp; from within an ulp, one step by the exact remainder
``y - s q`` and ``r`` gives the correctly rounded quotient (Markstein's theorem on division by
FMA; Muller et al., Handbook of Floating-Point Arithmetic). The remainder is taken as
``s q - y`` and the step subtracts it: a zero quotient then keeps y's sign with no copysign.
Where the quotient goes on to e4m3, y has a 16-bit dtype's few bits and s is the per-token
scale of an unbounded 16-bit amax no smaller than |y|, the step changes no code:
``div_to_e4m3`` is ``y d + y t`` alone. test_fp8_division.py runs its PTX against the IEEE
quotient for every such pair with ``|y| >= amax 2^-22``; smaller y give codes of zero either way.

Two 16-bit values a word: ``max_x2`` and ``min_x2`` compare them (ptxas joins two into one
three-input instruction), ``halves_max`` reads a word's two as fp32, ``unpack_x2`` one of them,
``round_mul_x2`` rounds two fp32 values into a word and multiplies it."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from cutlass import Float32, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


#: a PTX operand's IR type and register class, by its DSL type
_OPERANDS = {Float32: (T.f32, "f"), Uint32: (T.i32, "r")}


def _asm(result, args, body: str, loc, ip, side_effects: bool = False):
    """Inline PTX ``body``: ``$0`` of type ``result``, ``$1``... the ``args``, each a Float32
    or a Uint32."""
    ir_type, register = _OPERANDS[result]
    constraints = ",".join(["=" + register] + [_OPERANDS[type(v)][1] for v in args])
    return result(llvm.inline_asm(ir_type(), [v.ir_value(loc=loc, ip=ip) for v in args], body,
                                  constraints, has_side_effects=side_effects, loc=loc, ip=ip))


def _asm_f32(args, body: str, loc, ip) -> Float32:
    return _asm(Float32, [Float32(v) for v in args], body, loc, ip)


def _asm_b32(args, body: str, loc, ip) -> Uint32:
    return _asm(Uint32, [Uint32(v) for v in args], body, loc, ip)


@dsl_user_op
def mul_rn(a: Float32, b: Float32, *, loc=None, ip=None) -> Float32:
    """``a * b`` in fp32, rounded to nearest even and kept apart from any add (``mul.rn.f32``)."""
    return _asm_f32((a, b), "mul.rn.f32 $0, $1, $2;", loc, ip)


@dsl_user_op
def sum_of_products_x2(a: Uint32, b: Uint32, c: Uint32, d: Uint32, kind: str, *, loc=None,
                       ip=None) -> Uint32:
    """``a * b + c * d`` on two packed 16-bit values a word (``kind``: "bf16x2" or "f16x2"),
    each product and the sum rounded to nearest even (module docstring)."""
    return _asm_b32((a, b, c, d), "{ .reg .b32 p, q; "
                    f"mul.rn.{kind} p, $1, $2; mul.rn.{kind} q, $3, $4; add.rn.{kind} $0, p, q; }}",
                    loc, ip)


@dsl_user_op
def reciprocal_rn(s: Float32, *, loc=None, ip=None) -> Float32:
    """``1 / s`` rounded to nearest (``rcp.rn.f32``), where the code stands: as an asm statement
    with side effects no compiler moves it (its slow path branches on s)."""
    return _asm(Float32, [Float32(s)], "rcp.rn.f32 $0, $1;", loc, ip, side_effects=True)


@dsl_user_op
def reciprocals(s: Float32, s_finite: Float32, *, loc=None, ip=None):
    """``(r, d, t)`` for ``div_rn``, s > 0: 1/s rounded to nearest, rounded down, and the tail
    ``(1 - s d) d``, taken with ``s_finite`` (s, or fp32's largest value where s is infinite:
    then r, d and t are 0)."""
    r = _asm_f32((s,), "rcp.rn.f32 $0, $1;", loc, ip)
    d = _asm_f32((s,), "rcp.rm.f32 $0, $1;", loc, ip)
    t = _asm_f32((s_finite, d), "{ .reg .f32 e; neg.f32 e, $1; fma.rn.f32 e, e, $2, 0f3F800000; "
                 "mul.rn.f32 $0, e, $2; }", loc, ip)
    return r, d, t


def constant_reciprocals(s: float) -> tuple[float, float, float]:
    """``reciprocals`` of a constant divisor, computed exactly on the host."""
    exact = Fraction(1) / Fraction(s)
    r = np.float32(1.0) / np.float32(s)  # IEEE: rounded to nearest
    d = r if Fraction(float(r)) <= exact else np.nextafter(r, np.float32(0))
    e = Fraction(1) - Fraction(s) * Fraction(float(d))  # exact in fp32
    t = np.float32(float(e * Fraction(float(d))))  # e * d is exact in fp64: one rounding
    return float(r), float(d), float(t)


@dsl_user_op
def div_rn(y: Float32, s: Float32, recip, finite: bool = False, *, loc=None,
           ip=None) -> Float32:
    """``y / s`` rounded to nearest even as ``div.rn.f32`` computes it, for ``s > 0`` and
    ``recip = reciprocals(s, s)`` (module docstring): four FMA-pipe instructions a value. Where
    the remainder is not finite (y or s infinite, the quotient past fp32's range) the product
    ``y * r`` is kept, the division's infinity, zero or NaN. ``finite``: s is finite and no
    finite y's quotient overflows (a scale no smaller than ``max|y| / 448``), so only an
    infinite or NaN y meets a NaN remainder, and its NaN is kept: the test for it and its
    select are left out."""
    r, d, t = recip
    keep_product = "" if finite else (
        "mul.rn.f32 k, $1, $3; setp.nan.f32 bad, q1, q1; selp.f32 q1, k, q1, bad; ")
    return _asm_f32(
        (y, s, r, d, t),
        "{ .reg .f32 p, q0, e, q1, k, ny, nr; .reg .pred bad; "
        "neg.f32 ny, $1; neg.f32 nr, $3; "
        "mul.rn.f32 p, $1, $5; fma.rn.f32 q0, $1, $4, p; "
        "fma.rn.f32 e, $2, q0, ny; fma.rn.f32 q1, e, nr, q0; "
        f"{keep_product}mov.f32 $0, q1; }}", loc, ip)


#: ``div_to_e4m3``'s PTX, operands ``$1, $2, $3 = y, d, t`` (test_fp8_division.py runs it)
DIV_TO_E4M3 = "mul.rn.f32 p, $1, $3; fma.rn.f32 $0, $1, $2, p;"


@dsl_user_op
def div_to_e4m3(y: Float32, recip, *, loc=None, ip=None) -> Float32:
    """``y / s`` as far as its e4m3 code (rounded to nearest even) goes: ``y d + y t``, two
    FMA-pipe instructions a value, for y of a 16-bit dtype and ``recip = reciprocals(s, ...)``
    of a scale ``max(amax / 448, 1 / (448 * 512))`` with amax of that dtype and no smaller than
    ``|y|`` (module docstring). NaN, infinite and zero y and an infinite s as ``div_rn``."""
    _, d, t = recip
    return _asm_f32((y, d, t), "{ .reg .f32 p; " + DIV_TO_E4M3 + " }", loc, ip)


@dsl_user_op
def max_x2(a: Uint32, b: Uint32, kind: str, *, loc=None, ip=None) -> Uint32:
    """The larger of a's and b's values, lane by lane (``kind``: "bf16x2" or "f16x2"), NaN
    passed over."""
    return _asm_b32((a, b), f"max.{kind} $0, $1, $2;", loc, ip)


@dsl_user_op
def min_x2(a: Uint32, b: Uint32, kind: str, *, loc=None, ip=None) -> Uint32:
    """The smaller of a's and b's values, lane by lane, NaN passed over."""
    return _asm_b32((a, b), f"min.{kind} $0, $1, $2;", loc, ip)


@dsl_user_op
def halves_max(w: Uint32, kind: str, negate: bool = False, *, loc=None, ip=None) -> Float32:
    """The larger of a word's two 16-bit values in fp32, or of their negations (``negate``:
    minus the smaller), NaN passed over. The negation stays inside the asm: as two values,
    LLVM turns ``max(-a, -b)`` into ``-min(a, b)``, a ``min.f32`` the amax bound's alone."""
    if kind == "bf16x2":
        unpack = "shl.b32 u, $1, 16; and.b32 v, $1, 0xFFFF0000; mov.b32 a, u; mov.b32 b, v; "
    else:
        unpack = "mov.b32 {h, g}, $1; cvt.f32.f16 a, h; cvt.f32.f16 b, g; "
    sign = "neg.f32 a, a; neg.f32 b, b; " if negate else ""
    return _asm(Float32, [Uint32(w)], "{ .reg .b32 u, v; .reg .b16 h, g; .reg .f32 a, b; "
                f"{unpack}{sign}max.f32 $0, a, b; }}", loc, ip)


@dsl_user_op
def unpack_x2(w: Uint32, kind: str, high: bool, *, loc=None, ip=None) -> Float32:
    """One of a word's two 16-bit values (``high``: the upper) in fp32, exactly: bf16 by a shift
    or a mask, one instruction, where a 16-bit register's conversion spends two on the upper."""
    if kind == "bf16x2":
        body = "and.b32 $0, $1, 0xFFFF0000;" if high else "shl.b32 $0, $1, 16;"
    else:
        body = ("{ .reg .b16 h, g; mov.b32 {h, g}, $1; "
                f"cvt.f32.f16 $0, {'g' if high else 'h'}; }}")
    return _asm(Float32, [Uint32(w)], body, loc, ip)


@dsl_user_op
def round_mul_x2(lo: Float32, hi: Float32, w: Uint32, kind: str, *, loc=None,
                 ip=None) -> Uint32:
    """``(lo, hi)`` rounded to a word of two 16-bit values (``kind``), times the word w, each
    product rounded to nearest even: eager torch's ``y.to(x.dtype) * w`` two values at once."""
    return _asm(Uint32, [Float32(lo), Float32(hi), Uint32(w)],
                f"{{ .reg .b32 p; cvt.rn.{kind}.f32 p, $2, $1; mul.rn.{kind} $0, p, $3; }}",
                loc, ip)
