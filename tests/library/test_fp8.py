"""The fp8-output norm's arithmetic (``reference.quantize_fp8``, ``reference.rms_norm_fp8``) on
the CPU: against a float64 norm, and at the edges of the convention (zero rows, NaN and inf,
the largest finite values, saturation, ties, the per-token scale and its bound, the residual)."""

import math

import pytest
import torch

from rmsnorm_lab import reference as ref

FP8 = torch.float8_e4m3fn
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
#: the smallest per-token scale as fp32 holds it
MIN_SCALE = float(torch.tensor(ref.FP8_MIN_SCALE, dtype=torch.float32))
#: the per-token scale's relative error against float64: y's roundings to x's dtype (up to four
#: in the none mode: rstd, x * rstd, offset + w and y) plus fp32's
SCALE_REL = {torch.float32: 1e-6, torch.bfloat16: 2 ** -6, torch.float16: 2 ** -9}


def fresh(shape, dtype=torch.float32):
    return torch.randn(shape, dtype=torch.float32).to(dtype)


def bits(q):
    return q.view(torch.uint8)


def float64_norm(x, w, eps, offset):
    """The norm in float64, no rounding anywhere."""
    xd = x.double()
    rstd = 1.0 / torch.sqrt(xd.square().mean(dim=-1, keepdim=True) + eps)
    scale = (w.double() + offset) if w is not None else 1.0
    return xd * rstd * scale


def fp8_step(v):
    """The spacing of float8_e4m3fn at |v| (its subnormals' below 2**-6)."""
    e = torch.floor(torch.log2(v.abs().clamp_min(2.0 ** -6)))
    return torch.exp2(e - 3)


def assert_within_one_step(y_q, target):
    """Each fp8 value within one fp8 step of ``target`` (float64, already saturated)."""
    got = y_q.double()
    step = torch.maximum(fp8_step(got), fp8_step(target))
    err = (got - target).abs()
    assert bool((err <= step).all()), f"worst {float((err / step).max()):.3g} steps"


def saturated(v):
    return v.clamp(-ref.FP8_MAX, ref.FP8_MAX)


# ---------------------------------------------------------------- against float64

@pytest.mark.parametrize("per_token", [True, False], ids=["per_token", "static"])
@pytest.mark.parametrize("with_weight, offset", [(True, 0.0), (True, 1.0), (False, 0.0)])
@pytest.mark.parametrize("mode", ref.CASTING_MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_within_one_fp8_step_of_float64(dtype, mode, with_weight, offset, per_token):
    eps = 1e-6
    x = fresh((2, 9, 96), dtype)
    w = fresh((96,), dtype) if with_weight else None
    y64 = float64_norm(x, w, eps, offset)
    scale = None if per_token else torch.tensor(float(y64.abs().max()) / 300, dtype=torch.float32)
    y_q, scales = ref.rms_norm_fp8(x, w, eps, offset, mode, scale=scale)
    assert y_q.dtype == FP8 and y_q.shape == x.shape
    if per_token:
        assert scales.dtype == torch.float32 and scales.shape == x.shape[:-1]
        expect = y64.abs().amax(dim=-1) / ref.FP8_MAX
        torch.testing.assert_close(scales.double(), expect, rtol=SCALE_REL[dtype], atol=0)
        assert_within_one_step(y_q, saturated(y64 / scales.double().unsqueeze(-1)))
        # the row's largest |y| lands on (or one rounding of y below) the top of the range
        assert bool((y_q.float().abs().amax(dim=-1) >= 416).all())
    else:
        assert scales is scale
        assert_within_one_step(y_q, saturated(y64 / float(scale)))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_per_token_scale_is_the_rows_amax_over_448(dtype):
    x, w = fresh((6, 200), dtype), fresh((200,), dtype)
    y = ref.rms_norm(x, w, 1e-6, 0.0, "llama")
    y_q, scales = ref.quantize_fp8(y)
    amax = y.float().abs().amax(dim=-1)
    assert torch.equal(scales, amax / 448.0)
    # a division by the scale, not a multiplication by its reciprocal
    assert torch.equal(bits(y_q), bits(ref.saturate_fp8(y.float() / scales.unsqueeze(-1))))


# ---------------------------------------------------------------- edges of the convention

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_row_of_zeros_gets_the_smallest_scale_and_zeros(dtype):
    x = fresh((3, 64), dtype)
    x[1] = 0
    y_q, scales = ref.rms_norm_fp8(x, fresh((64,), dtype))
    assert float(scales[1]) == MIN_SCALE == float(torch.tensor([1.0]) / (448 * 512))
    assert bool((y_q[1].float() == 0).all())
    assert bool((scales[[0, 2]] > MIN_SCALE).all())
    y_q, _ = ref.rms_norm_fp8(x, None, scale=torch.tensor(0.01))
    assert bool((y_q[1].float() == 0).all())


@pytest.mark.parametrize("per_token", [True, False], ids=["per_token", "static"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nan_in_x_saturates_its_row_to_plus_448(dtype, per_token):
    """A NaN makes the row's rstd NaN, so every y of the row is NaN; NaN quantizes to +448
    (vLLM's clamp keeps the bound), and the amax skips NaN: the row gets the smallest scale."""
    x, w = fresh((3, 32), dtype), fresh((32,), dtype)
    x[1, 5] = float("nan")
    scale = None if per_token else torch.tensor(0.01)
    y_q, scales = ref.rms_norm_fp8(x, w, scale=scale)
    assert bool((y_q[1].float() == 448).all())
    assert not y_q.float().isnan().any()
    if per_token:
        assert float(scales[1]) == MIN_SCALE
        assert bool(scales.isfinite().all())
    rows, _ = ref.rms_norm_fp8(x[[0, 2]], w, scale=scale)  # the other rows are their own
    assert torch.equal(bits(y_q[[0, 2]]), bits(rows))


@pytest.mark.parametrize("per_token", [True, False], ids=["per_token", "static"])
@pytest.mark.parametrize("mode", ref.CASTING_MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_inf_in_x_zeroes_its_row_and_saturates_itself(dtype, mode, per_token):
    """An infinity makes the row's sum of squares inf and rstd 0: the row's finite elements
    normalize to 0, each +-inf to inf * 0 = NaN, which quantizes to +448 (either sign); per
    token the amax (NaN skipped) is 0, so the row gets the smallest scale."""
    x = fresh((3, 16), dtype)
    x[0, 2], x[0, 7] = float("inf"), float("-inf")
    scale = None if per_token else torch.tensor(0.5)
    y_q, scales = ref.rms_norm_fp8(x, fresh((16,), dtype), 1e-6, 0.0, mode, scale=scale)
    row = y_q[0].float()
    assert row[2] == 448 and row[7] == 448
    others = torch.ones(16, dtype=torch.bool)
    others[[2, 7]] = False
    assert bool((row[others] == 0).all())
    if per_token:
        assert float(scales[0]) == MIN_SCALE
    assert not y_q[1:].float().isnan().any()


def test_inf_and_nan_in_y_quantize_as_vllm():
    """Straight into the quantizer: +-inf saturate to +-448 under a static scale, NaN to +448;
    per token an inf in y makes the scale inf, so the inf itself (inf / inf) gives +448 and the
    row's finite values 0."""
    y = torch.tensor([[1.0, float("inf"), float("-inf"), float("nan")]])
    y_q, _ = ref.quantize_fp8(y, torch.tensor([1.0]))
    assert y_q.float().tolist() == [[1.0, 448.0, -448.0, 448.0]]
    y_q, scales = ref.quantize_fp8(y)
    assert math.isinf(float(scales[0]))
    assert y_q.float().tolist() == [[0.0, 448.0, 448.0, 448.0]]


@pytest.mark.parametrize("per_token", [True, False], ids=["per_token", "static"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_the_largest_finite_y(dtype, per_token):
    """y at x's dtype's largest finite values (rows of +-1 times a weight of max / 8): per token
    the scale is finite and the row lands on +-448; a static scale of 1 saturates them."""
    big = torch.finfo(dtype).max / 8
    x = torch.tensor([[1.0, -1.0] * 8], dtype=dtype)
    w = torch.full((16,), big, dtype=dtype)
    scale = None if per_token else torch.tensor(1.0)
    y_q, scales = ref.rms_norm_fp8(x, w, 0.0, 0.0, "llama", scale=scale)
    assert y_q.float().tolist() == [[448.0, -448.0] * 8]
    if per_token:
        assert torch.equal(scales, torch.tensor([big], dtype=torch.float32) / 448)


def test_the_largest_finite_x():
    """fp16's largest values normalize to +-1 (the fp32 sum of squares holds 65504**2); bf16's
    overflow that sum, so rstd is 0 and the row is zeros with the smallest scale, as
    ``rms_norm`` (and torch's own rms_norm) gives y = 0 there."""
    x = torch.tensor([[65504.0, -65504.0] * 4], dtype=torch.float16)
    y_q, scales = ref.rms_norm_fp8(x, None, 0.0)
    assert y_q.float().tolist() == [[448.0, -448.0] * 4]
    assert float(scales[0]) == float(torch.tensor(1 / 448, dtype=torch.float32))
    xb = torch.full((1, 8), torch.finfo(torch.bfloat16).max, dtype=torch.bfloat16)
    assert bool((ref.rms_norm(xb) == 0).all())
    assert bool((torch.nn.functional.rms_norm(xb, (8,)) == 0).all())
    y_q, scales = ref.rms_norm_fp8(xb)
    assert bool((y_q.float() == 0).all()) and float(scales[0]) == MIN_SCALE


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_small_static_scale_saturates(dtype):
    sign = torch.tensor([1.0, -1.0]).repeat(25)
    x = ((fresh((4, 50)).abs() + 0.05) * sign).to(dtype)  # |y| well above 448 * scale
    x[2, 3] = 0
    w = (torch.rand(50) + 0.5).to(dtype)
    y_q, _ = ref.rms_norm_fp8(x, w, scale=torch.tensor(1e-6))
    expect = sign.expand(4, 50) * 448
    expect[2, 3] = 0
    assert torch.equal(y_q.float(), expect)


@pytest.mark.parametrize("shape", [(), (1,)], ids=["0d", "1d"])
@pytest.mark.parametrize("mode", ref.CASTING_MODES)
def test_round_to_nearest_even_at_ties(mode, shape):
    """Rows of ones normalize to exactly 1 (eps 0), so y is the weight: values halfway between
    two fp8 neighbours go to the one with an even mantissa."""
    ties = [1.0625, 1.1875, -1.0625, 9.5, 10.5, 2 ** -10, 3 * 2 ** -10, 0.0146484375]
    expect = [1.0, 1.25, -1.0, 10.0, 10.0, 0.0, 2 ** -8, 0.015625]
    x = torch.ones(2, len(ties), dtype=torch.bfloat16)
    w = torch.tensor(ties, dtype=torch.bfloat16)
    assert w.float().tolist() == ties  # exact in bf16
    y_q, _ = ref.rms_norm_fp8(x, w, 0.0, 0.0, mode, scale=torch.ones(shape))
    assert y_q.float().tolist() == [expect, expect]


def test_scale_ub_bounds_the_per_token_amax():
    x = fresh((4, 64), torch.bfloat16)
    w = torch.ones(64, dtype=torch.bfloat16)
    y = ref.rms_norm(x, w)
    amax = y.float().abs().amax(dim=-1)
    ub = torch.tensor([float(amax.median())])  # some rows above it, some at or below
    y_q, scales = ref.rms_norm_fp8(x, w, scale_ub=ub)
    assert torch.equal(scales, torch.fmin(amax, ub) / 448)
    over = amax > ub
    assert bool(over.any()) and bool((~over).any())
    # a bounded row saturates at its largest values; the others are as without the bound
    assert bool((y_q[over].float().abs().amax(dim=-1) == 448).all())
    free, free_scales = ref.rms_norm_fp8(x, w)
    assert torch.equal(bits(y_q[~over]), bits(free[~over]))
    assert torch.equal(scales[~over], free_scales[~over])


@pytest.mark.parametrize("per_token", [True, False], ids=["per_token", "static"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_residual_normalizes_the_rounded_sum(dtype, per_token):
    x, r, w = fresh((5, 80), dtype), fresh((5, 80), dtype), fresh((80,), dtype)
    scale = None if per_token else torch.tensor(0.02)
    y_q, scales, h = ref.rms_norm_fp8(x, w, 1e-5, 0.0, "llama", scale=scale, residual=r)
    assert torch.equal(h, ref.add_residual(x, r)) and h.dtype == dtype
    y_h, scales_h = ref.rms_norm_fp8(h, w, 1e-5, 0.0, "llama", scale=scale)
    assert torch.equal(bits(y_q), bits(y_h))
    assert torch.equal(scales, scales_h)
    target = float64_norm(h, w, 1e-5, 0.0)
    s = scales.double().unsqueeze(-1) if per_token else float(scale)
    assert_within_one_step(y_q, saturated(target / s))


def test_static_scale_is_returned_as_given():
    x = fresh((2, 8))
    scale = torch.tensor([0.25])
    _, s = ref.rms_norm_fp8(x, scale=scale)
    assert s is scale


def test_fp8_order_counts_steps_between_neighbouring_values():
    codes = ref.fp8_order
    every = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn)
    values = every.float()
    finite = values[~values.isnan()]
    order = finite.sort().values.unique()  # -0 and +0 are one value
    steps = codes(order.to(torch.float8_e4m3fn))
    assert steps.tolist() == list(range(-126, 127))  # 448 is 126 steps above zero, each one
    assert int(codes(torch.tensor([-0.0]).to(torch.float8_e4m3fn))) == 0
