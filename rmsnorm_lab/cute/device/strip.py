"""A CTA's strip of rows in the kernels whose whole CTA walks rows one at a time (the staged
kernels, and the cluster kernels, where a cluster of CTAs shares each row): the thread's place,
the strip's rows (``strip_rows``), and each row's sum over the CTA."""

from __future__ import annotations

import dataclasses

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from .reduce import SLOTS, row_sum
from .tiles import strip_rows


@cute.jit
def strip_start(mX: cute.Tensor, cluster_n: cutlass.Constexpr[int] = 1):
    """``(tidx, rank, strip, n_strips, M, warp, lane)`` at the kernel's start: the thread, the
    strip its CTA walks (strip ``bidx`` of ``gdim``; with ``cluster_n`` > 1 a cluster walks one,
    and ``rank`` is the CTA's in the cluster, else None), the row count, the thread's warp and
    lane."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    gdim, _, _ = cute.arch.grid_dim()
    rank, strip, n_strips = None, bidx, gdim
    if cutlass.const_expr(cluster_n > 1):
        rank = cute.arch.block_idx_in_cluster()
        strip, n_strips = bidx // cluster_n, gdim // cluster_n
    return tidx, rank, strip, n_strips, mX.shape[0], tidx // 32, tidx % 32


@dataclasses.dataclass(frozen=True)
class Strip:
    """One CTA's strip of rows, at trace time: the thread (``tidx``, ``warp``, ``lane``), the
    strip (``strip`` of ``n_strips`` over ``M`` rows) and the shared memory of its rows' sums
    (``sBuf``, ``reduce.row_sum_slots``). Frozen: the DSL passes it through dynamic loops as it
    is."""

    tidx: Int32
    warp: Int32
    lane: Int32
    M: Int32
    strip: Int32
    n_strips: Int32
    sBuf: cute.Tensor
    warps_per_row: int

    def rows(self):
        """Rows ``[start, end)`` of the strip."""
        return strip_rows(self.M, self.strip, self.n_strips)

    @cute.jit
    def row_sum(self, part: Float32, step) -> Float32:
        """The CTA's total of ``part`` (this thread's share) for the strip's ``step``-th row:
        consecutive rows alternate slots (reduce.row_sum)."""
        return row_sum(part, self.sBuf, step % SLOTS, 0, self.warp, self.lane,
                       self.warps_per_row)
