"""CuTe DSL RMSNorm fused backward over a thread-block cluster: rows too wide for one CTA's
registers, each row's columns split over the CTAs of a cluster (``plan.cluster_n``), the row's
sum exchanged through distributed shared memory. The math, the copies and the naming are the
fused kernel's (kernels/backward.py)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32
from cutlass.memory import SmemAllocator

from .backward import RMSNormBackward
from ..plan.backward import BackwardPlan
from ..device import cluster_sum
from ..device.reduce import SLOTS, row_sum
from ..device.tiles import strip_rows


class RMSNormClusterBackward(RMSNormBackward):
    """The fused backward of a row too wide for one CTA (``plan.cluster_n`` > 1): cluster s walks
    strip s of the rows, CTA ``rank`` of the cluster holding columns ``[rank * cols_per_tile,
    (rank + 1) * cols_per_tile)``: its slice of w and of the fp32 dW accumulator stay in
    registers for the whole strip. Per row each CTA reduces its part of ``sum(m * x_hat)`` and
    the cluster's CTAs add their parts through distributed shared memory
    (``cluster_sum.exchange``); the row's total is then in every CTA. At the end each CTA writes
    its slice of the strip's partial dW row."""

    def __init__(self, plan: BackwardPlan):
        assert plan.kind == "fused" and plan.cluster_n > 1 and plan.chunks == 1 and not plan.dh
        super().__init__(plan)

    def launch(self, gDy, gX, gW, gRstd, gDx, gDwP, gDh, grid, offset, stream):
        """Host side: ``grid`` is the strips (one cluster each)."""
        p = self.plan
        mDy, mX, mW, mRstd, mDx, mDwP, _ = self.tensors(gDy, gX, gW, gRstd, gDx, gDwP, None,
                                                        grid)
        smem_bytes = SLOTS * self.warps_per_row * 4 + cluster_sum.smem_bytes(p.cluster_n)
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
        mbar = cluster_sum.mbarriers(smem)
        sBuf = smem.allocate_tensor(Float32, cute.make_layout((SLOTS, 1, self.warps_per_row)),
                                    byte_alignment=4)
        sSums = cluster_sum.slots(smem, cn)
        cluster_sum.start(mbar, tidx)

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

        row_start, row_end = strip_rows(M, strip, n_strips)

        # Prefetch: the next row's x, dy and rstd load into a second set of registers while
        # this row waits for its peers' sums, so the exchange's latency overlaps a row's loads.
        tXrXn = None
        tXrDyn = None
        rstd_n = Float32(0.0)
        if cutlass.const_expr(p.prefetch):
            tXrXn = cute.make_fragment_like(tXrX)
            tXrDyn = cute.make_fragment_like(tXrX)
            self.load_chunk(tiled_x, thr_x, mX, mDy, tiler, row_start, rank, tXcX, tXrXn,
                            tXrDyn, row_start < row_end)
            rstd_n = mRstd[cutlass.min(row_start, M - 1)]
        cute.arch.cluster_wait()

        for row in cutlass.range(row_start, row_end):
            step = row - row_start
            rstd = rstd_n
            if cutlass.const_expr(p.prefetch):
                tXrX.store(tXrXn.load())
                tXrDy.store(tXrDyn.load())
                self.load_chunk(tiled_x, thr_x, mX, mDy, tiler, row + 1, rank, tXcX, tXrXn,
                                tXrDyn, row + 1 < row_end)
                rstd_n = mRstd[cutlass.min(row + 1, M - 1)]
            else:
                self.load_chunk(tiled_x, thr_x, mX, mDy, tiler, row, rank, tXcX, tXrX, tXrDy)
                rstd = mRstd[row]
            x_hat = tXrX.load().to(Float32) * rstd
            dyf = tXrDy.load().to(Float32)
            m = self.m_of(dyf, tWrW, offset)
            part = row_sum((m * x_hat).reduce(cute.ReductionOp.ADD, Float32(0.0),
                                              reduction_profile=0),
                           sBuf, step % SLOTS, 0, warp, lane, self.warps_per_row)
            total = cluster_sum.exchange(part, mbar, sSums, step, rank, tidx, cn)
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
