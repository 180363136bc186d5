"""Backward plans in plain Python: strip partitioning, eligibility, thread mappings (no GPU)."""

import pytest
import torch

from rmsnorm_lab.cute.plan.backward import (
    DW_CTAS_PER_SM, DW_MIN_ROWS_PER_GROUP, FP32_LIVE, auto_mode, dw_row_groups, fused_strips,
    MAX_FUSED_CTAS_PER_SM, plan_backward, plan_split, resident_ctas, strip_bounds,
    strip_partition, vector_width)
from rmsnorm_lab.cute.plan.forward import COPY_BYTES, NotEligible

BF16, F32, F16 = torch.bfloat16, torch.float32, torch.float16


# --- strips -----------------------------------------------------------------------------------

@pytest.mark.parametrize("M,G", [(1, 1), (1, 132), (7, 3), (131, 132), (132, 132), (133, 132),
                                 (4096, 132), (100003, 132), (100003, 1), (10, 10), (0, 4)])
def test_strips_cover_every_row_once_in_order_and_balanced(M, G):
    parts = strip_partition(M, G)
    assert len(parts) == G
    assert parts[0][0] == 0 and parts[-1][1] == M
    for (s0, e0), (s1, e1) in zip(parts, parts[1:]):
        assert e0 == s1  # contiguous, no gap, no overlap
    sizes = [e - s for s, e in parts]
    assert sum(sizes) == M
    assert max(sizes) - min(sizes) <= 1


def test_remainder_rows_go_one_each_to_the_first_strips():
    # 10 rows over 4 strips: q = 2, r = 2 -> sizes 3, 3, 2, 2
    assert strip_partition(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    # 4101 rows over 132 strips: q = 31, r = 9 -> nine strips of 32, then 31s
    assert [e - s for s, e in strip_partition(4101, 132)][:10] == [32] * 9 + [31]


def test_fewer_rows_than_strips_leaves_the_last_strips_empty():
    parts = strip_partition(3, 8)
    assert parts[:3] == [(0, 1), (1, 2), (2, 3)]
    assert all(s == e == 3 for s, e in parts[3:])


def test_strip_bounds_match_the_textbook_split_and_reject_bad_indices():
    # s * q + min(s, r) is the same split as ceil-free integer interpolation with remainders
    # front-loaded; check it against an explicit construction.
    M, G = 1000, 7
    sizes = [M // G + (1 if s < M % G else 0) for s in range(G)]
    starts = [sum(sizes[:s]) for s in range(G)]
    assert [strip_bounds(M, G, s) for s in range(G)] == [
        (starts[s], starts[s] + sizes[s]) for s in range(G)]
    with pytest.raises(ValueError):
        strip_bounds(10, 4, 4)
    with pytest.raises(ValueError):
        strip_bounds(10, 0, 0)


def test_fused_strip_count_fills_the_resident_ctas_and_never_exceeds_rows():
    plan = plan_backward("fused", 4096, BF16, BF16, "llama", True)
    assert plan.ctas_per_sm == 2
    assert fused_strips(100003, 132, plan) == 264
    assert fused_strips(100003, 132) == 132  # without a plan: one per SM
    assert fused_strips(1, 132, plan) == 1
    assert fused_strips(131, 132, plan) == 131
    assert fused_strips(4096, 132, plan, strips=64) == 64
    with pytest.raises(ValueError):
        fused_strips(10, 132, plan, strips=0)


def test_resident_ctas_follow_the_register_model():
    # 128 registers (what ptxas -v reports for the N=4096 bf16 fused kernel) x 256 threads: two
    # CTAs fill the 64K-register file; at 64 threads eight fit, capped by MAX_FUSED_CTAS_PER_SM
    assert resident_ctas(256, 88 * 4) == 2
    assert resident_ctas(128, 88 * 4) == 4
    assert resident_ctas(64, 88 * 4, most=MAX_FUSED_CTAS_PER_SM) == MAX_FUSED_CTAS_PER_SM == 8
    assert resident_ctas(32, 0) == 32  # the SM's CTA limit
    assert resident_ctas(1024, 200 * 4) == 1  # never below one
    assert plan_backward("fused", 1024, BF16, BF16, "llama", True).ctas_per_sm == 8
    assert plan_backward("fused", 8192, BF16, BF16, "llama", True).ctas_per_sm == 1


def test_dw_row_groups_fill_the_gpu_but_keep_enough_rows_per_group():
    p = plan_backward("dw", 4096, BF16, BF16, "llama", True)
    assert p.col_blocks == 16
    g = dw_row_groups(100003, p, 132)
    assert g * p.col_blocks >= 132 * DW_CTAS_PER_SM and g <= 100003 // DW_MIN_ROWS_PER_GROUP
    assert dw_row_groups(1, p, 132) == 1
    assert dw_row_groups(64, p, 132) == 2


# --- eligibility and mappings -------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["fused", "dx", "dw"])
@pytest.mark.parametrize("dtype", [BF16, F16, F32])
def test_vector_path_when_width_and_alignment_allow_else_one_element(kind, dtype):
    vec = COPY_BYTES // dtype.itemsize
    assert plan_backward(kind, 4096, dtype, dtype, "llama", True).vec == vec
    assert plan_backward(kind, 4096, dtype, dtype, "llama", False).vec == 1
    assert plan_backward(kind, 1023, dtype, dtype, "llama", True).vec == 1
    assert vector_width(4098, dtype, True) == 1


@pytest.mark.parametrize("N", [1, 7, 1023, 4096, 8192, 4097])
@pytest.mark.parametrize("dtype", [BF16, F32])
def test_fused_and_dx_plans_cover_the_row(N, dtype):
    for kind in ("fused", "dx"):
        p = plan_backward(kind, N, dtype, dtype, "gemma", True)
        assert 32 <= p.threads <= 256 and p.threads & (p.threads - 1) == 0
        if kind == "fused" and N // p.vec < 32:  # narrower than a warp: lane groups
            assert p.threads == 32 and p.threads_per_row * p.rows_per_cta == 32
            assert p.threads_per_row >= N // p.vec
        else:
            assert p.rows_per_cta == 1
        assert p.cols_per_tile * p.chunks >= N
        assert p.cols_per_tile * (p.chunks - 1) < N  # no chunk is all padding
        if kind == "fused" and p.chunks > 1:
            assert p.dw_smem_bytes <= 160 * 1024 and not p.prefetch


@pytest.mark.parametrize("N,lanes", [(64, 8), (128, 16), (256, 32), (512, 32)])
def test_fused_rows_narrower_than_a_warp_share_it_in_lane_groups(N, lanes):
    p = plan_backward("fused", N, BF16, BF16, "llama", True)
    assert p.threads_per_row == lanes and p.rows_per_cta == 32 // lanes
    assert p.cols_per_tile == N
    assert plan_backward("dx", N, BF16, BF16, "llama", True).rows_per_cta == 1


def test_one_warp_strips_share_a_cta_and_write_one_partial_row_per_cta():
    from rmsnorm_lab.cute.plan.backward import ONE_WARP_STRIPS_PER_CTA, fused_strips
    narrow = plan_backward("fused", 128, BF16, BF16, "llama", True)
    assert narrow.threads == 32 and narrow.strips_per_cta == ONE_WARP_STRIPS_PER_CTA
    assert narrow.cta_threads == 32 * ONE_WARP_STRIPS_PER_CTA
    # partial rows = CTAs: the plan's per SM, or fewer when the rows run out first
    assert fused_strips(65536, 132, narrow) == 132 * narrow.ctas_per_sm
    assert fused_strips(20, 132, narrow) == 3  # 3 CTAs give each of 24 strips a row or none
    wide = plan_backward("fused", 4096, BF16, BF16, "llama", True)
    assert wide.strips_per_cta == 1 and wide.cta_threads == wide.threads


def test_fused_refuses_rows_too_wide_for_shared_memory_and_split_serves_them():
    with pytest.raises(NotEligible, match="use split"):
        plan_backward("fused", 65536, BF16, BF16, "llama", True)
    with pytest.raises(NotEligible, match="use split"):
        plan_backward("fused", 49152, F32, F32, "llama", True)
    dx, dw = plan_split(262144, BF16, BF16, "llama", True)
    assert dx.chunks > 1 and dx.cols_per_tile * dx.chunks >= 262144
    assert dw.col_blocks * dw.cols_per_tile >= 262144


def test_fused_register_model():
    """Elements a fused thread holds, costed at x + dy + w + fp32 accumulator + fp32 live values,
    fit the registers a 256-thread CTA may use (65536/256 = 255 minus overhead)."""
    for dtype, w in ((BF16, BF16), (BF16, F32), (F32, F32), (F16, F16)):
        p = plan_backward("fused", 8192, dtype, w, "none", True)
        per_elem = 2 * dtype.itemsize + w.itemsize + 4 + FP32_LIVE
        assert p.vec * p.vecs_per_thread * per_elem <= (255 - 40) * 4


def test_dw_plan_mapping_and_refusal_without_weight():
    p = plan_backward("dw", 4096, BF16, BF16, "llama", True)
    assert (p.threads_per_row, p.rows_per_cta, p.vecs_per_thread) == (32, 8, 1)
    assert p.cols_per_tile == 256  # one warp: 32 x 16 bytes of one row
    f = plan_backward("dw", 1023, BF16, BF16, "llama", True)
    assert f.vec == 1 and f.cols_per_tile == 256 and f.col_blocks == 4
    with pytest.raises(NotEligible, match="no weight"):
        plan_backward("dw", 4096, BF16, None, "llama", True)
    assert plan_split(4096, BF16, None, "llama", True)[1] is None


def test_bad_arguments():
    with pytest.raises(ValueError, match="kind"):
        plan_backward("both", 4096, BF16, BF16, "llama", True)
    with pytest.raises(ValueError, match="casting_mode"):
        plan_backward("fused", 4096, BF16, BF16, "liger", True)
    with pytest.raises(NotEligible, match="dtype"):
        plan_backward("fused", 4096, torch.int32, None, "llama", True)
    with pytest.raises(NotEligible, match="positive"):
        plan_backward("dx", 0, BF16, None, "llama", True)


def test_auto_mode():
    assert auto_mode(4096, BF16, BF16, "llama", True) == "fused"
    assert auto_mode(1023, BF16, BF16, "llama", True) == "fused"     # fallback fused
    assert auto_mode(65536, BF16, BF16, "llama", True) == "split"  # too wide to fuse
    assert auto_mode(4096, BF16, None, "llama", True) == "split"   # nothing to fuse


def test_auto_mode_takes_a_cluster_where_the_fused_row_needs_three_chunks_or_more():
    assert plan_backward("fused", 16384, BF16, BF16, "llama", True).chunks == 2
    assert plan_backward("fused", 32768, BF16, BF16, "llama", True).chunks == 3
    assert auto_mode(16384, BF16, BF16, "llama", True, arch="sm_90a") != "cluster"
    assert auto_mode(32768, BF16, BF16, "llama", True, arch="sm_90a") == "cluster"
    assert auto_mode(65536, BF16, BF16, "llama", True, arch="sm_90a") == "cluster"
    assert auto_mode(32768, BF16, BF16, "llama", True, arch="sm_80") == "fused"
    assert auto_mode(32768, BF16, BF16, "llama", True, dh=True, arch="sm_90a") != "cluster"
    assert auto_mode(32768, BF16, None, "llama", True, arch="sm_90a") == "split"


def test_plans_for_n4096_bf16():
    """The plans quoted in the notes: 256 threads x 2 copies of 8 bf16 per row."""
    fused = plan_backward("fused", 4096, BF16, BF16, "llama", True)
    dx, dw = plan_split(4096, BF16, BF16, "llama", True)
    for p in (fused, dx):
        assert (p.vec, p.threads, p.vecs_per_thread, p.chunks) == (8, 256, 2, 1)
    assert fused.prefetch
    assert (dw.vec, dw.threads, dw.cols_per_tile, dw.col_blocks) == (8, 256, 256, 16)


def test_fused_prefetches_the_next_row_where_registers_allow():
    assert plan_backward("fused", 4096, BF16, BF16, "llama", True).prefetch
    assert plan_backward("fused", 8192, BF16, F32, "llama", True).prefetch
    assert not plan_backward("fused", 8192, F32, F32, "llama", True).prefetch
    assert not plan_backward("dx", 4096, BF16, BF16, "llama", True).prefetch


def test_rows_too_wide_for_registers_fuse_in_chunks_with_dw_in_shared_memory():
    p = plan_backward("fused", 16384, BF16, BF16, "llama", True)
    assert p.chunks == 2 and not p.prefetch
    assert p.dw_smem_bytes == p.chunks * p.cols_per_tile * 4 == 16384 * 4
    assert plan_backward("fused", 8192, BF16, BF16, "llama", True).dw_smem_bytes == 0
    assert plan_backward("fused", 16384, BF16, None, "llama", True).dw_smem_bytes == 0
    assert plan_backward("fused", 32768, BF16, BF16, "llama", True).chunks == 3
    with pytest.raises(NotEligible, match="shared memory"):
        plan_backward("fused", 65536, BF16, BF16, "llama", True)


def test_backward_pdl_on_hopper_only():
    from rmsnorm_lab.cute.plan.backward import backward_uses_pdl
    assert backward_uses_pdl("sm_90a")
    assert not backward_uses_pdl("sm_100a") and not backward_uses_pdl(None)


def test_cluster_backward_splits_rows_one_cta_cannot_hold():
    from rmsnorm_lab.cute.plan.backward import plan_cluster_backward
    with pytest.raises(NotEligible, match="fits one CTA"):
        plan_cluster_backward(8192, BF16, BF16, "llama", True)
    p = plan_cluster_backward(16384, BF16, BF16, "llama", True)
    assert (p.cluster_n, p.vecs_per_thread, p.chunks, p.kind) == (4, 2, 1, "fused")
    assert p.cols_per_tile * p.cluster_n == 16384 and p.ctas_per_sm >= 2
    assert p.prefetch  # the next row's loads overlap the exchange
    assert plan_cluster_backward(65536, BF16, BF16, "llama", True).cluster_n == 8
    with pytest.raises(NotEligible, match="cluster of 8"):
        plan_cluster_backward(131072, BF16, BF16, "llama", True)
    with pytest.raises(NotEligible, match="fused add"):
        plan_cluster_backward(16384, BF16, BF16, "llama", True, dh=True)
    with pytest.raises(NotEligible, match="16-byte"):
        plan_cluster_backward(16385, BF16, BF16, "llama", True)
    with pytest.raises(NotEligible, match="Hopper"):
        plan_cluster_backward(16384, BF16, BF16, "llama", True, arch="sm_80")


def test_staged_backward_keeps_rows_in_flight_in_shared_memory():
    from rmsnorm_lab.cute.plan.backward import plan_staged_backward
    from rmsnorm_lab.cute.plan.forward import MAX_STAGES, STAGED_SMEM_PER_SM
    p = plan_staged_backward(4096, BF16, BF16, "llama", True)
    assert (p.kind, p.threads, p.vecs_per_thread, p.chunks, p.vec) == ("fused", 256, 1, 2, 8)
    assert 2 <= p.stages <= MAX_STAGES and p.ctas_per_sm >= 2 and p.dw_smem_bytes == 0
    for N, dtype in ((4096, BF16), (8192, BF16), (16384, BF16), (4096, F32)):
        q = plan_staged_backward(N, dtype, dtype, "llama", True)
        # the rings of every strip on an SM fit its shared memory
        assert q.ctas_per_sm * q.stages * 2 * N * dtype.itemsize <= STAGED_SMEM_PER_SM
    with pytest.raises(NotEligible, match="multiple of 2048"):
        plan_staged_backward(1024, BF16, BF16, "llama", True)
    with pytest.raises(NotEligible, match="shared memory"):
        plan_staged_backward(32768, BF16, BF16, "llama", True)
    # the fused add's: a third ring, of dh
    d = plan_staged_backward(4096, BF16, BF16, "llama", True, dh=True)
    assert d.dh and d.stages >= 2 and d.ctas_per_sm * d.stages * 3 * 4096 * 2 <= STAGED_SMEM_PER_SM
    with pytest.raises(NotEligible, match="two stages of a row each of x, dy and dh"):
        plan_staged_backward(32768, BF16, BF16, "llama", True, dh=True)
    with pytest.raises(NotEligible, match="16-byte"):
        plan_staged_backward(4096, BF16, BF16, "llama", False)


def test_auto_mode_stages_the_fused_adds_rows_where_its_fused_plan_holds_no_next_row():
    def auto(N, dtype=BF16):
        return auto_mode(N, dtype, dtype, "llama", True, dh=True, arch="sm_90a")
    for N in (2048, 4096):
        assert not plan_backward("fused", N, BF16, BF16, "llama", True, dh=True).prefetch
        assert auto(N) == "staged"
    assert plan_backward("fused", 8192, BF16, BF16, "llama", True, dh=True).prefetch
    assert auto(8192) == "fused"
    assert auto(16384) == "staged"            # no fused plan: staged rather than split
    assert auto(1024) == "fused"              # too narrow for the staged copies
    assert auto_mode(4096, BF16, BF16, "llama", True) == "fused"  # no dh: the row prefetches


def test_auto_mode_stages_rows_the_fused_plan_takes_in_two_chunks():
    """Staged where the fused plan needs column chunks and two rows fit shared memory; fused where
    the row fits registers (staging measured slower there); cluster from three chunks."""
    def auto(N, dtype=BF16, **kw):
        return auto_mode(N, dtype, dtype, "llama", True, arch="sm_90a", **kw)
    assert [auto(N) for N in (2048, 4096, 8192)] == ["fused"] * 3
    assert plan_backward("fused", 12288, F32, F32, "llama", True).chunks == 2
    assert auto(16384) == auto(24576) == auto(12288, F32) == "staged"
    assert auto(16384, F32) == "fused"        # two rows of x and dy exceed shared memory
    assert auto(32768) == "cluster"
    assert auto(32768, dh=True) == "split"    # the fused add: no cluster, nor two staged rows
    assert auto_mode(16384, BF16, None, "llama", True, arch="sm_90a") == "split"



def test_fused_ctas_pair_up_to_sum_their_dw_rows_where_a_row_sits_in_registers():
    from rmsnorm_lab.cute.plan.backward import DW_CLUSTER, with_dw_cluster
    bf16 = torch.bfloat16
    for N, dtype in ((1024, bf16), (4096, bf16), (8192, bf16), (4096, torch.float32)):
        plan = plan_backward("fused", N, dtype, dtype, "llama", True)
        paired = with_dw_cluster(plan, "sm_90a")
        assert paired.dw_cluster == DW_CLUSTER == 2 and plan.dw_cluster == 1
        # the grid counts clusters, one partial row each, the same CTAs on the GPU
        assert paired.resident_grid(132) * DW_CLUSTER == plan.resident_grid(132)
        assert fused_strips(100_000, 132, paired) == plan.resident_grid(132) // DW_CLUSTER
        # a cluster needs a row for each of its CTAs before it adds a second partial row
        assert fused_strips(3, 132, paired) == 2 and fused_strips(1, 132, paired) == 1
    plan = plan_backward("fused", 4096, bf16, bf16, "llama", True)
    assert with_dw_cluster(plan, "sm_100a").dw_cluster == DW_CLUSTER
    unchanged = [with_dw_cluster(plan, None), with_dw_cluster(plan, "sm_80"),
                 with_dw_cluster(plan_backward("fused", 4096, bf16, None, "llama", True),
                                 "sm_90a"),                                  # no weight, no dW
                 with_dw_cluster(plan_backward("fused", 128, bf16, bf16, "llama", True),
                                 "sm_90a"),                                  # lane groups
                 with_dw_cluster(plan_backward("fused", 16384, bf16, bf16, "llama", True),
                                 "sm_90a"),                                  # column chunks
                 with_dw_cluster(plan_backward("fused", 4100, bf16, bf16, "llama", True),
                                 "sm_90a")]                                  # one-element copies
    assert [p.dw_cluster for p in unchanged] == [1] * len(unchanged)
    assert with_dw_cluster(None, "sm_90a") is None
