"""CuTe DSL RMSNorm fused backward with rows staged in shared memory: each strip keeps its next
rows of x and dy (and the fused add's dh) in flight by ``cp.async`` (``plan.stages`` rows;
device/ring.py, shared with the staged forward), where the fused kernel (kernels/backward.py)
keeps one next row in registers, or none for the fused add. The math, the strips and the dW
partial rows are the fused kernel's; the naming too (``sX`` x's rows in shared memory, ``tXsX``
this thread's slice of one of them)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from .backward import RMSNormBackward, RMSNormBackwardDh
from ..plan.backward import BackwardPlan
from ..device.ring import StagedRows


class RMSNormStagedBackward(StagedRows, RMSNormBackward):
    """The ``staged`` plan. Strip s walks its rows; row i of the strip lives in stage
    ``i % stages`` of the shared-memory rings of x and dy (and dh; ``ring.RowRing``: a thread
    waits only for its own copies, so the rings need no barrier). Per row the two passes read x
    and dy from shared memory (the first for ``sum(m * x_hat)``, the second for dx and the dW
    accumulation; the fused add's dh joins dx there); registers hold w and the fp32 dW
    accumulator for the whole strip."""

    def __init__(self, plan: BackwardPlan):
        assert plan.kind == "fused" and plan.stages > 1 and plan.vecs_per_thread == 1
        assert plan.cluster_n == 1 and plan.strips_per_cta == 1
        super().__init__(plan)

    def launch(self, gDy, gX, gW, gRstd, gDx, gDwP, gDh, grid, offset, stream):
        """Host side: ``grid`` strips of one CTA; the rings of stages in shared memory."""
        mDy, mX, mW, mRstd, mDx, mDwP, mDh = self.tensors(gDy, gX, gW, gRstd, gDx, gDwP, gDh,
                                                          grid)
        self.launch_staged(self.kernel(mDy, mX, mW, mRstd, mDx, mDwP, offset, mDh), grid,
                           stream, rings=3 if self.plan.dh else 2)

    @cute.kernel
    def kernel(self, mDy: cute.Tensor, mX: cute.Tensor, mW: cute.Tensor, mRstd: cute.Tensor,
               mDx: cute.Tensor, mDwP: cute.Tensor, offset: Float32, mDh: cute.Tensor):
        p = self.plan
        s, ring = self.staged_strip((mX, mDy, mDh))
        sX, sDy, sDh = ring.rings
        cp = ring.cp
        M = s.M

        # w and the dW accumulator of every chunk, in registers for the whole strip
        tXrX = cp.fragment(mX)
        tWrW = [None] * p.chunks
        tXrDw = [None] * p.chunks
        if cutlass.const_expr(self.w_type is not None):
            for c in cutlass.range_constexpr(p.chunks):
                tWrW[c] = cp.weight(mW, c)
                tXrDw[c] = cute.make_fragment_like(tXrX, Float32)
                tXrDw[c].fill(0.0)

        row_start, row_end = s.rows()
        ring.fill(row_start, row_end)
        rstd_n = mRstd[cutlass.min(row_start, M - 1)]

        for row in cutlass.range(row_start, row_end):
            i = row - row_start
            ring.refill(row, i, row_end)
            rstd = rstd_n
            rstd_n = mRstd[cutlass.min(row + 1, M - 1)]
            st = ring.wait(i)

            mx = Float32(0.0)  # pass 1: sum(m * x_hat) over the row
            for c in cutlass.range_constexpr(p.chunks):
                xf = ring.read(sX, st, c).load().to(Float32)
                dyf = ring.read(sDy, st, c).load().to(Float32)
                m = self.m_of(dyf, tWrW[c], offset)
                mx = mx + (m * (xf * rstd)).reduce(cute.ReductionOp.ADD, Float32(0.0),
                                                   reduction_profile=0)
            mean_mx = s.row_sum(mx, i) / Float32(p.N)

            for c in cutlass.range_constexpr(p.chunks):  # pass 2: dx, and dW
                xf = ring.read(sX, st, c).load().to(Float32)
                dyf = ring.read(sDy, st, c).load().to(Float32)
                x_hat = xf * rstd
                m = self.m_of(dyf, tWrW[c], offset)
                dx = rstd * (m - x_hat * mean_mx)
                if cutlass.const_expr(p.dh):  # the fused add: h's own gradient joins dx
                    dx = dx + ring.read(sDh, st, c).load().to(Float32)
                tXrDx = cute.make_fragment_like(tXrX)
                tXrDx.store(dx.to(self.x_type))
                cute.copy(cp.tiled, tXrDx, cp.dst(mDx, row, c))
                if cutlass.const_expr(self.w_type is not None):
                    tXrDw[c].store(tXrDw[c].load() + dyf * self.x_hat_for_dw(x_hat))

        if cutlass.const_expr(self.w_type is not None):
            # this strip's partial dW row (an empty strip writes its zeros)
            for c in cutlass.range_constexpr(p.chunks):
                cute.autovec_copy(tXrDw[c], cp.dst(mDwP, s.strip, c))


class RMSNormStagedBackwardDh(RMSNormStagedBackward):
    """The staged plan of the fused residual add (``plan.dh``): dh, a third ring, joins dx."""

    def __init__(self, plan: BackwardPlan):
        assert plan.dh
        super().__init__(plan)

    __call__ = RMSNormBackwardDh.__call__
