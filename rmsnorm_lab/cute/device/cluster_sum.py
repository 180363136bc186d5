"""A row's sum across the CTAs of a thread-block cluster, row after row: each CTA sends its part
to every peer by one ``st.async`` into the peer's shared memory, counted by the peer's mbarrier,
so every CTA waits for exactly the ``cluster_n`` words it is owed and adds them itself. Two slot
sets and two mbarriers, taken in turn: a peer writes a set again only two rows later, after
this CTA's next send, which its threads make only once every one of them has read the set (the
CTA's own row sum, with its barrier, lies between).

``ClusterRows`` is the cluster kernels' common start and launch (the cluster forward in
kernels/forward.py, the cluster backward in kernels/backward_cluster.py), ``ClusterStrip`` a
CTA's part in its cluster's strip."""

from __future__ import annotations

import dataclasses
from typing import Any

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op
from cutlass.memory import SmemAllocator

from .reduce import row_sum_bytes, row_sum_slots
from .strip import Strip, strip_start


def smem_bytes(cluster_n: int) -> int:
    """Shared memory of ``mbarriers`` and ``slots``, with alignment room."""
    return 16 + 2 * cluster_n * 4 + 16


def mbarriers(smem):
    """The two mbarriers (first in the kernel's shared memory: 8-byte aligned)."""
    return smem.allocate_array(cutlass.Int64, num_elems=2)


def slots(smem, cluster_n: int) -> cute.Tensor:
    """The two sets of ``cluster_n`` fp32 slots the peers write."""
    return smem.allocate_tensor(Float32, cute.make_layout((2, cluster_n), stride=(cluster_n, 1)),
                                byte_alignment=4)


@cute.jit
def start(mbar, tidx):
    """Before the first exchange: the mbarriers initialized (each: one local arrival and the
    peers' words per use), then this CTA's arrival at the cluster barrier. A peer's shared memory
    may be written only once the peer runs and has initialized it: the kernel waits
    (``cute.arch.cluster_wait``) just before its first exchange, so the loads between overlap."""
    if tidx == 0:
        cute.arch.mbarrier_init(mbar, 1)
        cute.arch.mbarrier_init(mbar + 1, 1)
        cute.arch.mbarrier_init_fence()
    cute.arch.cluster_arrive_relaxed()


@cute.jit
def exchange(part: Float32, mbar, sSums: cute.Tensor, step, rank, tidx,
             cluster_n: cutlass.Constexpr[int]) -> Float32:
    """The cluster's total of ``part`` (this CTA's share of the row's sum, the same in all its
    threads) for the ``step``-th row of the strip: thread j sends it to CTA j, in slot ``rank``."""
    slot = step % 2            # the slot set and mbarrier of this row
    phase = (step // 2) % 2    # their phase: each is used every other row
    if tidx == 0:
        cute.arch.mbarrier_arrive_and_expect_tx(mbar + slot, cluster_n * 4)
    if tidx < cluster_n:
        cute.arch.store_async_dsmem(sSums.iterator + slot * cluster_n + rank, f32_bits(part),
                                    mbar + slot, tidx)
    cute.arch.mbarrier_wait(mbar + slot, phase)
    total = Float32(0.0)
    for j in cutlass.range_constexpr(cluster_n):
        total = total + sSums[slot, j]
    return total


@dsl_user_op
def f32_bits(value: Float32, *, loc=None, ip=None) -> Int32:
    """The 32 bits of an fp32 value as an Int32 (a remote store takes b32 words)."""
    return Int32(llvm.bitcast(T.i32(), Float32(value).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


@dataclasses.dataclass(frozen=True)
class ClusterStrip(Strip):
    """One CTA's part in its cluster's strip of rows, at trace time (``ClusterRows.strip``):
    a ``Strip`` and the CTA's ``rank`` in the cluster (its columns: chunk ``rank`` of each row),
    the exchange's mbarriers and slots, the register copy ``cp`` of its slice with the slice's
    column predicate (``pred``), x's registers (``tXrX``) and the slice of w, in registers for
    the whole strip (``tWrW``; None without a weight)."""

    rank: Int32
    mbar: Any              # the exchange's two mbarriers
    sSums: cute.Tensor     # the peers' parts (``slots``)
    cp: Any                # tiles.RowCopy of the CTA's slice
    pred: cute.Tensor
    tXrX: cute.Tensor
    tWrW: Any
    cluster_n: int

    @cute.jit
    def row_total(self, part: Float32, step) -> Float32:
        """The row's total of ``part`` (this thread's share of the row's sum) for the ``step``-th
        row of the strip: the CTA's sum (``Strip.row_sum``), then the cluster's (``exchange``)."""
        return exchange(self.row_sum(part, step), self.mbar, self.sSums, step, self.rank,
                        self.tidx, self.cluster_n)


class ClusterRows:
    """Mixin of the cluster kernels (``RMSNormClusterForward`` in kernels/forward.py,
    ``RMSNormClusterBackward`` in kernels/backward_cluster.py), with ``RowTiles``: a persistent
    grid of ``plan.cluster_n``-CTA clusters, cluster s walking strip s of the rows, CTA ``rank``
    holding columns ``[rank * cols_per_tile, (rank + 1) * cols_per_tile)`` of each row. Per row
    each CTA reduces its share of the row's sum and the cluster's CTAs add theirs through
    distributed shared memory (``ClusterStrip.row_total``)."""

    def launch_clusters(self, kernel, grid, stream):
        """Launches ``kernel`` (the kernel's launchable call) on ``grid`` strips, one cluster
        each, with the shared memory of the row sums and their exchange."""
        p = self.plan
        kernel.launch(grid=[grid * p.cluster_n, 1, 1], block=[p.threads, 1, 1],
                      cluster=[p.cluster_n, 1, 1],
                      smem=row_sum_bytes(1, self.warps_per_row) + smem_bytes(p.cluster_n),
                      stream=stream)

    @cute.jit
    def strip(self, mX: cute.Tensor, mW) -> ClusterStrip:
        """The kernel's start: this CTA's place in the cluster and its thread's in the CTA, the
        exchange's mbarriers (initialized, and the cluster barrier arrived at: the kernel waits
        on it just before its first exchange), the row sums' shared memory, and the register
        copy of the CTA's slice of a row, with w's slice."""
        p = self.plan
        tidx, rank, strip, n_strips, M, warp, lane = strip_start(mX, p.cluster_n)
        smem = SmemAllocator()
        mbar = mbarriers(smem)
        sBuf = row_sum_slots(smem, 1, self.warps_per_row)
        sSums = slots(smem, p.cluster_n)
        start(mbar, tidx)
        cp = self.row_copy((1, p.cols_per_tile), tidx, mX)
        pred = cp.column_predicate(rank)  # this CTA's slice is its chunk `rank`
        tXrX = cp.fragment(mX)
        tWrW = None
        if cutlass.const_expr(self.w_type is not None):
            tWrW = cp.weight(mW, rank)
        return ClusterStrip(tidx, warp, lane, M, strip, n_strips, sBuf, self.warps_per_row,
                            rank, mbar, sSums, cp, pred, tXrX, tWrW, p.cluster_n)
