"""CuTe DSL RMSNorm fused backward over a thread-block cluster: rows too wide for one CTA's
registers, each row's columns split over the CTAs of a cluster (``plan.cluster_n``), the row's
sum exchanged through distributed shared memory. The math, the copies and the naming are the
fused kernel's (backward.py)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32
from cutlass.memory import SmemAllocator

from .backward import RMSNormBackward
from .backward_plan import BackwardPlan
from .forward import f32_bits
from .reduce import SLOTS, row_sum


class RMSNormClusterBackward(RMSNormBackward):
    """The fused backward of a row too wide for one CTA (``plan.cluster_n`` > 1): cluster s walks
    strip s of the rows, CTA ``rank`` of the cluster holding columns ``[rank * cols_per_tile,
    (rank + 1) * cols_per_tile)``: its slice of w and of the fp32 dW accumulator stay in
    registers for the whole strip. Per row each CTA reduces its part of ``sum(m * x_hat)`` and
    sends it to every peer (``st.async`` into the peer's slot ``rank``, counted by the peer's
    mbarrier); the row's total is then in every CTA. Two slot sets and two mbarriers, taken in
    turn: a peer writes a set again only two rows later, after this CTA's next send, which its
    threads make only once every one of them has read the set (the row sum's barrier lies
    between). At the end each CTA writes its slice of the strip's partial dW row."""

    def __init__(self, plan: BackwardPlan):
        assert plan.kind == "fused" and plan.cluster_n > 1 and plan.chunks == 1 and not plan.dh
        super().__init__(plan)

    def launch(self, gDy, gX, gW, gRstd, gDx, gDwP, gDh, grid, offset, stream):
        """Host side: ``grid`` is the strips (one cluster each)."""
        p = self.plan
        mDy, mX, mW, mRstd, mDx, mDwP, _ = self.tensors(gDy, gX, gW, gRstd, gDx, gDwP, None,
                                                        grid)
        smem_bytes = 16 + (SLOTS * self.warps_per_row + 2 * p.cluster_n) * 4 + 16
        self.kernel(mDy, mX, mW, mRstd, mDx, mDwP, offset, None).launch(
            grid=[grid * p.cluster_n, 1, 1], block=[p.threads, 1, 1],
            cluster=[p.cluster_n, 1, 1], smem=smem_bytes, stream=stream)

    @cute.kernel
    def kernel(self, mDy: cute.Tensor, mX: cute.Tensor, mW: cute.Tensor, mRstd: cute.Tensor,
               mDx: cute.Tensor, mDwP: cute.Tensor, offset: Float32, mDh: cute.Tensor):
        p = self.plan
        cn = p.cluster_n
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        rank = cute.arch.block_idx_in_cluster()
        strip = bidx // cn
        n_strips = gdim // cn
        M = mX.shape[0]
        warp = tidx // 32
        lane = tidx % 32

        smem = SmemAllocator()
        mbar = smem.allocate_array(cutlass.Int64, num_elems=2)
        sBuf = smem.allocate_tensor(Float32, cute.make_layout((SLOTS, 1, self.warps_per_row)),
                                    byte_alignment=4)
        sSums = smem.allocate_tensor(Float32, cute.make_layout((2, cn), stride=(cn, 1)),
                                     byte_alignment=4)
        if tidx == 0:  # each: one local arrival and cn remote words per use
            cute.arch.mbarrier_init(mbar, 1)
            cute.arch.mbarrier_init(mbar + 1, 1)
            cute.arch.mbarrier_init_fence()
        cute.arch.cluster_arrive_relaxed()  # waited for before the first remote store

        tiler = (1, p.cols_per_tile)
        tiled_x = self.make_tiled_copy(tiler)
        thr_x = tiled_x.get_slice(tidx)
        tXcX = thr_x.partition_S(cute.local_tile(cute.make_identity_tensor(mX.shape), tiler,
                                                 (0, 0)))
        pred = self.column_predicate(tXcX, rank)  # this CTA's slice is its chunk `rank`
        tXrX = cute.make_fragment_like(thr_x.partition_S(cute.local_tile(mX, tiler, (0, 0))))
        tXrDy = cute.make_fragment_like(tXrX)
        tXrDx = cute.make_fragment_like(tXrX)

        tWrW = None
        tXrDw = None
        if cutlass.const_expr(self.w_type is not None):
            tWrW = self.load_weight(mW, tiler, thr_x, tXcX, rank)
            tXrDw = cute.make_fragment_like(tXrX, Float32)
            tXrDw.fill(0.0)

        # this strip's rows, as backward_plan.strip_bounds splits them
        q = M // n_strips
        r = M % n_strips
        row_start = strip * q + cutlass.min(strip, r)
        row_end = (strip + 1) * q + cutlass.min(strip + 1, r)

        # Prefetch: the next row's x, dy and rstd load into a second set of registers while
        # this row waits for its peers' sums, so the exchange's latency overlaps a row's loads.
        tXrXn = None
        tXrDyn = None
        rstd_n = Float32(0.0)
        if cutlass.const_expr(p.prefetch):
            tXrXn = cute.make_fragment_like(tXrX)
            tXrDyn = cute.make_fragment_like(tXrX)
            self.load_slice(tiled_x, thr_x, mX, mDy, tiler, row_start, rank, tXcX, tXrXn,
                            tXrDyn, row_start < row_end)
            rstd_n = mRstd[cutlass.min(row_start, M - 1)]
        cute.arch.cluster_wait()

        for row in cutlass.range(row_start, row_end):
            step = row - row_start
            slot = step % 2            # the slot set and mbarrier of this row
            phase = (step // 2) % 2    # their phase: each is used every other row
            rstd = rstd_n
            if cutlass.const_expr(p.prefetch):
                tXrX.store(tXrXn.load())
                tXrDy.store(tXrDyn.load())
                self.load_slice(tiled_x, thr_x, mX, mDy, tiler, row + 1, rank, tXcX, tXrXn,
                                tXrDyn, row + 1 < row_end)
                rstd_n = mRstd[cutlass.min(row + 1, M - 1)]
            else:
                self.load_slice(tiled_x, thr_x, mX, mDy, tiler, row, rank, tXcX, tXrX, tXrDy)
                rstd = mRstd[row]
            x_hat = tXrX.load().to(Float32) * rstd
            dyf = tXrDy.load().to(Float32)
            m = self.m_of(dyf, tWrW, offset)
            part = row_sum((m * x_hat).reduce(cute.ReductionOp.ADD, Float32(0.0),
                                              reduction_profile=0),
                           sBuf, slot, 0, warp, lane, self.warps_per_row)
            if tidx == 0:
                cute.arch.mbarrier_arrive_and_expect_tx(mbar + slot, cn * 4)
            if tidx < cn:  # thread j sends this CTA's part to CTA j, in its slot `rank`
                cute.arch.store_async_dsmem(sSums.iterator + slot * cn + rank, f32_bits(part),
                                            mbar + slot, tidx)
            cute.arch.mbarrier_wait(mbar + slot, phase)
            total = Float32(0.0)
            for j in cutlass.range_constexpr(cn):
                total = total + sSums[slot, j]
            dx = rstd * (m - x_hat * (total / Float32(p.N)))
            tXrDx.store(dx.to(self.x_type))
            cute.copy(tiled_x, tXrDx,
                      thr_x.partition_D(cute.local_tile(mDx, tiler, (row, rank))), pred=pred)
            if cutlass.const_expr(tXrDw is not None):
                tXrDw.store(tXrDw.load() + dyf * self.x_hat_for_dw(x_hat))

        if cutlass.const_expr(tXrDw is not None):
            # this CTA's slice of the strip's partial dW row (an empty strip writes its zeros)
            tXgDwP = thr_x.partition_D(cute.local_tile(mDwP, tiler, (strip, rank)))
            for k in cutlass.range_constexpr(p.vecs_per_thread):
                if pred[k, 0, 0]:
                    cute.autovec_copy(tXrDw[(None, k), None, None], tXgDwP[(None, k), None, None])

    @cute.jit
    def load_slice(self, tiled_x, thr_x, mX, mDy, tiler, row, rank, tXcX, tXrX, tXrDy,
                   row_ok=None):
        """Registers <- this CTA's slice (chunk ``rank``) of x and dy in ``row``; zeros where
        predicated off (padding columns, a row past the strip's end)."""
        pred = self.column_predicate(tXcX, rank, row_ok)
        tXrX.fill(0)
        tXrDy.fill(0)
        cute.copy(tiled_x, thr_x.partition_S(cute.local_tile(mX, tiler, (row, rank))), tXrX,
                  pred=pred)
        cute.copy(tiled_x, thr_x.partition_S(cute.local_tile(mDy, tiler, (row, rank))), tXrDy,
                  pred=pred)
