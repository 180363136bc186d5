"""The staged kernels' rows in shared memory (kernels/forward_staged.py,
kernels/backward_staged.py): each CTA walks a strip of rows (``strip.Strip``) and keeps the next
``stages - 1`` rows in flight by ``cp.async`` in a ring of stages (``RowRing``), so what is in
flight is bounded by shared memory (228 KB an SM on Hopper) rather than by registers.
``StagedRows`` is the kernels' common start and launch."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple

import cutlass
import cutlass.cute as cute
from cutlass.memory import SmemAllocator

from .pdl import wait_for_previous_grid
from .reduce import row_sum_bytes, row_sum_slots
from .strip import Strip, strip_start
from .tiles import RowCopy, RowTiles


@dataclasses.dataclass(frozen=True)
class RowRing:
    """A strip's ring of rows in shared memory: ``plan.stages`` rows of each staged tensor, row
    i of a CTA's strip in stage ``i % stages``. Each thread issues its own 16-byte copies of a
    row (every column chunk of every staged tensor) as one ``cp.async`` group, ``stages - 1``
    rows ahead of the row it works on, and waits only for its own group of that row. The
    ``cp.async`` copy (``g2s``, ``.cg``: through L2, past L1) and the register copy (``cp``)
    partition a chunk alike, so a thread reads back exactly the elements it copied itself: the
    ring needs no barrier, and a stage is refilled only after the same thread has read it."""

    stages: int
    chunks: int
    staged: Tuple[Optional[cute.Tensor], ...]  # the global tensors (None: not staged)
    rings: Tuple[Optional[cute.Tensor], ...]   # their rings in shared memory
    tiler: Tuple[int, int]
    g2s: Any                                   # the cp.async tiled copy
    thr_g2s: Any                               # this thread's slice of it
    cp: RowCopy                                # the register copy that reads the ring back

    @staticmethod
    def smem_bytes(plan, x_type, rings: int) -> int:
        """Shared memory of ``rings`` rings, with alignment room."""
        return rings * (plan.stages * plan.N * x_type.width // 8 + 128)

    @staticmethod
    def allocate(tiles: RowTiles, smem, staged):
        """One ring for each tensor of ``staged`` that is not None (None for the others)."""
        p = tiles.plan
        layout = cute.make_layout((p.stages, p.N), stride=(p.N, 1))
        return tuple(None if m is None else smem.allocate_tensor(tiles.x_type, layout,
                                                                 byte_alignment=128)
                     for m in staged)

    @staticmethod
    def make(tiles: RowTiles, tidx, tiler, staged, rings) -> "RowRing":
        """Thread ``tidx``'s copies of the rows of ``staged`` into ``rings`` (``allocate``)."""
        g2s = tiles.make_async_copy(tiler)
        cp = tiles.row_copy(tiler, tidx, staged[0])
        return RowRing(tiles.plan.stages, tiles.plan.chunks, tuple(staged), rings, tiler, g2s,
                       g2s.get_slice(tidx), cp)

    @cute.jit
    def stage(self, row, st, row_end):
        """One cp.async group: this thread's copies of ``row`` of each staged tensor into stage
        ``st`` (none past the strip's end: the group is then empty, and the count of groups the
        waits rely on stays one per row)."""
        for c in cutlass.range_constexpr(self.chunks):
            pred = self.cp.column_predicate(c, row < row_end)
            for m, s in zip(self.staged, self.rings):
                if cutlass.const_expr(m is not None):
                    cute.copy(self.g2s,
                              self.thr_g2s.partition_S(cute.local_tile(m, self.tiler, (row, c))),
                              self.thr_g2s.partition_D(cute.local_tile(s, self.tiler, (st, c))),
                              pred=pred)
        cute.arch.cp_async_commit_group()

    @cute.jit
    def fill(self, row_start, row_end):
        """Before the strip: its first ``stages - 1`` rows in flight."""
        for k in cutlass.range_constexpr(self.stages - 1):
            self.stage(row_start + k, k, row_end)

    @cute.jit
    def refill(self, row, i, row_end):
        """At the strip's i-th row, ``row``: the row ``stages - 1`` ahead, into the stage the
        previous row freed."""
        self.stage(row + self.stages - 1, (i + self.stages - 1) % self.stages, row_end)

    @cute.jit
    def wait(self, i):
        """Waits for this thread's copies of the strip's i-th row; returns the row's stage."""
        cute.arch.cp_async_wait_group(self.stages - 1)
        return i % self.stages

    @cute.jit
    def read(self, sX: cute.Tensor, st, c: cutlass.Constexpr[int]):
        """This thread's elements of column chunk c of stage ``st`` of the ring ``sX`` (one of
        ``rings``), in registers."""
        tXsX = self.cp.thr.partition_S(cute.local_tile(sX, self.tiler, (st, c)))
        tXrX = cute.make_fragment_like(tXsX)
        cute.autovec_copy(tXsX, tXrX)
        return tXrX


class StagedRows:
    """Mixin of the staged kernels, with ``RowTiles``: a persistent grid, CTA s walking strip s
    of the rows through a ring of stages of each staged tensor."""

    def launch_staged(self, kernel, grid, stream, rings: int):
        """Launches ``kernel`` (the kernel's launchable call) on ``grid`` strips of one CTA with
        ``rings`` rings. The launch bound holds ptxas to the registers of the plan's CTAs per
        SM; the carveout gives the SM's memory to shared memory, which the rings need."""
        p = self.plan
        kernel.launch(grid=[grid, 1, 1], block=[p.threads, 1, 1],
                      smem=RowRing.smem_bytes(p, self.x_type, rings)
                      + row_sum_bytes(1, self.warps_per_row),
                      stream=stream, min_blocks_per_mp=p.ctas_per_sm, preferred_smem_carveout=100,
                      use_pdl=p.pdl)

    @cute.jit
    def staged_strip(self, staged) -> Tuple[Strip, RowRing]:
        """The kernel's start: the CTA's strip, and the ring of the tensors of ``staged`` (x
        first; None: not staged)."""
        p = self.plan
        tidx, _, strip, n_strips, M, warp, lane = strip_start(staged[0])
        if cutlass.const_expr(p.pdl):
            wait_for_previous_grid()
        smem = SmemAllocator()
        rings = RowRing.allocate(self, smem, staged)
        sBuf = row_sum_slots(smem, 1, self.warps_per_row)
        ring = RowRing.make(self, tidx, (1, p.cols_per_tile), staged, rings)
        return Strip(tidx, warp, lane, M, strip, n_strips, sBuf, self.warps_per_row), ring
