"""CuTe DSL RMSNorm fused backward over a thread-block cluster: rows too wide for one CTA's
registers, each row's columns split over the CTAs of a cluster (``plan.cluster_n``), the row's
sum exchanged through distributed shared memory. The math, the copies and the naming are the
fused kernel's (kernels/backward.py)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from .backward import RMSNormBackward
from ..plan.backward import BackwardPlan
from ..device.cluster_sum import ClusterRows


class RMSNormClusterBackward(ClusterRows, RMSNormBackward):
    """The fused backward of a row too wide for one CTA (``plan.cluster_n`` > 1;
    ``cluster_sum.ClusterRows``): cluster s walks strip s of the rows, each CTA keeping its slice
    of w and of the fp32 dW accumulator in registers for the whole strip. Per row each CTA
    reduces its part of ``sum(m * x_hat)`` and the cluster's CTAs add their parts through
    distributed shared memory; the row's total is then in every CTA. At the end each CTA writes
    its slice of the strip's partial dW row."""

    def __init__(self, plan: BackwardPlan):
        assert plan.kind == "fused" and plan.cluster_n > 1 and plan.chunks == 1 and not plan.dh
        super().__init__(plan)

    def launch(self, gDy, gX, gW, gRstd, gDx, gDwP, gDh, grid, offset, stream):
        """Host side: ``grid`` is the strips (one cluster each)."""
        mDy, mX, mW, mRstd, mDx, mDwP, _ = self.tensors(gDy, gX, gW, gRstd, gDx, gDwP, None,
                                                        grid)
        self.launch_clusters(self.kernel(mDy, mX, mW, mRstd, mDx, mDwP, offset, None), grid,
                             stream)

    @cute.kernel
    def kernel(self, mDy: cute.Tensor, mX: cute.Tensor, mW: cute.Tensor, mRstd: cute.Tensor,
               mDx: cute.Tensor, mDwP: cute.Tensor, offset: Float32, mDh: cute.Tensor):
        p = self.plan
        s = self.strip(mX)
        cp, rank, tXrX = s.cp, s.rank, s.tXrX
        M = s.M
        tXrDy = cute.make_fragment_like(tXrX)
        tXrDx = cute.make_fragment_like(tXrX)
        tWrW = None
        tXrDw = None
        if cutlass.const_expr(self.w_type is not None):
            tWrW = cp.weight(mW, rank)
            tXrDw = cute.make_fragment_like(tXrX, Float32)
            tXrDw.fill(0.0)

        row_start, row_end = s.rows()
        # Prefetch: the next row's x, dy and rstd load into a second set of registers while
        # this row waits for its peers' sums, so the exchange's latency overlaps a row's loads.
        tXrXn = None
        tXrDyn = None
        rstd_n = Float32(0.0)
        if cutlass.const_expr(p.prefetch):
            tXrXn = cute.make_fragment_like(tXrX)
            tXrDyn = cute.make_fragment_like(tXrX)
            cp.load_rows((mX, mDy), (tXrXn, tXrDyn), row_start, rank, row_start < row_end)
            rstd_n = mRstd[cutlass.min(row_start, M - 1)]
        cute.arch.cluster_wait()

        for row in cutlass.range(row_start, row_end):
            step = row - row_start
            rstd = rstd_n
            if cutlass.const_expr(p.prefetch):
                tXrX.store(tXrXn.load())
                tXrDy.store(tXrDyn.load())
                cp.load_rows((mX, mDy), (tXrXn, tXrDyn), row + 1, rank, row + 1 < row_end)
                rstd_n = mRstd[cutlass.min(row + 1, M - 1)]
            else:
                cp.load_rows((mX, mDy), (tXrX, tXrDy), row, rank)
                rstd = mRstd[row]
            x_hat = tXrX.load().to(Float32) * rstd
            dyf = tXrDy.load().to(Float32)
            m = self.m_of(dyf, tWrW, offset)
            total = s.row_total((m * x_hat).reduce(cute.ReductionOp.ADD, Float32(0.0),
                                                   reduction_profile=0), step)
            dx = rstd * (m - x_hat * (total / Float32(p.N)))
            tXrDx.store(dx.to(self.x_type))
            cute.copy(cp.tiled, tXrDx, cp.dst(mDx, row, rank), pred=s.pred)
            if cutlass.const_expr(tXrDw is not None):
                tXrDw.store(tXrDw.load() + dyf * self.x_hat_for_dw(x_hat))

        if cutlass.const_expr(tXrDw is not None):
            # this CTA's slice of the strip's partial dW row (an empty strip writes its zeros)
            tXgDwP = cp.dst(mDwP, s.strip, rank)
            for k in cutlass.range_constexpr(p.vecs_per_thread):
                if s.pred[k, 0, 0]:
                    cute.autovec_copy(tXrDw[(None, k), None, None], tXgDwP[(None, k), None, None])
