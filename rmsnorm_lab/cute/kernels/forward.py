"""CuTe DSL RMSNorm forward: one kernel class for four variants chosen by the plan, its fused
residual add, and one class for rows split over a thread-block cluster.

* ``row``        one CTA per row; the row lives in registers between the reduction and the store.
* ``persistent`` the same tile, but the grid is sized from the SM count and each CTA loops over
                 rows (the weight stays in registers across rows).
* ``warp``       one warp per row, several rows per CTA: the reduction is shuffles only, with no
                 shared memory and no CTA barrier. Rows of one copy a lane come several tiles
                 to a CTA, every tile's loads issued before the first is reduced.
* ``fallback``   one element per copy with column predication: any width, any alignment.
* ``cluster``    (``RMSNormClusterForward``) a row too wide for one CTA's registers over the CTAs
                 of a cluster, their partial sums exchanged through distributed shared memory.

The row, warp and fallback kernels also write y quantized for the GEMM that reads it, fp8 or
NVFP4 (``plan.quant``): the same schedules with another store, forward_quant.py.

``RMSNormForward.kernel`` runs one of two schedules: ``tile_group`` (several tiles of short rows
a CTA) or ``tile_loop`` (tile after tile). Rows wider than the register budget
(``plan.chunks > 1``), and rows of 16 KB (see plan/forward.py), stream through registers in
column chunks: one pass for the sum of squares, a second pass to normalize that starts from the
last chunk, still in registers, and re-reads the others (from L2); ``chunk_steps`` orders both
passes' loads.

Naming follows the CUTLASS examples: ``mX`` whole tensor, ``gX`` this CTA's tile, ``tXgX`` this
thread's slice of it, ``tXrX`` its registers, ``tXcX`` the coordinates of those elements.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass.memory import SmemAllocator
from cutlass import Float32, Int32

from ..device.cluster_sum import ClusterRows
from ..device.pdl import wait_for_previous_grid
from ..plan.forward import ForwardPlan
from ..device.reduce import row_max, row_sum, row_sum_bytes, row_sum_slots
from ..device.tiles import EVICT, RowCopy, RowThread, RowTiles
from ..dtypes import TORCH_TO_CUTE


@dataclasses.dataclass(frozen=True)
class ForwardArgs:
    """The kernel's arguments, at trace time, for its schedules (the part of CUTLASS's kernel
    ``Params`` a launch fills): x, w, y, rstd, eps, the weight's offset, the fused add's
    residual and h, and the quantizing stores' scales (forward_quant.py): fp8's scale (static:
    read, one element; per token: written, one a row) and its amax bound, NVFP4's global scale
    and block scales (each tensor None where the plan has none); q/k-norm's rotary embedding."""

    mX: cute.Tensor
    mW: Optional[cute.Tensor]
    mY: cute.Tensor
    mRstd: Optional[cute.Tensor]
    eps: Float32
    offset: Float32
    mR: Optional[cute.Tensor]
    mH: Optional[cute.Tensor]
    mScale: Optional[cute.Tensor] = None
    mScaleUb: Optional[cute.Tensor] = None
    mBlockScales: Optional[cute.Tensor] = None
    #: the rotary embedding applied before the store (qk_rope.py's ``Rope``), or None
    rope: Any = None


class RMSNormForward(RowTiles):
    """``__call__`` is the host side (builds tensors, launches); ``kernel`` is the device body."""
    epilogue_ahead = 0  # tile_group's tiles whose epilogue inputs a subclass loads ahead

    def __init__(self, plan: ForwardPlan):
        self.plan = plan
        self.x_type = TORCH_TO_CUTE[plan.x_dtype]
        self.w_type = TORCH_TO_CUTE[plan.w_dtype] if plan.w_dtype is not None else None
        self.y_type = {"": self.x_type, "nvfp4": cutlass.Float4E2M1FN}.get(
            plan.quant, cutlass.Float8E4M3FN)
        self.warps_per_row = max(plan.threads_per_row // 32, 1)
        # a CTA's tiles (tile_group) hold one chunk each and are not a persistent strip
        assert plan.tiles_per_cta == 1 or (plan.chunks == 1 and not plan.persistent)

    @cute.jit
    def __call__(self, gX: cute.Tensor, gW: cute.Tensor, gY: cute.Tensor, gRstd: cute.Tensor,
                 grid: Int32, eps: Float32, offset: Float32, stream: cuda.CUstream):
        """Host side. The arguments arrive with dynamic layouts ((M, N):(ld, 1) for x and y), so
        one compilation serves every M and row stride, whatever marshaled them (TVM-FFI,
        from_dlpack, fake tensors); the layouts the kernel indexes are rebuilt here with N static
        and the row strides' divisibility made known to the compiler (``row_tensor``)."""
        self.launch(gX, gW, gY, gRstd, None, None, grid, eps, offset, stream)

    def weight_and_rstd(self, gW, gRstd, M):
        """``(mW, mRstd)``: the weight seen as a (rows_per_cta, N) tensor with row stride 0 (every
        row of the tile reads the same vector, and the tiled copy partitions it like x), and
        rstd as (M,); each None where the kernel has none."""
        p = self.plan
        mW = None
        if cutlass.const_expr(self.w_type is not None):
            mW = cute.make_tensor(gW.iterator,
                                  cute.make_layout((p.rows_per_cta, p.N), stride=(0, 1)))
        mRstd = None
        if cutlass.const_expr(p.store_rstd):
            mRstd = cute.make_tensor(gRstd.iterator, cute.make_layout((M,)))
        return mW, mRstd

    def tensors(self, gX, gW, gY, gRstd):
        """``(M, mX, mW, mY, mRstd)``: the row count and the kernel's tensors (``row_tensor``,
        ``weight_and_rstd``), what every forward's launch builds first."""
        M = Int32(gX.shape[0])
        mW, mRstd = self.weight_and_rstd(gW, gRstd, M)
        return M, self.row_tensor(gX, M), mW, self.row_tensor(gY, M), mRstd

    def launch(self, gX, gW, gY, gRstd, gR, gH, grid, eps, offset, stream, gScale=None,
               gScaleUb=None, gBlockScales=None):
        """Builds the kernel's tensors and launches it (traced inside a ``cute.jit`` host
        function; ``gR``/``gH``: the fused add's residual and h, ``gScale``/``gScaleUb``: the
        fp8 output's scale(s) and amax bound, ``gBlockScales`` NVFP4's, or None)."""
        p = self.plan
        M, mX, mW, mY, mRstd = self.tensors(gX, gW, gY, gRstd)
        mR = self.row_tensor(gR, M) if gR is not None else None
        mH = self.row_tensor(gH, M) if gH is not None else None
        mScale = mScaleUb = None
        if cutlass.const_expr(p.quant):
            mScale = cute.make_tensor(gScale.iterator, cute.make_layout(
                (M,) if p.quant == "token" else (1,)))
        if cutlass.const_expr(p.scale_ub):
            mScaleUb = cute.make_tensor(gScaleUb.iterator, cute.make_layout((1,)))
        mBlockScales = None
        if cutlass.const_expr(p.quant == "nvfp4"):
            # y as 32-bit words of 8 e2m1 values, a copy's worth; the scales as bytes
            ld = cute.assume(Int32(gY.stride[0]), divby=p.vec // 8)
            mY = cute.make_tensor(gY.iterator, cute.make_layout((M, p.N // 8), stride=(ld, 1)))
            mBlockScales = gBlockScales
        smem_bytes = 0
        if cutlass.const_expr(self.warps_per_row > 1):
            smem_bytes = row_sum_bytes(p.rows_per_cta, self.warps_per_row)
        # A launch bound makes ptxas fit min_ctas_per_sm CTAs on an SM (the tiles of one copy a
        # chunk: 32 registers); carveout 0 leaves the SM's memory to L1, where the weight's
        # re-reads hit (the kernel needs a few bytes of shared memory).
        bounds = {}
        if cutlass.const_expr(p.min_ctas_per_sm > 0):
            bounds = dict(min_blocks_per_mp=p.min_ctas_per_sm, preferred_smem_carveout=0)
        self.kernel(mX, mW, mY, mRstd, eps, offset, mR, mH, mScale, mScaleUb,
                    mBlockScales).launch(
            grid=[grid, 1, 1], block=[p.threads, 1, 1], smem=smem_bytes, stream=stream,
            use_pdl=p.pdl, **bounds)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor, mY: cute.Tensor, mRstd: cute.Tensor,
               eps: Float32, offset: Float32, mR: cute.Tensor, mH: cute.Tensor,
               mScale: cute.Tensor, mScaleUb: cute.Tensor, mBlockScales: cute.Tensor):
        p = self.plan
        a = ForwardArgs(mX, mW, mY, mRstd, eps, offset, mR, mH, mScale, mScaleUb, mBlockScales)
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        t = self.thread(tidx, bidx, gdim)
        if cutlass.const_expr(p.pdl):
            wait_for_previous_grid()  # before any global access (device/pdl.py)

        sBuf = None
        if cutlass.const_expr(self.warps_per_row > 1):
            smem = SmemAllocator()
            sBuf = row_sum_slots(smem, p.rows_per_cta, self.warps_per_row)

        cp = self.row_copy((p.rows_per_cta, p.cols_per_tile), tidx, mX)
        self.rows(a, t, cp, cp.fragment(mX), sBuf)

    def thread(self, tidx, bidx, ctas) -> RowThread:
        """Thread ``tidx`` of CTA ``bidx`` of the ``ctas`` that share the rows."""
        tpr = self.plan.threads_per_row
        return RowThread(tidx, bidx, ctas, row=tidx // tpr, warp=(tidx % tpr) // 32,
                         lane=tidx % 32)

    @cute.jit
    def rows(self, a: ForwardArgs, t: RowThread, cp: RowCopy, tXrX, sBuf):
        """Thread ``t``'s rows of ``a``, by the schedule of the plan's tile: ``tile_group``, or
        ``tile_loop`` with the weight in registers in its own dtype (an fp32 copy of offset + w
        would double its registers), loaded before the row where the plan says so
        (``weight_up_front``), else after the reduction, for each chunk."""
        p = self.plan
        if cutlass.const_expr(p.tiles_per_cta > 1):
            self.tile_group(a, t, cp, tXrX)
        else:
            tWrW = None
            if cutlass.const_expr(self.w_type is not None and p.weight_up_front):
                tWrW = cp.weight(a.mW, 0)
            self.tile_loop(a, t, cp, tXrX, tWrW, a.mX.shape[0], sBuf)

    @cute.jit
    def tile_loop(self, a: ForwardArgs, t: RowThread, cp: RowCopy, tXrX, tWrW, M, sBuf):
        """Tile after tile, ``bidx``, ``bidx + gdim``, ... (one tile per CTA, or a persistent
        grid): the sum of squares over the row's chunks, the row sum, then the chunks again,
        normalized and stored (``chunk_steps``: the order of their loads)."""
        p = self.plan
        mX, mW, mRstd, mR, mH = a.mX, a.mW, a.mRstd, a.mR, a.mH
        num_tiles = cute.ceil_div(M, p.rows_per_cta)
        # Pipelined chunks: a second register copy takes chunk c+1's loads while chunk c is
        # used; chunk c lives in regs[c % len(regs)].
        regs = [tXrX]
        if cutlass.const_expr(p.pipeline_chunks):
            regs = [tXrX, cute.make_fragment_like(tXrX)]
        # Prefetch (persistent): the CTA's next row is loaded into a second register copy while
        # this one is reduced and stored, so every CTA keeps a row's loads in flight.
        tXrXn = None
        if cutlass.const_expr(p.prefetch):
            tXrXn = cute.make_fragment_like(tXrX)
            self.load_chunk(cp, mX, t.bidx, 0, tXrXn, t.bidx < num_tiles)
        slot = Int32(0)  # the row sum's shared-memory slot, alternating (reduce.row_sum)
        loaded_scale = self.tensor_scale(a)  # in flight with the first row's loads
        for tile in cutlass.range(t.bidx, num_tiles, t.gdim):
            row = tile * p.rows_per_cta + t.row
            row_ok = row < M
            if cutlass.const_expr(p.prefetch):
                tXrX.store(tXrXn.load())
                self.load_chunk(cp, mX, tile + t.gdim, 0, tXrXn, tile + t.gdim < num_tiles)

            # Pass 1: sum of squares (chunks == 1 keeps x in tXrX for pass 2).
            ss = Float32(0.0)
            for load, use in self.chunk_steps(list(range(p.chunks)), p.prefetch):
                if cutlass.const_expr(load is not None):
                    self.load_chunk(cp, mX, tile, load, regs[load % len(regs)], row_ok,
                                    self.first_pass_evict(load))
                if cutlass.const_expr(use is not None):
                    tXrXc = regs[use % len(regs)]
                    if cutlass.const_expr(p.residual):
                        self.add_residual(cp, mR, mH, tile, use, tXrXc, row_ok)
                    ss = ss + self.sum_of_squares(tXrXc)
            ss = row_sum(ss, sBuf, slot, t.row, t.warp, t.lane, self.warps_per_row,
                         min(p.threads_per_row, 32))
            slot = slot ^ 1
            writer = row_ok and t.tidx % p.threads_per_row == 0  # of rstd, and a row's scale
            rstd = self.row_rstd(ss, a.eps, mRstd, row, writer)

            # Pass 2 walks the chunks back from the last one of pass 1, still in registers (h,
            # with a residual: pass 1 stored it).
            order = list(reversed(range(p.chunks)))
            if cutlass.const_expr(p.quant == "token"):
                # fp8 with a scale a row: the row's amax of |y| first, over the chunks walked
                # back; pass 2 then walks them forward, from chunk 0, still in registers.
                amax = Float32(0.0)
                for load, use in self.chunk_steps(order, True):
                    if cutlass.const_expr(load is not None):
                        self.load_chunk(cp, mH if p.residual else mX, tile, load,
                                        regs[load % len(regs)], row_ok, "last")
                    amax = cute.arch.fmax(amax, self.chunk_amax(
                        regs[use % len(regs)], rstd, self.chunk_weight(cp, mW, tWrW, use),
                        a.offset))
                amax = row_max(amax, sBuf, slot, t.row, t.warp, t.lane, self.warps_per_row,
                               min(p.threads_per_row, 32))
                slot = slot ^ 1
                scale = self.token_scale(a, amax, row, writer)
                order = list(range(p.chunks))
            else:
                scale = loaded_scale

            # Pass 2: normalize, scale, store (a scale a row: the chunk still in registers
            # holds y, chunk_amax's).
            for step, (load, use) in enumerate(self.chunk_steps(order, True)):
                if cutlass.const_expr(load is not None):
                    self.load_chunk(cp, mH if p.residual else mX, tile, load,
                                    regs[load % len(regs)], row_ok, "first")
                tXrXc = regs[use % len(regs)]
                if cutlass.const_expr(p.quant == "token" and step == 0):
                    self.store_fp8(cp, a.mY, tile, use, tXrXc, scale, row_ok)
                else:
                    self.store_chunk(cp, a, tile, use, tXrXc, rstd,
                                     self.chunk_weight(cp, mW, tWrW, use), row_ok, scale)

    def chunk_weight(self, cp: RowCopy, mW, tWrW, c: int):
        """w's registers for column chunk c: those loaded up front (``tWrW``), else chunk c's
        loaded now; None without a weight."""
        if self.w_type is None or tWrW is not None:
            return tWrW
        return cp.weight(mW, c)

    def chunk_steps(self, order, resident: bool):
        """One pass over the row's column chunks in ``order``, step by step, as ``(load, use)``:
        the chunk whose loads go out, then the chunk worked on (None: none). Pipelined chunks
        (``plan.pipeline_chunks``) load one chunk ahead, so its loads are in flight while the
        chunk before it is used; otherwise a chunk is loaded just before its use. ``resident``:
        the pass's first chunk is in registers already (the last chunk of pass 1, the
        prefetched row)."""
        ahead = 1 if self.plan.pipeline_chunks else 0
        steps = []
        for s in range(0 if resident else -ahead, len(order)):
            k = s + ahead
            load = order[k] if k < len(order) and not (resident and k == 0) else None
            steps.append((load, order[s] if s >= 0 else None))
        return steps

    @cute.jit
    def tile_group(self, a: ForwardArgs, t: RowThread, cp: RowCopy, tXrX):
        """The CTA's ``tiles_per_cta`` tiles (rows a warp or less wide, one chunk): every tile's
        loads (x's, the residual's, ``epilogue_ahead`` tiles' epilogue inputs) are issued into
        registers of their own before the first tile is reduced, so a thread has as many 16-byte
        loads in flight as it has tiles. A tile of short rows gives a thread one copy, too little
        to cover DRAM latency."""
        p = self.plan
        M = a.mX.shape[0]
        tiles = p.tiles_per_cta
        first = t.bidx * tiles
        bufs = [tXrX] + [cute.make_fragment_like(tXrX) for _ in range(tiles - 1)]
        res = [cute.make_fragment_like(tXrX) for _ in range(tiles if p.residual else 0)]
        ok = [(first + j) * p.rows_per_cta + t.row < M for j in range(tiles)]
        for m, regs in ((a.mX, bufs), (a.mR, res)):
            for j in cutlass.range_constexpr(len(regs)):
                self.load_chunk(cp, m, first + j, 0, regs[j], ok[j])
        # the epilogue's inputs (the rotation's tables) of the first tiles: in flight with x
        pre = [self.epilogue_loads(a, cp, first + j, ok[j], tXrX)
               if j < self.epilogue_ahead else None for j in range(tiles)]
        tWrW = None
        if cutlass.const_expr(self.w_type is not None):
            tWrW = cp.weight(a.mW, 0)
        loaded_scale = self.tensor_scale(a)
        for j in cutlass.range_constexpr(tiles):
            row = (first + j) * p.rows_per_cta + t.row
            if cutlass.const_expr(p.residual):
                self.store_h(cp, a.mH, first + j, 0, bufs[j], res[j], ok[j])
            ss = row_sum(self.sum_of_squares(bufs[j]), None, 0, t.row, 0, t.lane, 1,
                         p.threads_per_row)
            writer = ok[j] and t.lane % p.threads_per_row == 0  # of rstd, and a row's scale
            rstd = self.row_rstd(ss, a.eps, a.mRstd, row, writer)
            scale = loaded_scale
            if cutlass.const_expr(p.quant == "token"):
                amax = row_max(self.chunk_amax(bufs[j], rstd, tWrW, a.offset), None, 0, t.row,
                               0, t.lane, 1, p.threads_per_row)
                scale = self.token_scale(a, amax, row, writer)
                self.store_fp8(cp, a.mY, first + j, 0, bufs[j], scale, ok[j])
            else:
                self.store_chunk(cp, a, first + j, 0, bufs[j], rstd, tWrW, ok[j], scale, pre[j])
                k = j + self.epilogue_ahead  # the next tile whose inputs go out now
                if cutlass.const_expr(0 < self.epilogue_ahead and k < tiles):
                    pre[k] = self.epilogue_loads(a, cp, first + k, ok[k], tXrX)

    @cute.jit
    def row_rstd(self, total: Float32, eps: Float32, mRstd, row, writes):
        """rstd of a row whose sum of squares is ``total``, stored to ``mRstd[row]`` by the
        thread for which ``writes`` holds where the plan keeps rstd."""
        rstd = cute.math.rsqrt(total / Float32(self.plan.N) + eps)
        if cutlass.const_expr(self.plan.store_rstd):
            if writes:
                mRstd[row] = rstd
        return rstd

    def first_pass_evict(self, c: int) -> str:
        """Chunk c's eviction priority in the first pass: the chunks the second pass re-reads
        stay in L2 ("last"); the last chunk, kept in registers, is not read again ("first")."""
        return "first" if c == self.plan.chunks - 1 else "last"

    @cute.jit
    def add_residual(self, cp: RowCopy, mR, mH, tile, c: cutlass.Constexpr[int], tXrX, row_ok):
        """The fused add on column chunk c: registers <- h = x + residual (fp32 sum rounded to
        x's dtype, as the model's own add), stored to h."""
        tXrR = cute.make_fragment_like(tXrX)
        self.load_chunk(cp, mR, tile, c, tXrR, row_ok)
        self.store_h(cp, mH, tile, c, tXrX, tXrR, row_ok)

    @cute.jit
    def store_h(self, cp: RowCopy, mH, tile, c: cutlass.Constexpr[int], tXrX, tXrR, row_ok):
        """Registers ``tXrX`` <- h = x + residual (``tXrR``), stored to column chunk c of h."""
        tXrX.store((tXrX.load().to(Float32) + tXrR.load().to(Float32)).to(self.x_type))
        if row_ok:
            cute.copy(cp.tiled, tXrX, cp.dst(mH, tile, c), pred=cp.column_predicate(c))

    @cute.jit
    def sum_of_squares(self, tXrX) -> Float32:
        """This thread's share of the row's sum of squares, in fp32, over one register chunk."""
        xf = tXrX.load().to(Float32)
        return (xf * xf).reduce(cute.ReductionOp.ADD, Float32(0.0), reduction_profile=0)

    @cute.jit
    def store_chunk(self, cp: RowCopy, a: ForwardArgs, tile, c: cutlass.Constexpr[int], tXrX,
                    rstd: Float32, tWrW, row_ok, scale=None, pre=None):
        """Column chunk c of y <- normalize(registers); as fp8 (``plan.quant``), y times the
        inverse of the static scale (``scale`` as ``tensor_scale`` loaded it) or over the row's
        scale (``scale``: ``token_scale``'s); as NVFP4, ``scale`` is the global scale
        (``store_nvfp4``)."""
        mY = a.mY
        if cutlass.const_expr(self.plan.quant in ("static", "token")):
            self.round_y(tXrX, rstd, tWrW, a.offset)
            self.store_fp8(cp, mY, tile, c, tXrX, self.scale_multiplier(scale), row_ok)
            return
        y = self.normalize(tXrX.load().to(Float32), rstd, tWrW, a.offset)
        if cutlass.const_expr(self.plan.quant == "nvfp4"):
            self.store_nvfp4(cp, mY, a.mBlockScales, tile, c, tXrX, y, scale, row_ok)
        else:
            tXrY = cute.make_fragment_like(tXrX, self.y_type)
            tXrY.store(y.to(self.x_type))
            store = cp.tiled
            if cutlass.const_expr(self.plan.stream_y):
                store = self.streaming_store()
            if row_ok:
                cute.copy(store, tXrY, cp.dst(mY, tile, c), pred=cp.column_predicate(c))

    def streaming_store(self):
        """y's copy where ``plan.stream_y``: ``st.global.cs``, evict first, so y's lines leave
        L2 before the rows the second pass reads back from it."""
        return cute.make_copy_atom(cute.nvgpu.CopyR2GOp(), self.y_type,
                                   num_bits_per_copy=self.plan.vec * self.y_type.width,
                                   store_cache_mode=cute.nvgpu.StoreCacheMode.STREAMING)

    def tensor_scale(self, a: ForwardArgs):
        """What the quantizing epilogues (forward_quant.py) load once a thread: none here."""
        return None

    @cute.jit
    def normalize(self, xf, rstd: Float32, tWrW, offset: Float32):
        """y in fp32 with the casting mode's rounding points (see reference.py)."""
        mode = self.plan.casting_mode
        if cutlass.const_expr(mode == "gemma"):
            y = xf * rstd
        elif cutlass.const_expr(mode == "llama"):
            y = (xf * rstd).to(self.x_type).to(Float32)
        else:  # none: rstd, the normalized x and the product are each rounded to x's dtype
            rstd_x = rstd.to(self.x_type).to(Float32)
            y = (xf * rstd_x).to(self.x_type).to(Float32)
        if cutlass.const_expr(tWrW is not None):
            w = tWrW.load().to(Float32)
            if cutlass.const_expr(self.plan.offset):
                w = w + offset
            if cutlass.const_expr(mode == "none"):
                w = w.to(self.x_type).to(Float32)
            y = y * w
        return y

    @cute.jit
    def load_chunk(self, cp: RowCopy, mX, tile, c: cutlass.Constexpr[int], tXrX, row_ok,
                   evict: cutlass.Constexpr = None):
        """Registers <- column chunk c of this thread's row; zeros where predicated off, so the
        sum of squares needs no mask. ``evict`` ("last", "first"; where ``plan.l2_hints``): the
        load's L1 and L2 eviction priority."""
        tXrX.fill(0)
        if row_ok:
            tXgX = cp.src(mX, tile, c)
            pred = cp.column_predicate(c)
            if cutlass.const_expr(evict is None or not self.plan.l2_hints):
                cute.copy(cp.tiled, tXgX, tXrX, pred=pred)
            else:
                cute.copy(self.make_tiled_copy(cp.tiler, evict), tXgX, tXrX, pred=pred,
                          cache_policy=cutlass.Int64(EVICT[evict][1]))


class RMSNormFusedAddForward(RMSNormForward):
    """The fused residual add (``plan.residual``): the same kernel, with the residual read and
    h = x + residual written beside y."""

    def __init__(self, plan: ForwardPlan):
        assert plan.residual
        super().__init__(plan)

    @cute.jit
    def __call__(self, gX: cute.Tensor, gR: cute.Tensor, gW: cute.Tensor, gY: cute.Tensor,
                 gH: cute.Tensor, gRstd: cute.Tensor, grid: Int32, eps: Float32,
                 offset: Float32, stream: cuda.CUstream):
        """Host side: x, the residual, y and h arrive as (M, N):(ld, 1) rows."""
        self.launch(gX, gW, gY, gRstd, gR, gH, grid, eps, offset, stream)


class RMSNormClusterForward(ClusterRows, RMSNormForward):
    """``cluster``: rows too wide for one CTA's registers, each split over the ``plan.cluster_n``
    CTAs of a thread-block cluster (``cluster_sum.ClusterRows``): cluster s walks strip s of the
    rows; each CTA keeps its slice of w for the whole strip, and loads its slice of the next row
    into a second set of registers while this row's sum crosses the cluster. The row is read
    once and written once."""

    def __init__(self, plan: ForwardPlan):
        assert plan.variant == "cluster" and plan.cluster_n > 1 and plan.chunks == 1
        super().__init__(plan)

    def launch(self, gX, gW, gY, gRstd, gR, gH, grid, eps, offset, stream):
        """Host side: ``grid`` is the strips (``plan.grid``), one cluster each."""
        _, mX, mW, mY, mRstd = self.tensors(gX, gW, gY, gRstd)
        self.launch_clusters(self.kernel(mX, mW, mY, mRstd, eps, offset, None, None), grid,
                             stream)

    @cute.kernel
    def kernel(self, mX: cute.Tensor, mW: cute.Tensor, mY: cute.Tensor, mRstd: cute.Tensor,
               eps: Float32, offset: Float32, mR: cute.Tensor, mH: cute.Tensor):
        s = self.strip(mX, mW)
        cp, rank, tXrX, tWrW = s.cp, s.rank, s.tXrX, s.tWrW
        tXrXn = cute.make_fragment_like(tXrX)
        tXrY = cute.make_fragment_like(tXrX)

        # x's slice of the strip's first row, then of each next row while this one is reduced;
        # padding columns and rows past the strip's end load zeros, which add nothing
        row_start, row_end = s.rows()
        cp.load_rows((mX,), (tXrXn,), row_start, rank, row_start < row_end)
        cute.arch.cluster_wait()

        for row in cutlass.range(row_start, row_end):
            step = row - row_start
            tXrX.store(tXrXn.load())
            cp.load_rows((mX,), (tXrXn,), row + 1, rank, row + 1 < row_end)
            total = s.row_total(self.sum_of_squares(tXrX), step)
            rstd = self.row_rstd(total, eps, mRstd, row, rank == 0 and s.tidx == 0)
            tXrY.store(self.normalize(tXrX.load().to(Float32), rstd, tWrW, offset)
                       .to(self.x_type))
            cute.copy(cp.tiled, tXrY, cp.dst(mY, row, rank), pred=s.pred)
