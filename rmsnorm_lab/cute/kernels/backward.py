"""CuTe DSL RMSNorm backward: the fused kernel, and the split path's dX and dW kernels.

The math (reference.py holds the rounding points)::

    x_hat = x * rstd                         # fp32, rstd saved by the forward in fp32
    m     = dy * (offset + w)                # "none": w + offset and m rounded to x's dtype
    dx    = rstd * (m - x_hat * mean(m * x_hat))
    dw    = sum_rows(dy * x_hat)             # llama/none: x_hat rounded to x's dtype first

* ``RMSNormBackward`` with a ``fused`` plan: a persistent grid, CTA s walking the rows of strip s
  (backward_plan.strip_bounds). The shifted weight and an fp32 dW accumulator stay in registers
  for the whole strip; x and dy are read once, the next row's loaded while this row is reduced
  (``plan.prefetch``). At the end the accumulator becomes row s of ``dw_partial``. Rows narrower
  than a warp are walked ``rows_per_cta`` at a time, one lane group each, and the groups' dW
  accumulators are summed by shuffles before the write; one-warp strips share a CTA
  (``strips_per_cta``) and sum their rows in shared memory into one partial row; the CTAs of a
  thread-block cluster (``dw_cluster``) sum theirs in distributed shared memory (device/dw_cluster.py).
* ``RMSNormBackward`` with a ``dx`` plan: one CTA per row, dx only (the split path). Rows wider
  than the register budget take two passes over column chunks, like the forward.
* ``RMSNormClusterBackward`` (kernels/backward_cluster.py): the fused plan of a row too wide for one CTA,
  over the CTAs of a thread-block cluster.
* ``RMSNormBackwardDW`` (kernels/backward_dw.py): the split path's dW. CTA (b, g) sums ``dy * x_hat``
  over the rows of group g for column block b -- one warp per row, ``dw_unroll`` rows per warp
  in flight -- then reduces over its warps in shared memory and writes ``dw_partial[g, block b]``.

A last kernel, ``DwReduce`` (kernels/dw_reduce.py), sums the partial rows into dw.

The thread/value mapping and the predicated 16-byte tiled copies are the forward's (kernels/forward.py);
naming follows the CUTLASS examples (``mX`` tensor, ``gX`` tile, ``tXgX`` this thread's slice,
``tXrX`` its registers, ``tXcX`` the coordinates of those elements).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass.memory import SmemAllocator

from ..device import dw_cluster
from ..plan.backward import BackwardPlan
from ..dtypes import TORCH_TO_CUTE
from ..device.pdl import wait_for_previous_grid
from ..device.reduce import SLOTS, row_sum
from ..device.tiles import RowTiles, strip_rows


class _Common(RowTiles):
    """Copies, predicates and the per-element math shared by both kernel classes."""

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


class RMSNormBackward(_Common):
    """``fused`` and ``dx`` plans. ``__call__`` is the host side; ``kernel`` the device body."""

    def __init__(self, plan: BackwardPlan):
        assert plan.kind in ("fused", "dx")
        assert plan.rows_per_cta == 1 or (plan.kind == "fused" and plan.threads == 32)
        super().__init__(plan)
        self.fused = plan.kind == "fused"
        # A fused row too wide for registers streams through them in column chunks, and its dW
        # accumulator lives in shared memory instead.
        self.dw_in_smem = plan.dw_smem_bytes > 0
        self.warps_per_row = max(plan.threads_per_row // 32, 1)
        # One-warp strips sharing a CTA sum their dW rows in shared memory before the write.
        self.strips_meet = plan.strips_per_cta > 1 and plan.w_dtype is not None
        # The CTAs of a cluster sum their dW rows in distributed shared memory (device/dw_cluster.py).
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
        layouts are rebuilt here with N static, 32-bit sizes and strides (as in the forward:
        64-bit index math costs registers) and the row strides' divisibility by the copy width
        made known, so every copy is provably 16-byte aligned."""
        p = self.plan
        M = Int32(gX.shape[0])
        lddy = cute.assume(Int32(gDy.stride[0]), divby=p.vec)
        ldx = cute.assume(Int32(gX.stride[0]), divby=p.vec)
        lddx = cute.assume(Int32(gDx.stride[0]), divby=p.vec)
        mDy = cute.make_tensor(gDy.iterator, cute.make_layout((M, p.N), stride=(lddy, 1)))
        mX = cute.make_tensor(gX.iterator, cute.make_layout((M, p.N), stride=(ldx, 1)))
        mDx = cute.make_tensor(gDx.iterator, cute.make_layout((M, p.N), stride=(lddx, 1)))
        mDh = None
        if cutlass.const_expr(gDh is not None):
            lddh = cute.assume(Int32(gDh.stride[0]), divby=p.vec)
            mDh = cute.make_tensor(gDh.iterator, cute.make_layout((M, p.N), stride=(lddh, 1)))
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
            smem_bytes = SLOTS * self.warps_per_row * 4
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
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        M = mX.shape[0]
        rows = p.rows_per_cta  # rows worked on at once: lane groups of one warp, or the CTA's one
        strips = p.strips_per_cta  # strips in this CTA: one warp each, or the whole CTA
        tid = tidx  # this thread's place in its strip
        strip_in_cta = 0
        if cutlass.const_expr(strips > 1):
            tid = tidx % p.threads
            strip_in_cta = tidx // p.threads
        row_in_cta = tid // p.threads_per_row
        warp_in_row = tidx // 32
        lane = tidx % 32
        if cutlass.const_expr(p.pdl):
            wait_for_previous_grid()

        smem = SmemAllocator()
        sBuf = None
        if cutlass.const_expr(self.warps_per_row > 1):
            sBuf = smem.allocate_tensor(
                Float32, cute.make_layout((SLOTS, 1, self.warps_per_row)), byte_alignment=4)
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
            sStrips = smem.allocate_tensor(
                Float32, cute.make_layout((strips, p.N), stride=(p.N, 1)), byte_alignment=16)
        mbar, sRecv = None, None  # the cluster's dW exchange
        if cutlass.const_expr(self.dw_cluster > 1):
            mbar = dw_cluster.mbarrier(smem)
            sRecv = dw_cluster.slots(smem, p.N, self.dw_cluster)
            dw_cluster.start(mbar, tidx)

        tiler = (rows, p.cols_per_tile)
        tiled_x = self.make_tiled_copy(tiler)
        thr_x = tiled_x.get_slice(tid)
        tXcX = thr_x.partition_S(cute.local_tile(cute.make_identity_tensor(mX.shape), tiler,
                                                 (0, 0)))
        tXrX = cute.make_fragment_like(thr_x.partition_S(cute.local_tile(mX, tiler, (0, 0))))
        tXrDy = cute.make_fragment_like(tXrX)
        tXrDx = cute.make_fragment_like(tXrX)

        # Rows of this strip. Fused: strip s of G = gdim * strips, [s*q + min(s, r),
        # (s+1)*q + min(s+1, r)) with q, r = divmod(M, G) (backward_plan.strip_bounds).
        # dx: row bidx alone.
        row_start = bidx
        row_end = bidx + 1
        if cutlass.const_expr(self.fused):
            row_start, row_end = strip_rows(M, bidx * strips + strip_in_cta, gdim * strips)

        # With one chunk the weight is loaded once, before the row loop: the fused kernel reuses
        # it for every row of its strip (m needs it before the reduction, so unlike the forward
        # there is no later point where loading it would free registers).
        tWrW = None
        if cutlass.const_expr(self.w_type is not None and p.chunks == 1):
            tWrW = self.load_weight(mW, tiler, thr_x, tXcX, 0)
        # The dW accumulator: fp32, the same fragment layout as x, live for the whole strip.
        tXrDw = None
        if cutlass.const_expr(self.fused and self.w_type is not None):
            tXrDw = cute.make_fragment_like(tXrX, Float32)
            tXrDw.fill(0.0)
            if cutlass.const_expr(self.dw_in_smem):
                for c in cutlass.range_constexpr(p.chunks):
                    cute.autovec_copy(tXrDw, self.dw_slots(thr_x, sDw, tiler, c))

        # Prefetch (fused): the next row's x, dy and rstd are loaded into a second set of
        # registers while this row is reduced and stored, so a CTA -- alone on its SM with one
        # row at a time -- keeps a row's loads in flight through its barriers and stores.
        # Loads for a row past the strip's end are predicated off (and its rstd index clamped).
        tXrXn = None
        tXrDyn = None
        rstd_n = Float32(0.0)
        if cutlass.const_expr(p.prefetch):
            tXrXn = cute.make_fragment_like(tXrX)
            tXrDyn = cute.make_fragment_like(tXrX)
            first = row_start + row_in_cta
            self.load_chunk(tiled_x, thr_x, mX, mDy, tiler, row_start, 0, tXcX, tXrXn, tXrDyn,
                            first < row_end)
            rstd_n = mRstd[cutlass.min(first, M - 1)]

        # row0: the first of the rows worked on at once; this thread's row is row0 + row_in_cta
        for row0 in cutlass.range(row_start, row_end, rows):
            row = row0 + row_in_cta
            # rows past the strip's end: only in the last step of a strip of lane groups
            row_ok = None
            if cutlass.const_expr(rows > 1):
                row_ok = row < row_end
            rstd = rstd_n
            if cutlass.const_expr(p.prefetch):
                tXrX.store(tXrXn.load())
                tXrDy.store(tXrDyn.load())
                self.load_chunk(tiled_x, thr_x, mX, mDy, tiler, row0 + rows, 0, tXcX, tXrXn,
                                tXrDyn, row + rows < row_end)
                rstd_n = mRstd[cutlass.min(row + rows, M - 1)]
            elif cutlass.const_expr(rows > 1):
                rstd = mRstd[cutlass.min(row, M - 1)]
            else:
                rstd = mRstd[row]

            # Pass 1: sum(m * x_hat) over the row (chunks == 1 keeps x and dy for pass 2).
            mx = Float32(0.0)
            for c in cutlass.range_constexpr(p.chunks):
                chunk_w = tWrW
                if cutlass.const_expr(self.w_type is not None and tWrW is None):
                    chunk_w = self.load_weight(mW, tiler, thr_x, tXcX, c)
                if cutlass.const_expr(not p.prefetch):
                    self.load_chunk(tiled_x, thr_x, mX, mDy, tiler, row0, c, tXcX, tXrX, tXrDy,
                                    row_ok)
                x_hat = tXrX.load().to(Float32) * rstd
                m = self.m_of(tXrDy.load().to(Float32), chunk_w, offset)
                mx = mx + (m * x_hat).reduce(cute.ReductionOp.ADD, Float32(0.0),
                                             reduction_profile=0)
            # consecutive rows alternate reduction slots (reduce.row_sum)
            mx = row_sum(mx, sBuf, row0 % SLOTS, 0, warp_in_row, lane, self.warps_per_row,
                         min(p.threads_per_row, 32))
            mean_mx = mx / Float32(p.N)

            # Pass 2: dx (and the dW accumulation), store.
            for c in cutlass.range_constexpr(p.chunks):
                chunk_w = tWrW
                if cutlass.const_expr(p.chunks > 1):
                    if cutlass.const_expr(self.w_type is not None):
                        chunk_w = self.load_weight(mW, tiler, thr_x, tXcX, c)
                    self.load_chunk(tiled_x, thr_x, mX, mDy, tiler, row0, c, tXcX, tXrX, tXrDy,
                                    row_ok)
                dyf = tXrDy.load().to(Float32)
                x_hat = tXrX.load().to(Float32) * rstd
                m = self.m_of(dyf, chunk_w, offset)
                dx = rstd * (m - x_hat * mean_mx)
                if cutlass.const_expr(p.dh):  # the fused add: h's own gradient joins dx
                    tXrDh = cute.make_fragment_like(tXrX)
                    tXrDh.fill(0)
                    cute.copy(tiled_x, thr_x.partition_S(self.tile_at(mDh, tiler, row0, c)),
                              tXrDh, pred=self.column_predicate(tXcX, c, row_ok))
                    dx = dx + tXrDh.load().to(Float32)
                tXrDx.store(dx.to(self.x_type))
                tXgDx = thr_x.partition_D(self.tile_at(mDx, tiler, row0, c))
                cute.copy(tiled_x, tXrDx, tXgDx, pred=self.column_predicate(tXcX, c, row_ok))
                if cutlass.const_expr(self.dw_in_smem):
                    tXsDw = self.dw_slots(thr_x, sDw, tiler, c)
                    tXsDw.store(tXsDw.load() + dyf * self.x_hat_for_dw(x_hat))
                elif cutlass.const_expr(tXrDw is not None):
                    # Padding columns loaded as zeros add nothing.
                    tXrDw.store(tXrDw.load() + dyf * self.x_hat_for_dw(x_hat))

        if cutlass.const_expr(self.dw_in_smem):
            # This strip's partial dW row, chunk by chunk from shared memory.
            for c in cutlass.range_constexpr(p.chunks):
                tXsDw = self.dw_slots(thr_x, sDw, tiler, c)
                tXgDwP = thr_x.partition_D(cute.local_tile(mDwP, tiler, (bidx, c)))
                for k in cutlass.range_constexpr(p.vecs_per_thread):
                    if tXcX[(0, k), 0, 0][1] + c * p.cols_per_tile < p.N:
                        cute.autovec_copy(tXsDw[(None, k), None, None],
                                          tXgDwP[(None, k), None, None])
        elif cutlass.const_expr(tXrDw is not None):
            # This strip's partial dW row. Every strip writes, even an empty one (its zeros),
            # so the host's sum over partial rows never reads uninitialized memory. Lane groups
            # hold the same columns of different rows: butterfly shuffles across the groups sum
            # them, and the first group writes (the tile's other rows are never stored to).
            if cutlass.const_expr(rows > 1):
                for i in cutlass.range_constexpr((rows - 1).bit_length()):
                    for e in cutlass.range_constexpr(cute.size(tXrDw)):
                        tXrDw[e] = tXrDw[e] + cute.arch.shuffle_sync_bfly(
                            tXrDw[e], offset=p.threads_per_row << i)
            if cutlass.const_expr(self.dw_cluster > 1):
                dw_cluster.exchange(tXrDw, tXcX, mDwP, mbar, sRecv, tidx, p.N, p.vec,
                                    p.vecs_per_thread, self.dw_cluster, p.cta_threads)
            elif cutlass.const_expr(self.strips_meet):
                # Each strip's row goes to shared memory; then the CTA adds them column by
                # column, in strip order, into its one partial row.
                self.store_dw_row(tXrDw, thr_x.partition_D(
                    self.tile_at(sStrips, tiler, strip_in_cta, 0)), tXcX, row_in_cta)
                cute.arch.sync_threads()
                for col in cutlass.range(tidx, p.N, p.cta_threads):
                    total = Float32(0.0)
                    for j in cutlass.range_constexpr(strips):
                        total = total + sStrips[j, col]
                    mDwP[bidx, col] = total
            else:
                self.store_dw_row(tXrDw, thr_x.partition_D(self.tile_at(mDwP, tiler, bidx, 0)),
                                  tXcX, row_in_cta)

    @cute.jit
    def store_dw_row(self, tXrDw, tXgDw, tXcX, row_in_cta):
        """The strip's dW sums (fp32) to its row of ``tXgDw``: the first lane group writes, the
        columns before N."""
        if row_in_cta == 0:
            for k in cutlass.range_constexpr(self.plan.vecs_per_thread):
                if tXcX[(0, k), 0, 0][1] < self.plan.N:
                    cute.autovec_copy(tXrDw[(None, k), None, None], tXgDw[(None, k), None, None])

    @staticmethod
    def tile_at(mT, tiler, row0, c):
        """The tile of ``mT`` whose first row is ``row0``, column chunk c. A tile of several rows
        is anchored at ``row0`` (a strip need not start on a multiple of its rows); a tile of
        one row is simply tile ``row0``."""
        if cutlass.const_expr(tiler[0] == 1):
            return cute.local_tile(mT, tiler, (row0, c))
        return cute.local_tile(cute.domain_offset((row0, 0), mT), tiler, (0, c))

    @cute.jit
    def dw_slots(self, thr_x, sDw, tiler, c: cutlass.Constexpr[int]):
        """This thread's dW accumulator slots for column chunk c (shared memory)."""
        return thr_x.partition_D(cute.local_tile(sDw, tiler, (0, c)))

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

    @cute.jit
    def load_chunk(self, tiled_x, thr_x, mX, mDy, tiler, row0, c, tXcX, tXrX, tXrDy,
                   row_ok=None):
        """Registers <- column chunk c of x and dy in the tile from row ``row0`` (``c`` static,
        or a cluster CTA's rank, as in ``column_predicate``); zeros where predicated off, so
        padding columns and rows drop out of the row sum and the dW accumulator without a
        mask."""
        pred = self.column_predicate(tXcX, c, row_ok)
        tXrX.fill(0)
        tXrDy.fill(0)
        cute.copy(tiled_x, thr_x.partition_S(self.tile_at(mX, tiler, row0, c)), tXrX, pred=pred)
        cute.copy(tiled_x, thr_x.partition_S(self.tile_at(mDy, tiler, row0, c)), tXrDy, pred=pred)


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
