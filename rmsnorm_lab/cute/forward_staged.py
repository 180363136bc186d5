"""CuTe DSL RMSNorm forward for rows too wide for one CTA's registers, staged in shared memory.

``staged``: one CTA per row. Every thread issues its share of the row's 16-byte copies as
``cp.async`` into shared memory (``cp.async.cg``: through L2, past L1) in one go, then waits for
its own copies only: each thread reads back exactly the elements it copied, so no CTA barrier
stands between the loads and the arithmetic. What is in flight is bounded by shared memory
(228 KB an SM on Hopper) rather than by registers, which is what limits the register-resident
variants on wide rows (results/NOTES.md, "The clusters' first run"). The row is read from DRAM
once; the second pass (normalize and store) reads it from shared memory.

Naming follows forward.py: ``sX`` the row in shared memory, ``tXsX`` this thread's slice of it.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.memory import SmemAllocator

from .forward import RMSNormForward
from .plan import ForwardPlan
from .reduce import SLOTS, row_sum


class RMSNormStagedForward(RMSNormForward):
    """The ``staged`` plan: ``plan.chunks`` column chunks of one copy per thread each, all
    staged at once."""

    def __init__(self, plan: ForwardPlan):
        assert plan.variant == "staged" and plan.vecs_per_thread == 1 and not plan.residual
        super().__init__(plan)

    def launch(self, gX, gW, gY, gRstd, gR, gH, grid, eps, offset, stream):
        """Host side: one CTA per row, the row's bytes of shared memory each."""
        p = self.plan
        M = Int32(gX.shape[0])
        mX, mY = self.rows(gX, M), self.rows(gY, M)
        mW, mRstd = self.weight_and_rstd(gW, gRstd, M)
        smem_bytes = p.N * self.x_type.width // 8 + 128 + SLOTS * self.warps_per_row * 4
        self.kernel(mX, mW, mY, mRstd, eps, offset, None, None).launch(
            grid=[grid, 1, 1], block=[p.threads, 1, 1], smem=smem_bytes, stream=stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor, mY: cute.Tensor, mRstd: cute.Tensor,
               eps: Float32, offset: Float32, mR: cute.Tensor, mH: cute.Tensor):
        p = self.plan
        tidx, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        warp = tidx // 32
        lane = tidx % 32

        smem = SmemAllocator()
        sX = smem.allocate_tensor(self.x_type, cute.make_layout((1, p.N), stride=(p.N, 1)),
                                  byte_alignment=128)
        sBuf = smem.allocate_tensor(Float32, cute.make_layout((SLOTS, 1, self.warps_per_row)),
                                    byte_alignment=4)

        tiler = (1, p.cols_per_tile)
        # global -> shared, asynchronous; and the plain copy the stores and reads use, which
        # partitions a chunk alike: a thread's slice of sX is exactly what its cp.async wrote
        g2s = self.make_async_copy(tiler)
        thr_g2s = g2s.get_slice(tidx)
        tiled_x = self.make_tiled_copy(tiler)
        thr_x = tiled_x.get_slice(tidx)
        tXcX = thr_x.partition_S(cute.local_tile(cute.make_identity_tensor(mX.shape), tiler,
                                                 (0, 0)))

        # Every chunk's copy in flight at once (the plan makes N a multiple of a chunk).
        for c in cutlass.range_constexpr(p.chunks):
            cute.copy(g2s, thr_g2s.partition_S(cute.local_tile(mX, tiler, (row, c))),
                      thr_g2s.partition_D(cute.local_tile(sX, tiler, (0, c))))
        cute.arch.cp_async_commit_group()
        cute.arch.cp_async_wait_group(0)  # this thread's copies have landed

        ss = Float32(0.0)
        for c in cutlass.range_constexpr(p.chunks):
            tXsX = thr_x.partition_S(cute.local_tile(sX, tiler, (0, c)))
            tXrX = cute.make_fragment_like(tXsX)
            cute.autovec_copy(tXsX, tXrX)
            ss = ss + self.sum_of_squares(tXrX)
        ss = row_sum(ss, sBuf, 0, 0, warp, lane, self.warps_per_row)
        rstd = cute.math.rsqrt(ss / Float32(p.N) + eps)
        if cutlass.const_expr(p.store_rstd):
            if tidx == 0:
                mRstd[row] = rstd

        for c in cutlass.range_constexpr(p.chunks):
            tWrW = None
            if cutlass.const_expr(self.w_type is not None):
                tWrW = self.load_weight(mW, tiler, thr_x, tXcX, c)
            tXsX = thr_x.partition_S(cute.local_tile(sX, tiler, (0, c)))
            tXrX = cute.make_fragment_like(tXsX)
            cute.autovec_copy(tXsX, tXrX)
            tXrY = cute.make_fragment_like(tXrX)
            tXrY.store(self.normalize(tXrX.load().to(Float32), rstd, tWrW, offset)
                       .to(self.x_type))
            cute.copy(tiled_x, tXrY, thr_x.partition_D(cute.local_tile(mY, tiler, (row, c))))
