"""The CuTe q/k-norm + RoPE forward compiled without a GPU (sm_90a and sm_100a): its plan for each
dtype and head size, the rows it refuses, and its code: 16-byte loads and stores only (the rstd
words aside), no local memory, one rsqrt a row, the halves met by one shuffle a register where
they sit in other lanes, and the rotation's products rounded apart from its sum (16-bit rows
two values at a time)."""

import glob
import re
import tempfile

import pytest
import torch

from rmsnorm_lab.cute.inspect_ptx import ptxas_report
from rmsnorm_lab.cute.kernels.qk_rope import backward_ctas_per_sm
from rmsnorm_lab.cute.launch.qk_rope import compile_qk_rope, qk_rope_plan
from rmsnorm_lab.cute.plan.forward import NotEligible

CASES = [(torch.bfloat16, 128), (torch.bfloat16, 64), (torch.float16, 256), (torch.float32, 128),
         (torch.float32, 256), (torch.bfloat16, 96)]


def ptx_of(plan, arch):
    with tempfile.TemporaryDirectory() as d:
        compile_qk_rope(plan, arch, keep_ptx_dir=d)
        (path,) = glob.glob(f"{d}/*.ptx")
        return open(path).read()


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("dtype,D", CASES, ids=lambda v: str(v).replace("torch.", ""))
def test_compiles_with_wide_copies_and_shuffles_where_the_halves_are_apart(arch, dtype, D):
    plan = qk_rope_plan(D, dtype, dtype, "llama", True, arch, pdl=arch == "sm_90a")
    ptx = ptx_of(plan, arch)
    assert ".local" not in ptx
    wide = {"v4.b32", "v2.b64"}  # 16 bytes a copy (sm_100a moves fp32 as two 64-bit words)
    assert set(re.findall(r"\bld\.global\.(\S*)", ptx)) <= wide
    assert set(re.findall(r"\bst\.global\.(\S*)", ptx)) - wide == {"b32"}  # rstd
    # q's branch and k's each: a shuffle a 32-bit register of each tile's copy (two 16-bit
    # values, or one fp32), or none (fp32 rows of 256: both halves in one thread)
    words = plan.vec // (2 if dtype != torch.float32 else 1)
    shuffles = len(re.findall(r"shfl\.sync\.idx", ptx))
    assert shuffles == (0 if plan.vecs_per_thread > 1 else 2 * plan.tiles_per_cta * words)
    assert len(re.findall(r"\brsqrt\.approx", ptx)) == 2 * plan.tiles_per_cta
    # the rotation's products rounded apart from its sum, as eager torch rounds them: 16-bit
    # rows by their roundings to x's dtype (no half-precision fma), fp32 rows as mul.rn
    assert not re.search(r"\bfma\.rn\.(bf16|f16)", ptx)
    if dtype != torch.float32:  # two packed products and their sum a word
        kind = "bf16x2" if dtype == torch.bfloat16 else "f16x2"
        pairs = 2 * plan.tiles_per_cta * words * plan.vecs_per_thread  # q's branch and k's
        assert len(re.findall(rf"\bmul\.rn\.{kind}\b", ptx)) == 2 * pairs
        assert len(re.findall(rf"\badd\.rn\.{kind}\b", ptx)) == pairs
    if dtype == torch.float32:
        values = 2 * plan.tiles_per_cta * plan.vec * plan.vecs_per_thread  # q's branch and k's
        assert len(re.findall(r"\bmul\.rn\.f32\b", ptx)) == 2 * values


def test_rows_it_refuses():
    with pytest.raises(NotEligible, match="16-byte aligned"):
        qk_rope_plan(128, torch.bfloat16, torch.bfloat16, "llama", False, "sm_90a", True)
    with pytest.raises(NotEligible, match="whole 16-byte copies"):
        qk_rope_plan(72, torch.bfloat16, torch.bfloat16, "llama", True, "sm_90a", True)
    with pytest.raises(NotEligible, match="second copies"):  # 3 copies a lane: halves apart
        qk_rope_plan(768, torch.bfloat16, torch.bfloat16, "llama", True, "sm_90a", True)
    with pytest.raises(NotEligible, match="one warp's registers"):
        qk_rope_plan(8192, torch.bfloat16, torch.bfloat16, "llama", True, "sm_90a", True)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("dtype,D", CASES, ids=lambda v: str(v).replace("torch.", ""))
def test_the_backward_compiles_without_atomics_or_local_memory(arch, dtype, D):
    """16-byte loads of the rows (rstd's words aside) and stores, no local memory, no atomics
    (dW as partial rows), shuffles for the other half of ``dy * sin`` where the halves are in
    other lanes, the next tile's loads issued before this tile's math, and registers for every
    CTA of the persistent grid on an SM at once."""
    plan = qk_rope_plan(D, dtype, dtype, "llama", True, arch, pdl=arch == "sm_90a")
    with tempfile.TemporaryDirectory() as d:
        compile_qk_rope(plan, arch, keep_ptx_dir=d, backward=True)
        (path,) = glob.glob(f"{d}/*.ptx")
        ptx = open(path).read()
        report = ptxas_report(path, arch)
    wide = {"v4.b32", "v2.b64"}
    assert ".local" not in ptx and not re.search(r"\b(atom|red)\.", ptx)
    assert set(re.findall(r"\bld\.global\.(\S*)", ptx)) - wide == {"b32"}  # rstd
    assert set(re.findall(r"\bst\.global\.(\S*)", ptx)) <= wide | {"b32", "f32"}
    # one broadcast from lane 0 (the shared memory's base), then a shuffle a value of the other
    # half for q's rows and k's (the compiler may copy a loop's body: a multiple of them)
    idx = len(re.findall(r"shfl\.sync\.idx", ptx)) - 1
    if plan.vecs_per_thread > 1:
        assert idx == 0
    else:
        assert idx >= 2 * plan.vec and idx % plan.vec == 0
    # the next tile's dy, x, cos and sin are loaded before the first tile's math (its first
    # shuffle after the broadcast): the weight's copies, then two tiles' four rows of copies
    shuffles = [m.start() for m in re.finditer(r"shfl\.sync", ptx)]
    loads = re.findall(r"\bld\.global\.(?:v4\.b32|v2\.b64)", ptx[:shuffles[1]])
    assert len(loads) >= 9 * plan.vecs_per_thread
    # the persistent grid's CTAs all resident: their registers fit an SM, with no spill
    if report is not None:
        ctas = backward_ctas_per_sm(plan)
        assert report["spill_bytes"] == 0 and ctas >= 2
        assert report["registers"] * plan.threads * ctas <= 65536, report


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("dtype,D", CASES[:4], ids=lambda v: str(v).replace("torch.", ""))
def test_the_forward_loads_the_first_tiles_cos_and_sin_with_x(arch, dtype, D):
    """cos and sin of the tiles ``epilogue_ahead`` asks for go out with x and the weight, before
    the first row's reduction, so their latency overlaps x's rather than following the
    reduction; each next tile's go out after a tile's store, before that tile's reduction."""
    from rmsnorm_lab.cute.kernels.qk_rope import RMSNormQkRopeForward

    plan = qk_rope_plan(D, dtype, dtype, "llama", True, arch, pdl=arch == "sm_90a")
    ptx = ptx_of(plan, arch)
    q_branch = ptx[:ptx.index("rsqrt.approx", ptx.index("rsqrt.approx") + 1)]  # q's two tiles
    first_sum = q_branch.index("shfl.sync.bfly")
    copies = plan.vecs_per_thread  # 16-byte copies a thread a row
    ahead = min(RMSNormQkRopeForward.epilogue_ahead, plan.tiles_per_cta)
    loads = len(re.findall(r"\bld\.global\.", q_branch[:first_sum]))
    assert loads == copies * (plan.tiles_per_cta + 1 + 2 * ahead)  # x's tiles, w, tables
    if ahead < plan.tiles_per_cta:  # the next tile's tables: after the first store
        store = q_branch.index("st.global.v", first_sum)
        second_sum = q_branch.index("shfl.sync.bfly", store)
        assert len(re.findall(r"\bld\.global\.", q_branch[store:second_sum])) == 2 * copies
