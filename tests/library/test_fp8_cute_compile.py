"""The CuTe fp8 forward (``plan.quant``) without a GPU: its plans are the forward's tiles with an
fp8 epilogue, and the code compiled for Hopper and Blackwell quantizes and stores the way the
kernel says: one saturating convert for two values, the IEEE quotient from one reciprocal a row,
y two values a word where the rounding allows, 8 bytes of fp8 where x's copy is 16, no spills."""

import dataclasses
import re

import pytest
import torch

from rmsnorm_lab.cute.inspect_ptx import compile_and_inspect
from rmsnorm_lab.cute.plan.auto import auto_variant, row_class
from rmsnorm_lab.cute.plan.forward import PDL_MIN_THREADS, NotEligible, plan_forward
from rmsnorm_lab.cute.plan.quant import (FP8_COPIES_PER_THREAD, FP8_PDL_COPIES_PER_THREAD,
                                        fp8_launch_bound)

BF16, F32, F16 = torch.bfloat16, torch.float32, torch.float16
ARCHS = ["sm_90a", "sm_100a"]

# (variant, N, x dtype, w dtype, mode, quant, scale_ub, residual, offset): the row tile, the
# 16 KB two-pass tile, column chunks (pipelined, and with a residual), warp-per-row (per-head rows
# in tile groups), the fallback, every dtype and mode, with and without an offset
CASES = [
    ("row", 1024, BF16, BF16, "llama", "static", False, False, False),
    ("row", 1024, BF16, BF16, "llama", "token", False, False, False),
    ("row", 2048, BF16, BF16, "llama", "static", False, False, False),
    ("row", 2048, BF16, BF16, "llama", "token", False, False, False),
    ("row", 4096, BF16, BF16, "llama", "token", False, False, False),
    ("row", 4096, F16, F16, "llama", "token", False, False, True),
    ("row", 4096, BF16, BF16, "llama", "static", False, True, False),
    ("row", 4096, BF16, BF16, "llama", "static", False, False, True),
    ("row", 8192, BF16, BF16, "gemma", "token", True, False, True),
    ("row", 8192, BF16, BF16, "llama", "static", False, False, False),
    ("row", 16384, BF16, BF16, "llama", "static", False, False, False),
    ("row", 16384, BF16, BF16, "llama", "token", False, False, False),
    ("row", 32768, BF16, BF16, "llama", "static", False, False, False),
    ("row", 32768, BF16, BF16, "llama", "token", False, False, False),
    ("row", 65536, F16, F32, "llama", "static", False, False, False),
    ("row", 32768, BF16, None, "gemma", "token", True, True, True),
    ("row", 4096, F32, F32, "none", "token", False, True, False),
    ("warp", 128, BF16, BF16, "llama", "token", False, False, False),
    ("warp", 128, BF16, BF16, "llama", "static", False, True, False),
    ("warp", 1024, F16, F16, "none", "token", True, False, False),
    ("warp", 1024, BF16, BF16, "llama", "static", False, False, False),
    ("warp", 1024, BF16, BF16, "llama", "token", False, False, True),
    ("fallback", 1023, BF16, BF16, "llama", "token", False, True, False),
    ("fallback", 100003, F32, None, "gemma", "static", False, False, True),
]


def case_id(c) -> str:
    return "-".join(map(str, c[:2] + c[5:6])) + ("-offset" if c[8] else "")


def fp8_plan(variant, N, x, w, mode, quant, ub, residual, offset, arch):
    return plan_forward(variant, N, x, w, mode, store_rstd=False, aligned=True, arch=arch,
                        pdl=True, residual=residual, quant=quant, scale_ub=ub, offset=offset)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_the_plan_is_the_forwards_tile(case, arch):
    """The forward's tile with an fp8 epilogue, but a one-row tile of one chunk (no residual)
    takes four copies a thread (FP8_COPIES_PER_THREAD), where the forward takes two, or two on
    a CTA that four would leave too small for PDL, and the epilogue keeps off the register-bound
    tiles of one copy a chunk (Hopper's 16 KB and wide rows)."""
    plan = fp8_plan(*case, arch)
    variant, N, x, w, mode, quant, ub, residual, offset = case
    forward = plan_forward(variant, N, x, w, mode, store_rstd=False, aligned=True, arch=arch,
                           pdl=True, residual=residual)
    if plan.variant == "row" and plan.chunks == 1 and not residual:
        pdl_tile = (PDL_MIN_THREADS, FP8_PDL_COPIES_PER_THREAD)
        assert (plan.vecs_per_thread == FP8_COPIES_PER_THREAD or plan.threads_per_row == 256
                or (plan.threads_per_row, plan.vecs_per_thread) == pdl_tile)
        assert plan.threads_per_row * plan.vecs_per_thread * plan.vec >= N
        assert plan.min_ctas_per_sm == fp8_launch_bound(quant, offset, plan.threads,
                                                        plan.vecs_per_thread)
    elif forward.min_ctas_per_sm:
        assert plan.min_ctas_per_sm == 0 and plan.threads_per_row <= 256
    else:
        assert plan.min_ctas_per_sm == 0
        assert dataclasses.replace(plan, quant="", scale_ub=False, offset=True,
                                   min_ctas_per_sm=0) == forward


@pytest.mark.parametrize("quant", ["static", "token"])
def test_a_row_that_leaves_a_small_cta_takes_two_copies_a_thread_and_pdl(quant):
    """2048 bf16 columns: four copies a thread would make a CTA of 64 threads, which launches
    without PDL (plan/forward.py's PDL_MIN_THREADS); two copies make one of 128, launched with
    PDL on Hopper. 1024 columns, where two copies still leave 64 threads, keep four; fp32 x of
    1024 columns is 2048 bf16's bytes, the same tile."""
    def tile(N, x=BF16, arch="sm_90a"):
        p = plan_forward("row", N, x, x, "llama", store_rstd=False, aligned=True, arch=arch,
                         pdl=True, quant=quant, offset=False)
        return p.threads_per_row, p.vecs_per_thread, p.pdl
    assert tile(2048) == (PDL_MIN_THREADS, FP8_PDL_COPIES_PER_THREAD, True)
    assert tile(1024, F32) == tile(2048)
    assert tile(2048, arch="sm_100a") == (PDL_MIN_THREADS, FP8_PDL_COPIES_PER_THREAD, False)
    assert tile(1024) == (32, FP8_COPIES_PER_THREAD, False)
    assert tile(4096) == (PDL_MIN_THREADS, FP8_COPIES_PER_THREAD, True)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_compiles_to_a_saturating_fp8_store(case, arch):
    variant, N, x, w, mode, quant, ub, residual, offset = case
    plan = fp8_plan(*case, arch)
    ptx = compile_and_inspect(plan, arch)
    text = ptx.ptx
    assert re.search(r"\bcvt\.rn\.satfinite\.e4m3x2\.f32\b", text)
    # NaN goes to +448 before the convert (which would keep it): a min.f32 against 448.0,
    # which passes over NaN
    assert re.search(r"\bmin\.f32\s[^;]*0f43E00000", text)
    # no division by a register (the mean's division by N, amax's by 448 have constant
    # divisors): reciprocals of the scale, a static one's where each chunk (or each of a tile
    # group's unrolled tiles) is stored, after the loads, a row's once a row (per token: once
    # for each of a tile group's unrolled tiles, with 1 / scale rounded down)
    assert not re.findall(r"\bdiv\.rn\.f32\s+%r\d+, %r\d+, %r\d+;", text)
    # per token, y of a 16-bit dtype and no amax bound: y / s as arith.div_to_e4m3, which
    # needs 1 / s rounded down and its tail, not 1 / s rounded to nearest
    short = quant == "token" and x != F32 and not ub
    rcps = len(re.findall(r"\brcp\.rn\.f32\b", text))
    stores = plan.tiles_per_cta * (1 if quant == "token" else plan.chunks)
    assert rcps == (0 if short else stores)
    if quant == "token":
        assert len(re.findall(r"\brcp\.rm\.f32\b", text)) == plan.tiles_per_cta
        # amax / 448 as arith.div_rn: the faithful product corrected once by its exact
        # remainder, and so is y / s for each value of a copy at least, unless short
        corrections = len(re.findall(r"\bfma\.rn\.f32 e, %r\d+, q0, ny;", text))
        shorts = len(re.findall(r"\bmul\.rn\.f32 p, %r\d+, %r\d+; fma\.rn\.f32 %r\d+", text))
        if short:
            assert corrections == plan.tiles_per_cta and shorts >= plan.vec
        else:
            assert corrections >= plan.vec + 1 and shorts == 0
        assert re.search(r"\bmax\.(?:bf16x2|f16x2|f32)\b", text)  # amax: NaN passed over
        # the amax bound: a min.f32 against a register
        assert bool(re.search(r"\bmin\.f32\s+%r\d+, %r\d+, %r\d+;", text)) == ub
    # y rounded two values a word where the casting mode rounds the product (llama), w has x's
    # 16-bit dtype and there is no offset
    packed = mode == "llama" and x in (BF16, F16) and w == x and not offset
    kind = "bf16x2" if x == BF16 else "f16x2"
    assert bool(re.search(rf"\bmul(?:\.rn)?\.{kind}\b", text)) == packed
    # fp8 stores of a copy's vec elements: 8 bytes where x's copies are 16 (4 for fp32 x)
    width = plan.vec  # bytes of fp8 a copy
    stores = re.findall(r"\bst\.global(?:\.cs)?\.(v4\.b16|v2\.b32|b64|b32|v2\.b16|v4\.b8|b16|b8)\b",
                        text)
    expect = {8: ("v4.b16", "v2.b32", "b64"), 4: ("b32", "v2.b16", "v4.b8"), 1: ("b8",)}[width]
    assert any(s in expect for s in stores), stores
    assert ptx.local_accesses == 0
    if ptx.spill_bytes is None:
        pytest.skip("no ptxas new enough for this PTX; PTX-level checks passed")
    assert ptx.spill_bytes == 0, f"{ptx.spill_bytes} bytes spilled, {ptx.registers} regs"


@pytest.mark.parametrize("offset", [False, True])
@pytest.mark.parametrize("quant", ["static", "token"])
@pytest.mark.parametrize("variant,N,threads", [("warp", 1024, 256), ("row", 8192, 256),
                                               ("row", 4096, 128)])
def test_the_four_copy_tiles_keep_their_ctas_an_sm(variant, N, threads, quant, offset):
    """Four copies a thread: at most 64 registers, or an SM holds a CTA fewer (four of 256
    threads, eight of 128). The static scale's reciprocal comes after the loads
    (``scale_multiplier``): before them it would hold them back, at 74 registers at 8192
    columns (three CTAs). At 128 threads a static scale takes a launch bound
    (``fp8_launch_bound``): 66 registers without it."""
    plan = fp8_plan(variant, N, BF16, BF16, "llama", quant, False, False, offset, "sm_90a")
    ptx = compile_and_inspect(plan, "sm_90a")
    if ptx.registers is None:
        pytest.skip("no ptxas new enough for this PTX")
    assert plan.threads == threads and plan.vecs_per_thread == 4
    assert ptx.registers <= 64 and ptx.spill_bytes == 0, ptx.registers


@pytest.mark.parametrize("variant", ["persistent", "cluster", "staged"])
def test_other_variants_write_no_fp8(variant):
    with pytest.raises(NotEligible, match="fp8 output is written by the row, warp, fallback"):
        plan_forward(variant, 32768, BF16, BF16, "llama", False, True, arch="sm_90a",
                     quant="token")


def test_an_fp8_plan_keeps_no_rstd_and_bounds_only_per_token_scales():
    with pytest.raises(NotEligible, match="no rstd"):
        plan_forward("row", 4096, BF16, BF16, "llama", True, True, quant="static")
    with pytest.raises(ValueError, match="per-token"):
        plan_forward("row", 4096, BF16, BF16, "llama", False, True, quant="static",
                     scale_ub=True)
    with pytest.raises(ValueError, match="quant must be one of"):
        plan_forward("row", 4096, BF16, BF16, "llama", False, True, quant="dynamic")


@pytest.mark.parametrize("M,N", [(1, 4096), (1000, 4096), (65536, 4096), (65536, 128),
                                 (16384, 8192), (64, 1000)])
def test_auto_always_picks_a_variant_with_an_fp8_kernel(M, N):
    for residual in (False, True):
        v = auto_variant(N, True, BF16, M, residual=residual)
        fp8_plan(v, N, BF16, BF16, "llama", "token", False, residual, False, "sm_90a")
        assert row_class(M) in (0, 1, 2)


def test_a_static_scale_at_few_rows_keeps_the_bound():
    """1024 rows of 4096 columns (the middle row class) take the same 128-thread tile, bound:
    eight CTAs an SM, so 1024 CTAs fit one wave of an H100's or H200's 132 SMs."""
    plan = plan_forward("row", 4096, BF16, BF16, "llama", False, True, arch="sm_90a", pdl=True,
                        row_class=row_class(1024), quant="static", offset=False)
    assert (plan.threads, plan.vecs_per_thread, plan.min_ctas_per_sm) == (128, 4, 8)
    assert 132 * plan.min_ctas_per_sm >= 1024
