"""How every row kernel of the lab maps threads and 16-byte copies onto a tile of rows, shared by
the forward and backward kernel classes (their plans carry the same fields: threads_per_row,
rows_per_cta, vec, vecs_per_thread, cols_per_tile, N)."""

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync

# A load's eviction priority ("first", "last"): its L1 priority, and its 64-bit L2 policy for
# ``.L2::cache_hint``, as ``createpolicy.fractional`` with fraction 1.0 makes it (the values of
# CUTLASS's ``CacheHintSm90``).
EVICT = {"first": (cute.nvgpu.CacheEvictionPriority.EVICT_FIRST, 0x12F0000000000000),
         "last": (cute.nvgpu.CacheEvictionPriority.EVICT_LAST, 0x14F0000000000000)}


def strip_rows(M, strip, n_strips):
    """Rows ``[start, end)`` of strip ``strip`` of ``n_strips``, as ``backward_plan.strip_bounds``
    splits them: ``s * q + min(s, r)`` with ``q, r = divmod(M, n_strips)``, which never forms
    ``s * M`` (an Int32 overflow for large M). The persistent kernels' strips of rows."""
    q = M // n_strips
    r = M % n_strips
    return strip * q + cutlass.min(strip, r), (strip + 1) * q + cutlass.min(strip + 1, r)


class RowTiles:
    """Mixin: ``self.plan`` describes the tile and ``self.x_type`` its elements; these build its
    layout, copies, predicates and the weight's registers."""

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

    @cute.jit
    def column_predicate(self, tXcX, c, row_ok=None):
        """One flag per column block of chunk c (``tXcX``: the coordinates of chunk 0; ``c``
        static, or a cluster CTA's rank: its chunk of the row): does the block start before N
        (and, when given, is the row valid)?

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
            col_ok = tXcX[(0, k), 0, 0][1] + c * p.cols_per_tile < p.N
            if cutlass.const_expr(row_ok is None):
                pred[k, 0, 0] = col_ok
            else:
                pred[k, 0, 0] = col_ok & row_ok
        return pred

    @cute.jit
    def load_weight(self, mW, tiler, thr_x, tXcX, c):
        """Registers holding w (its own dtype) for this thread's columns of chunk c (as in
        ``column_predicate``), in x's fragment layout. A wider weight (fp32 w with bf16 x) takes
        as many 16-byte copies per column block as it needs (autovec_copy)."""
        tWgW = thr_x.partition_S(cute.local_tile(mW, tiler, (0, c)))
        tWrW = cute.make_fragment_like(tWgW)
        tWrW.fill(0)
        for k in cutlass.range_constexpr(self.plan.vecs_per_thread):
            if tXcX[(0, k), 0, 0][1] + c * self.plan.cols_per_tile < self.plan.N:
                cute.autovec_copy(tWgW[(None, k), None, None], tWrW[(None, k), None, None])
        return tWrW

    # -- the staged kernels' ring of rows in shared memory (forward_staged, backward_staged) --

    def ring_copies(self, tiler, tidx, mX):
        """``(g2s, thr_g2s, tiled_x, thr_x, tXcX)``: the global -> shared ``cp.async`` copy of a
        tile and the plain copy between memory and registers, with thread ``tidx``'s slices of
        both, and that thread's coordinates in chunk 0 of ``mX``. The two partition a chunk
        alike, so a thread reads back from shared memory exactly what its own cp.async wrote:
        the ring needs no barrier."""
        g2s = self.make_async_copy(tiler)
        tiled_x = self.make_tiled_copy(tiler)
        thr_x = tiled_x.get_slice(tidx)
        tXcX = thr_x.partition_S(cute.local_tile(cute.make_identity_tensor(mX.shape), tiler,
                                                 (0, 0)))
        return g2s, g2s.get_slice(tidx), tiled_x, thr_x, tXcX

    @cute.jit
    def stage(self, g2s, thr_g2s, rows, rings, tiler, tXcX, row, st, row_end):
        """One cp.async group: this thread's copies of ``row`` of each of ``rows`` (None: not
        staged) into stage ``st`` of its ring in ``rings`` (none past the strip's end: the group
        is then empty, and the count of groups the waits rely on stays one per row)."""
        for c in cutlass.range_constexpr(self.plan.chunks):
            pred = self.column_predicate(tXcX, c, row < row_end)
            for m, s in zip(rows, rings):
                if cutlass.const_expr(m is not None):
                    cute.copy(g2s, thr_g2s.partition_S(cute.local_tile(m, tiler, (row, c))),
                              thr_g2s.partition_D(cute.local_tile(s, tiler, (st, c))), pred=pred)
        cute.arch.cp_async_commit_group()

    @cute.jit
    def read_stage(self, thr_x, ring, tiler, st, c: cutlass.Constexpr[int]):
        """This thread's elements of column chunk c in stage ``st`` of ``ring``, in registers."""
        tXsX = thr_x.partition_S(cute.local_tile(ring, tiler, (st, c)))
        tXrX = cute.make_fragment_like(tXsX)
        cute.autovec_copy(tXsX, tXrX)
        return tXrX
