"""CuTe DSL RMSNorm fused backward with rows staged in shared memory: each strip keeps its next
rows of x and dy (and the fused add's dh) in flight by ``cp.async`` (``plan.stages`` rows), where
the fused kernel (kernels/backward.py) keeps one next row in registers, or none for the fused add. The
math, the strips and the dW partial rows are the fused kernel's; the naming too (``sX`` x's rows
in shared memory, ``tXsX`` this thread's slice of one of them)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32
from cutlass.memory import SmemAllocator

from .backward import RMSNormBackward, RMSNormBackwardDh
from ..plan.backward import BackwardPlan
from ..device.pdl import wait_for_previous_grid
from ..device.reduce import SLOTS, row_sum
from ..device.tiles import RowRing, strip_rows


class RMSNormStagedBackward(RMSNormBackward):
    """The ``staged`` plan. Strip s walks its rows; row i of the strip lives in stage
    ``i % stages`` of the shared-memory rings of x and dy (and dh; ``tiles.RowRing``: a thread
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
        p = self.plan
        mDy, mX, mW, mRstd, mDx, mDwP, mDh = self.tensors(gDy, gX, gW, gRstd, gDx, gDwP, gDh,
                                                          grid)
        smem_bytes = (RowRing.smem_bytes(p, self.x_type, 3 if p.dh else 2)
                      + SLOTS * self.warps_per_row * 4)
        # the launch bound holds ptxas to the registers of the plan's strips per SM; the
        # carveout gives the SM's memory to shared memory, which the rings need
        self.kernel(mDy, mX, mW, mRstd, mDx, mDwP, offset, mDh).launch(
            grid=[grid, 1, 1], block=[p.threads, 1, 1], smem=smem_bytes, stream=stream,
            min_blocks_per_mp=p.ctas_per_sm, preferred_smem_carveout=100, use_pdl=p.pdl)

    @cute.kernel
    def kernel(self, mDy: cute.Tensor, mX: cute.Tensor, mW: cute.Tensor, mRstd: cute.Tensor,
               mDx: cute.Tensor, mDwP: cute.Tensor, offset: Float32, mDh: cute.Tensor):
        p = self.plan
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        M = mX.shape[0]
        warp = tidx // 32
        lane = tidx % 32
        if cutlass.const_expr(p.pdl):
            wait_for_previous_grid()

        smem = SmemAllocator()
        staged = (mX, mDy, mDh)
        rings = RowRing.allocate(self, smem, staged)
        sBuf = smem.allocate_tensor(Float32, cute.make_layout((SLOTS, 1, self.warps_per_row)),
                                    byte_alignment=4)
        ring = RowRing.make(self, tidx, (1, p.cols_per_tile), staged, rings)
        cp = ring.cp
        sX, sDy, sDh = rings

        # w and the dW accumulator of every chunk, in registers for the whole strip
        tXrX = cp.fragment(mX)
        tWrW = [None] * p.chunks
        tXrDw = [None] * p.chunks
        if cutlass.const_expr(self.w_type is not None):
            for c in cutlass.range_constexpr(p.chunks):
                tWrW[c] = cp.weight(mW, c)
                tXrDw[c] = cute.make_fragment_like(tXrX, Float32)
                tXrDw[c].fill(0.0)

        row_start, row_end = strip_rows(M, bidx, gdim)
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
            mean_mx = row_sum(mx, sBuf, i % SLOTS, 0, warp, lane, self.warps_per_row) \
                / Float32(p.N)

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
                cute.autovec_copy(tXrDw[c], cp.dst(mDwP, bidx, c))


class RMSNormStagedBackwardDh(RMSNormStagedBackward):
    """The staged plan of the fused residual add (``plan.dh``): dh, a third ring, joins dx."""

    def __init__(self, plan: BackwardPlan):
        assert plan.dh
        super().__init__(plan)

    __call__ = RMSNormBackwardDh.__call__
