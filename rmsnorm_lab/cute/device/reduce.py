"""Row reductions shared by the CuTe kernels: thread -> warp (shuffles) -> CTA (shared memory)."""

import cutlass
import cutlass.cute as cute
from cutlass import Float32

#: shared-memory slots a CTA-wide row sum alternates between (see ``row_sum``)
SLOTS = 2


@cute.jit
def row_sum(partial: Float32, sBuf: cute.Tensor, slot: cutlass.Int32,
            row_in_cta: cutlass.Int32, warp_in_row: cutlass.Int32, lane: cutlass.Int32,
            warps_per_row: cutlass.Constexpr[int],
            lanes_per_row: cutlass.Constexpr[int] = 32) -> Float32:
    """Sum ``partial`` over the threads of one row.

    A row spread over one warp needs shuffles only; a row narrower than a warp
    (``lanes_per_row`` < 32, a power of two) shares the warp with other rows, and its butterfly
    stays within its own lanes. Wider rows stage one value per warp in
    ``sBuf[slot, row, warp]`` (``sBuf``: ``(SLOTS, rows, warps)``), wait at one barrier, and every
    thread reads the whole row of values back, so all threads leave with the total.

    One barrier per reduction, not two: a kernel that reduces row after row alternates ``slot``
    (0, 1, 0, ...) with every reduction (``row_max`` too). A thread writes slot s again two
    reductions later, after the barrier of the one in between, which every thread reaches only
    once it has read slot s, so no write can overtake a read still pending.
    """
    return _row_reduce(partial, lambda a, b: a + b, cute.arch.warp_reduction_sum, sBuf, slot,
                       row_in_cta, warp_in_row, lane, warps_per_row, lanes_per_row)


@cute.jit
def row_max(partial: Float32, sBuf: cute.Tensor, slot: cutlass.Int32,
            row_in_cta: cutlass.Int32, warp_in_row: cutlass.Int32, lane: cutlass.Int32,
            warps_per_row: cutlass.Constexpr[int],
            lanes_per_row: cutlass.Constexpr[int] = 32) -> Float32:
    """The largest ``partial`` of a row's threads, as ``row_sum`` sums them; for values of at
    least 0 (an amax), NaN passed over (``fmax``)."""
    return _row_reduce(partial, cute.arch.fmax, cute.arch.warp_reduction_max, sBuf, slot,
                       row_in_cta, warp_in_row, lane, warps_per_row, lanes_per_row)


@cute.jit
def _row_reduce(partial: Float32, combine: cutlass.Constexpr, warp_reduce: cutlass.Constexpr,
                sBuf: cute.Tensor, slot: cutlass.Int32, row_in_cta: cutlass.Int32,
                warp_in_row: cutlass.Int32, lane: cutlass.Int32,
                warps_per_row: cutlass.Constexpr[int],
                lanes_per_row: cutlass.Constexpr[int]) -> Float32:
    total = warp_reduce(partial, threads_in_group=lanes_per_row)
    if cutlass.const_expr(warps_per_row > 1):
        if lane == 0:
            sBuf[slot, row_in_cta, warp_in_row] = total
        cute.arch.sync_threads()
        total = Float32(0.0)
        for w in cutlass.range_constexpr(warps_per_row):
            total = combine(total, sBuf[slot, row_in_cta, w])
    return total


def row_sum_slots(smem, rows: int, warps: int) -> cute.Tensor:
    """``row_sum``'s shared memory, ``(SLOTS, rows, warps)`` fp32: a value per warp of each row
    of the tile, in each slot."""
    return smem.allocate_tensor(Float32, cute.make_layout((SLOTS, rows, warps)), byte_alignment=4)


def row_sum_bytes(rows: int, warps: int) -> int:
    """The size of ``row_sum_slots(smem, rows, warps)``."""
    return SLOTS * rows * warps * 4
