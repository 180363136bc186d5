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
from ..device.tiles import strip_rows


class RMSNormStagedBackward(RMSNormBackward):
    """The ``staged`` plan. Strip s walks its rows; row i of the strip lives in stage
    ``i % stages`` of the shared-memory ring. Each thread issues its own 16-byte copies of a row
    (x and dy, every column chunk) as one ``cp.async`` group, ``stages - 1`` rows ahead, and
    waits only for its own group of this row: a thread reads back exactly the elements it copied
    (the copy and the reads partition a chunk by the same layout), so the ring needs no barrier,
    and a stage is refilled only after the same thread has read it. Per row the two passes read x
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
        ring = p.stages * p.N * self.x_type.width // 8
        smem_bytes = (3 if p.dh else 2) * (ring + 128) + SLOTS * self.warps_per_row * 4
        # the launch bound holds ptxas to the registers of the plan's strips per SM; the
        # carveout gives the SM's memory to shared memory, which the rings need
        self.kernel(mDy, mX, mW, mRstd, mDx, mDwP, offset, mDh).launch(
            grid=[grid, 1, 1], block=[p.threads, 1, 1], smem=smem_bytes, stream=stream,
            min_blocks_per_mp=p.ctas_per_sm, preferred_smem_carveout=100, use_pdl=p.pdl)

    @cute.kernel
    def kernel(self, mDy: cute.Tensor, mX: cute.Tensor, mW: cute.Tensor, mRstd: cute.Tensor,
               mDx: cute.Tensor, mDwP: cute.Tensor, offset: Float32, mDh: cute.Tensor):
        p = self.plan
        S = p.stages
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        M = mX.shape[0]
        warp = tidx // 32
        lane = tidx % 32
        if cutlass.const_expr(p.pdl):
            wait_for_previous_grid()

        smem = SmemAllocator()
        ring = cute.make_layout((S, p.N), stride=(p.N, 1))
        sX = smem.allocate_tensor(self.x_type, ring, byte_alignment=128)
        sDy = smem.allocate_tensor(self.x_type, ring, byte_alignment=128)
        sDh = None
        if cutlass.const_expr(p.dh):
            sDh = smem.allocate_tensor(self.x_type, ring, byte_alignment=128)
        sBuf = smem.allocate_tensor(Float32, cute.make_layout((SLOTS, 1, self.warps_per_row)),
                                    byte_alignment=4)

        tiler = (1, p.cols_per_tile)
        g2s, thr_g2s, tiled_x, thr_x, tXcX = self.ring_copies(tiler, tidx, mX)

        # w and the dW accumulator of every chunk, in registers for the whole strip
        tXrX = cute.make_fragment_like(thr_x.partition_S(cute.local_tile(mX, tiler, (0, 0))))
        tWrW = [None] * p.chunks
        tXrDw = [None] * p.chunks
        if cutlass.const_expr(self.w_type is not None):
            for c in cutlass.range_constexpr(p.chunks):
                tWrW[c] = self.load_weight(mW, tiler, thr_x, tXcX, c)
                tXrDw[c] = cute.make_fragment_like(tXrX, Float32)
                tXrDw[c].fill(0.0)

        row_start, row_end = strip_rows(M, bidx, gdim)

        for k in cutlass.range_constexpr(S - 1):
            self.stage(g2s, thr_g2s, (mX, mDy, mDh), (sX, sDy, sDh), tiler, tXcX,
                       row_start + k, k, row_end)
        rstd_n = mRstd[cutlass.min(row_start, M - 1)]

        for row in cutlass.range(row_start, row_end):
            i = row - row_start
            self.stage(g2s, thr_g2s, (mX, mDy, mDh), (sX, sDy, sDh), tiler, tXcX, row + S - 1,
                       (i + S - 1) % S, row_end)
            rstd = rstd_n
            rstd_n = mRstd[cutlass.min(row + 1, M - 1)]
            cute.arch.cp_async_wait_group(S - 1)  # this thread's copies of `row` have landed
            st = i % S

            mx = Float32(0.0)  # pass 1: sum(m * x_hat) over the row
            for c in cutlass.range_constexpr(p.chunks):
                xf = self.read_stage(thr_x, sX, tiler, st, c).load().to(Float32)
                dyf = self.read_stage(thr_x, sDy, tiler, st, c).load().to(Float32)
                m = self.m_of(dyf, tWrW[c], offset)
                mx = mx + (m * (xf * rstd)).reduce(cute.ReductionOp.ADD, Float32(0.0),
                                                   reduction_profile=0)
            mean_mx = row_sum(mx, sBuf, i % SLOTS, 0, warp, lane, self.warps_per_row) \
                / Float32(p.N)

            for c in cutlass.range_constexpr(p.chunks):  # pass 2: dx, and dW
                xf = self.read_stage(thr_x, sX, tiler, st, c).load().to(Float32)
                dyf = self.read_stage(thr_x, sDy, tiler, st, c).load().to(Float32)
                x_hat = xf * rstd
                m = self.m_of(dyf, tWrW[c], offset)
                dx = rstd * (m - x_hat * mean_mx)
                if cutlass.const_expr(p.dh):  # the fused add: h's own gradient joins dx
                    dx = dx + self.read_stage(thr_x, sDh, tiler, st, c).load().to(Float32)
                tXrDx = cute.make_fragment_like(tXrX)
                tXrDx.store(dx.to(self.x_type))
                cute.copy(tiled_x, tXrDx,
                          thr_x.partition_D(cute.local_tile(mDx, tiler, (row, c))))
                if cutlass.const_expr(self.w_type is not None):
                    tXrDw[c].store(tXrDw[c].load() + dyf * self.x_hat_for_dw(x_hat))

        if cutlass.const_expr(self.w_type is not None):
            # this strip's partial dW row (an empty strip writes its zeros)
            for c in cutlass.range_constexpr(p.chunks):
                cute.autovec_copy(tXrDw[c],
                                  thr_x.partition_D(cute.local_tile(mDwP, tiler, (bidx, c))))


class RMSNormStagedBackwardDh(RMSNormStagedBackward):
    """The staged plan of the fused residual add (``plan.dh``): dh, a third ring, joins dx."""

    def __init__(self, plan: BackwardPlan):
        assert plan.dh
        super().__init__(plan)

    __call__ = RMSNormBackwardDh.__call__
