"""The last step of dW: ``dw[n] = sum_g partial[g, n]``, fp32 partial rows to the weight's dtype.

Both backward paths leave G fp32 partial rows of dW (one per fused strip, or per row group of the
split path's dW kernel). Finishing with torch, ``partial.sum(0).to(w.dtype)``, takes two
launches and two dispatches on the host, a share of the fused backward at 16384 x 4096 worth
saving; this kernel does it in one launch, in a fraction of that device time, and rounds once, at
the store (docs/design-record.md, 'Backward: the dW reduction kernel').

Mapping: CTA b owns 32 consecutive columns; its 32 warps are *row lanes*: lane l sums rows l,
l + 32, l + 64, ... of those columns (a warp reads 128 contiguous bytes of one row per load, and
the loop is unrolled so each thread has several loads in flight), then the 32 lane sums of each
column meet in shared memory and warp 0 adds them in lane order. The order of additions is fixed,
so dW is bitwise reproducible run to run (no atomics).

``DwReducePair`` sums two weights' partials, side by side in (G, 2N) rows, into two vectors in one
launch: the q/k-norm backward's two weights, whose narrow rows (a head, 64 to 256 columns) leave
each launch a few CTAs of latency, so a second launch would cost as long as the first.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.memory import SmemAllocator

from ..device.pdl import wait_for_previous_grid

COLS_PER_CTA = 32   # one warp across the columns: 128-byte loads of fp32
ROW_LANES = 32      # warps per CTA, each on its own rows (1024 threads)
UNROLL = 8          # loads in flight per thread


class DwReduce:
    """``__call__(partial (G, N) fp32, dw (N,) in the weight's dtype, stream)``."""

    def __init__(self, N: int, w_type, pdl: bool = False):
        self.N = N
        self.w_type = w_type
        self.pdl = pdl  # programmatic dependent launch (device/pdl.py)
        self.vectors = 1  # weights whose partials sit side by side in a row

    @cute.jit
    def __call__(self, gPart: cute.Tensor, gDw: cute.Tensor, stream: cuda.CUstream):
        self.launch(gPart, gDw, None, stream)

    @cute.jit
    def launch(self, gPart: cute.Tensor, gDw: cute.Tensor, gDw2, stream: cuda.CUstream):
        cols = self.N * self.vectors
        G = Int32(gPart.shape[0])
        mPart = cute.make_tensor(gPart.iterator, cute.make_layout((G, cols), stride=(cols, 1)))
        mDw = cute.make_tensor(gDw.iterator, cute.make_layout((self.N,)))
        mDw2 = None
        if cutlass.const_expr(gDw2 is not None):
            mDw2 = cute.make_tensor(gDw2.iterator, cute.make_layout((self.N,)))
        self.kernel(mPart, mDw, mDw2).launch(
            grid=[-(-cols // COLS_PER_CTA), 1, 1], block=[COLS_PER_CTA * ROW_LANES, 1, 1],
            smem=ROW_LANES * COLS_PER_CTA * 4, stream=stream, use_pdl=self.pdl)

    @cute.kernel
    def kernel(self, mPart: cute.Tensor, mDw: cute.Tensor, mDw2):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        G = mPart.shape[0]
        cols = self.N * self.vectors
        c = tidx % COLS_PER_CTA
        lane = tidx // COLS_PER_CTA
        col = bidx * COLS_PER_CTA + c
        if cutlass.const_expr(self.pdl):
            wait_for_previous_grid()

        # UNROLL rows a step, their loads issued together: the row index is clamped rather than
        # tested (a test of each row is a branch after each load, each load then waiting for the
        # one before); the rows past G are left out of the sum, which adds in row order.
        total = Float32(0.0)
        if col < cols:
            vals = cute.make_rmem_tensor(cute.make_layout(UNROLL), Float32)
            for g0 in cutlass.range(lane, G, ROW_LANES * UNROLL):
                for i in cutlass.range_constexpr(UNROLL):
                    vals[i] = mPart[cutlass.min(g0 + i * ROW_LANES, G - 1), col]
                for i in cutlass.range_constexpr(UNROLL):
                    if g0 + i * ROW_LANES < G:
                        total = total + vals[i]

        smem = SmemAllocator()
        sSum = smem.allocate_tensor(
            Float32, cute.make_layout((ROW_LANES, COLS_PER_CTA), stride=(COLS_PER_CTA, 1)),
            byte_alignment=16)
        sSum[lane, c] = total
        cute.arch.sync_threads()
        if lane == 0:
            acc = Float32(0.0)
            for l in cutlass.range_constexpr(ROW_LANES):
                acc = acc + sSum[l, c]
            if col < self.N:
                mDw[col] = acc.to(self.w_type)
            if cutlass.const_expr(mDw2 is not None):
                if col >= self.N and col < cols:
                    mDw2[col - self.N] = acc.to(self.w_type)


class DwReducePair(DwReduce):
    """``__call__(partials (G, 2N) fp32, dw (N,), dw2 (N,), stream)``: row g holds the first
    weight's partial row in its first N columns, the second's in the rest."""

    def __init__(self, N: int, w_type, pdl: bool = False):
        super().__init__(N, w_type, pdl)
        self.vectors = 2

    @cute.jit
    def __call__(self, gPart: cute.Tensor, gDw: cute.Tensor, gDw2: cute.Tensor,
                 stream: cuda.CUstream):
        self.launch(gPart, gDw, gDw2, stream)
