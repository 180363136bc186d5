"""CuTe DSL RMSNorm backward: the fused kernel and the split path's dX kernel
(``RMSNormBackward``), with the math every backward kernel shares (``_Common``).

The math (reference.py holds the rounding points)::

    x_hat = x * rstd                         # fp32, rstd saved by the forward in fp32
    m     = dy * (offset + w)                # "none": w + offset and m rounded to x's dtype
    dx    = rstd * (m - x_hat * mean(m * x_hat))
    dw    = sum_rows(dy * x_hat)             # llama/none: x_hat rounded to x's dtype first

* ``fused`` plan: a persistent grid, CTA s walking the rows of strip s (plan/backward.py
  ``strip_bounds``). The shifted weight and an fp32 dW accumulator stay in registers for the
  whole strip; x and dy are read once, the next row's loaded while this row is reduced
  (``plan.prefetch``). At the end the accumulator becomes row s of ``dw_partial``
  (``write_dw``): rows narrower than a warp are walked ``rows_per_cta`` at a time, one lane
  group each, and the groups' accumulators are summed by shuffles before the write; one-warp
  strips share a CTA (``strips_per_cta``) and sum their rows in shared memory into one partial
  row; the CTAs of a thread-block cluster (``dw_cluster``) sum theirs in distributed shared
  memory (device/dw_cluster.py); a row too wide for the registers keeps its accumulator in
  shared memory.
* ``dx`` plan: one CTA per row, dx only (the split path). Rows wider than the register budget
  take two passes over column chunks, like the forward.

The kernel reads as its phases, per row: ``load_row`` (the prefetched row, or none, and rstd),
``row_mean`` (pass 1: mean(m * x_hat) over the row), ``dx_and_dw`` (pass 2: dx stored, dW
accumulated); after the strip, ``write_dw``.

The other backward kernels: ``RMSNormClusterBackward`` (kernels/backward_cluster.py, the fused
plan of a row too wide for one CTA, over a thread-block cluster), ``RMSNormStagedBackward``
(kernels/backward_staged.py, rows staged in shared memory), ``RMSNormBackwardDW``
(kernels/backward_dw.py, the split path's dW) and ``DwReduce`` (kernels/dw_reduce.py, the sum
of the partial rows into dw).

The thread/value mapping and the predicated 16-byte tiled copies are device/tiles.py's; naming
follows the CUTLASS examples (``mX`` tensor, ``gX`` tile, ``tXgX`` this thread's slice, ``tXrX``
its registers, ``tXcX`` the coordinates of those elements).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.memory import SmemAllocator

from ..device import dw_cluster
from ..plan.backward import BackwardPlan
from ..dtypes import TORCH_TO_CUTE
from ..device.pdl import wait_for_previous_grid
from ..device.reduce import SLOTS, row_sum, row_sum_bytes, row_sum_slots
from ..device.tiles import RowCopy, RowThread, RowTiles, strip_rows


class _Common(RowTiles):
    """The per-element math shared by the backward kernel classes."""

    def __init__(self, plan: BackwardPlan):
        self.plan = plan
        self.x_type = TORCH_TO_CUTE[plan.x_dtype]
        self.w_type = TORCH_TO_CUTE[plan.w_dtype] if plan.w_dtype is not None else None

    @cute.jit
    def x_hat_for_dw(self, x_hat):
        """The x_hat that multiplied w in the forward: rounded to x's dtype except in gemma."""
        if cutlass.const_expr(self.plan.casting_mode == "gemma"):
            return x_hat
        return x_hat.to(self.x_type).to(Float32)

    @cute.jit
    def m_of(self, dyf, tWrW, offset: Float32):
        """m = dy * (offset + w) in fp32; "none" rounds offset + w and m to x's dtype, as its
        forward did every product. Without a weight m is dy."""
        if cutlass.const_expr(tWrW is None):
            return dyf
        w = tWrW.load().to(Float32) + offset
        if cutlass.const_expr(self.plan.casting_mode == "none"):
            w = w.to(self.x_type).to(Float32)
            return (dyf * w).to(self.x_type).to(Float32)
        return dyf * w


@dataclasses.dataclass(frozen=True)
class BackwardArgs:
    """The kernel's arguments, at trace time, for its phases (the part of CUTLASS's kernel
    ``Params`` a launch fills): dy, x, w, rstd, dx, the dW partial rows, the weight's offset and
    dh (each tensor None where the plan has none)."""

    mDy: cute.Tensor
    mX: cute.Tensor
    mW: Optional[cute.Tensor]
    mRstd: cute.Tensor
    mDx: cute.Tensor
    mDwP: Optional[cute.Tensor]
    offset: Float32
    mDh: Optional[cute.Tensor]


@dataclasses.dataclass(frozen=True)
class RowRegs:
    """The registers a row works in, at trace time: x and dy (``x``, ``dy``; ``x_next``,
    ``dy_next``: the next row's, where the plan prefetches), dx, and w where one chunk holds it
    for the whole strip (else None)."""

    x: cute.Tensor
    dy: cute.Tensor
    dx: cute.Tensor
    x_next: Optional[cute.Tensor]
    dy_next: Optional[cute.Tensor]
    w: Optional[cute.Tensor]


@dataclasses.dataclass(frozen=True)
class DwRow:
    """A fused strip's dW row, at trace time: the fp32 accumulator in registers (``regs``, x's
    fragment layout) or, for the wide row, in shared memory (``smem``, chunk by chunk; ``regs``
    then only zeroes it), and what its write-out needs: the one-warp strips' rows (``strips``,
    summed in shared memory), or the cluster exchange's mbarrier and receive slots (``mbar``,
    ``recv``: device/dw_cluster.py). Each None where the plan has none."""

    regs: Optional[cute.Tensor]
    smem: Optional[cute.Tensor]
    strips: Optional[cute.Tensor]
    mbar: Any
    recv: Optional[cute.Tensor]


class RMSNormBackward(_Common):
    """``fused`` and ``dx`` plans. ``__call__`` is the host side; ``kernel`` the device body."""

    def __init__(self, plan: BackwardPlan):
        assert plan.kind in ("fused", "dx")
        assert plan.rows_per_cta == 1 or (plan.kind == "fused" and plan.threads == 32)
        super().__init__(plan)
        self.fused = plan.kind == "fused"
        self.warps_per_row = max(plan.threads_per_row // 32, 1)
        # The dW write-out (``write_dw``): a fused row too wide for registers streams through
        # them in column chunks, and its dW accumulator lives in shared memory instead;
        self.dw_in_smem = plan.dw_smem_bytes > 0
        # one-warp strips sharing a CTA sum their dW rows in shared memory before the write;
        self.strips_meet = plan.strips_per_cta > 1 and plan.w_dtype is not None
        # the CTAs of a cluster sum theirs in distributed shared memory (device/dw_cluster.py).
        self.dw_cluster = plan.dw_cluster if plan.w_dtype is not None else 1

    @cute.jit
    def __call__(self, gDy: cute.Tensor, gX: cute.Tensor, gW: cute.Tensor, gRstd: cute.Tensor,
                 gDx: cute.Tensor, gDwP: cute.Tensor, grid: Int32, offset: Float32,
                 stream: cuda.CUstream):
        """Host side (see ``launch``)."""
        self.launch(gDy, gX, gW, gRstd, gDx, gDwP, None, grid, offset, stream)

    def tensors(self, gDy, gX, gW, gRstd, gDx, gDwP, gDh, grid):
        """The kernel's tensors ``(mDy, mX, mW, mRstd, mDx, mDwP, mDh)``. dy, x, dx (and dh)
        arrive as (M, N):(ld, 1) with dynamic M and row strides, w as (N,), rstd as (M,), the
        fp32 dW partials as (grid, N) (fused with a weight; otherwise an unread stand-in); the
        rows are rebuilt by ``row_tensor`` (N static, 32-bit sizes and strides, every copy
        provably 16-byte aligned)."""
        p = self.plan
        M = Int32(gX.shape[0])
        mDy, mX, mDx = (self.row_tensor(g, M) for g in (gDy, gX, gDx))
        mDh = self.row_tensor(gDh, M) if gDh is not None else None
        mRstd = cute.make_tensor(gRstd.iterator, cute.make_layout((M,)))
        mW = None
        mDwP = None
        if cutlass.const_expr(self.w_type is not None):
            # The weight as a (1, N) tile row, partitioned by the same tiled copy as x.
            mW = cute.make_tensor(gW.iterator, cute.make_layout((1, p.N), stride=(0, 1)))
            if cutlass.const_expr(self.fused):
                # One fp32 partial row per strip; the row stride N is static, so the compiler
                # sees 16-byte aligned rows on the vector path.
                mDwP = cute.make_tensor(gDwP.iterator,
                                        cute.make_layout((grid, p.N), stride=(p.N, 1)))
        return mDy, mX, mW, mRstd, mDx, mDwP, mDh

    def launch(self, gDy, gX, gW, gRstd, gDx, gDwP, gDh, grid, offset, stream):
        """Host side: the kernel's tensors (``tensors``), its shared memory and launch bounds."""
        p = self.plan
        mDy, mX, mW, mRstd, mDx, mDwP, mDh = self.tensors(gDy, gX, gW, gRstd, gDx, gDwP, gDh, grid)
        smem_bytes = 0
        if cutlass.const_expr(self.warps_per_row > 1):
            smem_bytes = row_sum_bytes(1, self.warps_per_row)
        # The wide fused row: min_blocks_per_mp caps ptxas at 65536 / (ctas_per_sm * threads)
        # registers, so the CTAs the plan counts on are resident together (the carveout: all of
        # L1 that can be shared memory, which their dW rows need). Elsewhere: the defaults.
        min_blocks, carveout = 0, None
        if cutlass.const_expr(self.dw_in_smem):
            smem_bytes = smem_bytes + 16 + p.dw_smem_bytes  # 16: alignment after the row sums
            min_blocks, carveout = p.ctas_per_sm, 100
        if cutlass.const_expr(self.strips_meet):
            smem_bytes = smem_bytes + 16 + p.strips_per_cta * p.N * 4
        cluster = {}  # with dw_cluster, ``grid`` counts clusters (one partial row each)
        if cutlass.const_expr(self.dw_cluster > 1):
            smem_bytes = smem_bytes + dw_cluster.smem_bytes(p.N)
            cluster = {"cluster": [self.dw_cluster, 1, 1]}
        self.kernel(mDy, mX, mW, mRstd, mDx, mDwP, offset, mDh).launch(
            grid=[grid * self.dw_cluster, 1, 1], block=[p.cta_threads, 1, 1], smem=smem_bytes,
            stream=stream, min_blocks_per_mp=min_blocks, preferred_smem_carveout=carveout,
            use_pdl=p.pdl, **cluster)

    @cute.kernel
    def kernel(self, mDy: cute.Tensor, mX: cute.Tensor, mW: cute.Tensor, mRstd: cute.Tensor,
               mDx: cute.Tensor, mDwP: cute.Tensor, offset: Float32, mDh: cute.Tensor):
        p = self.plan
        a = BackwardArgs(mDy, mX, mW, mRstd, mDx, mDwP, offset, mDh)
        rows = p.rows_per_cta  # rows worked on at once: lane groups of one warp, or the CTA's one
        strips = p.strips_per_cta  # strips in this CTA: one warp each, or the whole CTA
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        M = mX.shape[0]
        tid, strip = tidx, 0  # this thread's place in its strip, and its strip in the CTA
        if cutlass.const_expr(strips > 1):
            tid, strip = tidx % p.threads, tidx // p.threads
        t = RowThread(tidx, bidx, gdim, row=tid // p.threads_per_row, warp=tidx // 32,
                      lane=tidx % 32, tid=tid, strip=strip)
        if cutlass.const_expr(p.pdl):
            wait_for_previous_grid()

        smem = SmemAllocator()
        sBuf = None
        if cutlass.const_expr(self.warps_per_row > 1):
            sBuf = row_sum_slots(smem, 1, self.warps_per_row)
        sDw, sStrips, mbar, sRecv = self.dw_smem(smem, tidx)

        cp = self.row_copy((rows, p.cols_per_tile), tid, mX)
        tXrX = cp.fragment(mX)
        tXrDy = cute.make_fragment_like(tXrX)
        tXrDx = cute.make_fragment_like(tXrX)

        # Rows of this strip. Fused: strip s of gdim * strips (plan/backward.py strip_bounds).
        # dx: row bidx alone.
        row_start = bidx
        row_end = bidx + 1
        if cutlass.const_expr(self.fused):
            row_start, row_end = strip_rows(M, bidx * strips + strip, gdim * strips)

        # With one chunk the weight is loaded once, before the row loop: the fused kernel reuses
        # it for every row of its strip (m needs it before the reduction, so unlike the forward
        # there is no later point where loading it would free registers).
        tWrW = None
        if cutlass.const_expr(self.w_type is not None and p.chunks == 1):
            tWrW = cp.weight(mW, 0)
        dw = DwRow(self.dw_accumulator(cp, tXrX, sDw), sDw, sStrips, mbar, sRecv)

        # Prefetch (fused): the next row's x, dy and rstd are loaded into a second set of
        # registers while this row is reduced and stored, so a CTA -- alone on its SM with one
        # row at a time -- keeps a row's loads in flight through its barriers and stores.
        tXrXn, tXrDyn, rstd_n = self.prefetch_first(cp, a, tXrX, row_start, row_end, 0, t.row)
        regs = RowRegs(tXrX, tXrDy, tXrDx, tXrXn, tXrDyn, tWrW)

        # row0: the first of the rows worked on at once; this thread's row is row0 + t.row
        for row0 in cutlass.range(row_start, row_end, rows):
            row = row0 + t.row
            # rows past the strip's end: only in the last step of a strip of lane groups
            row_ok = None
            if cutlass.const_expr(rows > 1):
                row_ok = row < row_end
            rstd, rstd_n = self.load_row(cp, a, regs, row0, row, row_end, rstd_n)
            mean_mx = self.row_mean(cp, a, regs, row0, row_ok, rstd, t, sBuf)
            self.dx_and_dw(cp, a, regs, dw, row0, row_ok, rstd, mean_mx)
        self.write_dw(cp, dw, mDwP, bidx, t)

    def dw_smem(self, smem, tidx):
        """``(sDw, sStrips, mbar, sRecv)``: the shared memory of the dW row's accumulation and
        write-out (each None where the plan has none; ``DwRow``). The cluster's exchange is
        started here: its mbarrier initialized, the cluster barrier arrived at."""
        p = self.plan
        # The wide fused row's dW accumulator: one fp32 (1, chunks * cols_per_tile) row in shared
        # memory, partitioned per chunk exactly like x, so every thread reads and writes only its
        # own slots (no barrier needed, from the zeroing to the final store).
        sDw = None
        if cutlass.const_expr(self.dw_in_smem):
            width = p.chunks * p.cols_per_tile
            sDw = smem.allocate_tensor(Float32, cute.make_layout((1, width), stride=(width, 1)),
                                       byte_alignment=16)
        sStrips = None  # the dW row of each strip of the CTA, summed at the end
        if cutlass.const_expr(self.strips_meet):
            sStrips = smem.allocate_tensor(Float32, cute.make_layout(
                (p.strips_per_cta, p.N), stride=(p.N, 1)), byte_alignment=16)
        mbar, sRecv = None, None  # the cluster's dW exchange
        if cutlass.const_expr(self.dw_cluster > 1):
            mbar = dw_cluster.mbarrier(smem)
            sRecv = dw_cluster.slots(smem, p.N, self.dw_cluster)
            dw_cluster.start(mbar, tidx)
        return sDw, sStrips, mbar, sRecv

    @cute.jit
    def dw_accumulator(self, cp: RowCopy, tXrX, sDw):
        """The strip's fp32 dW accumulator, zeroed: registers in x's fragment layout, live for
        the whole strip (fused with a weight; None otherwise), and the wide row's slots in
        shared memory."""
        tXrDw = None
        if cutlass.const_expr(self.fused and self.w_type is not None):
            tXrDw = cute.make_fragment_like(tXrX, Float32)
            tXrDw.fill(0.0)
            if cutlass.const_expr(self.dw_in_smem):
                for c in cutlass.range_constexpr(self.plan.chunks):
                    cute.autovec_copy(tXrDw, self.dw_slots(cp, sDw, c))
        return tXrDw

    @cute.jit
    def prefetch_first(self, cp: RowCopy, a: BackwardArgs, tXrX, row_start, row_end, c,
                       row_in_tile=None):
        """``(tXrXn, tXrDyn, rstd_n)``: with prefetch, registers for the next row's x and dy,
        holding the strip's first row already (this thread's row of it: ``row_in_tile`` past
        ``row_start``; its chunk c: a cluster CTA's slice), and that row's rstd; ``(None, None,
        0)`` without. Loads for a row past the strip's end are predicated off (and its rstd
        index clamped)."""
        M = a.mX.shape[0]
        tXrXn = None
        tXrDyn = None
        rstd_n = Float32(0.0)
        if cutlass.const_expr(self.plan.prefetch):
            tXrXn = cute.make_fragment_like(tXrX)
            tXrDyn = cute.make_fragment_like(tXrX)
            first = row_start
            if cutlass.const_expr(row_in_tile is not None):
                first = row_start + row_in_tile
            cp.load_rows((a.mX, a.mDy), (tXrXn, tXrDyn), row_start, c, first < row_end)
            rstd_n = a.mRstd[cutlass.min(first, M - 1)]
        return tXrXn, tXrDyn, rstd_n

    @cute.jit
    def load_row(self, cp: RowCopy, a: BackwardArgs, regs: RowRegs, row0, row, row_end, rstd_n,
                 c=0, loads: cutlass.Constexpr[bool] = False):
        """``(rstd, rstd_n)``: this row's rstd and, with prefetch, the next row's. With prefetch
        the row's x and dy arrived during the previous row, and the next row's loads go out now
        (chunk c: a cluster CTA's slice). Without, the row's chunks load in the passes, or here
        where ``loads`` says so (the cluster kernel's one slice)."""
        p = self.plan
        M = a.mX.shape[0]
        rows = p.rows_per_cta
        rstd = rstd_n
        if cutlass.const_expr(p.prefetch):
            regs.x.store(regs.x_next.load())
            regs.dy.store(regs.dy_next.load())
            cp.load_rows((a.mX, a.mDy), (regs.x_next, regs.dy_next), row0 + rows, c,
                         row + rows < row_end)
            rstd_n = a.mRstd[cutlass.min(row + rows, M - 1)]
        else:
            if cutlass.const_expr(loads):
                cp.load_rows((a.mX, a.mDy), (regs.x, regs.dy), row0, c)
            if cutlass.const_expr(rows > 1):
                rstd = a.mRstd[cutlass.min(row, M - 1)]
            else:
                rstd = a.mRstd[row]
        return rstd, rstd_n

    @cute.jit
    def row_mean(self, cp: RowCopy, a: BackwardArgs, regs: RowRegs, row0, row_ok, rstd: Float32,
                 t: RowThread, sBuf) -> Float32:
        """Pass 1: mean(m * x_hat) over the row (chunks == 1 keeps x and dy for pass 2)."""
        p = self.plan
        mx = Float32(0.0)
        for c in cutlass.range_constexpr(p.chunks):
            chunk_w = regs.w
            if cutlass.const_expr(self.w_type is not None and regs.w is None):
                chunk_w = cp.weight(a.mW, c)
            if cutlass.const_expr(not p.prefetch):
                cp.load_rows((a.mX, a.mDy), (regs.x, regs.dy), row0, c, row_ok)
            x_hat = regs.x.load().to(Float32) * rstd
            m = self.m_of(regs.dy.load().to(Float32), chunk_w, a.offset)
            mx = mx + (m * x_hat).reduce(cute.ReductionOp.ADD, Float32(0.0),
                                         reduction_profile=0)
        # consecutive rows alternate reduction slots (reduce.row_sum)
        mx = row_sum(mx, sBuf, row0 % SLOTS, 0, t.warp, t.lane, self.warps_per_row,
                     min(p.threads_per_row, 32))
        return mx / Float32(p.N)

    @cute.jit
    def dx_and_dw(self, cp: RowCopy, a: BackwardArgs, regs: RowRegs, dw: DwRow, row0, row_ok,
                  rstd: Float32, mean_mx: Float32):
        """Pass 2: dx stored, chunk by chunk, and dy * x_hat added to the dW accumulator."""
        p = self.plan
        for c in cutlass.range_constexpr(p.chunks):
            chunk_w = regs.w
            if cutlass.const_expr(p.chunks > 1):
                if cutlass.const_expr(self.w_type is not None):
                    chunk_w = cp.weight(a.mW, c)
                cp.load_rows((a.mX, a.mDy), (regs.x, regs.dy), row0, c, row_ok)
            dyf = regs.dy.load().to(Float32)
            x_hat = regs.x.load().to(Float32) * rstd
            m = self.m_of(dyf, chunk_w, a.offset)
            dx = rstd * (m - x_hat * mean_mx)
            if cutlass.const_expr(p.dh):  # the fused add: h's own gradient joins dx
                tXrDh = cute.make_fragment_like(regs.x)
                cp.load_rows((a.mDh,), (tXrDh,), row0, c, row_ok)
                dx = dx + tXrDh.load().to(Float32)
            regs.dx.store(dx.to(self.x_type))
            tXgDx = cp.thr.partition_D(cp.tile_at(a.mDx, row0, c))
            cute.copy(cp.tiled, regs.dx, tXgDx, pred=cp.column_predicate(c, row_ok))
            self.accumulate_dw(cp, dw, c, dyf, x_hat)

    @cute.jit
    def accumulate_dw(self, cp: RowCopy, dw: DwRow, c: cutlass.Constexpr[int], dyf, x_hat):
        """dW += dy * x_hat on column chunk c (padding columns, loaded as zeros, add nothing)."""
        if cutlass.const_expr(self.dw_in_smem):
            tXsDw = self.dw_slots(cp, dw.smem, c)
            tXsDw.store(tXsDw.load() + dyf * self.x_hat_for_dw(x_hat))
        elif cutlass.const_expr(dw.regs is not None):
            dw.regs.store(dw.regs.load() + dyf * self.x_hat_for_dw(x_hat))

    @cute.jit
    def write_dw(self, cp: RowCopy, dw: DwRow, mDwP, row, t: Optional[RowThread] = None, c=0):
        """This strip's dW row to partial row ``row`` of ``mDwP`` (its chunk c: a cluster CTA's
        slice of the row), by the plan's strategy:

        * the wide row (``dw_in_smem``): chunk by chunk from shared memory;
        * registers: the lane groups of a warp (``rows_per_cta`` > 1) hold the same columns of
          different rows, summed first by butterfly shuffles; then
          - a cluster's CTAs (``dw_cluster``) sum their rows in distributed shared memory, each
            writing its slice of the cluster's row (device/dw_cluster.py);
          - one-warp strips of a CTA (``strips_meet``) put their rows in shared memory and the
            CTA adds them column by column, in strip order;
          - else the first lane group stores the row (``t``: the thread's place, where
            strategies need it).

        Every strip writes, even an empty one (its zeros), so the sum over partial rows never
        reads uninitialized memory."""
        p = self.plan
        if cutlass.const_expr(self.dw_in_smem):
            for k in cutlass.range_constexpr(p.chunks):
                cp.copy_columns(self.dw_slots(cp, dw.smem, k), cp.dst(mDwP, row, k), k)
        elif cutlass.const_expr(dw.regs is not None):
            tXrDw = dw.regs
            if cutlass.const_expr(p.rows_per_cta > 1):
                for i in cutlass.range_constexpr((p.rows_per_cta - 1).bit_length()):
                    for e in cutlass.range_constexpr(cute.size(tXrDw)):
                        tXrDw[e] = tXrDw[e] + cute.arch.shuffle_sync_bfly(
                            tXrDw[e], offset=p.threads_per_row << i)
            if cutlass.const_expr(self.dw_cluster > 1):
                dw_cluster.exchange(cp, tXrDw, mDwP, dw.mbar, dw.recv, t.tidx, self.dw_cluster,
                                    p.cta_threads)
            elif cutlass.const_expr(self.strips_meet):
                self.store_dw_row(cp, tXrDw, dw.strips, t.strip, 0, t.row)
                cute.arch.sync_threads()
                for col in cutlass.range(t.tidx, p.N, p.cta_threads):
                    total = Float32(0.0)
                    for j in cutlass.range_constexpr(p.strips_per_cta):
                        total = total + dw.strips[j, col]
                    mDwP[row, col] = total
            else:
                self.store_dw_row(cp, tXrDw, mDwP, row, c, None if t is None else t.row)

    @cute.jit
    def store_dw_row(self, cp: RowCopy, tXrDw, mT, row, c, row_in_cta=None):
        """The strip's dW sums (fp32) to row ``row`` of ``mT``, column chunk c: the columns
        before N, by the first lane group (``row_in_cta`` 0; None: a tile of one row)."""
        tXgDw = cp.thr.partition_D(cp.tile_at(mT, row, c))
        if cutlass.const_expr(row_in_cta is None):
            cp.copy_columns(tXrDw, tXgDw, c)
        else:
            if row_in_cta == 0:
                cp.copy_columns(tXrDw, tXgDw, c)

    @cute.jit
    def dw_slots(self, cp: RowCopy, sDw, c: cutlass.Constexpr[int]):
        """This thread's dW accumulator slots for column chunk c (shared memory)."""
        return cp.dst(sDw, 0, c)


class RMSNormBackwardDh(RMSNormBackward):
    """``fused`` and ``dx`` plans of the fused residual add (``plan.dh``): dx (= the residual's
    gradient) is h's incoming gradient plus the norm's dx, rounded once."""

    def __init__(self, plan: BackwardPlan):
        assert plan.dh
        super().__init__(plan)

    @cute.jit
    def __call__(self, gDy: cute.Tensor, gX: cute.Tensor, gW: cute.Tensor, gRstd: cute.Tensor,
                 gDx: cute.Tensor, gDh: cute.Tensor, gDwP: cute.Tensor, grid: Int32,
                 offset: Float32, stream: cuda.CUstream):
        """Host side: dh arrives as (M, N):(ld, 1) rows like dy."""
        self.launch(gDy, gX, gW, gRstd, gDx, gDwP, gDh, grid, offset, stream)
