"""CuTe DSL RMSNorm fused backward over a thread-block cluster: rows too wide for one CTA's
registers, each row's columns split over the CTAs of a cluster (``plan.cluster_n``), the row's
sum exchanged through distributed shared memory. The math, the copies and the naming are the
fused kernel's (kernels/backward.py)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from .backward import BackwardArgs, DwRow, RMSNormBackward, RowRegs
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
        a = BackwardArgs(mDy, mX, mW, mRstd, mDx, mDwP, offset, mDh)
        s = self.strip(mX, mW)
        cp, rank, tXrX, tWrW = s.cp, s.rank, s.tXrX, s.tWrW
        tXrDy = cute.make_fragment_like(tXrX)
        tXrDx = cute.make_fragment_like(tXrX)
        dw = DwRow(self.dw_accumulator(cp, tXrX, None), None, None, None, None)

        row_start, row_end = s.rows()
        # Prefetch: the next row's x, dy and rstd load into a second set of registers while
        # this row waits for its peers' sums, so the exchange's latency overlaps a row's loads.
        tXrXn, tXrDyn, rstd_n = self.prefetch_first(cp, a, tXrX, row_start, row_end, rank)
        regs = RowRegs(tXrX, tXrDy, tXrDx, tXrXn, tXrDyn, tWrW)
        cute.arch.cluster_wait()

        for row in cutlass.range(row_start, row_end):
            step = row - row_start
            rstd, rstd_n = self.load_row(cp, a, regs, row, row, row_end, rstd_n, rank, loads=True)
            x_hat = tXrX.load().to(Float32) * rstd
            dyf = tXrDy.load().to(Float32)
            m = self.m_of(dyf, tWrW, offset)
            total = s.row_total((m * x_hat).reduce(cute.ReductionOp.ADD, Float32(0.0),
                                                   reduction_profile=0), step)
            dx = rstd * (m - x_hat * (total / Float32(p.N)))
            tXrDx.store(dx.to(self.x_type))
            cute.copy(cp.tiled, tXrDx, cp.dst(mDx, row, rank), pred=s.pred)
            self.accumulate_dw(cp, dw, 0, dyf, x_hat)
        # this CTA's slice of the strip's partial dW row (an empty strip writes its zeros)
        self.write_dw(cp, dw, mDwP, s.strip, c=rank)
