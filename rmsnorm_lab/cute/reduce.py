"""Row reductions shared by the CuTe kernels: thread -> warp (shuffles) -> CTA (shared memory)."""

import cutlass
import cutlass.cute as cute
from cutlass import Float32


@cute.jit
def row_sum(partial: Float32, sBuf: cute.Tensor, row_in_cta: cutlass.Int32,
            warp_in_row: cutlass.Int32, lane: cutlass.Int32,
            warps_per_row: cutlass.Constexpr[int],
            lanes_per_row: cutlass.Constexpr[int] = 32) -> Float32:
    """Sum ``partial`` over the threads of one row.

    A row spread over one warp needs shuffles only; a row narrower than a warp
    (``lanes_per_row`` < 32, a power of two) shares the warp with other rows, and its butterfly
    stays within its own lanes. Wider rows stage one value per warp in
    ``sBuf[row, warp]`` and every thread reads the whole strip back, so all threads leave with the
    total (no broadcast step). The trailing barrier lets the caller reuse ``sBuf`` right away
    (the persistent kernel does, on its next row).
    """
    total = cute.arch.warp_reduction_sum(partial, threads_in_group=lanes_per_row)
    if cutlass.const_expr(warps_per_row > 1):
        if lane == 0:
            sBuf[row_in_cta, warp_in_row] = total
        cute.arch.sync_threads()
        total = Float32(0.0)
        for w in cutlass.range_constexpr(warps_per_row):
            total = total + sBuf[row_in_cta, w]
        cute.arch.sync_threads()
    return total
