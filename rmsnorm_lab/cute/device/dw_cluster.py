"""A fused backward's dW rows summed across the CTAs of a thread-block cluster before they reach
global memory (``plan.dw_cluster`` CTAs a cluster, each walking its own strip of rows).

At the end of its strip each CTA holds an fp32 dW row of N in registers. The row is cut into
``dw_cluster`` column slices of S = N / dw_cluster; CTA ``j`` of the cluster owns slice ``j``.
Every CTA sends each 16-byte piece of its row to the slice's owner with one ``st.async`` into the
owner's shared memory, at ``recv[sender rank, column in slice]``, counted by the owner's mbarrier
(N x 4 bytes arrive in all: S columns from each of the cluster's CTAs). Each CTA waits for exactly
those bytes, adds the slots sender by sender (a fixed order: dW stays bitwise reproducible) and
writes its slice of the cluster's one partial row. The cluster writes one partial row where its
CTAs wrote one each, and the reduction kernel reads that many fewer.

A CTA may send only once its peers have initialized their mbarriers: each arrives at the cluster
barrier after its initialization, at the kernel's start, and waits on it just before sending, at
the end, long after every peer has arrived. Nothing of a sender's shared memory is read remotely,
and a CTA exits only once every byte owed to it has landed, so no barrier follows the exchange.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32

from .cluster_sum import f32_bits


def smem_bytes(N: int) -> int:
    """The mbarrier and the receive slots (N fp32), with alignment room."""
    return 16 + N * 4 + 16


def mbarrier(smem):
    """The exchange's mbarrier (allocate it before the slots: 8-byte aligned)."""
    return smem.allocate_array(cutlass.Int64, num_elems=1)


def slots(smem, N: int, cluster: int) -> cute.Tensor:
    """The receive slots: (sender rank, column of this CTA's slice), fp32, 16-byte aligned."""
    S = N // cluster
    return smem.allocate_tensor(Float32, cute.make_layout((cluster, S), stride=(S, 1)),
                                byte_alignment=16)


@cute.jit
def start(mbar, tidx):
    """At the kernel's start: the mbarrier initialized (one local arrival), then this CTA's
    arrival at the cluster barrier, which the exchange waits on."""
    if tidx == 0:
        cute.arch.mbarrier_init(mbar, 1)
        cute.arch.mbarrier_init_fence()
    cute.arch.cluster_arrive_relaxed()


@cute.jit
def exchange(cp, tXrDw, mDwP, mbar, sRecv, tidx, cluster: cutlass.Constexpr[int],
             threads: cutlass.Constexpr[int]):
    """Send this thread's dW columns (``tXrDw``, in the fragment layout of ``cp``, a
    ``tiles.RowCopy``: vector k at column ``cp.tXcX[(0, k), 0, 0][1]``) to their slices'
    owners, then sum this CTA's slice over the cluster into its partial row ``mDwP[cluster
    index]`` (``threads``: the CTA's)."""
    N, vec = cp.plan.N, cp.plan.vec
    S = N // cluster
    rank = cute.arch.block_idx_in_cluster()
    bidx, _, _ = cute.arch.block_idx()
    cute.arch.cluster_wait()
    if tidx == 0:  # peers' bytes may land first: the count goes below zero until this arrives
        cute.arch.mbarrier_arrive_and_expect_tx(mbar, N * 4)
    for k in cutlass.range_constexpr(cp.plan.vecs_per_thread):
        col = cp.tXcX[(0, k), 0, 0][1]
        if col < N:
            owner = col // S
            for q in cutlass.range_constexpr(vec // 4):  # 16 bytes a store
                # slots' rows and a piece's columns start at multiples of 4 fp32
                at = cute.assume(rank * S + col % S + 4 * q, divby=4)
                cute.arch.store_async_dsmem(
                    sRecv.iterator + at,
                    tuple(f32_bits(tXrDw[(4 * q + e, k), 0, 0]) for e in range(4)),
                    mbar, owner)
    cute.arch.mbarrier_wait(mbar, 0)
    for c in cutlass.range(tidx, S, threads):
        total = Float32(0.0)
        for j in cutlass.range_constexpr(cluster):
            total = total + sRecv[j, c]
        mDwP[bidx // cluster, rank * S + c] = total
