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
from cutlass import Float32, Int32, Uint32

from cutlass.memory import SmemAllocator

from ..device.arith import mul_rn, sum_of_products_x2
from ..device.pdl import wait_for_previous_grid
from ..device.reduce import row_sum
from ..device.tiles import RowCopy, RowTiles, strip_rows
from ..dtypes import TORCH_TO_CUTE
from ..plan.forward import ForwardPlan
from .forward import ForwardArgs, RMSNormForward


@dataclasses.dataclass(frozen=True)
class Rope:
    """The rotary embedding of one tensor's rows, at trace time: cos and sin (T, D), one row a
    token, and the heads a token (the rows a token of this tensor)."""
    mCos: cute.Tensor
    mSin: cute.Tensor
    heads: Int32


class RowHalves:
    """Mixin of the q/k-rope kernels (a ``RowTiles`` plan of one chunk): a thread's copies of
    its token's cos and sin, and the other half of a row for each of its copies."""

    @cute.jit
    def start(self, mX: cute.Tensor):
        """A kernel's first steps: ``(tidx, bidx, gdim, cp)``, the thread's and CTA's indices, the
        grid's size and the register copy of a tile of ``mX``'s rows, after the previous grid's
        writes (PDL: before any global access, device/pdl.py)."""
        p = self.plan
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        if cutlass.const_expr(p.pdl):
            wait_for_previous_grid()
        return tidx, bidx, gdim, self.row_copy((p.rows_per_cta, p.cols_per_tile), tidx, mX)

    def block(self, cp: RowCopy, k: int):
        """The place in the row, in copies, of this thread's copy k."""
        return cp.tXcX[(0, k), 0, 0][1] // self.plan.vec

    @cute.jit
    def tables(self, cp: RowCopy, rope: Rope, token, row_ok, like):
        """``(cos, sin)``: registers shaped like ``like`` holding the token's cos and sin at this
        thread's columns (16-byte copies; zeros where the row or the column is out)."""
        p = self.plan
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.x_type,
                                   num_bits_per_copy=p.vec * self.x_type.width)
        tCr, tSr = cute.make_fragment_like(like, self.x_type), cute.make_fragment_like(
            like, self.x_type)
        tCr.fill(0)
        tSr.fill(0)
        for k in cutlass.range_constexpr(p.vecs_per_thread):
            block = self.block(cp, k)
            if row_ok and block < p.N // p.vec:
                gC = cute.zipped_divide(rope.mCos[token, None], (p.vec,))
                gS = cute.zipped_divide(rope.mSin[token, None], (p.vec,))
                cute.copy(atom, gC[None, block], tCr[(None, k), 0, 0])
                cute.copy(atom, gS[None, block], tSr[(None, k), 0, 0])
        return tCr, tSr

    @cute.jit
    def other_half(self, tVr, tPr, cp: RowCopy, k: cutlass.Constexpr[int]):
        """The values D/2 columns away from copy k of ``tVr`` (fp32 values, or 32-bit words of
        packed 16-bit ones): in this thread (two copies a lane, ``D / 2`` a multiple of a row's
        lanes' copies), or one shuffle a register from the lane ``D / (2 * vec)`` away in the
        row, staged in ``tPr``."""
        p = self.plan
        half = p.N // (2 * p.vec)  # copies in half a row
        if cutlass.const_expr(half % p.threads_per_row == 0 and p.vecs_per_thread > 1):
            kk = (k + half // p.threads_per_row) % p.vecs_per_thread
            other = tVr[(None, kk), 0, 0].load()
        else:
            lane = cute.arch.lane_idx()
            src = cutlass.select_(self.block(cp, k) < half, lane + half, lane - half)
            for i in cutlass.range_constexpr(cute.size(tVr, mode=[0, 0])):
                tPr[(i, k), 0, 0] = cute.arch.shuffle_sync(tVr[(i, k), 0, 0], src)
            other = tPr[(None, k), 0, 0].load()
        return other


class RMSNormQkRopeForward(RowHalves, RMSNormForward):
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
        tidx, bidx, gdim, cp = self.start(mQ)
        tXrX = cp.fragment(mQ)
        zero = Float32(0.0)
        if bidx < q_ctas:
            a = ForwardArgs(mQ, mWq, mQo, mRq, eps, zero, None, None,
                            rope=Rope(mCos, mSin, heads_q))
            self.rows(a, self.thread(tidx, bidx, q_ctas), cp, tXrX, None)
        else:
            a = ForwardArgs(mK, mWk, mKo, mRk, eps, zero, None, None,
                            rope=Rope(mCos, mSin, heads_k))
            self.rows(a, self.thread(tidx, bidx - q_ctas, gdim - q_ctas), cp, tXrX, None)

    # tiles whose cos and sin tile_group loads ahead of their use: with x, then each next one
    # after a tile's store (both tiles up front took 55 registers against 48: 9 CTAs an SM, not 10)
    epilogue_ahead = 1

    @cute.jit
    def epilogue_loads(self, a: ForwardArgs, cp: RowCopy, tile, row_ok, like):
        """The tile's cos and sin rows, in flight while earlier work goes on."""
        row = cp.tXcX[(0, 0), 0, 0][0] + tile * self.plan.rows_per_cta
        return self.tables(cp, a.rope, row // a.rope.heads, row_ok, like)

    @cute.jit
    def store_chunk(self, cp: RowCopy, a: ForwardArgs, tile, c: cutlass.Constexpr[int], tXrX,
                    rstd: Float32, tWrW, row_ok, scale=None, pre=None):
        """The row's normalized values rounded to x's dtype (the norm's output), rotated with
        its token's cos and sin (each product and the sum rounded to x's dtype), stored; the
        tables from ``pre`` where ``tile_group`` loaded them ahead."""
        p = self.plan
        y = self.normalize(tXrX.load().to(Float32), rstd, tWrW, a.offset)
        if cutlass.const_expr(pre is None):
            pre = self.epilogue_loads(a, cp, tile, row_ok, tXrX)
        tCr, tSr = pre
        tOr = cute.make_fragment_like(tXrX)
        if cutlass.const_expr(self.x_type == Float32):
            self.rotate_fp32(cp, y, tCr, tSr, tOr)
        else:
            self.rotate_packed(cp, y, tCr, tSr, tOr)
        if row_ok:
            cute.copy(cp.tiled, tOr, cp.dst(a.mY, tile, c), pred=cp.column_predicate(c))

    @cute.jit
    def rotate_fp32(self, cp: RowCopy, y, tCr, tSr, tOr):
        """``tOr`` <- y * cos + rotate_half(y) * sin on fp32 rows, the products as mul.rn, which
        the compiler never fuses into the sum."""
        p = self.plan
        tYr = cute.make_fragment_like(tOr, Float32)
        tYr.store(y)
        tPr = cute.make_fragment_like(tYr)
        for k in cutlass.range_constexpr(p.vecs_per_thread):
            # rotate_half: -y of the second half for the first, y of the first for the second
            sign = cutlass.select_(self.block(cp, k) < p.N // (2 * p.vec), Float32(-1.0),
                                   Float32(1.0))
            tPr[(None, k), 0, 0].store(self.other_half(tYr, tPr, cp, k) * sign)
            for i in cutlass.range_constexpr(p.vec):
                tOr[(i, k), 0, 0] = (mul_rn(tYr[(i, k), 0, 0], tCr[(i, k), 0, 0])
                                     + mul_rn(tPr[(i, k), 0, 0], tSr[(i, k), 0, 0]))

    @cute.jit
    def rotate_packed(self, cp: RowCopy, y, tCr, tSr, tOr):
        """The same on 16-bit rows, two values a 32-bit word: y rounded to x's dtype (the norm's
        output), the other half's words shuffled, its sign flipped in the first half (an xor of
        the sign bits: exact), then each product and the sum rounded to x's dtype by packed
        ``mul.rn`` / ``add.rn`` (device/arith.py: eager torch's rounding, bit for bit)."""
        p = self.plan
        kind = "bf16x2" if self.x_type == cutlass.BFloat16 else "f16x2"
        tYr = cute.make_fragment_like(tOr)
        tYr.store(y.to(self.x_type))
        yw, cw, sw, ow = (cute.recast_tensor(t, Uint32) for t in (tYr, tCr, tSr, tOr))
        tPr = cute.make_fragment_like(yw)
        for k in cutlass.range_constexpr(p.vecs_per_thread):
            flip = cutlass.select_(self.block(cp, k) < p.N // (2 * p.vec), Uint32(0x80008000),
                                   Uint32(0))
            tPr[(None, k), 0, 0].store(self.other_half(yw, tPr, cp, k))
            for i in cutlass.range_constexpr(p.vec // 2):
                ow[(i, k), 0, 0] = sum_of_products_x2(yw[(i, k), 0, 0], cw[(i, k), 0, 0],
                                                      tPr[(i, k), 0, 0] ^ flip,
                                                      sw[(i, k), 0, 0], kind)


@dataclasses.dataclass(frozen=True)
class HeadRows:
    """One tensor's part of the backward, at trace time: the gradient at its output, its input,
    rstd, the gradient at its input (written), its weight's registers, its dW accumulator and
    the heads a token."""
    mDy: cute.Tensor
    mX: cute.Tensor
    mRstd: cute.Tensor
    mDx: cute.Tensor
    tWrW: cute.Tensor
    tAcc: cute.Tensor
    heads: Int32


#: The backward's persistent grid fills an SM with this many threads: 5 CTAs of 128 (16-bit
#: rows take 87-96 registers), 2 of 256 (fp32 rows of 256: 117-122); the CPU tests hold the
#: registers to that. A grid of more CTAs than are resident would run its strips in a second
#: wave, after the first's.
BACKWARD_THREADS_PER_SM = 640


def backward_ctas_per_sm(plan: ForwardPlan) -> int:
    """The backward's CTAs an SM: its grid's multiple."""
    return max(1, BACKWARD_THREADS_PER_SM // plan.threads)


class RMSNormQkRopeBackward(RowHalves, RowTiles):
    """The backward of q's and k's rows in one launch: a persistent grid, CTA g walking strip g
    of the tokens, q's rows of the strip then k's (a token's heads are consecutive rows, so a
    strip's rows of each are one run), ``rows_per_cta`` at a time, the next tile's dy, x, cos,
    sin and rstd loaded while this one is worked on. A row's gradient goes back through the
    rotation first, in fp32 (reference.rope_backward: ``dy·cos`` plus the other half's
    ``dy·sin``, added in the first half and subtracted in the second), then through the norm
    (reference.rms_norm_backward); a tensor's dW stays in registers for its run, is summed over
    the CTA's rows in a fixed order and written as row g of its partial (``dw_reduce`` sums the
    rows: dW is bitwise reproducible)."""

    def __init__(self, plan: ForwardPlan):
        assert plan.chunks == 1 and plan.threads_per_row <= 32
        self.plan = plan
        self.x_type = TORCH_TO_CUTE[plan.x_dtype]
        self.w_type = TORCH_TO_CUTE[plan.w_dtype]

    @cute.jit
    def __call__(self, gDq: cute.Tensor, gDk: cute.Tensor, gQ: cute.Tensor, gK: cute.Tensor,
                 gWq: cute.Tensor, gWk: cute.Tensor, gCos: cute.Tensor, gSin: cute.Tensor,
                 gRq: cute.Tensor, gRk: cute.Tensor, gDqx: cute.Tensor, gDkx: cute.Tensor,
                 gP: cute.Tensor, heads_q: Int32, heads_k: Int32, grid: Int32,
                 stream: cuda.CUstream):
        """Host side: the outputs' gradients, q, k and the inputs' gradients as (rows, D)
        head rows, cos and sin (T, D), rstd (rows,), the partial rows (grid, 2D) fp32: q's
        weight's in the first D columns, k's in the rest (one ``DwReducePair`` sums both)."""
        p = self.plan
        Mq, Mk = Int32(gQ.shape[0]), Int32(gK.shape[0])
        T = Int32(gCos.shape[0])
        rows = [self.row_tensor(g, M) for g, M in ((gDq, Mq), (gDk, Mk), (gQ, Mq), (gK, Mk),
                                                   (gDqx, Mq), (gDkx, Mk))]
        weights = [cute.make_tensor(g.iterator, cute.make_layout((p.rows_per_cta, p.N),
                                                                 stride=(0, 1)))
                   for g in (gWq, gWk)]
        rstd = [cute.make_tensor(g.iterator, cute.make_layout((M,)))
                for g, M in ((gRq, Mq), (gRk, Mk))]
        partial = [cute.make_tensor(gP.iterator + side * p.N,
                                    cute.make_layout((grid, p.N), stride=(2 * p.N, 1)))
                   for side in (0, 1)]
        warps = p.threads // 32
        self.kernel(*rows, *weights, self.row_tensor(gCos, T), self.row_tensor(gSin, T), *rstd,
                    *partial, heads_q, heads_k).launch(
            grid=[grid, 1, 1], block=[p.threads, 1, 1], smem=warps * p.N * 4, stream=stream,
            use_pdl=p.pdl)

    @cute.kernel
    def kernel(self, mDq: cute.Tensor, mDk: cute.Tensor, mQ: cute.Tensor, mK: cute.Tensor,
               mDqx: cute.Tensor, mDkx: cute.Tensor, mWq: cute.Tensor, mWk: cute.Tensor,
               mCos: cute.Tensor, mSin: cute.Tensor, mRq: cute.Tensor, mRk: cute.Tensor,
               mPq: cute.Tensor, mPk: cute.Tensor, heads_q: Int32, heads_k: Int32):
        p = self.plan
        tidx, bidx, gdim, cp = self.start(mQ)
        start, end = strip_rows(mCos.shape[0], bidx, gdim)
        smem = SmemAllocator()
        sDw = smem.allocate_tensor(Float32, cute.make_layout((p.threads // 32, p.N)),
                                   byte_alignment=16)
        for mDy, mX, mR, mDx, mW, mP, heads in ((mDq, mQ, mRq, mDqx, mWq, mPq, heads_q),
                                                (mDk, mK, mRk, mDkx, mWk, mPk, heads_k)):
            tAcc = cp.fragment(mX, Float32)
            tAcc.fill(0.0)
            part = HeadRows(mDy, mX, mR, mDx, cp.weight(mW, 0), tAcc, heads)
            rope = Rope(mCos, mSin, heads)
            first, last = start * heads, end * heads  # the strip's rows of this tensor
            tiles = self.tile_loads(cp, part, rope, first, last, tidx)
            for row0 in cutlass.range(first, last, p.rows_per_cta):
                ahead = self.tile_loads(cp, part, rope, row0 + p.rows_per_cta, last, tidx)
                self.head_rows(cp, part, tiles, row0, last, tidx)
                for now, nxt in zip(tiles, ahead):  # the next tile's registers become this one's
                    now.store(nxt.load())
            self.write_partial(cp, tAcc, sDw, mP, bidx, tidx)

    @cute.jit
    def tile_loads(self, cp: RowCopy, part: HeadRows, rope: Rope, row0, last, tidx):
        """Registers of the tile of rows from ``row0`` (those before ``last``): dy, x, their
        tokens' cos and sin, rstd (zeros past ``last``)."""
        p = self.plan
        row = row0 + tidx // p.threads_per_row
        row_ok = row < last
        tDyr, tXr = cp.fragment(part.mX), cp.fragment(part.mX)
        cp.load_rows((part.mDy, part.mX), (tDyr, tXr), row0, 0, row_ok)
        tCr, tSr = self.tables(cp, rope, row // rope.heads, row_ok, tXr)
        tRr = cute.make_rmem_tensor(cute.make_layout(1), Float32)
        tRr[0] = Float32(0.0)
        if row_ok:
            tRr[0] = part.mRstd[row]
        return tDyr, tXr, tCr, tSr, tRr

    @cute.jit
    def head_rows(self, cp: RowCopy, part: HeadRows, tiles, row0, last, tidx):
        """The tile of rows from ``row0`` (``tiles``: its registers, from ``tile_loads``):
        rope's transpose, then the norm's backward; dx stored, dW accumulated."""
        p = self.plan
        tDyr, tXr, tCr, tSr, tRr = tiles
        pred = cp.column_predicate(0, row0 + tidx // p.threads_per_row < last)
        rstd = tRr[0]
        dy = tDyr.load().to(Float32)
        tGs = cute.make_fragment_like(tXr, Float32)  # dy * sin, whose other half each copy takes
        tGs.store(dy * tSr.load().to(Float32))
        tPr = cute.make_fragment_like(tGs)
        tG = cute.make_fragment_like(tGs)
        for k in cutlass.range_constexpr(p.vecs_per_thread):
            first = self.block(cp, k) < p.N // (2 * p.vec)
            other = self.other_half(tGs, tPr, cp, k)
            sign = cutlass.select_(first, Float32(1.0), Float32(-1.0))
            tG[(None, k), 0, 0].store(tDyr[(None, k), 0, 0].load().to(Float32)
                                      * tCr[(None, k), 0, 0].load().to(Float32) + sign * other)
        g = tG.load()
        w = part.tWrW.load().to(Float32)
        mode = p.casting_mode
        m = g * w
        if cutlass.const_expr(mode == "none"):
            m = (g * w.to(self.x_type).to(Float32)).to(self.x_type).to(Float32)
        x_hat = tXr.load().to(Float32) * rstd
        dot = row_sum((m * x_hat).reduce(cute.ReductionOp.ADD, Float32(0.0),
                                         reduction_profile=0),
                      None, 0, tidx // p.threads_per_row, 0, tidx % 32, 1, p.threads_per_row)
        tDxr = cute.make_fragment_like(tXr)
        tDxr.store((rstd * (m - x_hat * (dot / Float32(p.N)))).to(self.x_type))
        cute.copy(cp.tiled, tDxr, cp.thr.partition_D(cp.tile_at(part.mDx, row0, 0)), pred=pred)
        x_hat_w = x_hat
        if cutlass.const_expr(mode != "gemma"):
            x_hat_w = x_hat.to(self.x_type).to(Float32)
        part.tAcc.store(part.tAcc.load() + g * x_hat_w)

    @cute.jit
    def write_partial(self, cp: RowCopy, tAcc, sDw, mP, bidx, tidx):
        """Row ``bidx`` of the partial ``mP`` <- the sum of the CTA's rows' accumulators: the row
        groups of a warp by shuffles, then the warps through shared memory, in a fixed order."""
        p = self.plan
        tpr = p.threads_per_row
        for i in cutlass.range_constexpr(cute.size(tAcc)):
            total = tAcc[i]
            for s in cutlass.range_constexpr(5):
                if cutlass.const_expr((16 >> s) >= tpr):
                    total = total + cute.arch.shuffle_sync_bfly(total, offset=16 >> s)
            tAcc[i] = total
        warp, lane = tidx // 32, tidx % 32
        if lane < tpr:
            for k in cutlass.range_constexpr(p.vecs_per_thread):
                col = cp.tXcX[(0, k), 0, 0][1]
                if col < p.N:
                    for e in cutlass.range_constexpr(p.vec):
                        sDw[warp, col + e] = tAcc[(e, k), 0, 0]
        cute.arch.sync_threads()
        if warp == 0 and lane < tpr:
            for k in cutlass.range_constexpr(p.vecs_per_thread):
                col = cp.tXcX[(0, k), 0, 0][1]
                if col < p.N:
                    for e in cutlass.range_constexpr(p.vec):
                        dw = Float32(0.0)
                        for w in cutlass.range_constexpr(p.threads // 32):
                            dw = dw + sDw[w, col + e]
                        mP[bidx, col + e] = dw
        cute.arch.sync_threads()
