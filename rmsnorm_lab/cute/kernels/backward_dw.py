"""CuTe DSL RMSNorm backward, the split path's dW kernel: CTA (b, g) sums ``dy * x_hat`` over the
rows of group g for column block b -- one warp per row, ``dw_unroll`` rows per warp in flight --
then reduces over its warps in shared memory and writes ``dw_partial[g, block b]``; ``DwReduce``
(kernels/dw_reduce.py) sums the partial rows. The math and the copies are the fused kernel's
(kernels/backward.py)."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.memory import SmemAllocator

from .backward import _Common
from ..plan.backward import BackwardPlan
from ..device.pdl import wait_for_previous_grid
from ..device.tiles import strip_rows


class RMSNormBackwardDW(_Common):
    """The split path's dW kernel: grid (column blocks, row groups)."""

    def __init__(self, plan: BackwardPlan):
        assert plan.kind == "dw" and plan.w_dtype is not None
        super().__init__(plan)

    @cute.jit
    def __call__(self, gDy: cute.Tensor, gX: cute.Tensor, gRstd: cute.Tensor, gDwP: cute.Tensor,
                 stream: cuda.CUstream):
        """Host side: dy and x (M, N):(ld, 1), rstd (M,), the fp32 partials (row groups, N);
        layouts rebuilt with N static and 32-bit sizes, as in ``RMSNormBackward``."""
        p = self.plan
        M = Int32(gX.shape[0])
        row_groups = Int32(gDwP.shape[0])
        mDy, mX = self.row_tensor(gDy, M), self.row_tensor(gX, M)
        mRstd = cute.make_tensor(gRstd.iterator, cute.make_layout((M,)))
        mDwP = cute.make_tensor(gDwP.iterator,
                                cute.make_layout((row_groups, p.N), stride=(p.N, 1)))
        smem_bytes = p.rows_per_cta * p.cols_per_tile * 4
        self.kernel(mDy, mX, mRstd, mDwP).launch(
            grid=[p.col_blocks, row_groups, 1], block=[p.threads, 1, 1], smem=smem_bytes,
            stream=stream, use_pdl=p.pdl)

    @cute.kernel
    def kernel(self, mDy: cute.Tensor, mX: cute.Tensor, mRstd: cute.Tensor, mDwP: cute.Tensor):
        p = self.plan
        tidx, _, _ = cute.arch.thread_idx()
        col_block, group, _ = cute.arch.block_idx()
        _, groups, _ = cute.arch.grid_dim()
        M = mX.shape[0]
        row_lane = tidx // p.threads_per_row
        if cutlass.const_expr(p.pdl):
            wait_for_previous_grid()

        row_start, row_end = strip_rows(M, group, groups)  # this group's rows
        tiler = (p.rows_per_cta, p.cols_per_tile)
        # Column coordinates of this thread's elements in column block col_block (the row part
        # of these coordinates is unused: the row is row_lane past the tile's first row).
        cp = self.row_copy(tiler, tidx, mX, (0, col_block))

        # dw_unroll rows per row lane per step, each with its own x and dy registers.
        tXrX = [cp.fragment(mX) for _ in range(p.dw_unroll)]
        tXrDy = [cute.make_fragment_like(tXrX[0]) for _ in range(p.dw_unroll)]
        tXrDw = cute.make_fragment_like(tXrX[0], Float32)
        tXrDw.fill(0.0)

        # A step covers rows_per_cta * dw_unroll rows of the group: row lane l takes rows
        # row0 + u * rows_per_cta + l (one warp per row on the vector path: a 512-byte coalesced
        # segment per load). All loads of a step are issued before the first product, so a
        # thread has 2 * dw_unroll copies in flight. There is no branch on the row: a row past
        # the group's end reads the last row's rstd (always valid) and loads nothing (its copies
        # are predicated off, leaving zeros that add nothing). The tile is re-anchored at each
        # row (domain_offset): groups need not start on a multiple of rows_per_cta.
        for row0 in cutlass.range(row_start, row_end, p.rows_per_cta * p.dw_unroll):
            rstd = [Float32(0.0)] * p.dw_unroll
            for u in cutlass.range_constexpr(p.dw_unroll):
                row = row0 + u * p.rows_per_cta + row_lane
                rstd[u] = mRstd[cutlass.min(row, row_end - 1)]
                first = row0 + u * p.rows_per_cta
                gX = cp.tile_at(mX, first, col_block)
                gDy = cp.tile_at(mDy, first, col_block)
                # Built in the loop: a predicate tensor built before the dynamic loop and used
                # inside it failed to compile (cute.copy received an ArithValue, DSL 4.8.1); the
                # compiler hoists the loop-invariant column flags anyway.
                pred = cp.column_predicate(0, row < row_end)
                tXrX[u].fill(0)
                tXrDy[u].fill(0)
                cute.copy(cp.tiled, cp.thr.partition_S(gX), tXrX[u], pred=pred)
                cute.copy(cp.tiled, cp.thr.partition_S(gDy), tXrDy[u], pred=pred)
            for u in cutlass.range_constexpr(p.dw_unroll):
                x_hat = tXrX[u].load().to(Float32) * rstd[u]
                tXrDw.store(tXrDw.load()
                            + tXrDy[u].load().to(Float32) * self.x_hat_for_dw(x_hat))

        # Reduce over the row lanes through shared memory: each thread stores its fragment into
        # a row-major (rows_per_cta, cols_per_tile) fp32 tile (vec contiguous floats per column
        # block), then thread t sums column t over the lanes and writes it.
        smem = SmemAllocator()
        sAcc = smem.allocate_tensor(
            Float32, cute.make_layout((p.rows_per_cta, p.cols_per_tile),
                                      stride=(p.cols_per_tile, 1)), byte_alignment=16)
        cute.autovec_copy(tXrDw, cp.thr.partition_D(sAcc))
        cute.arch.sync_threads()
        for col in cutlass.range(tidx, p.cols_per_tile, p.threads):
            total = Float32(0.0)
            for lane in cutlass.range_constexpr(p.rows_per_cta):
                total = total + sAcc[lane, col]
            gcol = col_block * p.cols_per_tile + col
            if gcol < p.N:
                mDwP[group, gcol] = total
