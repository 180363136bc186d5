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
from typing import Optional

import torch

from ..common.rows import INT32_LIMIT
from ..registry import FORWARD_VARIANTS as VARIANTS
COPY_BYTES = 16
# Threads per row for the row/persistent variants: about 2 copies in flight per thread, at most
# 256 threads. Measured on the H200 (bf16, graph replay; results/NOTES.md, "thread mapping"):
# at 65536x4096, 256 threads x 2 copies ran at 4165 GB/s, 128 x 4 at 4095, 512 x 1 at 3610;
# at 16384x16384, 256 x 8 at 4148 and 1024 x 2 at 2571.
MAX_THREADS = 256
COPIES_PER_THREAD = 2
# At most this many 16-byte copies per thread per chunk on the row path: 26 (the register
# model's bound at 256 threads) made ptxas spill 2.5 KB at N=262144 bf16; 8 covers N=16384 bf16
# in one chunk and spills nothing.
MAX_COPIES_PER_CHUNK = 8
# Register model for "does the row fit in registers": a CTA of T threads may use 65536/T registers
# per thread (at most 255); about REG_OVERHEAD of them go to addresses, predicates and
# temporaries, the rest hold this thread's x and w elements. ptxas -v confirms no spills for
# every plan the tests compile (tests/test_cute_compile.py).
REG_OVERHEAD = 40
_ELEM_BYTES = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}


class NotEligible(ValueError):
    """The variant cannot serve this shape/alignment; the message says why."""


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
    ctas_per_sm: int = 0     # persistent grid = SMs x this (0: other variants)
    prefetch: bool = False   # persistent: load the CTA's next row while this one is reduced
    min_ctas_per_sm: int = 0  # > 0: launch bound, ptxas fits this many CTAs on an SM
    pdl: bool = False        # programmatic dependent launch (``uses_pdl``)

    @property
    def persistent(self) -> bool:
        return self.variant == "persistent"

    @property
    def pipeline_chunks(self) -> bool:
        """Chunk c+1's loads issued before chunk c is used (``pipelines``)."""
        return pipelines(self.chunks, self.vecs_per_thread)

    def grid(self, M: int, sm_count: int) -> int:
        tiles = -(-M // self.rows_per_cta)
        if not self.persistent:
            return tiles
        return max(1, min(tiles, sm_count * self.ctas_per_sm))


# Rows of exactly this many 16-byte copies (16 KB: N=8192 in bf16 or fp16) take a two-pass tile
# on the row variant: 512 threads x 1 copy x 2 column chunks, each chunk's loads issued before the
# previous chunk is used, and a launch bound of 4 CTAs per SM (ptxas then holds the kernel to 32
# registers: 64 warps per SM). That is the shape of torch.compile's kernel at this width.
# H200, 16384x8192 bf16, graph replay, one process (results/NOTES.md 22): 129.6-130.0 us against
# 130.9-131.6 for the one-pass 256 x 4 tile (62 registers, 32 warps per SM); without the
# pipelining 130.3-130.7; without the launch bound (44 registers, 2 CTAs) 162. Other widths keep
# the one-pass tile: at N=4096 512 threads lost 16%, at N=16384 512 x 2 chunks lost 1%.
TWO_PASS_ROW_COPIES = 1024
TWO_PASS_THREADS = 512
TWO_PASS_CTAS_PER_SM = 4
# Measured on Hopper only; for sm_100a ptxas spilled 24 bytes under the same launch bound.
TWO_PASS_ARCHS = ("sm_90a",)


def two_pass_fits(x_dtype: torch.dtype, w_dtype: Optional[torch.dtype], casting_mode: str) -> bool:
    """Does ptxas fit the two-pass tile in the 32 registers its launch bound allows, without
    spilling? Yes for a weight no wider than x (or none) in the llama and gemma modes; an fp32
    weight on bf16 x spilled 28 bytes, the none mode's extra roundings 24 (ptxas -v, sm_90a;
    tests/test_cute_compile.py compiles every case)."""
    narrow_weight = w_dtype is None or _ELEM_BYTES[w_dtype] <= _ELEM_BYTES[x_dtype]
    return narrow_weight and casting_mode != "none"


# Programmatic dependent launch (PDL): the kernel is launched with programmatic stream
# serialization, so its CTAs may become resident while the previous kernel on the stream drains;
# they wait (griddepcontrol.wait) before touching global memory, and each triggers its own
# dependents at once. What it saves is the gap between one grid's end and the next one's start.
# H200, bf16, back-to-back launches in one CUDA graph, us without -> with (results/NOTES.md 24):
# row kernel in the forward sweep 16384x4096 66.0 -> 64.5, 65536x4096 256.3 -> 256.0, 32768x4096
# 129.7 -> 127.5, 4096x4096 18.5 -> 17.8, 16384x2048 34.4 -> 33.6, 16384x8192 129.7 -> 128.3. It
# lost on the persistent grid (1024x4096: 5.29 -> 5.52 in a probe, every CTA resident from the
# start), on 64-thread row CTAs (16384x1024: 17.8 -> 20.5) and on warp-per-row in the sweep
# (16384x1024: 17.6 -> 18.2), so those launch as before. Measured on Hopper only.
PDL_ARCHS = ("sm_90a",)
PDL_VARIANTS = ("row",)
PDL_MIN_THREADS = 128


def uses_pdl(variant: str, threads: int, arch: Optional[str]) -> bool:
    """Does a forward kernel of ``variant`` with CTAs of ``threads`` launch with PDL on ``arch``
    (when ``settings.pdl`` allows it)?"""
    return arch in PDL_ARCHS and variant in PDL_VARIANTS and threads >= PDL_MIN_THREADS


def check_int32_addressable(M: int, row_stride: int, N: int) -> None:
    """The kernels index with 32-bit arithmetic (64-bit cost the N=4096 row kernel a third of its
    resident CTAs); refuse, naming the way out, what that cannot address."""
    if M * max(row_stride, N) >= INT32_LIMIT:
        raise ValueError(f"x spans {M * max(row_stride, N)} elements; the CuTe kernels address "
                         f"at most 2^31 - 1 with 32-bit indices: use backend='triton', or split x")


def is_aligned(t: torch.Tensor) -> bool:
    """16-byte vector copies need a 2-D tensor's base pointer and row stride 16-byte aligned."""
    return (t.data_ptr() % COPY_BYTES == 0
            and (t.stride(0) * t.element_size()) % COPY_BYTES == 0)


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def elems_in_registers(threads: int, x_bytes: int, w_bytes: int = 0) -> int:
    """How many row elements one thread can hold without spilling, each costing ``x_bytes``
    (plus ``w_bytes`` for the matching weight) of registers."""
    regs = min(255, 65536 // threads) - REG_OVERHEAD
    return regs * 4 // (x_bytes + w_bytes)


def row_threads(n_vecs: int) -> int:
    """Threads per row of a one-row CTA: COPIES_PER_THREAD copies each where the row allows, a
    power of two from one warp to MAX_THREADS (forward and backward alike)."""
    return min(MAX_THREADS, max(32, _pow2_ceil(-(-n_vecs // COPIES_PER_THREAD))))


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
                 arch: Optional[str] = None, pdl: bool = False) -> ForwardPlan:
    """The plan of ``variant`` for rows of N; ``arch`` (e.g. ``sm_90a``) is the target the plan
    will be compiled for, where a tile depends on it (the two-pass tile, PDL); None: any target.
    ``pdl``: launch with PDL where ``uses_pdl`` says it pays (the caller passes ``settings.pdl``).
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if x_dtype not in _ELEM_BYTES:
        raise NotEligible(f"x dtype {x_dtype} is not supported")
    if N < 1:
        raise NotEligible("N must be positive")
    elem = _ELEM_BYTES[x_dtype]
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
                  casting_mode=casting_mode, store_rstd=store_rstd, vec=vec)
    w_bytes = _ELEM_BYTES[w_dtype] if w_dtype is not None else 0

    def max_vecs_of(threads: int) -> int:
        return elems_in_registers(threads, elem, w_bytes) // vec

    if variant == "warp":
        vecs_per_thread = -(-n_vecs // 32)
        # Rows per CTA: 2 for long rows, up to 8 for short ones (H200: 2 rows beat 4 and 8 at
        # N=4096 bf16, 8 rows were best at N=1024).
        rows = max(2, min(8, 32 // vecs_per_thread))
        if vecs_per_thread > max_vecs_of(32 * rows):
            raise NotEligible(f"warp-per-row keeps the row in one warp's registers: at most "
                              f"{32 * max_vecs_of(32 * rows) * vec} elements of {x_dtype}, N={N}")
        return ForwardPlan(threads_per_row=32, rows_per_cta=rows,
                           vecs_per_thread=vecs_per_thread, chunks=1,
                           pdl=pdl and uses_pdl(variant, 32 * rows, arch), **common)
    threads, vecs_per_thread, chunks = _row_mapping(n_vecs, max_vecs_of)
    min_ctas_per_sm = 0
    if (variant == "row" and n_vecs == TWO_PASS_ROW_COPIES
            and arch in TWO_PASS_ARCHS and two_pass_fits(x_dtype, w_dtype, casting_mode)):
        threads, vecs_per_thread = TWO_PASS_THREADS, 1
        chunks, min_ctas_per_sm = n_vecs // TWO_PASS_THREADS, TWO_PASS_CTAS_PER_SM
    ctas_per_sm = 0
    prefetch = False
    if variant == "persistent":
        # A second register copy of the row for the next row's loads, where it fits: a CTA
        # then always has a row in flight, as the fused backward does.
        prefetch = chunks == 1 and vecs_per_thread * vec <= elems_in_registers(
            threads, 2 * elem + w_bytes)
        ctas_per_sm = resident_ctas(  # + 4 registers: the row loop's index and bounds
            threads, vecs_per_thread * vec * ((2 if prefetch else 1) * elem + w_bytes),
            extra_regs=4)
    return ForwardPlan(threads_per_row=threads, rows_per_cta=1, vecs_per_thread=vecs_per_thread,
                       chunks=chunks, ctas_per_sm=ctas_per_sm, prefetch=prefetch,
                       min_ctas_per_sm=min_ctas_per_sm,
                       pdl=pdl and uses_pdl(variant, threads, arch), **common)


def pipelines(chunks: int, vecs_per_thread: int) -> bool:
    """Do the chunked passes load chunk c+1 while chunk c is used? Where ptxas keeps the second
    register copy within the CTAs already resident. H200, bf16 row kernel, graph replay
    (results/NOTES.md 22): 256 threads x 8 copies over 4 chunks at 2048x65536, 163.6 vs 176.5 us
    (120 vs 110 registers); over 8 chunks at 1024x131072, 204.1 vs 210.3; the two-pass tile of one
    copy per chunk at 16384x8192, 129.7 vs 130.5. Over 2 chunks of 8 copies (4096x32768) ptxas
    kept both chunks live across the passes, 200 vs 124 registers and one CTA per SM instead of
    two: 147.4 vs 137.5 us. Such rows keep the plain chunk loop."""
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


# Rows of at most this many bytes go to warp-per-row under `auto`: at 16384x1024 bf16 it ran at
# 3746 GB/s vs 3603 for CTA-per-row (results/h200/fwd.csv); at N=2048 CTA-per-row won (3877 vs
# 3759), and from N=4096 up CTA-per-row was fastest or within 0.5%.
AUTO_WARP_MAX_ROW_BYTES = 2048
# At most this many rows go to the persistent variant under `auto`: with few rows a CTA per row
# fills only a few waves, and the persistent grid's next-row prefetch keeps loads in flight
# instead. H200, bf16, graph replay (results/h200/logs/fwd-small-m-probe-c3ab5be.jsonl): at
# N=1024-8192 and M=128-2048 persistent was fastest or within 2.4% (1024x4096: 5.41 vs 5.91 us for
# CTA-per-row), at M=3072 CTA-per-row won from N=4096 up (3072x4096: 14.03 vs 14.29), and at
# M=4096-8192 CTA-per-row or warp-per-row won at every N except 4096x2048 (persistent by 1.7%).
AUTO_PERSISTENT_MAX_ROWS = 2048


def auto_variant(N: int, aligned: bool, x_dtype: torch.dtype, M: int) -> str:
    """The variant ``auto`` launches for M rows of N, from the H200 forward sweeps
    (results/NOTES.md 21): persistent for at most AUTO_PERSISTENT_MAX_ROWS rows, else
    warp-per-row for rows of at most AUTO_WARP_MAX_ROW_BYTES, else CTA-per-row. Persistent
    trailed CTA-per-row by 4-19% at every larger shape of the sweep."""
    elem = _ELEM_BYTES[x_dtype]
    if not aligned or N % (COPY_BYTES // elem):
        return "fallback"
    if M <= AUTO_PERSISTENT_MAX_ROWS:
        return "persistent"
    return "warp" if N * elem <= AUTO_WARP_MAX_ROW_BYTES else "row"
