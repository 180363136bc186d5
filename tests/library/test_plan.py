"""Eligibility rules and thread mappings of the CuTe forward plans (plain Python, no GPU)."""

import pytest
import torch

from rmsnorm_lab.cute.plan.auto import auto_variant
from rmsnorm_lab.cute.plan.forward import (COPY_BYTES, NotEligible, RowsRule, elems_in_registers,
                                           pipelines, plan_forward, uses_pdl)

BF16, F32, F16 = torch.bfloat16, torch.float32, torch.float16


def plan(variant, N, dtype=BF16, w=BF16, aligned=True, arch="sm_90a"):
    return plan_forward(variant, N, dtype, w, "llama", True, aligned, arch=arch)


@pytest.mark.parametrize("variant", ["row", "persistent", "warp"])
def test_vector_variants_refuse_widths_off_the_vector(variant):
    with pytest.raises(NotEligible, match="multiple of the vector width 8"):
        plan(variant, 1023)
    with pytest.raises(NotEligible, match="multiple of the vector width 4"):
        plan(variant, 1022, F32, F32)


@pytest.mark.parametrize("variant", ["row", "persistent", "warp"])
def test_vector_variants_refuse_unaligned(variant):
    with pytest.raises(NotEligible, match="aligned"):
        plan(variant, 4096, aligned=False)


@pytest.mark.parametrize("N", [1, 7, 1023, 4097, 65537])
def test_fallback_serves_any_width_and_alignment(N):
    p = plan("fallback", N, aligned=False)
    assert p.vec == 1
    assert p.cols_per_tile * p.chunks >= N


@pytest.mark.parametrize("dtype", [BF16, F16, F32])
@pytest.mark.parametrize("N", [8, 1024, 4096, 8192, 16384, 65536, 262144])
def test_row_plan_covers_the_row_with_16_byte_copies(dtype, N):
    p = plan("row", N, dtype, dtype)
    assert p.vec * torch.tensor([], dtype=dtype).element_size() == COPY_BYTES
    assert p.cols_per_tile * p.chunks >= N
    # no chunk is entirely padding, and the thread count is a power of two within a CTA
    assert p.cols_per_tile * (p.chunks - 1) < N
    assert 32 <= p.threads <= 1024 and p.threads & (p.threads - 1) == 0
    # registers: x and w elements per thread within the model's budget
    per_thread = p.vec * p.vecs_per_thread
    assert per_thread <= elems_in_registers(p.threads, dtype.itemsize, dtype.itemsize)


def test_wide_rows_stream_in_chunks_and_narrow_rows_do_not():
    assert plan("row", 4096).chunks == 1
    assert plan("row", 16384).chunks == 1
    assert plan("row", 262144).chunks > 1


@pytest.mark.parametrize("N,dtype,w", [(8192, BF16, BF16), (8192, F16, None), (4096, F32, F32),
                                        (8192, BF16, F16)])
def test_rows_of_16_kb_take_the_two_pass_tile(N, dtype, w):
    p = plan("row", N, dtype, w)
    assert (p.threads_per_row, p.vecs_per_thread, p.chunks) == (512, 1, 2)
    assert p.min_ctas_per_sm == 4 and p.pipeline_chunks


def test_the_two_pass_tile_only_where_it_fits_32_registers_on_hopper_row_kernels():
    one_pass = dict(threads_per_row=256, vecs_per_thread=4, chunks=1, min_ctas_per_sm=0)
    for p in (plan("row", 8192, BF16, F32),  # a wider weight spilled under the bound
              plan_forward("row", 8192, BF16, BF16, "none", True, True, arch="sm_90a"),  # so did
              plan("persistent", 8192),                                          # mode none
              plan("row", 8192, arch="sm_100a"),  # spilled there; not measured on Blackwell
              plan("row", 8192, arch=None)):
        assert {k: getattr(p, k) for k in one_pass} == one_pass
    assert plan("row", 4096).min_ctas_per_sm == 0 and plan("row", 16384).min_ctas_per_sm == 0


def test_chunks_pipeline_except_two_chunks_of_a_full_register_budget():
    assert not pipelines(1, 8)
    assert not pipelines(2, 8)  # 4096x32768: 200 registers, one CTA per SM
    assert pipelines(2, 1) and pipelines(4, 8) and pipelines(16, 8)
    # without the wide tile (not Hopper): 256 threads x 2 chunks of 8 copies at 32768 bf16
    assert not plan("row", 32768, arch=None).pipeline_chunks
    assert plan("row", 65536, arch=None).pipeline_chunks


def test_rows_wider_than_the_registers_take_a_copy_a_chunk_at_64_warps_an_sm_on_hopper():
    from rmsnorm_lab.cute.plan.forward import WIDE_CTAS_PER_SM, WIDE_THREADS
    for N, chunks in ((24576, 3), (32768, 4), (49152, 6), (65536, 8), (20480, 3)):
        p = plan("row", N)
        assert (p.threads, p.vecs_per_thread, p.chunks) == (WIDE_THREADS, 1, chunks)
        assert p.min_ctas_per_sm == WIDE_CTAS_PER_SM and WIDE_THREADS * WIDE_CTAS_PER_SM == 2048
        assert p.pipeline_chunks and p.stream_y and p.l2_hints
    assert plan("row", 16384).chunks == 1                       # fits the registers
    t = plan("row", 8192)                                       # the 16 KB two-pass tile
    assert t.chunks == 2 and t.min_ctas_per_sm and not t.stream_y and not t.l2_hints
    # not where ptxas spills under the bound, nor unmeasured: the usual chunked row
    for p in (plan("row", 32768, w=F32), plan_forward("row", 32768, BF16, BF16, "none", True,
                                                      True, arch="sm_90a"),
              plan("row", 32768, arch="sm_100a"),
              plan_forward("row", 32768, BF16, BF16, "llama", True, True, arch="sm_90a",
                           residual=True)):
        assert (p.threads, p.chunks, p.min_ctas_per_sm) == (256, 2, 0) and p.stream_y
        assert p.l2_hints == (not p.residual)


def test_warp_plan_is_one_warp_per_row_and_refuses_rows_too_wide_for_registers():
    p = plan("warp", 4096)
    assert p.threads_per_row == 32 and p.rows_per_cta > 1 and p.chunks == 1
    with pytest.raises(NotEligible, match="warp-per-row"):
        plan("warp", 16384)


def test_persistent_grid_is_bounded_by_sms_and_rows():
    p = plan("persistent", 4096)
    assert p.grid(132).of(10) == 10
    g = p.grid(132).of(65536)
    assert 132 <= g <= 132 * 2048 // p.threads
    assert plan("row", 4096).grid(132).of(65536) == 65536
    w = plan("warp", 1024)
    assert w.grid(132).of(9) == -(-9 // w.rows_per_cta)


def test_auto_falls_back_for_unaligned_or_odd_widths():
    assert auto_variant(1023, True, BF16, 16384) == "fallback"
    assert auto_variant(4096, False, BF16, 16384) == "fallback"
    assert auto_variant(4096, False, BF16, 1024) == "fallback"
    assert auto_variant(4096, True, BF16, 16384) == "row"
    assert auto_variant(1024, True, BF16, 16384) == "warp"
    assert auto_variant(1024, True, F32, 16384) == "row"  # 4 KB rows


def test_auto_takes_the_chunked_row_for_wide_rows_never_a_cluster_nor_staged():
    for N in (1024, 4096, 16384, 32768, 49152, 65536, 131072):
        for M in (1, 4096, 65536):
            assert auto_variant(N, True, BF16, M) not in ("cluster", "staged")
    for N, dtype in ((32768, BF16), (49152, BF16), (65536, BF16), (24576, F32)):
        assert auto_variant(N, True, dtype, 4096) == "row"
    assert auto_variant(65536, False, BF16, 16384) == "fallback"


def test_auto_variant_fp8_output_takes_the_row_tile_where_it_fills_a_warp():
    """fp8 output from 2 KB rows on (FP8_ROW_MIN_BYTES): the row variant's one-row CTA of the
    fp8 epilogue's copies a thread; narrower rows, and the fused add, keep warp-per-row."""
    for quant in ("static", "token"):
        assert auto_variant(1024, True, BF16, 16384, quant=quant) == "row"
        assert auto_variant(512, True, F32, 16384, quant=quant) == "row"
        assert auto_variant(512, True, BF16, 16384, quant=quant) == "warp"
        assert auto_variant(128, True, BF16, 65536, quant=quant) == "warp"
        assert auto_variant(1024, True, BF16, 16384, residual=True, quant=quant) == "warp"
    plan = plan_forward("row", 1024, BF16, BF16, "llama", False, True, arch="sm_90a",
                        quant="static", offset=False)
    assert (plan.threads_per_row, plan.vecs_per_thread, plan.rows_per_cta) == (32, 4, 1)


def test_auto_variant_fused_add_keeps_warp_per_row_at_few_rows():
    assert auto_variant(4096, True, BF16, 1024, residual=True) == "row"
    assert auto_variant(65536, True, BF16, 4096, residual=True) == "row"
    assert auto_variant(128, True, BF16, 65536, residual=True) == "warp"
    assert auto_variant(1024, True, BF16, 1024, residual=True) == "warp"


def test_staged_rows_are_wide_rows_ringed_through_shared_memory():
    from rmsnorm_lab.cute.plan.forward import STAGED_SMEM_PER_SM
    p = plan("staged", 32768)
    assert (p.threads, p.vecs_per_thread, p.chunks, p.vec) == (256, 1, 16, 8)
    assert (p.ctas_per_sm, p.stages) == (1, 3)
    assert p.persistent and p.grid(132).of(5) == 5         # never more CTAs than rows
    assert p.grid(132).of(16384) == 132 * p.ctas_per_sm    # one resident wave
    for N, dtype in ((24576, BF16), (32768, BF16), (49152, BF16), (16384, F32)):
        q = plan("staged", N, dtype)
        # every CTA's ring fits the SM's shared memory, two rows at least
        assert q.stages >= 2 and q.ctas_per_sm * q.stages * N * dtype.itemsize \
            <= STAGED_SMEM_PER_SM
    with pytest.raises(NotEligible, match="fits one CTA"):
        plan("staged", 4096)
    with pytest.raises(NotEligible, match="multiple of 256"):
        plan("staged", 32768 + 8)
    with pytest.raises(NotEligible, match="shared memory"):
        plan("staged", 65536)  # two 128 KB rows
    with pytest.raises(NotEligible, match="fused add"):
        plan_forward("staged", 32768, BF16, BF16, "llama", True, True, residual=True)


def test_a_cluster_grid_holds_as_many_clusters_as_the_sms_hold_ctas():
    c = plan("cluster", 32768)
    assert (c.cluster_n, c.ctas_per_sm) == (4, 2)
    # CLUSTER_GRID_WAVES nominal waves of clusters, each walking a strip of rows
    assert c.grid(132).of(16384) == 8 * (132 * 2 // 4)
    assert c.grid(132).of(3) == 3                 # never more clusters than rows
    # the grid is one rule of M, which the native node evaluates too
    assert c.grid_cap(132) == 528 and c.grid(132) == RowsRule(c.rows_per_cta, 528)
    p = plan("persistent", 4096)
    assert plan("row", 4096).grid_cap(132) == 0 and p.grid_cap(132) == 132 * p.ctas_per_sm


def test_auto_takes_the_few_rows_tiles_for_few_rows():
    from rmsnorm_lab.cute.plan.auto import (AUTO_FEW_ROWS_MAX as most, AUTO_FEWEST_ROWS_MAX as fewest,
                                       row_class)
    from rmsnorm_lab.cute.plan.forward import FEW_ROWS_COPIES_PER_THREAD
    assert [row_class(m) for m in (1, fewest, fewest + 1, most, most + 1, 65536)] == \
        [2, 2, 1, 1, 0, 0]
    for n in (1024, 4096, 8192, 32768):
        for m in (1, fewest + 1, most):
            assert auto_variant(n, True, BF16, m) == "row"
    assert auto_variant(4096, True, BF16, most + 1) == "row"
    assert auto_variant(1024, True, BF16, most + 1) == "warp"

    def few(N, rows, dtype=BF16, **kw):
        return plan_forward("row", N, dtype, dtype, "llama", False, True, arch="sm_90a",
                            pdl=True, row_class=rows, **kw)
    # class 1: FEW_ROWS_COPIES_PER_THREAD copies a thread; class 2: the usual tile (2 copies,
    # as many as 256 threads allow); one row a CTA, PDL at every CTA size
    for N, threads, usual in ((1024, 32, 64), (2048, 64, 128), (4096, 128, 256),
                              (8192, 256, 256), (16384, 256, 256)):
        for rows, want in ((1, threads), (2, usual)):
            p = few(N, rows)
            assert (p.threads, p.rows_per_cta, p.chunks, p.pdl) == (want, 1, 1, True)
            assert p.threads * p.vecs_per_thread * p.vec == N
        assert few(N, 1).vecs_per_thread == max(FEW_ROWS_COPIES_PER_THREAD, N // 8 // 256)
    assert few(1024, 1, F32).threads == 64
    # rows wider than the registers and the fused add keep their tiles
    for rows in (1, 2):
        assert few(32768, rows) == plan_forward("row", 32768, BF16, BF16, "llama", False, True,
                                                arch="sm_90a", pdl=True)
        assert few(4096, rows, residual=True).threads == 256


def test_auto_launch_follows_the_row_count():
    """The launch cache sees M only through auto's rule: a few-rows call and a many-rows call of
    the same width get different plans, two many-rows calls share one."""
    from rmsnorm_lab.cute.launch.forward import forward_launch
    from rmsnorm_lab.cute.plan.auto import AUTO_FEW_ROWS_MAX as most
    from rmsnorm_lab.settings import settings
    w = torch.randn(4096, dtype=BF16)
    auto = settings.snapshot()._replace(forward_variant="auto", pdl=True)
    few = forward_launch(torch.randn(most, 4096, dtype=BF16), w, "llama", False, auto, 132)
    many = forward_launch(torch.randn(most + 1, 4096, dtype=BF16), w, "llama", False, auto, 132)
    assert few.plan.variant == many.plan.variant == "row"
    assert few.plan.threads < many.plan.threads
    assert forward_launch(torch.randn(9000, 4096, dtype=BF16), w, "llama", False, auto,
                          132) is many
    row = forward_launch(torch.randn(8, 4096, dtype=BF16), w, "llama", False,
                         auto._replace(forward_variant="row"), 132)
    assert row.plan.variant == "row"


def test_unknown_variant_is_a_value_error():
    with pytest.raises(ValueError, match="variant"):
        plan("blocked", 4096)


def test_int32_addressing_limit_is_enforced_with_a_way_out():
    from rmsnorm_lab.cute.plan.forward import check_int32_addressable
    check_int32_addressable(M=2**31 // 4096 - 1, row_stride=4096, N=4096)
    with pytest.raises(ValueError, match="backend='triton'"):
        check_int32_addressable(M=2**31 // 4096, row_stride=4096, N=4096)
    with pytest.raises(ValueError, match="2\\^31"):
        check_int32_addressable(M=2**20, row_stride=2**12, N=8)  # a strided view counts its span


def test_pdl_only_where_measured_to_pay_and_only_when_asked():
    def pdl(variant, N, arch="sm_90a", asked=True):
        return plan_forward(variant, N, BF16, BF16, "llama", False, True, arch=arch,
                            pdl=asked).pdl
    assert pdl("row", 4096) and pdl("row", 2048) and pdl("row", 8192)
    assert not pdl("warp", 1024)                   # lost in the forward sweep
    assert not pdl("row", 4096, asked=False)       # settings.pdl off
    assert not pdl("persistent", 4096)             # lost on the persistent grid
    assert not pdl("row", 1024)                    # 64-thread CTAs lost at many rows
    assert not pdl("fallback", 4096)               # not measured
    assert not pdl("row", 4096, arch="sm_100a")    # not measured on Blackwell
    assert not pdl("row", 4096, arch=None)         # target unknown
    assert uses_pdl("row", 128, "sm_90a") and not uses_pdl("row", 64, "sm_90a")
    assert uses_pdl("row", 32, "sm_90a", few_rows=True)  # auto at few rows
    assert not uses_pdl("row", 128, "sm_100a", few_rows=True)
    assert uses_pdl("warp", 128, "sm_90a", tiles_per_cta=2)  # short rows' tile groups
    assert not uses_pdl("warp", 256, "sm_90a") and not uses_pdl("warp", 128, "sm_100a",
                                                                  tiles_per_cta=2)


def test_compile_target_for_every_architecture_torch_reports():
    """The architecture-specific ``a`` target from Hopper on (where PDL, clusters and TMA live),
    the plain one before: sm_80 and sm_89 have no ``a`` variant."""
    from rmsnorm_lab.cute.launch.compile import arch_name
    assert [arch_name(*cc) for cc in ((8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (10, 3), (12, 0))] \
        == ["sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "sm_103a", "sm_120a"]


def test_y_streams_past_l2_only_for_rows_wider_than_the_registers():
    wide = plan_forward("row", 32768, BF16, BF16, "llama", False, True, arch="sm_90a")
    assert wide.chunks > 1 and wide.stream_y
    tile = plan_forward("row", 8192, BF16, BF16, "llama", False, True, arch="sm_90a")
    assert tile.chunks == 2 and tile.min_ctas_per_sm and not tile.stream_y  # the two-pass tile
    assert not plan_forward("row", 4096, BF16, BF16, "llama", False, True, arch="sm_90a").stream_y


def test_short_rows_take_several_tiles_a_cta_and_longer_rows_one():
    """Rows of one copy a lane (per-head widths) take SHORT_ROW_TILES tiles in CTAs of
    SHORT_ROW_THREADS, and the grid counts CTAs of all their rows; four copies a lane keep one."""
    from rmsnorm_lab.cute.plan.forward import SHORT_ROW_THREADS, SHORT_ROW_TILES
    for N, dtype in ((64, BF16), (128, BF16), (256, BF16), (128, F32)):
        p = plan("warp", N, dtype)
        assert (p.vecs_per_thread, p.threads, p.tiles_per_cta) == \
            (1, SHORT_ROW_THREADS, SHORT_ROW_TILES)
        assert p.cta_rows == p.rows_per_cta * SHORT_ROW_TILES
        assert p.grid(132).of(65536) == 65536 // p.cta_rows
        assert p.grid(132).of(p.cta_rows + 1) == 2
        assert not p.pdl  # plan() does not ask for PDL
    long_rows = plan("warp", 1024)
    assert (long_rows.vecs_per_thread, long_rows.tiles_per_cta) == (4, 1)
    assert plan_forward("warp", 128, BF16, BF16, "llama", True, True, arch="sm_90a",
                        pdl=True).pdl
