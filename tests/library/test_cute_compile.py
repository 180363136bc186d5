"""Every CuTe forward variant compiles without a GPU for Hopper and Blackwell, and the code it
produces moves data the way the lab claims: 16-byte global accesses, no local memory, no spills."""

import re

import pytest
import torch

from rmsnorm_lab.cute.inspect_ptx import compile_and_inspect, waits_before_global_access
from rmsnorm_lab.cute.plan.forward import plan_forward

BF16, F32, F16 = torch.bfloat16, torch.float32, torch.float16
ARCHS = ["sm_90a", "sm_100a"]

# (variant, N, x dtype, w dtype, mode): every variant, every dtype, every mode, weightless,
# mixed weight dtype, the widest warp row, the two-pass tile of 16 KB rows (under its launch
# bound), rows wider than the registers (one copy a chunk on Hopper, two plain chunks or
# pipelined chunks elsewhere), and pipelined chunks of very wide rows.
CASES = [
    ("row", 4096, BF16, BF16, "llama"),
    ("row", 8192, BF16, BF16, "llama"),
    ("row", 8192, F16, None, "gemma"),
    ("row", 4096, F32, F32, "gemma"),
    ("row", 32768, BF16, BF16, "llama"),
    ("row", 49152, BF16, BF16, "gemma"),
    ("row", 24576, BF16, None, "llama"),
    ("row", 65536, BF16, F32, "llama"),
    ("row", 16384, F16, F32, "gemma"),
    ("row", 262144, BF16, BF16, "none"),
    ("persistent", 4096, BF16, BF16, "llama"),
    ("persistent", 8192, F32, None, "gemma"),
    ("warp", 4096, BF16, BF16, "none"),
    ("warp", 1024, F32, F32, "llama"),
    ("warp", 128, BF16, BF16, "llama"),    # per-head rows: two rows share a warp
    ("warp", 64, BF16, F32, "gemma"),      # four rows share a warp
    ("fallback", 1023, BF16, BF16, "llama"),
    ("fallback", 65537, F32, F32, "gemma"),
    ("cluster", 32768, BF16, BF16, "llama"),  # two CTAs share a row
    ("cluster", 131072, BF16, None, "gemma"),  # eight
    ("cluster", 65536, F32, F32, "none"),
]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("variant,N,x_dtype,w_dtype,mode", CASES,
                         ids=[f"{c[0]}-{c[1]}-{str(c[2])[6:]}-{c[4]}" for c in CASES])
def test_compiles_with_expected_memory_instructions(arch, variant, N, x_dtype, w_dtype, mode):
    plan = plan_forward(variant, N, x_dtype, w_dtype, mode, store_rstd=True, aligned=True,
                        arch=arch, pdl=True)
    facts = compile_and_inspect(plan, arch)
    # programmatic dependent launch: one wait, ahead of every global access, and one trigger
    pdl = int(plan.pdl)
    assert (facts.grid_dependency_waits, facts.dependents_triggers) == (pdl, pdl)
    assert not pdl or waits_before_global_access(facts.ptx)
    if variant == "fallback":
        assert facts.global_loads_16B == 0 and facts.global_loads_scalar > 0
    else:
        # a 16-byte load and store for every column block of the CTA's part of the row
        blocks = -(-min(N, plan.cols_per_tile * plan.chunks) // (plan.vec * plan.threads_per_row))
        assert facts.global_loads_16B >= blocks
        assert facts.global_stores_16B >= blocks
    # rows wider than the registers store y evict-first: the second pass re-reads them from L2
    streaming = len(re.findall(r"\bst\.global\.cs\.", facts.ptx))
    assert (streaming > 0) == plan.stream_y, (plan.chunks, streaming)
    assert plan.stream_y == (plan.chunks > 1 and N * plan.x_dtype.itemsize > 32768)
    # x loaded with L2 priorities where y streams (not with the fused add)
    hinted = len(re.findall(r"\bld\.global\.L1::evict_(?:first|last)\.L2::cache_hint", facts.ptx))
    assert (hinted > 0) == plan.l2_hints == (plan.stream_y and not plan.residual)
    assert facts.local_accesses == 0
    # the warp-level butterfly over a row's lanes: 16, 8, 4, 2, 1 for a whole warp
    lanes = min(plan.threads_per_row, 32)
    assert facts.shuffles >= lanes.bit_length() - 1
    if plan.threads_per_row <= 32:
        assert facts.barriers == 0  # warp-per-row needs no CTA barrier
    if facts.spill_bytes is None:
        pytest.skip("no ptxas new enough for this PTX; PTX-level checks passed")
    assert facts.spill_bytes == 0, f"{facts.spill_bytes} bytes spilled, {facts.registers} regs"
    if plan.min_ctas_per_sm:  # the launch bound held: that many CTAs fit the register file
        assert facts.registers * plan.threads * plan.min_ctas_per_sm <= 65536
    assert facts.stack_bytes == 0


# The fused residual add (h = x + residual stored, then normalized): every variant, the chunked
# row (pass 2 re-reads h), narrow warp rows (a per-head row on half a warp), and the fallback.
RESIDUAL_CASES = [
    ("row", 4096, BF16, BF16, "llama"),
    ("row", 32768, BF16, BF16, "gemma"),
    ("row", 8192, F16, None, "none"),
    ("persistent", 4096, BF16, BF16, "llama"),
    ("warp", 1024, F32, F32, "llama"),
    ("warp", 256, BF16, BF16, "llama"),
    ("warp", 128, BF16, BF16, "llama"),
    ("fallback", 1023, BF16, BF16, "gemma"),
]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("variant,N,x_dtype,w_dtype,mode", RESIDUAL_CASES,
                         ids=[f"{c[0]}-{c[1]}-{str(c[2])[6:]}-{c[4]}" for c in RESIDUAL_CASES])
def test_fused_add_forward_reads_the_residual_and_stores_h(arch, variant, N, x_dtype, w_dtype,
                                                           mode):
    plan = plan_forward(variant, N, x_dtype, w_dtype, mode, store_rstd=True, aligned=True,
                        arch=arch, pdl=True, residual=True)
    assert not plan.prefetch and not plan.pipeline_chunks and not plan.min_ctas_per_sm
    facts = compile_and_inspect(plan, arch)
    if variant == "fallback":
        assert facts.global_loads_16B == 0 and facts.global_loads_scalar > 0
    else:  # x and the residual in, h and y out, 16 bytes at a time
        blocks = -(-N // (plan.vec * plan.threads_per_row))
        assert facts.global_loads_16B >= 2 * blocks
        assert facts.global_stores_16B >= 2 * blocks
    assert facts.local_accesses == 0
    if facts.spill_bytes is None:
        pytest.skip("no ptxas new enough for this PTX; PTX-level checks passed")
    assert facts.spill_bytes == 0, f"{facts.spill_bytes} bytes spilled, {facts.registers} regs"


@pytest.mark.parametrize("arch", ARCHS)
def test_cluster_sums_meet_in_distributed_shared_memory(arch):
    """The cluster variant: its CTAs start together (a cluster barrier before any remote
    store), each sends its sum to every peer with one asynchronous remote store counted by the
    peer's mbarrier (two, taken in turn), and waits on its own; the row is read once (no column
    chunks), with the next row's slice in flight: two CTAs an SM in registers, no spill."""
    plan = plan_forward("cluster", 65536, BF16, BF16, "llama", store_rstd=True, aligned=True,
                        arch=arch)
    assert (plan.cluster_n, plan.chunks, plan.ctas_per_sm) == (8, 1, 2)
    facts = compile_and_inspect(plan, arch)
    ptx = facts.ptx
    assert ptx.count("mbarrier.init.shared") == 2
    assert "barrier.cluster.wait" in ptx and "fence.mbarrier_init" in ptx
    # w, then x's slice before the loop and in it
    assert facts.global_loads_16B >= 3 * plan.vecs_per_thread and facts.local_accesses == 0
    if facts.spill_bytes is not None:
        assert facts.spill_bytes == 0
        assert -(-facts.registers // 8) * 8 * plan.threads * plan.ctas_per_sm <= 65536
    assert ptx.count("st.async.shared::cluster.mbarrier::complete_tx::bytes") == 1
    assert "mbarrier.try_wait" in ptx
    assert ptx.index("barrier.cluster.wait") < ptx.index("st.async")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("N,dtype,w_dtype", [(32768, BF16, BF16), (49152, BF16, None)],
                         ids=["32768-bf16", "49152-bf16-noweight"])
def test_staged_rows_go_to_shared_memory_by_cp_async(arch, N, dtype, w_dtype):
    """The staged variant: every 16-byte copy of x is a cp.async into the ring, one commit
    group a row (the prologue's stages - 1 rows, then one a row in the loop) and one wait in the
    loop; x is never loaded into registers from global memory (only w is, once), the row sum is
    the kernel's one barrier, and ptxas keeps w within the registers the plan's CTAs per SM
    leave."""
    plan = plan_forward("staged", N, dtype, w_dtype, "llama", store_rstd=True, aligned=True,
                        arch=arch)
    assert plan.vecs_per_thread == 1 and plan.chunks * plan.threads * plan.vec == N
    facts = compile_and_inspect(plan, arch)
    ptx = facts.ptx
    assert ptx.count("cp.async.cg.shared.global") == plan.chunks * plan.stages
    assert ptx.count("cp.async.commit_group") == plan.stages
    assert ptx.count("cp.async.wait_group") == 1
    assert facts.global_loads_16B == (plan.chunks if w_dtype is not None else 0)  # w only
    assert facts.global_stores_16B == plan.chunks and ptx.count("bar.sync") == 1
    assert facts.local_accesses == 0
    if facts.spill_bytes is not None:
        assert facts.spill_bytes == 0
        assert facts.registers <= 65536 // (plan.threads * plan.ctas_per_sm)



def test_reading_the_ptx_leaves_no_file_open():
    """The notebooks run with warnings shown: compiling and inspecting must not leak a file."""
    import gc
    import warnings

    plan = plan_forward("row", 4096, BF16, BF16, "llama", False, True, arch="sm_90a")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ResourceWarning)
        compile_and_inspect(plan, "sm_90a")
        gc.collect()
    assert not [w for w in seen if issubclass(w.category, ResourceWarning)]


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("plan_arch", [None, "sm_90a"])
def test_chunked_second_pass_rereads_all_but_the_last_chunk(residual, plan_arch):
    """32768 bf16, no weight: two column chunks of 8 copies a thread (any target; and Hopper's
    with the fused add), or four of one copy (Hopper's wide tile). The first pass loads every
    chunk (and the residual's, with the fused add), the second re-reads all but the last (x, or
    the h the first pass stored); the last is still in registers."""
    plan = plan_forward("row", 32768, BF16, None, "llama", store_rstd=True, aligned=True,
                        arch=plan_arch, residual=residual)
    wide = plan_arch == "sm_90a" and not residual
    assert (plan.chunks, plan.vecs_per_thread) == ((4, 1) if wide else (2, 8))
    assert plan.chunks > 1  # the second pass keeps the last chunk in registers
    facts = compile_and_inspect(plan, "sm_90a")
    first_pass = plan.chunks * plan.vecs_per_thread * (2 if residual else 1)
    assert facts.global_loads_16B == first_pass + (plan.chunks - 1) * plan.vecs_per_thread


@pytest.mark.parametrize("residual", [False, True])
def test_short_rows_issue_every_tiles_loads_before_reducing(residual):
    """Per-head rows (128 bf16, one copy a lane): a CTA owns SHORT_ROW_TILES tiles, and the 16-byte
    loads of all of them (x, and the residual) come before the first shuffle of a reduction."""
    from rmsnorm_lab.cute.plan.forward import SHORT_ROW_TILES
    plan = plan_forward("warp", 128, BF16, BF16, "llama", store_rstd=True, aligned=True,
                        arch="sm_90a", residual=residual)
    assert plan.tiles_per_cta == SHORT_ROW_TILES > 1
    assert plan.grid(132).of(1000) == -(-1000 // (plan.rows_per_cta * plan.tiles_per_cta))
    facts = compile_and_inspect(plan, "sm_90a")
    body = facts.ptx[:facts.ptx.index("shfl.sync")]
    loads = len(re.findall(r"ld\.global[.\w]*\.v4", body))
    assert loads >= plan.tiles_per_cta * (2 if residual else 1)
    assert facts.local_accesses == 0 and not facts.spill_bytes


def test_each_forward_variant_names_the_kernel_class_its_plans_compile_to():
    """The registry line of a forward variant names its kernel class (``Variant.kernel``), which
    the launch builds from a plan of that variant."""
    from rmsnorm_lab.cute.launch.forward import kernel_object
    from rmsnorm_lab.registry import VARIANTS
    widths = {"cluster": 32768, "staged": 32768, "fallback": 1023}
    for v in VARIANTS:
        if v.backend == "cute" and v.op == "fwd":
            p = plan_forward(v.name, widths.get(v.name, 4096), BF16, BF16, "llama", False, True,
                             arch="sm_90a")
            assert type(kernel_object(p)).__name__ == v.kernel.rsplit(".", 1)[1], v.name
