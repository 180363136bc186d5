"""The per-token division of the CuTe fp8 epilogue (``cute.device.arith.div_rn``) emulated on the
CPU, step for step in exact arithmetic: the IEEE quotient ``div.rn.f32`` gives, for bf16 y and
the scales ``token_scale`` makes (``y d + y t``, with 1/s rounded down and its tail, corrected
once by its FMA remainder and 1/s rounded to nearest), zeros keeping y's sign; and where a row
holds an infinity, the divisor clamped to fp32's largest value gives what division by infinity
does, without the test of the remainder (``finite=True``). For 16-bit y and unbounded scales,
``div_to_e4m3`` leaves the correction out: every such pair keeps its e4m3 code."""

from fractions import Fraction

import numpy as np
import pytest
import torch

from rmsnorm_lab import reference
from rmsnorm_lab.cute.device import arith

F32_MAX = float(np.finfo(np.float32).max)
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's inf - inf


def f32(q: Fraction, down: bool = False) -> float:
    """``q`` rounded once to the nearest fp32 (ties to even), or down (q > 0), subnormals and
    overflow included."""
    if q == 0:
        return 0.0
    a = abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    ulp = Fraction(2) ** (max(e, -126) - 23)
    n, rest = divmod(a, ulp)
    n = int(n) + (1 if not down and (rest > ulp / 2 or (rest == ulp / 2 and n % 2)) else 0)
    v = float(n * ulp)
    return np.copysign(v if v <= F32_MAX else np.inf, float(q))


def mul(a: float, b: float) -> float:
    if not np.isfinite([a, b]).all() or a == 0 or b == 0:
        return float(np.float32(a) * np.float32(b))  # inf/NaN and signed zeros as IEEE's
    return f32(Fraction(a) * Fraction(b))


def fma(a: float, b: float, c: float) -> float:
    if not all(np.isfinite([a, b, c])):
        return float(np.float32(a) * np.float32(b) + np.float32(c))  # inf/NaN as IEEE's
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact != 0:
        return f32(exact)
    # an exact zero is -0 only as the sum of two negative zeros (round to nearest)
    negative_product = (a == 0 or b == 0) and np.signbit(a) != np.signbit(b)
    return -0.0 if negative_product and c == 0 and np.signbit(c) else 0.0


def reciprocals(s: float, s_finite: float) -> tuple[float, float, float]:
    """``arith.reciprocals``: rcp.rn, rcp.rm (0 for an infinite s), the tail by fma and mul."""
    r = d = 0.0
    if np.isfinite(s):
        r, d = f32(Fraction(1) / Fraction(s)), f32(Fraction(1) / Fraction(s), down=True)
    return r, d, mul(fma(-s_finite, d, 1.0), d)


def div_rn(y: float, s: float, recip, finite: bool) -> float:
    """The PTX of ``div_rn``, one instruction a line."""
    r, d, t = recip
    q0 = fma(y, d, mul(y, t))
    q1 = fma(fma(s, q0, -y), -r, q0)
    if not finite and np.isnan(q1):
        q1 = mul(y, r)
    return q1


def same(a: float, b: float) -> bool:
    return (np.isnan(a) and np.isnan(b)) or (a == b and np.signbit(a) == np.signbit(b))


def bf16_values(n: int, seed: int) -> np.ndarray:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-8, 9, (n,), generator=g))
    return x.to(torch.bfloat16).float().numpy()


@pytest.mark.parametrize("seed", range(4))
def test_the_corrected_product_is_the_ieee_quotient(seed):
    """Scales from the row's amax (and from amaxes of few bits, where quotients land on ties of
    the fp8 rounding): every quotient equals numpy's fp32 division, bit for bit, zeros and
    their signs included."""
    y = np.concatenate([bf16_values(400, seed), [0.0, -0.0]])
    amaxes = [float(np.abs(y).max()), 1.5, 3.0 * 2.0 ** -7, 0.1, 448.0 / 3]
    for amax in amaxes:
        s = float(max(np.float32(amax) / np.float32(448.0), np.float32(1 / (448 * 512))))
        recip = reciprocals(s, s)
        for v in y:
            want = float(np.float32(v) / np.float32(s))
            for finite in (False, True):
                got = div_rn(float(v), s, recip, finite)
                assert same(got, want), (v, s, finite, got, want)


def test_the_constant_reciprocals_are_the_kernels():
    """``constant_reciprocals`` (448's, at trace time) equals what ``reciprocals`` computes."""
    got = arith.constant_reciprocals(448.0)
    assert got == reciprocals(448.0, 448.0)
    assert got[1] <= 1 / 448 <= got[0] and got[2] > 0


def test_a_row_with_an_infinity_divides_as_by_infinity():
    """Its scale is infinite (returned so) and its reciprocals 0; the kernel divides by fp32's
    largest value with those, and no test of the remainder: finite values give zeros of their
    sign, the largest included, and infinities NaN (the store maps NaN to +448, as it maps
    inf / inf), as the division by infinity does."""
    recip = reciprocals(np.inf, F32_MAX)
    assert recip == (0.0, 0.0, 0.0)
    for v in [1.0, -2.5, 0.0, -0.0, 3.3e38, -3.3e38, -1e-30, np.inf, -np.inf, np.nan]:
        want = float(np.float32(v) / np.float32(np.inf))
        assert same(div_rn(v, F32_MAX, recip, True), want), v


def test_without_the_test_an_overflowing_quotient_loses_its_sign():
    """Why a bounded amax (``scale_ub``) keeps the test: y past the bound by far overflows the
    quotient, the remainder is NaN, and only the kept product says -inf."""
    s = float(np.float32(1e-6))
    recip = reciprocals(s, s)
    y = -3.0e38
    assert div_rn(y, s, recip, False) == -np.inf
    assert np.isnan(div_rn(y, s, recip, True))


def test_every_bf16_value_of_a_range_divides_exactly():
    """Every bf16 value of [2^-8, 2^9) and its negation, over scales from amaxes that land
    quotients on the fp8 rounding's ties and off them: the IEEE quotient each time."""
    pos = torch.arange(0x3B80, 0x4400, dtype=torch.int32).to(torch.int16)
    y = pos.view(torch.bfloat16).float().numpy()
    y = np.concatenate([y, -y[::5]])
    for amax in (448.0 / 3, 7.0, 0.1):
        s = float(np.float32(amax) / np.float32(448.0))
        recip = reciprocals(s, s)
        for v in y:
            want = float(np.float32(v) / np.float32(s))
            assert same(div_rn(float(v), s, recip, True), want), (v, s)


def positive_values(dtype: torch.dtype) -> np.ndarray:
    """Every positive finite value of a 16-bit dtype, subnormals included, in fp32."""
    top = {torch.bfloat16: 0x7F80, torch.float16: 0x7C00}[dtype]
    return torch.arange(1, top, dtype=torch.int32).to(torch.int16).view(dtype).float().numpy()


def e4m3(q: np.ndarray) -> np.ndarray:
    """The store's codes of fp32 quotients (``reference.saturate_fp8``: NaN to 448, clamped,
    nearest e4m3 with ties to even, as ``min.f32`` then ``cvt.rn.satfinite``)."""
    q = torch.from_numpy(np.asarray(q, dtype=np.float32))
    return reference.saturate_fp8(q).view(torch.uint8).numpy()


def run_ptx(body: str, operands: dict) -> np.ndarray:
    """Runs a PTX body of ``mul.rn.f32`` and ``fma.rn.f32`` lines on float64 arrays, each result
    rounded once to fp32: exact where each product and sum fits float64's 53 bits (as
    ``short_division_mismatches`` says of ``div_to_e4m3``'s). Returns ``$0``."""
    regs = dict(operands)
    for line in filter(None, (part.strip() for part in body.split(";"))):
        op, args = line.split(None, 1)
        dst, *src = [a.strip() for a in args.split(",")]
        v = [regs[a] for a in src]
        exact = {"mul.rn.f32": lambda: v[0] * v[1], "fma.rn.f32": lambda: v[0] * v[1] + v[2]}[op]()
        regs[dst] = exact.astype(np.float32).astype(np.float64)
    return regs["$0"].astype(np.float32)


def short_division_mismatches(dtype: torch.dtype, one_multiply: bool = False) -> int:
    """Over every amax of ``dtype`` (its scale as ``token_scale`` makes it) and every y of the
    dtype with ``amax * 2^-22 <= y <= amax``: how many e4m3 codes of ``div_to_e4m3``'s PTX
    (``arith.DIV_TO_E4M3``, run by ``run_ptx``), or of ``y r``, differ from the IEEE quotient's.
    In float64 each fp32 rounding is the PTX's one rounding of an exact value: products of y's
    11 bits and a 24-bit factor are exact, ``1 - s d`` is, and so is ``y d + y t`` rounded (its
    bits span 48); the quotient ``y / s`` lies at least 2^-49 of its size from a tie of fp32's
    rounding (y's 11 bits cannot be s times a 25-bit odd significand), so float64's division
    rounds it to fp32 as div.rn does. Smaller y give quotients below 2^-13: e4m3's smallest step
    is 2^-9, so below 2^-10 both round to a zero of y's sign."""
    f32 = np.float32
    values = positive_values(dtype)
    scales = np.maximum(values / f32(448.0), f32(1 / (448 * 512))).astype(f32)
    bad = 0
    for amax, s in zip(values, scales.tolist()):
        y = values[(values >= amax * 2.0 ** -22) & (values <= amax)].astype(np.float64)
        want = (y / s).astype(f32)
        r, d, t = reciprocals(s, s)
        if one_multiply:
            got = (y * r).astype(f32)
        else:
            got = run_ptx(arith.DIV_TO_E4M3, {"$1": y, "$2": d, "$3": t})
        bad += int((e4m3(got) != e4m3(want)).sum())
    return bad


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_without_the_correction_every_16_bit_pair_keeps_its_code(dtype):
    """``div_to_e4m3``: for every pair of a 16-bit y and a per-token scale of an amax no
    smaller than |y| (no bound), the e4m3 code of ``y d + y t`` is the IEEE quotient's. Negative
    y mirror positive (each step rounds to nearest), zeros keep their sign as in ``div_rn``."""
    assert short_division_mismatches(dtype) == 0
    scales = [float(np.float32(1 / (448 * 512))), float(np.float32(3.0) / 448), np.inf]
    for v in [0.0, -0.0, 1.5, -1.5, np.inf, -np.inf, np.nan]:
        for s in scales[2:] if abs(v) == np.inf else scales:  # an infinite y: s is infinite
            _, d, t = reciprocals(s, min(s, F32_MAX))
            got = run_ptx(arith.DIV_TO_E4M3, {"$1": np.array([v]), "$2": d, "$3": t})
            assert e4m3(got) == e4m3(np.array([np.float32(v) / np.float32(s)])), (v, s)


def test_one_multiply_by_the_nearest_reciprocal_is_not_enough():
    """Why ``div_to_e4m3`` keeps the tail: ``y r`` changes 19,180 codes of bf16 pairs."""
    assert short_division_mismatches(torch.bfloat16, one_multiply=True) == 19180
