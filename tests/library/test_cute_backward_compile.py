"""Every CuTe backward kernel compiles without a GPU for Hopper and Blackwell, and the code moves
data the way the lab claims: 16-byte global loads (scalar ones on the fallback), no local memory,
and ptxas -v reports no spills."""

import dataclasses
import re

import pytest
import torch

from rmsnorm_lab.cute.plan.backward import backward_uses_pdl, plan_backward
from rmsnorm_lab.cute.inspect_ptx import compile_and_inspect, waits_before_global_access

BF16, F32, F16 = torch.bfloat16, torch.float32, torch.float16
ARCHS = ["sm_90a", "sm_100a"]

# (kind, N, x dtype, w dtype, mode, aligned): every kernel, dtype and mode; weightless; a mixed
# weight dtype; the widest fused rows the register model admits, with and without the next-row
# prefetch (8192 bf16 with an fp32 weight: ~245 registers); rows too wide for that (chunked, dW
# in shared memory); a chunked dx row; and the
# vec=1 fallback for an odd width (also with a wider fp32 weight) and for unaligned tensors.
CASES = [
    ("fused", 4096, BF16, BF16, "llama", True),
    ("fused", 8192, BF16, BF16, "none", True),
    ("fused", 8192, F32, F32, "gemma", True),
    ("fused", 4096, F16, F32, "none", True),
    ("fused", 8192, BF16, F32, "llama", True),
    ("fused", 16384, BF16, None, "llama", True),
    ("fused", 16384, BF16, BF16, "llama", True),   # chunked, dW accumulated in shared memory
    ("fused", 32768, BF16, F32, "none", True),
    ("fused", 1023, BF16, BF16, "llama", True),
    ("fused", 1023, BF16, F32, "gemma", True),
    ("fused", 4096, F16, F16, "gemma", False),
    ("dx", 4096, BF16, BF16, "llama", True),
    ("dx", 32768, BF16, BF16, "none", True),
    ("dx", 8192, F16, None, "none", True),
    ("dx", 1023, F32, F32, "gemma", True),
    ("dw", 4096, BF16, BF16, "gemma", True),
    ("dw", 4096, F32, F32, "llama", True),
    ("dw", 1023, BF16, BF16, "none", True),
]


def _id(c):
    w = "now" if c[3] is None else str(c[3])[6:]
    return f"{c[0]}-{c[1]}-{str(c[2])[6:]}-{w}-{c[4]}" + ("" if c[5] else "-unaligned")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kind,N,x_dtype,w_dtype,mode,aligned", CASES, ids=[_id(c) for c in CASES])
def test_compiles_with_expected_memory_instructions(arch, kind, N, x_dtype, w_dtype, mode,
                                                    aligned):
    plan = plan_backward(kind, N, x_dtype, w_dtype, mode, aligned)
    plan = dataclasses.replace(plan, pdl=backward_uses_pdl(arch))  # as the runner launches it
    facts = compile_and_inspect(plan, arch)
    # programmatic dependent launch: one wait, ahead of every global access, and one trigger
    pdl = int(plan.pdl)
    assert (facts.grid_dependency_waits, facts.dependents_triggers) == (pdl, pdl)
    assert not pdl or waits_before_global_access(facts.ptx)
    # Column blocks per thread per tensor that can hold part of the row (the compiler drops
    # blocks that start past N in every thread: the chunked plan pads its last chunk).
    blocks = -(-N // (plan.vec * plan.threads_per_row))
    if plan.vec == 1:
        assert facts.global_loads_16B == 0 and facts.global_loads_scalar > 0
        assert facts.global_stores_16B == 0
    elif kind == "dw":
        assert facts.global_loads_16B >= 2  # x and dy, one 16-byte block each per row
    else:
        # x and dy for every column block; dx stored with 16-byte stores; the fused kernel's
        # fp32 partial dW row adds 16-byte stores of its own.
        assert facts.global_loads_16B >= 2 * blocks
        dw_stores = blocks * plan.vec * 4 // 16 if (kind == "fused" and w_dtype) else 0
        assert facts.global_stores_16B >= blocks + dw_stores
    assert facts.local_accesses == 0
    if kind != "dw":
        assert facts.shuffles >= 5  # the row reduction's warp butterfly: 16, 8, 4, 2, 1
    assert facts.barriers >= 1
    if facts.spill_bytes is None:
        pytest.skip("no ptxas new enough for this PTX; PTX-level checks passed")
    if plan.dw_smem_bytes and plan.ctas_per_sm > 1:
        # The wide fused kernel runs under a launch bound of two CTAs per SM (128 registers):
        # ptxas spills a few bytes (32 on sm_90a, 160 on sm_100a), and on the H200 that ran
        # 16384x16384 in 479.8 µs against 604.5 µs unbounded (184 registers, one CTA per SM).
        assert facts.registers <= 128
        assert facts.spill_bytes <= 256, f"{facts.spill_bytes} bytes spilled"
        return
    assert facts.spill_bytes == 0, f"{facts.spill_bytes} bytes spilled, {facts.registers} regs"
    assert facts.stack_bytes == 0


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("w_dtype", [BF16, F32], ids=["bf16", "fp32"])
def test_dw_reduce_compiles_with_unrolled_loads_and_one_rounding_store(arch, w_dtype, tmp_path):
    import glob

    from rmsnorm_lab.cute.kernels import dw_reduce
    from rmsnorm_lab.cute.launch.backward import compile_dw_reduce
    from rmsnorm_lab.cute.inspect_ptx import ptx_facts, ptxas_report

    pdl = backward_uses_pdl(arch)
    compile_dw_reduce(4096, w_dtype, arch, keep_ptx_dir=str(tmp_path), pdl=pdl)
    (path,) = glob.glob(str(tmp_path / "*.ptx"))
    ptx = open(path).read()
    facts = ptx_facts(ptx, arch)
    assert facts.grid_dependency_waits == int(pdl)
    assert not pdl or waits_before_global_access(ptx)
    # the row-lane loop unrolled: UNROLL fp32 loads a step
    assert facts.global_loads_scalar >= dw_reduce.UNROLL
    assert facts.local_accesses == 0 and facts.barriers >= 1
    report = ptxas_report(path, arch)
    if report is None:
        pytest.skip("no ptxas new enough for this PTX; PTX-level checks passed")
    assert report["spill_bytes"] == 0


@pytest.mark.parametrize("arch", ARCHS)
def test_the_pair_reduction_stores_each_half_of_its_columns_into_its_own_weight(arch, tmp_path):
    """``DwReducePair`` (the q/k-norm backward's two weights in one launch): the row-lane loop
    unrolled as the single reduction's, and two rounding stores, one into each weight's dW."""
    import glob

    from rmsnorm_lab.cute.kernels import dw_reduce
    from rmsnorm_lab.cute.launch.backward import compile_dw_reduce
    from rmsnorm_lab.cute.inspect_ptx import ptx_facts

    compile_dw_reduce(128, BF16, arch, keep_ptx_dir=str(tmp_path), pair=True)
    (path,) = glob.glob(str(tmp_path / "*.ptx"))
    ptx = open(path).read()
    facts = ptx_facts(ptx, arch)
    assert facts.global_loads_scalar >= dw_reduce.UNROLL and facts.local_accesses == 0
    assert len(re.findall(r"\bst\.global\.b16", ptx)) == 2, "one store into each weight's dW"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("pair", [False, True])
def test_the_reduction_issues_a_steps_loads_before_it_adds_any(arch, pair, tmp_path):
    """In the machine code, the row-lane loop's UNROLL loads go out together, ahead of the adds
    that wait for them: no branch between two loads (a test of each row against G would put one
    there, each load then waiting for the last)."""
    import glob

    from rmsnorm_lab.cute.kernels import dw_reduce
    from rmsnorm_lab.cute.launch.backward import compile_dw_reduce
    from rmsnorm_lab.cute.inspect_ptx import sass

    compile_dw_reduce(128 if pair else 4096, BF16, arch, keep_ptx_dir=str(tmp_path), pair=pair)
    (path,) = glob.glob(str(tmp_path / "*.ptx"))
    code = sass(path, arch)
    if code is None:
        pytest.skip("no ptxas and nvdisasm new enough for this PTX")
    marks = "".join("L" if re.search(r"\bLDG\b", line) else "A" if re.search(r"\bFADD\b", line)
                    else "|" if re.search(r"\bBRA\b", line) else "" for line in code.splitlines())
    assert "L" * dw_reduce.UNROLL + "A" in marks, marks
    assert not re.search(r"L\|", marks), f"a branch right after a load: {marks}"


# The fused residual add's backward (dh joins dx): the fused and dx kernels, every dtype, with
# and without a weight, one chunked dx row and the fallback; the wide fused kernel is refused.
DH_CASES = [
    ("fused", 4096, BF16, BF16, "llama", True),
    ("fused", 8192, F16, F16, "gemma", True),
    ("fused", 4096, F32, None, "none", True),
    ("fused", 128, BF16, BF16, "llama", True),
    ("dx", 4096, BF16, BF16, "llama", True),
    ("dx", 32768, BF16, BF16, "gemma", True),
    ("fused", 1023, BF16, BF16, "llama", True),
]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kind,N,x_dtype,w_dtype,mode,aligned", DH_CASES,
                         ids=[_id(c) for c in DH_CASES])
def test_fused_add_backward_reads_dh_and_spills_nothing(arch, kind, N, x_dtype, w_dtype, mode,
                                                       aligned):
    base = plan_backward(kind, N, x_dtype, w_dtype, mode, aligned)
    plan = plan_backward(kind, N, x_dtype, w_dtype, mode, aligned, dh=True)
    plan = dataclasses.replace(plan, pdl=backward_uses_pdl(arch))
    facts = compile_and_inspect(plan, arch)
    blocks = -(-N // (plan.vec * plan.threads_per_row))
    if plan.vec > 1:  # x, dy and dh for every column block
        assert facts.global_loads_16B >= 3 * blocks
    else:
        assert facts.global_loads_16B == 0
    assert facts.local_accesses == 0
    assert plan.dh and not base.dh and plan.chunks >= base.chunks
    if facts.spill_bytes is None:
        pytest.skip("no ptxas new enough for this PTX; PTX-level checks passed")
    assert facts.spill_bytes == 0, f"{facts.spill_bytes} bytes spilled, {facts.registers} regs"


def test_wide_fused_add_backward_is_refused_for_split():
    from rmsnorm_lab.cute.plan.backward import auto_mode
    from rmsnorm_lab.cute.plan.forward import NotEligible
    with pytest.raises(NotEligible, match="split"):
        plan_backward("fused", 16384, BF16, BF16, "llama", True, dh=True)
    assert auto_mode(16384, BF16, BF16, "llama", True, dh=True) == "staged"
    assert auto_mode(16384, BF16, BF16, "llama", True) == "staged"


# The fused plans' strips per SM rest on the register model; ptxas has the last word. Where the
# model admits the next-row prefetch it must not cost a strip (the fused add's backward at 4096).
STRIP_CASES = [(4096, BF16, False), (4096, BF16, True), (2048, BF16, True), (1024, BF16, True),
               (8192, BF16, True), (2048, F32, False)]


@pytest.mark.parametrize("N,dtype,dh", STRIP_CASES,
                         ids=[f"{n}-{str(d)[6:]}{'-dh' if h else ''}" for n, d, h in STRIP_CASES])
def test_fused_plan_strips_fit_the_registers_ptxas_gives(N, dtype, dh):
    plan = plan_backward("fused", N, dtype, dtype, "llama", True, dh=dh)
    facts = compile_and_inspect(plan, "sm_90a")
    if facts.registers is None:
        pytest.skip("no ptxas new enough for this PTX")
    per_thread = -(-facts.registers // 8) * 8  # allocated per warp in units of 8 per thread
    assert plan.ctas_per_sm * plan.threads_per_row * per_thread <= 65536, (
        f"{facts.registers} registers: {plan.ctas_per_sm} strips of {plan.threads_per_row} "
        f"threads do not fit one SM (prefetch={plan.prefetch})")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("N,x_dtype,w_dtype", [(16384, BF16, BF16), (32768, BF16, None),
                                               (16384, F32, F32)],
                         ids=["16384-bf16", "32768-bf16-noweight", "16384-fp32"])
def test_cluster_backward_exchanges_each_rows_sum_through_distributed_shared_memory(
        arch, N, x_dtype, w_dtype):
    """Two mbarriers taken in turn, one cluster barrier before the loop, one remote store per
    row: the row's slice in registers, read once (no chunks), no local memory."""
    from rmsnorm_lab.cute.plan.backward import plan_cluster_backward
    plan = plan_cluster_backward(N, x_dtype, w_dtype, "llama", True, arch=arch)
    facts = compile_and_inspect(plan, arch)
    ptx = facts.ptx
    assert ptx.count("mbarrier.init.shared") == 2 and "barrier.cluster.wait" in ptx
    assert ptx.count("st.async.shared::cluster.mbarrier::complete_tx::bytes") == 1
    assert "mbarrier.try_wait" in ptx
    assert facts.local_accesses == 0
    # x and dy of the slice, twice with the prefetch (before the loop and in it)
    assert facts.global_loads_16B >= (4 if plan.prefetch else 2) * plan.vecs_per_thread
    if facts.spill_bytes is not None:
        assert facts.spill_bytes == 0 and facts.registers * plan.threads * plan.ctas_per_sm <= 65536


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("N,x_dtype,w_dtype,dh", [(4096, BF16, BF16, False),
                                                  (16384, BF16, BF16, False),
                                                  (4096, BF16, None, False),
                                                  (4096, BF16, BF16, True)],
                         ids=["4096-bf16", "16384-bf16", "4096-bf16-noweight", "4096-bf16-add"])
def test_staged_backward_rings_rows_through_shared_memory(arch, N, x_dtype, w_dtype, dh):
    """Each row of x and dy (and the fused add's dh) arrives by cp.async (one commit group a row,
    stages - 1 of them before the loop), one wait per row, the row sum's barrier the only one;
    x, dy and dh are never loaded into registers from global memory (only w is), no local
    memory, and the registers of the plan's strips per SM."""
    from rmsnorm_lab.cute.plan.backward import plan_staged_backward
    plan = plan_staged_backward(N, x_dtype, w_dtype, "llama", True, dh=dh)
    facts = compile_and_inspect(plan, arch)
    ptx = facts.ptx
    copies = (3 if dh else 2) * plan.chunks  # x, dy (and dh), a 16-byte copy per chunk
    assert ptx.count("cp.async.cg.shared.global") == copies * plan.stages
    assert ptx.count("cp.async.commit_group") == plan.stages
    assert ptx.count("cp.async.wait_group") == 1 and ptx.count("bar.sync") == 1
    assert facts.global_loads_16B == (plan.chunks if w_dtype is not None else 0)
    assert facts.local_accesses == 0
    if facts.spill_bytes is not None:
        assert facts.spill_bytes == 0
        assert -(-facts.registers // 8) * 8 * plan.threads * plan.ctas_per_sm <= 65536



DW_CLUSTER_CASES = [(4096, BF16, BF16, "llama", False), (8192, BF16, F32, "none", False),
                    (4096, F32, F32, "gemma", False), (1024, F16, F16, "llama", False),
                    (4096, BF16, BF16, "llama", True)]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("N,x_dtype,w_dtype,mode,dh", DW_CLUSTER_CASES,
                         ids=[f"{c[0]}-{str(c[1])[6:]}-{str(c[2])[6:]}-{c[3]}"
                              + ("-add" if c[4] else "") for c in DW_CLUSTER_CASES])
def test_fused_backward_sums_its_dw_rows_across_a_cluster(arch, N, x_dtype, w_dtype, mode, dh):
    """With ``dw_cluster`` the dW row leaves a CTA as 16-byte remote stores, one a four fp32 of
    the thread's columns, counted by the owner's one mbarrier, after one cluster barrier; the
    owner's sum goes to global memory as fp32 (no 16-byte partial-row stores are left), no local
    memory, and the registers of the plan's strips per SM."""
    from rmsnorm_lab.cute.plan.backward import with_dw_cluster
    plan = with_dw_cluster(plan_backward("fused", N, x_dtype, w_dtype, mode, True, dh=dh), arch)
    assert plan.dw_cluster == 2
    facts = compile_and_inspect(plan, arch)
    ptx = facts.ptx
    pieces = plan.vecs_per_thread * plan.vec // 4
    assert ptx.count("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4") == pieces
    assert ptx.count("mbarrier.init.shared") == 1 and ptx.count("barrier.cluster.wait") == 1
    assert "mbarrier.try_wait" in ptx and facts.local_accesses == 0
    plain = compile_and_inspect(dataclasses.replace(plan, dw_cluster=1), arch)
    dx_stores = plan.vecs_per_thread  # the partial row's 16-byte stores are gone, dx's stay
    assert facts.global_stores_16B == dx_stores < plain.global_stores_16B
    if facts.spill_bytes is not None:
        assert facts.spill_bytes == 0
        assert -(-facts.registers // 8) * 8 * plan.threads * plan.ctas_per_sm <= 65536
