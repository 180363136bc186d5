"""The per-token division of the CuTe fp8 epilogue (``cute.device.arith.div_rn``) emulated on the
CPU, step for step in exact arithmetic: the IEEE quotient ``div.rn.f32`` gives, for bf16 y and
the scales ``token_scale`` makes (the product ``y * r`` corrected twice by its FMA remainder),
and where a row holds an infinity, the divisor clamped to fp32's largest value gives what
division by infinity does, without the test of the remainders (``finite=True``)."""

from fractions import Fraction

import numpy as np
import pytest
import torch

F32_MAX = float(np.finfo(np.float32).max)
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's inf - inf


def f32(q: Fraction) -> float:
    """``q`` rounded once to the nearest fp32 (ties to even), subnormals and overflow
    included."""
    if q == 0:
        return 0.0
    a = abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    ulp = Fraction(2) ** (max(e, -126) - 23)
    n, rest = divmod(a, ulp)
    n = int(n) + (1 if rest > ulp / 2 or (rest == ulp / 2 and n % 2) else 0)
    v = float(n * ulp)
    return np.copysign(v if v <= F32_MAX else np.inf, float(q))


def fma(a: float, b: float, c: float) -> float:
    if not all(np.isfinite([a, b, c])):
        return float(np.float32(a) * np.float32(b) + np.float32(c))  # inf/NaN as IEEE's
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact != 0:
        return f32(exact)
    # an exact zero is -0 only as the sum of two negative zeros (round to nearest)
    negative_product = (a == 0 or b == 0) and np.signbit(a) != np.signbit(b)
    return -0.0 if negative_product and c == 0 and np.signbit(c) else 0.0


def div_rn(y: float, s: float, r: float, finite: bool) -> float:
    """The PTX of ``div_rn``, one instruction a line."""
    q0 = float(np.float32(y) * np.float32(r))  # its infinities, NaN and zeros
    if np.isfinite(q0) and q0 != 0:
        q0 = f32(Fraction(y) * Fraction(r))
    e = fma(-s, q0, y)
    q1 = fma(e, r, q0)
    e = fma(-s, q1, y)
    q2 = fma(e, r, q1)
    if not finite and np.isnan(q2):
        q2 = q0
    return float(np.copysign(q2, y))


def same(a: float, b: float) -> bool:
    return (np.isnan(a) and np.isnan(b)) or (a == b and np.signbit(a) == np.signbit(b))


def bf16_values(n: int, seed: int) -> np.ndarray:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp2(torch.randint(-8, 9, (n,), generator=g))
    return x.to(torch.bfloat16).float().numpy()


@pytest.mark.parametrize("seed", range(4))
def test_the_corrected_product_is_the_ieee_quotient(seed):
    """Scales from the row's amax (and from amaxes of few bits, where quotients land on ties of
    the fp8 rounding): every quotient equals numpy's fp32 division, bit for bit."""
    y = bf16_values(400, seed)
    amaxes = [float(np.abs(y).max()), 1.5, 3.0 * 2.0 ** -7, 0.1, 448.0 / 3]
    for amax in amaxes:
        s = float(max(np.float32(amax) / np.float32(448.0), np.float32(1 / (448 * 512))))
        r = float(np.float32(1.0) / np.float32(s))
        for v in y:
            want = float(np.float32(v) / np.float32(s))
            for finite in (False, True):
                got = div_rn(float(v), s, r, finite)
                assert same(got, want), (v, s, finite, got, want)


def test_a_row_with_an_infinity_divides_as_by_infinity():
    """Its scale is infinite (returned so) and the reciprocal 0; the kernel divides by fp32's
    largest value with that reciprocal and no test of the remainders: finite values give zeros
    of their sign, the largest included, and infinities NaN (the store maps NaN to +448, as it
    maps inf / inf), as the division by infinity does."""
    s, r = F32_MAX, 0.0
    for v in [1.0, -2.5, 0.0, -0.0, 3.3e38, -3.3e38, -1e-30, np.inf, -np.inf, np.nan]:
        want = float(np.float32(v) / np.float32(np.inf))
        assert same(div_rn(v, s, r, True), want), v


def test_without_the_test_an_overflowing_quotient_loses_its_sign():
    """Why a bounded amax (``scale_ub``) keeps the test: y past the bound by far overflows the
    quotient, the remainders are NaN, and only the kept product says -inf."""
    s = float(np.float32(1e-6))
    r = float(np.float32(1.0) / np.float32(s))
    y = -3.0e38
    assert div_rn(y, s, r, False) == -np.inf
    assert np.isnan(div_rn(y, s, r, True))
