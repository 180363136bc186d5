"""CuTe DSL RMSNorm forward for rows too wide for one CTA's registers, ringed through shared
memory.

``staged``: a persistent grid whose CTAs walk strips of rows, each keeping a ring of
``plan.stages`` rows in shared memory, filled by ``cp.async`` ``stages - 1`` rows ahead of the
row it works on (device/ring.py, shared with the backward's ``staged`` mode,
kernels/backward_staged.py). The row is read from DRAM once; both passes (the sum of squares,
then normalize and store) read it from shared memory, and w sits in registers for the whole
strip. A variant to pick, not ``auto``'s: the chunked row is faster at every width
(docs/design-record.md, 'Forward: variants auto does not launch').

Naming follows kernels/forward.py: ``sX`` the ring in shared memory, ``tXsX`` this thread's slice
of one of its rows.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from .forward import RMSNormForward
from ..plan.forward import ForwardPlan
from ..device.ring import StagedRows


class RMSNormStagedForward(StagedRows, RMSNormForward):
    """The ``staged`` plan: row i of a CTA's strip lives in stage ``i % stages`` of the ring
    (``ring.RowRing``: a thread waits only for its own copies, so the ring needs no barrier).
    The row sum's barrier is the kernel's only one."""

    def __init__(self, plan: ForwardPlan):
        assert plan.variant == "staged" and plan.stages > 1 and plan.vecs_per_thread == 1
        assert not plan.residual
        super().__init__(plan)

    def launch(self, gX, gW, gY, gRstd, gR, gH, grid, eps, offset, stream):
        """Host side: ``grid`` strips of one CTA; the ring of stages in shared memory."""
        _, mX, mW, mY, mRstd = self.tensors(gX, gW, gY, gRstd)
        self.launch_staged(self.kernel(mX, mW, mY, mRstd, eps, offset, None, None), grid,
                           stream, rings=1)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor, mY: cute.Tensor, mRstd: cute.Tensor,
               eps: Float32, offset: Float32, mR: cute.Tensor, mH: cute.Tensor):
        p = self.plan
        s, ring = self.staged_strip((mX,))
        (sX,) = ring.rings
        cp = ring.cp
        # w of every chunk, in registers for the whole strip
        tWrW = [None] * p.chunks
        if cutlass.const_expr(self.w_type is not None):
            for c in cutlass.range_constexpr(p.chunks):
                tWrW[c] = cp.weight(mW, c)

        row_start, row_end = s.rows()
        ring.fill(row_start, row_end)
        for row in cutlass.range(row_start, row_end):
            i = row - row_start
            ring.refill(row, i, row_end)
            st = ring.wait(i)

            ss = Float32(0.0)
            for c in cutlass.range_constexpr(p.chunks):
                ss = ss + self.sum_of_squares(ring.read(sX, st, c))
            rstd = self.row_rstd(s.row_sum(ss, i), eps, mRstd, row, s.tidx == 0)

            for c in cutlass.range_constexpr(p.chunks):
                tXrX = ring.read(sX, st, c)
                tXrY = cute.make_fragment_like(tXrX)
                tXrY.store(self.normalize(tXrX.load().to(Float32), rstd, tWrW[c], offset)
                           .to(self.x_type))
                cute.copy(cp.tiled, tXrY, cp.dst(mY, row, c))
