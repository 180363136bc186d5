"""Launch plans for the CuTe forward kernels, in plain Python (no CUTLASS import: CPU-testable).

A plan fixes everything the kernel bakes in at compile time: the dtypes, the row width N, how many
elements one copy moves (16 bytes on the vector path, one element on the fallback), how threads
map onto a row, and how many rows a CTA owns. ``plan_forward`` applies the eligibility rules and
raises ``NotEligible`` with the reason when a variant cannot serve a shape.

Thread/value mapping of one CTA tile (rows_per_cta x cols_per_tile)::

    thread t = (c, r) with c < threads_per_row, r < rows_per_cta handles row r, and in column
    block k (k < vecs_per_thread) the `vec` contiguous elements starting at
        col = (k * threads_per_row + c) * vec
    so neighbouring threads touch neighbouring 16-byte chunks: every warp-wide load is coalesced.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import torch

from ...common.rows import INT32_LIMIT
from ...registry import FORWARD_VARIANTS as VARIANTS
from .quant import (FP8_COPIES_PER_THREAD, FP8_PDL_COPIES_PER_THREAD, fp8_launch_bound,
                    quant_problem)
COPY_BYTES = 16
# Threads per row for a row held in registers in one pass: about 2 copies in flight per thread,
# at most 256 threads; more threads of fewer copies each lost (the tiles of one copy a chunk,
# below, are another matter; docs/design-record.md, 'Forward: the row in registers').
MAX_THREADS = 256
COPIES_PER_THREAD = 2
# At most this many 16-byte copies per thread per chunk on the row path: the register model's
# own bound at 256 threads let ptxas spill on very wide rows; 8 covers N=16384 bf16 in one chunk
# and spills nothing.
MAX_COPIES_PER_CHUNK = 8
# Register model for "does the row fit in registers": a CTA of T threads may use 65536/T registers
# per thread (at most 255); about REG_OVERHEAD of them go to addresses, predicates and
# temporaries, the rest hold this thread's x and w elements. ptxas -v confirms no spills for
# every plan the tests compile (tests/library/test_cute_compile.py).
REG_OVERHEAD = 40
ELEM_BYTES = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}


class NotEligible(ValueError):
    """The variant cannot serve this shape/alignment; the message says why."""


@dataclasses.dataclass(frozen=True)
class RowsRule:
    """An integer that follows the row count M: ``max(1, min(cap, ceil(M / per)))`` (cap 0: no
    cap). Grids, strip counts and rows of dW partials are such rules, so one plan serves every M;
    the Python launches and the native node evaluate the same rule per call."""
    per: int = 1
    cap: int = 0

    def of(self, M: int) -> int:
        n = -(-M // self.per)
        return max(1, min(n, self.cap) if self.cap else n)


@dataclasses.dataclass(frozen=True)
class RowTilePlan:
    """The tile every row kernel works on (forward and backward plans alike); the kernels' shared
    layout code (``tiles.RowTiles``) reads these fields."""
    N: int
    vec: int                 # elements per copy (16 bytes on the vector path, 1 on the fallback)
    threads_per_row: int     # threads across the columns of one row
    rows_per_cta: int
    vecs_per_thread: int     # column blocks per thread in one pass over a chunk

    @property
    def threads(self) -> int:
        return self.threads_per_row * self.rows_per_cta

    @property
    def cols_per_tile(self) -> int:
        return self.vec * self.threads_per_row * self.vecs_per_thread


@dataclasses.dataclass(frozen=True)
class ForwardPlan(RowTilePlan):
    variant: str
    x_dtype: torch.dtype
    w_dtype: Optional[torch.dtype]  # None: no weight
    casting_mode: str
    store_rstd: bool
    chunks: int              # 1: the row stays in registers; >1: two passes over column chunks
    ctas_per_sm: int = 0     # persistent grid = SMs x this CTAs (0: other variants)
    prefetch: bool = False   # persistent: load the CTA's next row while this one is reduced
    min_ctas_per_sm: int = 0  # > 0: launch bound, ptxas fits this many CTAs on an SM
    pdl: bool = False        # programmatic dependent launch (``uses_pdl``)
    #: the fused residual add: the row is h = x + residual, stored, then normalized
    residual: bool = False
    #: cluster: the CTAs of a thread-block cluster that share one row (1: other variants)
    cluster_n: int = 1
    #: staged: rows of the CTA's strip in flight in shared memory (0: other variants)
    stages: int = 0
    #: consecutive tiles a CTA owns, every tile's loads issued before the first is reduced
    tiles_per_cta: int = 1
    #: y written as float8_e4m3fn: "" (y in x's dtype), "static" (one scale for the tensor) or
    #: "token" (a scale per row, from the row's amax); ``scale_ub``: the amax bounded above
    quant: str = ""
    scale_ub: bool = False
    #: w's scale is ``offset + w`` for the run-time offset; False, where the call's offset is 0,
    #: adds none (fp8 plans: the compiler then takes llama's rounding two values a word)
    offset: bool = True

    @property
    def cta_rows(self) -> int:
        """Rows one CTA of a grid that grows with M covers: its tiles' rows."""
        return self.rows_per_cta * self.tiles_per_cta

    @property
    def stream_y(self) -> bool:
        """Store y evict-first (``st.global.cs``)? For rows too wide for the registers, whose
        second pass reads the row back from L2 while y streams past it: column chunks, not the
        two-pass tile of 16 KB rows (its rows in flight fit L2, and evict-first stores cost time
        there), not rows staged in shared memory
        (docs/design-record.md, 'Forward: L2 policies on wide rows')."""
        return (self.chunks > 1 and not self.stages
                and self.N > self.vec * MAX_THREADS * MAX_COPIES_PER_CHUNK)

    @property
    def l2_hints(self) -> bool:
        """Load x with L2 eviction priorities? Where ``stream_y``, without a residual: the
        chunks the second pass re-reads evict last in the first pass, every other load of x
        evicts first, as torch.compile's kernel loads them
        (docs/design-record.md, 'Forward: L2 policies on wide rows')."""
        return self.stream_y and not self.residual

    @property
    def weight_up_front(self) -> bool:
        """Load w before the row rather than after the reduction? The persistent grids, which
        load it once for every row they visit. A CTA of one tile loads it after the reduction:
        up front it costs registers, made warp-per-row spill and lost time
        (docs/design-record.md, 'Forward: the weight after the reduction')."""
        return self.chunks == 1 and self.persistent

    @property
    def persistent(self) -> bool:
        return self.variant in ("persistent", "cluster", "staged")

    @property
    def pipeline_chunks(self) -> bool:
        """Chunk c+1's loads issued before chunk c is used (``pipelines``); not with a residual,
        whose second pass re-reads the h the first pass stored."""
        return pipelines(self.chunks, self.vecs_per_thread) and not self.residual

    def grid_cap(self, sm_count: int) -> int:
        """The persistent grids' size: what is resident at once, in CTAs (``cluster``: clusters,
        ``persistent_grid``); 0 for the grids of one tile per CTA, which grow with M. The Python
        launch (``grid``) and the native node's rule read it."""
        return persistent_grid(sm_count, self.ctas_per_sm, self.cluster_n) \
            if self.persistent else 0

    def grid(self, sm_count: int) -> RowsRule:
        """The grid, in CTAs (clusters for ``cluster``), as a rule of M: a tile of ``cta_rows``
        rows a CTA, up to ``grid_cap``."""
        return RowsRule(self.cta_rows, self.grid_cap(sm_count))


# ``auto``'s few-rows tile of the middle row class (cute/plan/auto.py): copies a thread.
FEW_ROWS_COPIES_PER_THREAD = 4
# Warp-per-row rows of at most one 16-byte copy a lane (per-head rows: N <= 256 bf16) leave a
# thread one load in flight a tile. A CTA of SHORT_ROW_THREADS takes SHORT_ROW_TILES consecutive
# tiles and issues all their loads before it reduces the first. Two: each tile's 64-bit row
# address takes registers, so more cost CTAs (docs/design-record.md, 'Forward: per-head rows').
SHORT_ROW_THREADS = 128
SHORT_ROW_TILES = 2


# Two tiles of the row variant take one 16-byte copy a thread a column chunk, each chunk's loads
# issued before the previous chunk is used, under a launch bound that holds ptxas to 32 registers:
# 64 warps an SM, the shape of torch.compile's kernels at these widths. Without the bound ptxas
# takes more registers and fewer CTAs fit.
# * Rows of exactly TWO_PASS_ROW_COPIES copies (16 KB: N=8192 bf16): 512 threads x 2 chunks,
#   4 CTAs an SM; the one-pass tile stays faster at N=4096 and N=16384
#   (docs/design-record.md, 'Forward: the two-pass tile at 16 KB rows').
# * Rows wider than the registers (``stream_y``): 1024 threads x as many chunks as the row needs,
#   2 CTAs an SM; faster than 256 threads x 8 copies a chunk, and than the cluster variant
#   (docs/design-record.md, 'Forward: wide rows at 1024 threads').
TWO_PASS_ROW_COPIES = 1024
TWO_PASS_THREADS = 512
TWO_PASS_CTAS_PER_SM = 4
WIDE_THREADS = 1024
WIDE_CTAS_PER_SM = 2
# Measured on Hopper only; for sm_100a ptxas spills under the same launch bounds.
TWO_PASS_ARCHS = ("sm_90a",)


def two_pass_fits(x_dtype: torch.dtype, w_dtype: Optional[torch.dtype], casting_mode: str) -> bool:
    """Does ptxas fit the tiles of one copy a chunk in the 32 registers their launch bounds
    allow, without spilling? Yes for a weight no wider than x (or none) in the llama and gemma
    modes; an fp32 weight on bf16 x, and the none mode's extra roundings, made them spill
    (ptxas -v, sm_90a; tests/library/test_cute_compile.py compiles every case). fp8 plans take
    a one-row tile of their own (plan/quant.py)."""
    narrow_weight = w_dtype is None or ELEM_BYTES[w_dtype] <= ELEM_BYTES[x_dtype]
    return narrow_weight and casting_mode != "none"


# Programmatic dependent launch (PDL): the kernel is launched with programmatic stream
# serialization, so its CTAs may become resident while the previous kernel on the stream drains;
# they wait (griddepcontrol.wait) before touching global memory, and each triggers its own
# dependents at once. What it saves is the gap between one grid's end and the next one's start:
# it pays for the row kernel with CTAs of 128 threads or more (fp8's tile is sized for it), for
# `auto`'s row kernel at few rows (``row_class``) at any CTA size and for warp-per-row's short-row
# tiles. The persistent grid, 64-thread row CTAs at many rows and warp-per-row's one-tile CTAs
# lost with it. Measured on Hopper only (docs/design-record.md, 'Forward: PDL on Hopper').
PDL_ARCHS = ("sm_90a",)
PDL_VARIANTS = ("row",)
PDL_MIN_THREADS = 128


def uses_pdl(variant: str, threads: int, arch: Optional[str], few_rows: bool = False,
             tiles_per_cta: int = 1) -> bool:
    """Does a forward kernel of ``variant`` with CTAs of ``threads`` launch with PDL on ``arch``
    (when ``settings.pdl`` allows it)? ``few_rows``: ``auto``'s row kernel at few rows
    (``row_class``), which always does; so does a CTA of several tiles (``tiles_per_cta``)."""
    if arch not in PDL_ARCHS:
        return False
    return tiles_per_cta > 1 or (variant in PDL_VARIANTS
                                 and (few_rows or threads >= PDL_MIN_THREADS))


def check_int32_addressable(M: int, row_stride: int, N: int) -> None:
    """The kernels index with 32-bit arithmetic (64-bit index math costs registers, and so
    resident CTAs: docs/design-record.md, 'Kernels: 32-bit indices'); refuse, naming the way
    out, what that cannot address."""
    if M * max(row_stride, N) >= INT32_LIMIT:
        raise ValueError(f"x spans {M * max(row_stride, N)} elements; the CuTe kernels address "
                         f"at most 2^31 - 1 with 32-bit indices: use backend='triton', or split x")


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def elems_in_registers(threads: int, x_bytes: int, w_bytes: int = 0) -> int:
    """How many row elements one thread can hold without spilling, each costing ``x_bytes``
    (plus ``w_bytes`` for the matching weight) of registers."""
    regs = min(255, 65536 // threads) - REG_OVERHEAD
    return regs * 4 // (x_bytes + w_bytes)


def row_threads(n_vecs: int, copies: int = COPIES_PER_THREAD) -> int:
    """Threads per row of a one-row CTA: ``copies`` copies each where the row allows, a power of
    two from one warp to MAX_THREADS (forward and backward alike)."""
    return min(MAX_THREADS, max(32, _pow2_ceil(-(-n_vecs // copies))))


def chunked(vecs_per_thread: int, max_vecs: int):
    """``(vecs_per_thread, chunks)``: as few column chunks as keep each within ``max_vecs``
    copies per thread, the copies spread evenly over them."""
    chunks = -(-vecs_per_thread // max_vecs)
    return -(-vecs_per_thread // chunks), chunks


def _row_mapping(n_vecs: int, max_vecs_of):
    """Threads per row, column blocks per thread and chunk count for one CTA covering a row of
    n_vecs copies: COPIES_PER_THREAD copies per thread where the row allows, a power-of-two
    thread count between one warp and MAX_THREADS, and as many column chunks as the register
    budget forces."""
    threads = row_threads(n_vecs)
    max_vecs = max(1, min(MAX_COPIES_PER_CHUNK, max_vecs_of(threads)))
    vecs_per_thread, chunks = chunked(-(-n_vecs // threads), max_vecs)
    return threads, vecs_per_thread, chunks


def plan_forward(variant: str, N: int, x_dtype: torch.dtype, w_dtype: Optional[torch.dtype],
                 casting_mode: str, store_rstd: bool, aligned: bool,
                 arch: Optional[str] = None, pdl: bool = False,
                 residual: bool = False, row_class: int = 0, quant: str = "",
                 scale_ub: bool = False, offset: bool = True) -> ForwardPlan:
    """The plan of ``variant`` for rows of N; ``arch`` (e.g. ``sm_90a``) is the target the plan
    will be compiled for, where a tile depends on it (the two-pass tile, PDL); None: any target.
    ``pdl``: launch with PDL where ``uses_pdl`` says it pays (the caller passes ``settings.pdl``).
    ``residual``: the fused residual add, which holds a residual chunk beside x's while it adds
    them (the register model counts both), and takes neither the persistent grid's prefetch nor
    the tiles of one copy a chunk (all measured without it). ``row_class``: ``auto``'s class of
    the row count, whose few-rows tiles cute/plan/auto.py describes. ``quant``: y written as fp8
    (a static or per-token scale, ``scale_ub`` bounding its amax) or NVFP4 (plan/quant.py).
    ``offset``: False where the call's offset is 0 (ForwardPlan.offset)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    problem = quant_problem(quant, scale_ub, variant, N, ELEM_BYTES.get(x_dtype), store_rstd,
                            arch)
    if problem:
        raise NotEligible(problem)
    if x_dtype not in ELEM_BYTES:
        raise NotEligible(f"x dtype {x_dtype} is not supported")
    if N < 1:
        raise NotEligible("N must be positive")
    elem = ELEM_BYTES[x_dtype]
    vec = COPY_BYTES // elem
    if variant != "fallback":
        if N % vec:
            raise NotEligible(f"N={N} is not a multiple of the vector width {vec} "
                              f"({COPY_BYTES}-byte copies of {x_dtype})")
        if not aligned:
            raise NotEligible("x or y is not 16-byte aligned (base pointer or row stride)")
    else:
        vec = 1
    n_vecs = N // vec
    common = dict(variant=variant, x_dtype=x_dtype, w_dtype=w_dtype, N=N,
                  casting_mode=casting_mode, store_rstd=store_rstd, vec=vec, residual=residual,
                  quant=quant, scale_ub=scale_ub, offset=offset)
    w_bytes = ELEM_BYTES[w_dtype] if w_dtype is not None else 0
    x_bytes = elem * (2 if residual else 1)  # x, and the residual while it is added

    def max_vecs_of(threads: int) -> int:
        return elems_in_registers(threads, x_bytes, w_bytes) // vec

    if variant == "cluster":
        return _cluster_plan(n_vecs, max_vecs_of, arch, common)
    if variant == "staged":
        return _staged_plan(n_vecs, max_vecs_of, common)
    if variant == "warp":
        vecs_per_thread = -(-n_vecs // 32)
        # A row of fewer copies than a warp has lanes (a per-head row: 128 bf16 are 16 copies)
        # takes a power-of-two group of lanes, so two or more rows share a warp and no lane idles.
        lanes = min(32, 1 << (n_vecs - 1).bit_length())
        # Rows per CTA: 2 for long rows, up to 8 for short ones, the best measured at N=4096 and
        # N=1024 (docs/design-record.md, 'Forward: warp-per-row for short rows'); as many more
        # as rows share a warp.
        rows = max(2, min(8, 32 // vecs_per_thread)) * (32 // lanes)
        if vecs_per_thread > max_vecs_of(lanes * rows):
            raise NotEligible(f"warp-per-row keeps the row in one warp's registers: at most "
                              f"{lanes * max_vecs_of(lanes * rows) * vec} elements of "
                              f"{x_dtype}, N={N}")
        tiles = 1
        if vecs_per_thread == 1:  # a lane holds one copy of a row (SHORT_ROW_TILES)
            rows, tiles = SHORT_ROW_THREADS // lanes, SHORT_ROW_TILES
        return ForwardPlan(threads_per_row=lanes, rows_per_cta=rows,
                           vecs_per_thread=vecs_per_thread, chunks=1, tiles_per_cta=tiles,
                           pdl=pdl and uses_pdl(variant, lanes * rows, arch, tiles_per_cta=tiles),
                           **common)
    threads, vecs_per_thread, chunks = _row_mapping(n_vecs, max_vecs_of)
    min_ctas_per_sm = 0
    few_rows = row_class > 0 and variant == "row" and chunks == 1 and not residual
    fp8_threads = row_threads(n_vecs, FP8_COPIES_PER_THREAD)  # the fp8 epilogue's row tile
    if fp8_threads < PDL_MIN_THREADS <= row_threads(n_vecs, FP8_PDL_COPIES_PER_THREAD):
        fp8_threads = PDL_MIN_THREADS  # a CTA that launches with PDL (plan/quant.py)
    if few_rows:
        if row_class == 1:
            threads = row_threads(n_vecs, FEW_ROWS_COPIES_PER_THREAD)
            vecs_per_thread = -(-n_vecs // threads)
        min_ctas_per_sm = fp8_launch_bound(quant, offset, threads, vecs_per_thread)
    elif (variant == "row" and not residual and quant in ("static", "token") and chunks == 1
            and -(-n_vecs // fp8_threads) <= max_vecs_of(fp8_threads)):
        threads, vecs_per_thread = fp8_threads, -(-n_vecs // fp8_threads)
        min_ctas_per_sm = fp8_launch_bound(quant, offset, threads, vecs_per_thread)
    elif (variant == "row" and not residual and not quant and arch in TWO_PASS_ARCHS
            and two_pass_fits(x_dtype, w_dtype, casting_mode)):
        if n_vecs == TWO_PASS_ROW_COPIES:
            threads, vecs_per_thread = TWO_PASS_THREADS, 1
            chunks, min_ctas_per_sm = n_vecs // TWO_PASS_THREADS, TWO_PASS_CTAS_PER_SM
        elif chunks > 1:
            threads, vecs_per_thread = WIDE_THREADS, 1
            chunks, min_ctas_per_sm = -(-n_vecs // WIDE_THREADS), WIDE_CTAS_PER_SM
    ctas_per_sm = 0
    prefetch = False
    if variant == "persistent":
        # A second register copy of the row for the next row's loads, where it fits: a CTA
        # then always has a row in flight, as the fused backward does.
        prefetch = not residual and chunks == 1 and vecs_per_thread * vec <= elems_in_registers(
            threads, 2 * elem + w_bytes)
        ctas_per_sm = resident_ctas(  # + 4 registers: the row loop's index and bounds
            threads, vecs_per_thread * vec * ((2 if prefetch else 1) * x_bytes + w_bytes),
            extra_regs=4)
    return ForwardPlan(threads_per_row=threads, rows_per_cta=1, vecs_per_thread=vecs_per_thread,
                       chunks=chunks, ctas_per_sm=ctas_per_sm, prefetch=prefetch,
                       min_ctas_per_sm=min_ctas_per_sm,
                       pdl=pdl and uses_pdl(variant, threads, arch, few_rows), **common)


# The cluster variant: CTAs of MAX_THREADS threads per cluster, at most the portable cluster size
# (8 on Hopper and Blackwell), on the architectures with thread-block clusters.
MAX_CLUSTER = 8
CLUSTER_ARCHS = ("sm_90a", "sm_100a", "sm_103a")
# Copies per thread a cluster CTA aims at: with the next row's copies beside them, small enough
# for two CTAs an SM (one CTA's phases -- loads, barrier, exchange, stores -- overlap another's).
CLUSTER_COPIES_PER_THREAD = 4
# The cluster kernels' persistent grids hold this many times the clusters that would be resident
# if every SM were filled. A cluster is placed inside one GPC, and GPCs whose SM counts are not
# multiples of the cluster leave some of the nominally resident clusters for a second wave, which
# doubles the time of their strips; several waves of shorter strips keep that tail short
# (docs/design-record.md, 'Kernels: cluster grids of eight waves').
CLUSTER_GRID_WAVES = 8


def persistent_grid(sm_count: int, ctas_per_sm: int, cluster_n: int = 1) -> int:
    """A persistent kernel's grid: ``ctas_per_sm`` CTAs on each SM, resident all at once; for a
    cluster kernel (``cluster_n`` > 1), clusters in CLUSTER_GRID_WAVES nominal waves."""
    if cluster_n > 1:
        return CLUSTER_GRID_WAVES * max(1, sm_count * ctas_per_sm // cluster_n)
    return max(1, sm_count * ctas_per_sm)


def _cluster_plan(n_vecs: int, max_vecs_of, arch: Optional[str], common: dict) -> ForwardPlan:
    """The ``cluster`` plan: a row too wide for one CTA's registers split over a cluster's CTAs
    (a power of two), each a column slice of CLUSTER_COPIES_PER_THREAD copies a thread where the
    cluster size allows; their sums of squares meet in distributed shared memory. A persistent
    grid: each cluster walks a strip of rows with the next row's slice in flight. The row is read
    from DRAM once, where the ``row`` variant's column chunks read it twice (the second time
    mostly from L2)."""
    if arch is not None and arch not in CLUSTER_ARCHS:
        raise NotEligible(f"thread-block clusters need Hopper or later, not {arch}")
    if common["residual"]:
        raise NotEligible("the cluster variant serves rms_norm alone, not the fused add")
    # copies one CTA holds in one pass (the row variant's bound on a chunk)
    per_cta = MAX_THREADS * max(1, min(MAX_COPIES_PER_CHUNK, max_vecs_of(MAX_THREADS)))
    if n_vecs <= per_cta:
        raise NotEligible("the row fits one CTA's registers: no cluster needed")
    want = -(-n_vecs // (MAX_THREADS * CLUSTER_COPIES_PER_THREAD))
    cluster_n = min(MAX_CLUSTER, max(2, _pow2_ceil(want)))
    vecs_per_thread = -(-n_vecs // (cluster_n * MAX_THREADS))
    # per element: x and the next row's x, and w (the fp32 copies are transient)
    vec = common["vec"]
    elem = ELEM_BYTES[common["x_dtype"]]
    w_bytes = ELEM_BYTES[common["w_dtype"]] if common["w_dtype"] is not None else 0
    if vecs_per_thread * vec > elems_in_registers(MAX_THREADS, 2 * elem, w_bytes):
        raise NotEligible(f"the row needs more than a cluster of {MAX_CLUSTER} CTAs' registers")
    return ForwardPlan(threads_per_row=MAX_THREADS, rows_per_cta=1,
                       vecs_per_thread=vecs_per_thread, chunks=1, cluster_n=cluster_n,
                       ctas_per_sm=resident_ctas(MAX_THREADS,
                                                 vecs_per_thread * vec * (2 * elem + w_bytes)),
                       **common)


# The staged plans (this forward, and the backward's): at most this many rows in flight per CTA,
# in at most this much shared memory an SM (Hopper's 228 KB, less a CTA's reserve and the row
# sums).
MAX_STAGES = 4
STAGED_SMEM_PER_SM = 220 * 1024


def staged_fit(ctas: int, stage_bytes: int, what: str) -> Tuple[int, int]:
    """``(ctas, stages)`` of a staged plan: as many of the ``ctas`` the registers allow as leave
    each at least two stages of ``stage_bytes`` in STAGED_SMEM_PER_SM, and as many stages (at
    most MAX_STAGES) as then fit; NotEligible, naming ``what`` two stages hold, where not even
    one CTA's two do."""
    while ctas > 1 and STAGED_SMEM_PER_SM // ctas < 2 * stage_bytes:
        ctas -= 1
    stages = min(MAX_STAGES, STAGED_SMEM_PER_SM // ctas // stage_bytes)
    if stages < 2:
        raise NotEligible(f"{what} ({2 * stage_bytes // 1024} KB) do not fit "
                          f"{STAGED_SMEM_PER_SM // 1024} KB of shared memory")
    return ctas, stages


def _staged_plan(n_vecs: int, max_vecs_of, common: dict) -> ForwardPlan:
    """The ``staged`` plan: a row too wide for one CTA's registers goes through a ring of
    ``stages`` rows in shared memory, filled by ``cp.async`` ``stages - 1`` rows ahead, while a
    persistent grid's CTAs walk strips of rows. MAX_THREADS threads, one 16-byte copy each per
    column chunk (N a multiple of a chunk's columns); registers hold w for the whole strip. As
    many CTAs an SM as their registers allow and two rows each fit shared memory, as many stages
    as that leaves room for."""
    if common["residual"]:
        raise NotEligible("the staged variant serves rms_norm alone, not the fused add")
    per_cta = MAX_THREADS * max(1, min(MAX_COPIES_PER_CHUNK, max_vecs_of(MAX_THREADS)))
    if n_vecs <= per_cta:
        raise NotEligible("the row fits one CTA's registers: no staging needed")
    if n_vecs % MAX_THREADS:
        raise NotEligible(f"the staged variant needs N a multiple of {MAX_THREADS} copies "
                          f"({MAX_THREADS * common['vec']} elements)")
    elems = n_vecs // MAX_THREADS * common["vec"]  # per thread
    w_bytes = ELEM_BYTES[common["w_dtype"]] if common["w_dtype"] is not None else 0
    if elems * w_bytes > elems_in_registers(MAX_THREADS, 1):
        raise NotEligible("w of the row does not fit a CTA's registers")
    row_bytes = n_vecs * COPY_BYTES
    # w, and the thread's x of the row: ptxas hoists the shared-memory reads of the unrolled
    # chunks (at 24576 bf16 it spilled when held to two CTAs an SM); + 16 for the fp32 math
    ctas, stages = staged_fit(resident_ctas(
        MAX_THREADS, elems * (w_bytes + ELEM_BYTES[common["x_dtype"]]), extra_regs=16),
        row_bytes, "two rows")
    return ForwardPlan(threads_per_row=MAX_THREADS, rows_per_cta=1, vecs_per_thread=1,
                       chunks=n_vecs // MAX_THREADS, ctas_per_sm=ctas, stages=stages, **common)


def pipelines(chunks: int, vecs_per_thread: int) -> bool:
    """Do the chunked passes load chunk c+1 while chunk c is used? Where ptxas keeps the second
    register copy within the CTAs already resident: over more than 2 chunks, and over 2 chunks of
    one copy each. Over 2 chunks of several copies ptxas keeps both chunks live across the
    passes, which leaves room for one CTA per SM instead of two; such rows keep the plain chunk
    loop (docs/design-record.md, 'Forward: pipelined chunks')."""
    return chunks > 2 or (chunks == 2 and vecs_per_thread == 1)


def resident_ctas(threads: int, register_bytes_per_thread: int, extra_regs: int = 0,
                  most: int = 32) -> int:
    """CTAs of ``threads`` threads that fit on one SM at once when each thread holds
    ``register_bytes_per_thread`` of row data plus REG_OVERHEAD (+ ``extra_regs``) registers, at
    most ``most``: the register model behind every persistent grid of the lab (the forward's
    ``persistent`` variant, the fused backward's strips). A grid larger than that runs as a
    second wave and loses the point of being persistent. Registers are allocated per warp in units
    of 8 per thread, at most 255; an SM holds 2048 threads and 32 CTAs."""
    regs = REG_OVERHEAD + extra_regs + -(-register_bytes_per_thread // 4)
    regs = min(255, -(-regs // 8) * 8)
    return max(1, min(65536 // (regs * threads), 2048 // threads, most))
