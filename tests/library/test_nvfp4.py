"""NVFP4 on paper, compiled for real: the format's reference (the kernel's fp32 arithmetic,
step by step) against a float64 reading of the format, the swizzled scale layout, the plans, and
the CuTe kernel compiled for Blackwell (sm_100a) without a GPU, its PTX read. The lab's GPU is a
Hopper: the kernel itself has not run."""

import re

import pytest
import torch

from rmsnorm_lab import reference as R
from rmsnorm_lab.cute.inspect_ptx import compile_and_inspect
from rmsnorm_lab.cute.plan.forward import NotEligible, plan_forward

BF16 = torch.bfloat16


def test_e2m1_rounds_to_nearest_even_and_saturates():
    v = torch.tensor([0.0, 0.25, 0.26, 0.74, 0.75, 1.25, 1.26, 1.75, 2.5, 2.6, 3.5, 5.0, 5.1,
                      7.0, float("inf"), float("nan"), -0.75, -3.4])
    got = R.e2m1_values(R.round_e2m1(v)).tolist()
    assert got == [0.0, 0.0, 0.5, 0.5, 1.0, 1.0, 1.5, 2.0, 2.0, 3.0, 4.0, 4.0, 6.0, 6.0, 6.0,
                   6.0, -1.0, -3.0]


def test_every_e2m1_value_is_kept():
    values = torch.tensor(R.FP4_VALUES + tuple(-x for x in R.FP4_VALUES[1:]))
    assert torch.equal(R.e2m1_values(R.round_e2m1(values)), values)


def test_the_swizzled_layout_is_flashinfers_128x4_tiles():
    """(row, block) -> m_tile * k_tiles * 512 + k_tile * 512 + (row % 32) * 16
    + (row % 128) // 32 * 4 + block % 4, every byte of the padded buffer used once."""
    M, blocks = 300, 10  # rows padded to 384, blocks to 12
    rows = torch.arange(384).unsqueeze(1).expand(384, 12)
    cols = torch.arange(12).unsqueeze(0).expand(384, 12)
    off = R.nvfp4_scale_offset(rows, cols, blocks)
    assert sorted(off.reshape(-1).tolist()) == list(range(R.nvfp4_scales_size(M, 16 * blocks)))
    assert int(R.nvfp4_scale_offset(torch.tensor(130), torch.tensor(5), blocks)) == \
        (1 * 3 + 1) * 512 + 2 * 16 + 0 * 4 + 1
    assert int(R.nvfp4_scale_offset(torch.tensor(97), torch.tensor(2), blocks)) == \
        1 * 16 + 3 * 4 + 2


def quantized(M=256, N=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = (torch.randn(M, N, generator=g) * torch.logspace(-2, 2, M).unsqueeze(1)).to(BF16)
    gs = torch.tensor([448 * 6 / float(y.float().abs().max())])
    return y, gs, *R.quantize_nvfp4(y, gs)


def test_the_arithmetic_against_float64():
    """Each block's scale is e4m3 of ``g * amax / 6`` (to within fp32's rounding of 1/6), and
    each value is the nearest e2m1 step of ``y * g / scale`` (checked in float64: ties aside, a
    value sits within half a step of its code)."""
    y, gs, q, scales = quantized()
    M, N = y.shape
    rows = torch.arange(M).unsqueeze(1).expand(M, N // 16)
    blocks = torch.arange(N // 16).unsqueeze(0).expand(M, N // 16)
    s = scales.float()[R.nvfp4_scale_offset(rows, blocks, N // 16)].double()
    amax = y.double().reshape(M, N // 16, 16).abs().amax(-1)
    exact = (gs.double() * amax / 6).clamp(max=448)
    assert ((s - exact).abs() <= exact * 2 ** -3 / 2 * 1.001 + 2 ** -9).all()  # e4m3's half ulp
    codes = torch.stack((q & 0xF, q >> 4), -1).reshape(M, N)
    got = R.e2m1_values(codes).double().reshape(M, N // 16, 16)
    target = y.double().reshape(M, N // 16, 16) * (gs.double() / s).unsqueeze(-1)
    grid = torch.tensor(R.FP4_VALUES, dtype=torch.float64)
    nearest = (target.abs().unsqueeze(-1) - grid).abs().min(-1).values
    assert ((got.abs() - target.abs().clamp(max=6)).abs() <= nearest + 1e-6).all()
    back = R.dequantize_nvfp4(q, scales, gs, N).double()
    rel = ((back - y.double()).norm(dim=1) / y.double().norm(dim=1)).max()
    assert rel < 0.13  # e2m1: one mantissa bit, about 0.1 a row


def test_a_zero_block_nan_and_the_padding():
    y = torch.randn(3, 64).to(BF16)
    y[0, :16] = 0
    y[1, 20] = float("nan")
    q, scales = R.quantize_nvfp4(y, torch.tensor([100.0]))
    assert int(q[0, :8].sum()) == 0  # a zero block: scale 0, values 0
    codes = torch.stack((q & 0xF, q >> 4), -1).reshape(3, 64)
    assert int(codes[1, 20]) == 7  # NaN to +6
    used = R.nvfp4_scale_offset(torch.arange(3).unsqueeze(1), torch.arange(4).unsqueeze(0), 4)
    padding = torch.ones(512, dtype=torch.bool)
    padding[used.reshape(-1)] = False
    assert scales.numel() == 512 and int(scales.view(torch.uint8)[padding].sum()) == 0
    assert float(scales.float()[int(used[0, 0])]) == 0  # the zero block's scale


@pytest.mark.parametrize("arch,variant,N,x,msg", [
    ("sm_90a", "row", 4096, BF16, "Blackwell"),
    ("sm_100a", "fallback", 4096, BF16, "row, warp"),
    ("sm_100a", "persistent", 4096, BF16, "fp8 output is written"),
    ("sm_100a", "row", 4096, torch.float32, "bfloat16 or float16"),
    ("sm_100a", "row", 4104, BF16, "multiple of 16"),
])
def test_plans_refuse_what_nvfp4_cannot(arch, variant, N, x, msg):
    with pytest.raises(NotEligible, match=msg):
        plan_forward(variant, N, x, x, "llama", False, True, arch=arch, quant="nvfp4")


CASES = [("row", 4096, False), ("row", 32768, False), ("warp", 128, True), ("warp", 2048, False),
         ("row", 1040, True)]


@pytest.mark.parametrize("variant,N,residual", CASES)
def test_compiles_for_blackwell(variant, N, residual):
    """sm_100a: one e2m1 convert a pair of values, one e4m3 convert and one shuffle a block half,
    a 32-bit store of 8 values a copy and a byte a scale, the division by the block scale
    IEEE, no spill."""
    plan = plan_forward(variant, N, BF16, BF16, "llama", False, True, arch="sm_100a",
                        residual=residual, quant="nvfp4")
    facts = compile_and_inspect(plan, "sm_100a")
    ptx = facts.ptx
    copies = plan.vecs_per_thread * plan.chunks * (plan.tiles_per_cta or 1)
    assert len(re.findall(r"\bcvt\.rn\.satfinite\.e2m1x2\.f32\b", ptx)) == copies * 4
    assert len(re.findall(r"\bcvt\.rn\.satfinite\.e4m3x2\.f32\b", ptx)) == copies
    assert len(re.findall(r"\bdiv\.rn\.f32\s+%r\d+, %r\d+, %r\d+;", ptx)) == copies
    assert re.search(r"\bshfl\.sync\.bfly\.b32\s+%r\d+, %r\d+, 1,", ptx)
    stores = set(re.findall(r"\bst\.global(?:\.[a-z0-9]+)+", ptx))
    assert {"st.global.b32", "st.global.b8"} <= stores
    assert facts.local_accesses == 0
    if facts.spill_bytes is None:
        pytest.skip("no ptxas new enough for this PTX; PTX-level checks passed")
    assert facts.spill_bytes == 0
