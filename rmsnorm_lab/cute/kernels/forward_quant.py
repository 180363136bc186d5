"""The forward's quantizing epilogues: y written for the GEMM that reads it, by the row,
warp-per-row and fallback kernels of forward.py (their tiles, their sums, another store).

* ``RMSNormFp8Forward`` (``plan.quant`` ``static`` or ``token``): float8_e4m3fn. y rounded to x's
  dtype, then multiplied by the inverse of a static scale, or divided by the row's own scale
  (its amax of ``|y|`` over 448: one more row reduction, and over column chunks one more pass;
  the chunk in registers keeps y from the amax to the store); NaN to +448 and the convert
  saturating (reference.quantize_fp8).
* ``RMSNormNvfp4Forward`` (``plan.quant == "nvfp4"``, Blackwell): e2m1 values with an e4m3 scale
  a block of 16, a block's two halves in neighbouring lanes (reference.quantize_nvfp4).

``QuantEpilogue`` holds the steps both read; forward.py's schedules call them where the plan
quantizes.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint32

from ...reference import FP8_MAX, FP8_MIN_SCALE
from ..device.arith import (constant_reciprocals, div_rn, div_to_e4m3, halves_max, max_x2,
                            min_x2, reciprocal_rn, reciprocals, round_mul_x2, unpack_x2)
from ..device.tiles import RowCopy
from ..plan.forward import ForwardPlan
from .forward import ForwardArgs, RMSNormForward

#: fp32's largest finite value: the per-token divisor's bound (``token_scale``)
FP32_MAX = 3.4028234663852886e38
#: ``reciprocals`` of 448, the divisor of a row's amax (``token_scale``)
BY_FP8_MAX = constant_reciprocals(FP8_MAX)


class QuantEpilogue:
    """Mixin of RMSNormForward: the per-thread, per-row and per-chunk steps of the
    quantizing stores."""

    @cute.jit
    def tensor_scale(self, a: ForwardArgs):
        """Once a thread: the static fp8 scale or NVFP4's global scale, as loaded; None
        otherwise."""
        scale = None
        if cutlass.const_expr(self.plan.quant in ("static", "nvfp4")):
            scale = a.mScale[0]
        return scale

    @cute.jit
    def scale_multiplier(self, loaded):
        """``1 / scale`` of a static fp8 scale (IEEE, ``rcp.rn``); any other scale as given.
        Taken where a chunk is stored, after w's loads: the reciprocal's slow path branches on
        the scale, and a branch ahead of x's or w's loads would hold them back until the scale
        arrives."""
        if cutlass.const_expr(self.plan.quant == "static"):
            loaded = reciprocal_rn(loaded)
        return loaded

    @cute.jit
    def store_nvfp4(self, cp: RowCopy, mQ, mBlockScales, tile, c: cutlass.Constexpr[int], tXrX,
                    y, global_scale: Float32, row_ok):
        """Column chunk c of y as NVFP4 (reference.quantize_nvfp4). A copy is 8 values, half a
        block of 16, and the lane beside holds the other half: their amax meets by one shuffle,
        the block's e4m3 scale is ``min(global_scale * amax * fp32(1/6), 448)``, the values
        ``e2m1(y * (global_scale / scale))`` (0 where the scale is), NaN to +6. The lane of the
        block's first half stores the scale (swizzled: reference.nvfp4_scale_offset), each lane
        its 8 values as one 32-bit word."""
        p = self.plan
        tYr = cute.make_fragment_like(tXrX, Float32)
        tYr.store(y.to(self.x_type).to(Float32))
        tQr = cute.make_fragment_like(tXrX, self.y_type)
        blocks_per_row = p.N // 16
        k_tiles = (blocks_per_row + 3) // 4
        for k in cutlass.range_constexpr(p.vecs_per_thread):
            half = tYr[(None, k), 0, 0].load()
            mag = cute.where(half == half, cute.math.abs(half), Float32(0.0))
            amax = mag.reduce(cute.ReductionOp.MAX, Float32(0.0), reduction_profile=0)
            amax = cute.arch.fmax(amax, cute.arch.shuffle_sync_bfly(amax, offset=1))
            sf = cute.arch.fmin(global_scale * amax * Float32(1.0 / 6.0), Float32(448.0))
            sf8 = sf.to(cutlass.Float8E4M3FN)
            sff = sf8.to(Float32)
            inv = Float32(0.0)
            if sff != Float32(0.0):
                inv = global_scale / sff
            v = half * inv
            tQr[(None, k), 0, 0].store(cute.where(v == v, v, Float32(6.0)).to(self.y_type))
            row, col = cp.tXcX[(0, k), 0, 0]
            row = row + tile * p.rows_per_cta
            col = col + c * p.cols_per_tile
            if row_ok and col < p.N:
                block = col // 16
                if col % 16 == 0:
                    mBlockScales[((row // 128) * k_tiles + block // 4) * 512 + (row % 32) * 16
                                 + (row % 128) // 32 * 4 + block % 4] = sf8
                words = cute.recast_tensor(tQr[(None, k), 0, 0], cutlass.Uint32)
                mQ[row, col // 8] = words[0]

    def word_kind(self):
        """The PTX kind of two 16-bit values a word of x's dtype; None for fp32 x, and for the
        fallback's copies of one value."""
        if self.x_type.width != 16 or self.plan.vec % 2:
            return None
        return "bf16x2" if self.x_type is cutlass.BFloat16 else "f16x2"

    @cute.jit
    def unpacked(self, tXrX, k: cutlass.Constexpr[int]):
        """Copy k of a register chunk of x's dtype, in fp32: two values a word (``unpack_x2``)."""
        tYf = cute.make_fragment_like(tXrX[(None, k), 0, 0], Float32)
        if cutlass.const_expr(self.word_kind() is None):
            tYf.store(tXrX[(None, k), 0, 0].load().to(Float32))
        else:
            words = cute.recast_tensor(tXrX[(None, k), 0, 0], Uint32)
            for i in cutlass.range_constexpr(cute.size(words)):
                tYf[2 * i] = unpack_x2(words[i], self.word_kind(), False)
                tYf[2 * i + 1] = unpack_x2(words[i], self.word_kind(), True)
        return tYf

    @cute.jit
    def sum_of_squares(self, tXrX) -> Float32:
        """This thread's share of the row's sum of squares, in fp32, over one register chunk,
        value after value (``unpacked``)."""
        ss = Float32(0.0)
        for k in cutlass.range_constexpr(self.plan.vecs_per_thread):
            xf = self.unpacked(tXrX, k)
            for i in cutlass.range_constexpr(cute.size(xf)):
                ss = xf[i] * xf[i] + ss
        return ss

    @cute.jit
    def round_y(self, tXrX, rstd: Float32, tWrW, offset: Float32):
        """Registers ``tXrX`` <- y rounded to x's dtype, where they held x (or h). In the mode
        "llama" with 16-bit x and w and no offset (``plan.offset``, known at compile time), the
        fp32 product of two 16-bit values is exact, so the product rounded to x's dtype is
        ``mul.rn`` on two values a word (``round_mul_x2``): the same rounding, in fewer
        instructions."""
        p = self.plan
        if cutlass.const_expr(p.casting_mode == "llama" and self.word_kind() is not None
                              and self.w_type is self.x_type and not p.offset):
            for k in cutlass.range_constexpr(p.vecs_per_thread):
                xf = self.unpacked(tXrX, k)
                words = cute.recast_tensor(tXrX[(None, k), 0, 0], Uint32)
                wwords = cute.recast_tensor(tWrW[(None, k), 0, 0], Uint32)
                for i in cutlass.range_constexpr(cute.size(words)):
                    words[i] = round_mul_x2(xf[2 * i] * rstd, xf[2 * i + 1] * rstd, wwords[i],
                                            self.word_kind())
        else:
            tXrX.store(self.normalize(tXrX.load().to(Float32), rstd, tWrW, offset)
                       .to(self.x_type))

    @cute.jit
    def chunk_amax(self, tXrX, rstd: Float32, tWrW, offset: Float32) -> Float32:
        """This thread's largest ``|y|`` over one register chunk, which then holds y rounded to
        x's dtype (``store_fp8`` quantizes it from there); NaN passed over (``max.f32``, as
        vLLM's ``fmaxf``); padding columns hold x = 0 and so y = 0. 16-bit values are compared
        two a word: the largest and the smallest of each lane, ``max(hi, -lo)`` at the end."""
        self.round_y(tXrX, rstd, tWrW, offset)
        amax = Float32(0.0)
        if cutlass.const_expr(self.word_kind() is not None):
            words = cute.recast_tensor(tXrX, Uint32)
            hi, lo = words[0], words[0]
            for i in cutlass.range_constexpr(1, cute.size(words)):
                hi = max_x2(hi, words[i], self.word_kind())
                lo = min_x2(lo, words[i], self.word_kind())
            amax = cute.arch.fmax(amax, cute.arch.fmax(halves_max(hi, self.word_kind()),
                                                       halves_max(lo, self.word_kind(), True)))
        else:
            for i in cutlass.range_constexpr(cute.size(tXrX)):
                amax = cute.arch.fmax(amax, cute.math.abs(tXrX[i]))
        return amax

    @cute.jit
    def token_scale(self, a: ForwardArgs, amax: Float32, row, writes):
        """A row's fp8 scale, ``max(min(amax, scale_ub) / 448, 1 / (448 * 512))`` (the IEEE
        quotient, ``div_rn``), stored to ``mScale[row]`` by the thread for which ``writes``
        holds; returned as the divisor ``store_fp8`` takes, with its ``reciprocals``. Without a
        bound the divisor is at most fp32's largest finite value, its reciprocals still those
        of s: in a row holding an infinity (s infinite, 1 / s zero) the finite values then
        divide to zeros and the infinities to NaN, as by infinity, and ``div_rn`` needs no test
        of its remainder."""
        if cutlass.const_expr(self.plan.scale_ub):
            amax = cute.arch.fmin(amax, a.mScaleUb[0])
        by_448 = tuple(Float32(v) for v in BY_FP8_MAX)
        s = cute.arch.fmax(div_rn(amax, Float32(FP8_MAX), by_448),
                           Float32(FP8_MIN_SCALE))
        if writes:
            a.mScale[row] = s
        s_finite = cute.arch.fmin(s, Float32(FP32_MAX))
        recip = reciprocals(s, s_finite)
        if cutlass.const_expr(self.plan.scale_ub):
            return s, recip
        return s_finite, recip

    def short_division(self) -> bool:
        """Per token, does y divide as ``div_to_e4m3`` (two instructions a value)? For 16-bit
        x without an amax bound: the pairs of y and scale checked against the IEEE quotient.
        fp32 y (24 bits) and a bounded scale (any fp32) keep ``div_rn``'s corrected quotient."""
        return self.x_type.width == 16 and not self.plan.scale_ub

    @cute.jit
    def store_fp8(self, cp: RowCopy, mQ, tile, c: cutlass.Constexpr[int], tXrX, scale, row_ok):
        """Column chunk c of y, in registers ``tXrX`` in x's dtype (``round_y``), as fp8: times
        the static scale's inverse, or divided by the row's scale (``scale``: the pair
        ``token_scale`` returns; ``div_rn``, the IEEE quotient, or ``div_to_e4m3`` where
        ``short_division`` holds: the same code); NaN to +448 (``min.f32``
        passes over it), the rest saturated to +-448 by the convert (``cvt.rn.satfinite``),
        rounded to nearest even."""
        p = self.plan
        tXrQ = cute.make_fragment_like(tXrX, self.y_type)
        for k in cutlass.range_constexpr(p.vecs_per_thread):  # a copy at a time: fewer live
            tYf = self.unpacked(tXrX, k)
            for i in cutlass.range_constexpr(p.vec):
                if cutlass.const_expr(p.quant == "token" and self.short_division()):
                    v = div_to_e4m3(tYf[i], scale[1])
                elif cutlass.const_expr(p.quant == "token"):
                    v = div_rn(tYf[i], scale[0], scale[1], finite=not p.scale_ub)
                else:
                    v = tYf[i] * scale
                tYf[i] = cute.arch.fmin(v, Float32(FP8_MAX))
            tXrQ[(None, k), 0, 0].store(tYf.load().to(self.y_type))
        store = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.y_type,
                                    num_bits_per_copy=p.vec * self.y_type.width)
        if cutlass.const_expr(p.stream_y):
            store = self.streaming_store()
        if row_ok:
            cute.copy(store, tXrQ, cp.dst(mQ, tile, c), pred=cp.column_predicate(c))


class RMSNormFp8Forward(QuantEpilogue, RMSNormForward):
    """y written as float8_e4m3fn (``plan.quant``), with or without the fused residual add: one
    signature for both, the residual's tensors and the amax bound stand-ins where the plan has
    none (the kernel never reads them)."""

    def __init__(self, plan: ForwardPlan):
        assert plan.quant
        super().__init__(plan)

    @cute.jit
    def __call__(self, gX: cute.Tensor, gR: cute.Tensor, gW: cute.Tensor, gQ: cute.Tensor,
                 gH: cute.Tensor, gScale: cute.Tensor, gScaleUb: cute.Tensor, grid: Int32,
                 eps: Float32, offset: Float32, stream: cuda.CUstream):
        """Host side: x, the residual, h (x's dtype) and q (fp8) arrive as (M, N):(ld, 1) rows;
        ``gScale`` the static scale (read) or the per-token scales (written, one a row)."""
        p = self.plan
        self.launch(gX, gW, gQ, None, gR if p.residual else None, gH if p.residual else None,
                    grid, eps, offset, stream, gScale, gScaleUb if p.scale_ub else None)


class RMSNormNvfp4Forward(QuantEpilogue, RMSNormForward):
    """y written as NVFP4 for a Blackwell block-scaled GEMM (``plan.quant == "nvfp4"``), with or
    without the fused residual add (stand-ins where the plan has none, as the fp8 output's)."""

    def __init__(self, plan: ForwardPlan):
        assert plan.quant == "nvfp4"
        super().__init__(plan)

    @cute.jit
    def __call__(self, gX: cute.Tensor, gR: cute.Tensor, gW: cute.Tensor, gQ: cute.Tensor,
                 gH: cute.Tensor, gGlobalScale: cute.Tensor, gBlockScales: cute.Tensor,
                 grid: Int32, eps: Float32, offset: Float32, stream: cuda.CUstream):
        """Host side: x, the residual and h as (M, N):(ld, 1) rows, q as (M, N/8) 32-bit words
        (8 e2m1 values each), the global scale one fp32, the block scales the swizzled bytes."""
        p = self.plan
        self.launch(gX, gW, gQ, None, gR if p.residual else None, gH if p.residual else None,
                    grid, eps, offset, stream, gGlobalScale, None, gBlockScales)
