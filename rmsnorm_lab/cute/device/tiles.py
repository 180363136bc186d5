"""How every row kernel of the lab maps threads and 16-byte copies onto a tile of rows.

* ``RowTiles``: a mixin of the forward and backward kernel classes (their plans carry the same
  fields: threads_per_row, rows_per_cta, vec, vecs_per_thread, cols_per_tile, N); it builds the
  row tensors, the thread/value layout and the copies.
* ``RowCopy``: one thread's share of those copies inside a kernel (the tiled copy, the thread's
  slice, the tiler, the coordinates of its elements), with its predicates and the weight's
  registers.
* ``RowThread``: a thread's place in the grid and in its tile.
* ``strip_rows``: the rows of one strip of a persistent grid.
"""

import dataclasses
from typing import Any, Tuple

import cutlass
import cutlass.cute as cute
from cutlass import Int32
from cutlass.cute.nvgpu import cpasync

# A load's eviction priority ("first", "last"): its L1 priority, and its 64-bit L2 policy for
# ``.L2::cache_hint``, as ``createpolicy.fractional`` with fraction 1.0 makes it (the values of
# CUTLASS's ``CacheHintSm90``).
EVICT = {"first": (cute.nvgpu.CacheEvictionPriority.EVICT_FIRST, 0x12F0000000000000),
         "last": (cute.nvgpu.CacheEvictionPriority.EVICT_LAST, 0x14F0000000000000)}


def strip_rows(M, strip, n_strips):
    """Rows ``[start, end)`` of strip ``strip`` of ``n_strips``, as plan/backward.py
    ``strip_bounds`` splits them: ``s * q + min(s, r)`` with ``q, r = divmod(M, n_strips)``,
    which never forms ``s * M`` (an Int32 overflow for large M). The persistent kernels' strips
    of rows, and the split dW kernel's row groups."""
    q = M // n_strips
    r = M % n_strips
    return strip * q + cutlass.min(strip, r), (strip + 1) * q + cutlass.min(strip + 1, r)


class RowTiles:
    """Mixin: ``self.plan`` describes the tile and ``self.x_type`` its elements; these build the
    row tensors, the tile's layout and its copies."""

    def row_tensor(self, g: cute.Tensor, M) -> cute.Tensor:
        """``g`` as (M, N) rows with N static and 32-bit strides divisible by the copy width.

        32-bit sizes and strides (the launcher refuses tensors of 2^31 elements or more):
        TVM-FFI hands over 64-bit ones, and 64-bit index math costs the row kernel registers,
        resident CTAs per SM and bandwidth (docs/design-record.md, 'Kernels: 32-bit indices').
        The launcher guarantees row strides divisible by the copy width (plan eligibility);
        telling the compiler lets it prove every copy is 16-byte aligned."""
        ld = cute.assume(Int32(g.stride[0]), divby=self.plan.vec)
        return cute.make_tensor(g.iterator, cute.make_layout((M, self.plan.N), stride=(ld, 1)))

    def make_tiled_copy(self, tiler, evict=None):
        """The tile's copy, global memory <-> registers: ``plan.vec`` elements (16 bytes on the
        vector path) per thread per copy, threads laid out by ``tv_layout``. ``evict`` (a key of
        EVICT): a load with that L1 priority, whose L2 policy each ``cute.copy`` passes as
        ``cache_policy`` (``ld.global.L1::evict_*.L2::cache_hint``)."""
        bits = self.plan.vec * self.x_type.width
        if evict is None:
            atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.x_type,
                                       num_bits_per_copy=bits)
        else:
            atom = cute.make_copy_atom(cute.nvgpu.CopyG2ROp(), self.x_type, num_bits_per_copy=bits,
                                       l1c_evict_priority=EVICT[evict][0])
        return cute.make_tiled_copy(atom, self.tv_layout(), tiler)

    def make_async_copy(self, tiler):
        """The same tile, global -> shared memory by ``cp.async`` through L2 (``.cg``). It
        partitions a tile exactly as ``make_tiled_copy`` does, so a thread that reads shared
        memory through the latter reads the elements it copied itself."""
        atom = cute.make_copy_atom(cpasync.CopyG2SOp(cache_mode=cpasync.LoadCacheMode.GLOBAL),
                                   self.x_type, num_bits_per_copy=self.plan.vec * self.x_type.width)
        return cute.make_tiled_copy(atom, self.tv_layout(), tiler)

    def tv_layout(self) -> cute.Layout:
        """(thread, value) -> position in the column-major (rows_per_cta, cols_per_tile) tile.

        Thread (c, r) owns row r; its value (v, k) is column (k * threads_per_row + c) * vec + v,
        so a warp's k-th copy covers 32 consecutive 16-byte chunks of one row.
        """
        p = self.plan
        rows = p.rows_per_cta
        return cute.make_layout(
            ((p.threads_per_row, rows), (p.vec, p.vecs_per_thread)),
            stride=((p.vec * rows, 1), (rows, p.vec * p.threads_per_row * rows)),
        )

    def row_copy(self, tiler, tidx, mX: cute.Tensor, tile=(0, 0)) -> "RowCopy":
        """Thread ``tidx``'s share of the tile copy over ``mX``'s rows, its coordinates taken in
        ``tile`` (the dW kernel's column block; tile (0, 0) elsewhere)."""
        tiled = self.make_tiled_copy(tiler)
        thr = tiled.get_slice(tidx)
        tXcX = thr.partition_S(cute.local_tile(cute.make_identity_tensor(mX.shape), tiler, tile))
        return RowCopy(self.plan, tiled, thr, tiler, tXcX)


@dataclasses.dataclass(frozen=True)
class RowThread:
    """A thread of a row kernel, at trace time: its index ``tidx`` in the CTA, its CTA (``bidx``
    of ``gdim``), the row of the tile it works on (``row``), its warp within that row and its
    lane. A CTA of several one-warp strips (the fused backward's ``strips_per_cta``) adds the
    thread's strip in the CTA (``strip``) and its index within that strip (``tid``).
    Frozen, as ``RowCopy``."""

    tidx: Int32
    bidx: Int32
    gdim: Int32
    row: Int32
    warp: Int32
    lane: Int32
    tid: Any = None
    strip: Any = 0


@dataclasses.dataclass(frozen=True)
class RowCopy:
    """One thread's share of a kernel's row tiles: the tiled copy (``tiled``), the thread's slice
    of it (``thr``), the ``tiler``, and ``tXcX``, the coordinates of the thread's elements in
    tile (0, 0); a tile at (t, c) adds (t * rows_per_cta, c * cols_per_tile), and column blocks
    at or past N are predicated off. Built once per kernel at trace time and handed to its
    helpers, which then take only what differs: the tensor, the tile, the chunk, the registers.
    Frozen: the DSL passes a frozen dataclass through its dynamic loops as it is, read-only."""

    plan: Any
    tiled: Any
    thr: Any
    tiler: Tuple[int, int]
    tXcX: cute.Tensor

    def src(self, mT: cute.Tensor, tile, c) -> cute.Tensor:
        """This thread's slice of tile (``tile``, ``c``) of ``mT``, read from."""
        return self.thr.partition_S(cute.local_tile(mT, self.tiler, (tile, c)))

    def dst(self, mT: cute.Tensor, tile, c) -> cute.Tensor:
        """This thread's slice of tile (``tile``, ``c``) of ``mT``, written to."""
        return self.thr.partition_D(cute.local_tile(mT, self.tiler, (tile, c)))

    def fragment(self, mT: cute.Tensor, dtype=None) -> cute.Tensor:
        """Registers shaped like this thread's slice of a tile of ``mT`` (in ``dtype``: fp32
        accumulators)."""
        tXgX = self.thr.partition_S(cute.local_tile(mT, self.tiler, (0, 0)))
        if dtype is None:
            return cute.make_fragment_like(tXgX)
        return cute.make_fragment_like(tXgX, dtype)

    def tile_at(self, mT: cute.Tensor, row0, c) -> cute.Tensor:
        """The tile of ``mT`` whose first row is ``row0``, column chunk c. A tile of several rows
        is anchored at ``row0`` (a strip need not start on a multiple of its rows); a tile of
        one row is simply tile ``row0``."""
        if cutlass.const_expr(self.tiler[0] == 1):
            return cute.local_tile(mT, self.tiler, (row0, c))
        return cute.local_tile(cute.domain_offset((row0, 0), mT), self.tiler, (0, c))

    @cute.jit
    def column_predicate(self, c, row_ok=None):
        """One flag per column block of chunk c (``c`` static, or a cluster CTA's rank: its chunk
        of the row): does the block start before N (and, when given, is the row valid)?

        A thread's slice of the tile has shape ((vec, vecs_per_thread), 1, 1): the column blocks
        are the second sub-mode of mode 0, not a mode of their own. One flag per copy suffices:
        on the vector path N is a multiple of vec (plan eligibility); on the fallback vec is 1.
        The flags are laid out like that slice with stride 0 over the vec elements, as
        ``cute.copy`` expects.
        """
        p = self.plan
        pred = cute.make_rmem_tensor(
            cute.make_layout((p.vecs_per_thread, 1, 1), stride=(1, 0, 0)), cutlass.Boolean)
        for k in cutlass.range_constexpr(p.vecs_per_thread):
            col_ok = self.tXcX[(0, k), 0, 0][1] + c * p.cols_per_tile < p.N
            if cutlass.const_expr(row_ok is None):
                pred[k, 0, 0] = col_ok
            else:
                pred[k, 0, 0] = col_ok & row_ok
        return pred

    @cute.jit
    def load_rows(self, tensors, regs, row0, c, row_ok=None):
        """Registers ``regs`` <- column chunk c of each of ``tensors`` in the tile from row
        ``row0`` (``tile_at``; ``c`` as in ``column_predicate``); zeros where predicated off, so
        padding columns and rows add nothing to a sum."""
        pred = self.column_predicate(c, row_ok)
        for tXrT in regs:
            tXrT.fill(0)
        for mT, tXrT in zip(tensors, regs):
            cute.copy(self.tiled, self.thr.partition_S(self.tile_at(mT, row0, c)), tXrT,
                      pred=pred)

    @cute.jit
    def weight(self, mW: cute.Tensor, c):
        """Registers holding w (its own dtype) for this thread's columns of chunk c (as in
        ``column_predicate``), in x's fragment layout. A wider weight (fp32 w with bf16 x) takes
        as many 16-byte copies per column block as it needs (autovec_copy)."""
        tWgW = self.src(mW, 0, c)
        tWrW = cute.make_fragment_like(tWgW)
        tWrW.fill(0)
        self.copy_columns(tWgW, tWrW, c)
        return tWrW

    @cute.jit
    def copy_columns(self, tXsrc, tXdst, c):
        """``tXdst`` <- ``tXsrc`` (this thread's slices of chunk c) for the column blocks before
        N, by autovec_copy: the fp32 dW rows and the weight."""
        for k in cutlass.range_constexpr(self.plan.vecs_per_thread):
            if self.tXcX[(0, k), 0, 0][1] + c * self.plan.cols_per_tile < self.plan.N:
                cute.autovec_copy(tXsrc[(None, k), None, None], tXdst[(None, k), None, None])
