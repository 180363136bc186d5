"""Qwen3's attention prologue on the forward's per-head tiles (``qk_norm_rope``): each head row of
q and of k normalized with its own weight, then rotated by its token's cos and sin in
transformers' half-rotation layout before the store, ``y * cos + rotate_half(y) * sin`` with
``rotate_half(y) = cat(-y[D/2:], y[:D/2])``, each product and the sum rounded to x's dtype as the
model's eager ops round them (reference.rope).

Rows are (token, head) pairs, token-major, so a row's token is ``row // heads``. One launch
serves q and k: the first ``q_ctas`` CTAs take q's rows, the rest k's, each with the forward's
own schedule (``tile_group``'s tiles, or ``tile_loop``). A row's two halves meet where the tile
puts them: one copy a lane, the lane ``D / (2 * vec)`` away holds the other half (one shuffle a
value); two copies a lane (fp32 rows of 256), the thread holds both.
"""

from __future__ import annotations

import dataclasses

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from ..device.pdl import wait_for_previous_grid
from ..device.tiles import RowCopy, RowThread
from ..plan.forward import ForwardPlan
from .forward import ForwardArgs, RMSNormForward


@dataclasses.dataclass(frozen=True)
class Rope:
    """The rotary embedding of one tensor's rows, at trace time: cos and sin (T, D), one row a
    token, and the heads a token (the rows a token of this tensor)."""
    mCos: cute.Tensor
    mSin: cute.Tensor
    heads: Int32


class RMSNormQkRopeForward(RMSNormForward):
    """q's and k's head rows normalized and rotated in one launch (module docstring)."""

    def __init__(self, plan: ForwardPlan):
        half = plan.N // (2 * plan.vec)
        assert plan.chunks == 1 and plan.threads_per_row <= 32 and plan.store_rstd
        assert plan.N % (2 * plan.vec) == 0 and not plan.residual and not plan.quant
        # the halves: in other lanes of the row (one copy a lane), or in this thread
        assert plan.vecs_per_thread == 1 or half % plan.threads_per_row == 0
        super().__init__(plan)

    @cute.jit
    def __call__(self, gQ: cute.Tensor, gK: cute.Tensor, gWq: cute.Tensor, gWk: cute.Tensor,
                 gCos: cute.Tensor, gSin: cute.Tensor, gQo: cute.Tensor, gKo: cute.Tensor,
                 gRq: cute.Tensor, gRk: cute.Tensor, heads_q: Int32, heads_k: Int32,
                 q_ctas: Int32, grid: Int32, eps: Float32, stream: cuda.CUstream):
        """Host side: q, k and their outputs arrive as (rows, D):(ld, 1) head rows, cos and sin
        as (T, D):(ld, 1), rstd as (rows,); ``grid`` CTAs, the first ``q_ctas`` of them q's."""
        Mq, mQ, mWq, mQo, mRq = self.tensors(gQ, gWq, gQo, gRq)
        Mk, mK, mWk, mKo, mRk = self.tensors(gK, gWk, gKo, gRk)
        T = Int32(gCos.shape[0])
        mCos, mSin = self.row_tensor(gCos, T), self.row_tensor(gSin, T)
        self.kernel(mQ, mWq, mQo, mRq, mK, mWk, mKo, mRk, mCos, mSin, heads_q, heads_k, q_ctas,
                    eps).launch(grid=[grid, 1, 1], block=[self.plan.threads, 1, 1],
                                stream=stream, use_pdl=self.plan.pdl)

    @cute.kernel
    def kernel(self, mQ: cute.Tensor, mWq: cute.Tensor, mQo: cute.Tensor, mRq: cute.Tensor,
               mK: cute.Tensor, mWk: cute.Tensor, mKo: cute.Tensor, mRk: cute.Tensor,
               mCos: cute.Tensor, mSin: cute.Tensor, heads_q: Int32, heads_k: Int32,
               q_ctas: Int32, eps: Float32):
        p = self.plan
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        if cutlass.const_expr(p.pdl):
            wait_for_previous_grid()  # before any global access (device/pdl.py)
        cp = self.row_copy((p.rows_per_cta, p.cols_per_tile), tidx, mQ)
        tXrX = cp.fragment(mQ)
        zero = Float32(0.0)
        if bidx < q_ctas:
            a = ForwardArgs(mQ, mWq, mQo, mRq, eps, zero, None, None,
                            rope=Rope(mCos, mSin, heads_q))
            self.rows(a, self.thread(tidx, bidx, q_ctas), cp, tXrX)
        else:
            a = ForwardArgs(mK, mWk, mKo, mRk, eps, zero, None, None,
                            rope=Rope(mCos, mSin, heads_k))
            self.rows(a, self.thread(tidx, bidx - q_ctas, gdim - q_ctas), cp, tXrX)

    def thread(self, tidx, bidx, ctas) -> RowThread:
        """Thread ``tidx`` of CTA ``bidx`` of ``ctas``, counted within its tensor's CTAs."""
        tpr = self.plan.threads_per_row
        return RowThread(tidx, bidx, ctas, row=tidx // tpr, warp=(tidx % tpr) // 32,
                         lane=tidx % 32)

    @cute.jit
    def rows(self, a: ForwardArgs, t: RowThread, cp: RowCopy, tXrX):
        """One tensor's rows, by the forward's schedule for the plan's tile."""
        p = self.plan
        if cutlass.const_expr(p.tiles_per_cta > 1):
            self.tile_group(a, t, cp, tXrX)
        else:
            tWrW = None
            if cutlass.const_expr(p.weight_up_front):
                tWrW = cp.weight(a.mW, 0)
            self.tile_loop(a, t, cp, tXrX, tWrW, a.mX.shape[0], None)

    @cute.jit
    def store_chunk(self, cp: RowCopy, a: ForwardArgs, tile, c: cutlass.Constexpr[int], tXrX,
                    rstd: Float32, tWrW, row_ok, scale=None):
        """The row's normalized values rounded to x's dtype (the norm's output), rotated with
        its token's cos and sin (each product and the sum rounded to x's dtype), stored."""
        p = self.plan
        rope = a.rope
        y = self.normalize(tXrX.load().to(Float32), rstd, tWrW, a.offset)
        tYr = cute.make_fragment_like(tXrX, Float32)
        tYr.store(y.to(self.x_type).to(Float32))
        tCr, tSr = cute.make_fragment_like(tXrX), cute.make_fragment_like(tXrX)
        tCr.fill(0)
        tSr.fill(0)
        half = p.N // (2 * p.vec)  # copies in half a row
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.x_type,
                                   num_bits_per_copy=p.vec * self.x_type.width)
        tOr = cute.make_fragment_like(tXrX)
        tPr = cute.make_fragment_like(tYr)  # the other half's values, from the lane that has them
        for k in cutlass.range_constexpr(p.vecs_per_thread):
            row, col = cp.tXcX[(0, k), 0, 0]
            row = row + tile * p.rows_per_cta
            block = col // p.vec  # this copy's place in the row
            if row_ok and block < p.N // p.vec:
                token = row // rope.heads
                gC = cute.zipped_divide(rope.mCos[token, None], (p.vec,))
                gS = cute.zipped_divide(rope.mSin[token, None], (p.vec,))
                cute.copy(atom, gC[None, block], tCr[(None, k), 0, 0])
                cute.copy(atom, gS[None, block], tSr[(None, k), 0, 0])
            yk = tYr[(None, k), 0, 0].load()
            if cutlass.const_expr(half % p.threads_per_row == 0 and p.vecs_per_thread > 1):
                # the other half is this thread's copy half / threads_per_row blocks away
                kk = (k + half // p.threads_per_row) % p.vecs_per_thread
                other = tYr[(None, kk), 0, 0].load()
            else:  # one copy a lane: the lane ``half`` away in the row holds the other half
                lane = cute.arch.lane_idx()
                src = cutlass.select_(block < half, lane + half, lane - half)
                for i in cutlass.range_constexpr(p.vec):
                    tPr[(i, k), 0, 0] = cute.arch.shuffle_sync(tYr[(i, k), 0, 0], src)
                other = tPr[(None, k), 0, 0].load()
            # rotate_half: -y of the second half for the first, y of the first for the second
            sign = cutlass.select_(block < half, Float32(-1.0), Float32(1.0))
            cos = tCr[(None, k), 0, 0].load().to(Float32)
            sin = tSr[(None, k), 0, 0].load().to(Float32)
            out = ((yk * cos).to(self.x_type).to(Float32)
                   + (other * sign * sin).to(self.x_type).to(Float32))
            tOr[(None, k), 0, 0].store(out.to(self.x_type))
        if row_ok:
            cute.copy(cp.tiled, tOr, cp.dst(a.mY, tile, c), pred=cp.column_predicate(c))
