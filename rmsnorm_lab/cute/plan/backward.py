"""Launch plans for the CuTe backward kernels, in plain Python (no CUTLASS import: CPU-testable).

Three kernels serve the backward (``dx = rstd * (m - x_hat * mean(m * x_hat))`` with
``m = dy * (offset + w)``, and ``dw = sum_rows(dy * x_hat)``; see reference.py):

* ``fused``  a persistent grid of G CTAs, one per *strip* of contiguous rows, G = SMs x
             ``ctas_per_sm`` (as many as are resident at once). A CTA keeps the shifted weight and
             an fp32 dW accumulator for the whole row in registers, computes dx row by row, and at
             the end writes its accumulator as one partial row ``dw_partial[strip, :N]``. x and dy
             are read once. Where registers allow (``prefetch``) the next row's x and dy are
             loaded while the current row is reduced and stored. Rows too wide for registers go
             through them in column chunks (two passes; the second re-reads the row, mostly from
             L2) with the dW accumulator in shared memory. A strip of one warp (rows of at
             most 32 copies; narrower rows in lane groups, several rows at a time) shares its
             CTA with ONE_WARP_STRIPS_PER_CTA - 1 others, and they write one partial row. On
             Hopper and later the CTAs of a row held in registers pair up in clusters of
             DW_CLUSTER that sum their rows in distributed shared memory (``dw_cluster``), one
             partial row a cluster.
* ``dx``     the split path's first kernel: one CTA per row, dx only (like the forward's ``row``
             variant; rows wider than the register budget stream through in column chunks).
* ``dw``     the split path's second kernel: grid (column blocks, row groups); each CTA sums
             ``dy * x_hat`` over the rows of its group for its columns, reduces over its row lanes
             in shared memory and writes ``dw_partial[group, cols]``; each row lane issues the
             loads of ``dw_unroll`` rows before using them. x and dy are read again.

``cluster`` (``plan_cluster_backward``) is the fused kernel for rows one CTA cannot hold, each
row's columns split over the CTAs of a thread-block cluster, a strip per cluster.

Either way a last small kernel (kernels/dw_reduce.py) sums the G (or row-group) fp32 partial rows into dw,
reading G x N fp32 values: little next to the M x N inputs.

Thread/value mapping is the forward's (plan/forward.py): thread c of a row owns, in column block k, the
``vec`` contiguous elements starting at ``col = (k * threads_per_row + c) * vec``. The ``dw``
kernel uses the same formula with ``rows_per_cta`` row lanes that walk the rows of their group.

Every vector plan moves 16 bytes per copy; a width that is not a multiple of the vector width, or
an unaligned tensor, gets ``vec = 1`` (the fallback) instead of an error.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

import torch

from ...registry import BACKWARD_MODES
from .forward import (CLUSTER_ARCHS, COPIES_PER_THREAD, COPY_BYTES, ELEM_BYTES, MAX_CLUSTER,
                      MAX_COPIES_PER_CHUNK, MAX_THREADS, PDL_ARCHS, NotEligible, RowsRule,
                      RowTilePlan, chunked, elems_in_registers, persistent_grid, resident_ctas,
                      row_threads, staged_fit)

KINDS = ("fused", "dx", "dw")
MODES = BACKWARD_MODES + ("auto",)
# The dW kernel's CTA: one warp across the columns (32 x 16 bytes: a 512-byte coalesced segment of
# one row per warp-wide load) and DW_ROW_LANES warps on different rows of the group.
DW_COL_THREADS = 32
DW_ROW_LANES = 8
# A row group never holds fewer rows than this (each CTA of the dW kernel pays a shared-memory
# reduction and writes a partial row; below ~32 rows per group those costs dominate).
DW_MIN_ROWS_PER_GROUP = 32
# dW CTAs to aim for per SM: what fits at once. ptxas -v gives the unrolled kernel more than 64
# and at most 128 registers at 256 threads (N=4096 bf16), so two CTAs are resident per SM;
# 512 threads x 2 x DW_UNROLL 16-byte loads is 64 KB in flight per SM (a choice, not a sweep).
DW_CTAS_PER_SM = 2
# Rows each dW row lane keeps in flight: the loop over its rows is unrolled this many times, so
# a thread issues 2 x DW_UNROLL 16-byte loads (x and dy) before it needs the first result.
DW_UNROLL = 4
# A cap on the fused kernel's strips per SM: every strip writes (and the dW reduction reads) one
# fp32 partial row of N; 8 an SM is the best at N=1024
# (docs/design-record.md, 'Backward: strips per SM'). A strip of one warp (rows of at most 256
# bf16) may take up to 32 per SM: at 8 an SM holds 8 warps, each waiting on one short row's
# loads, and a partial row of N <= 256 costs at most 1 KB.
MAX_FUSED_CTAS_PER_SM = 8
MAX_ONE_WARP_STRIPS_PER_SM = 32
# One-warp strips share a CTA this many at a time and sum their dW rows in shared memory before
# writing one partial row: a partial row per strip leaves the reduction kernel (one CTA per 32
# columns) thousands of rows to read at N = 128 (docs/design-record.md, 'Backward: per-head rows').
ONE_WARP_STRIPS_PER_CTA = 8
# Shared memory: what one SM offers CTAs on sm_90/sm_100 (228 KB less 1 KB reserved per CTA), and
# the most a wide fused row's fp32 dW accumulator may take (N <= 40960).
SM_SMEM_BYTES = 227 * 1024
FUSED_SMEM_BYTES = 160 * 1024
WIDE_FUSED_CTAS_PER_SM = 2
# Register bytes per row element beyond the loaded values: with the row in registers, the fp32
# x_hat and m computed before the row reduction stay live until dx is formed after it (without
# this term the fused plan at N=16384 bf16 "none" ran out of registers and spilled, in ptxas -v).
FP32_LIVE = 8


@dataclasses.dataclass(frozen=True)
class BackwardPlan(RowTilePlan):
    """``rows_per_cta``: 1 for dx; for fused, the rows a one-warp strip works on at once (1 unless
    a row is narrower than the warp); the dW kernel's row lanes."""
    kind: str
    x_dtype: torch.dtype
    w_dtype: Optional[torch.dtype]  # None: no weight (then there is no dw and no dW kernel)
    casting_mode: str
    chunks: int = 1          # dx, fused: >1 streams the row through registers in column chunks
    dw_unroll: int = 1       # dw only: rows a row lane has in flight (loop unroll factor)
    prefetch: bool = False   # fused only: load the next row's x and dy during this row
    ctas_per_sm: int = 1     # fused only: CTAs per SM the registers allow (fused_strips)
    strips_per_cta: int = 1  # fused only: one-warp strips per CTA, their dW rows summed on chip
    pdl: bool = False        # programmatic dependent launch (backward_uses_pdl)
    #: fused and dx: the fused add's gradient at h joins dx (dx = dh + the norm's dx)
    dh: bool = False
    #: cluster: the CTAs of a thread-block cluster that share each row of a strip (1: one CTA)
    cluster_n: int = 1
    #: staged: rows of x and dy in flight in shared memory per strip (0: other plans)
    stages: int = 0
    #: fused: CTAs of a thread-block cluster, each on its own strip, whose dW rows are summed in
    #: distributed shared memory into one partial row (device/dw_cluster.py; 1: a partial row a CTA)
    dw_cluster: int = 1

    def resident_grid(self, sms: int) -> int:
        """The fused grid: CTAs of ``ctas_per_sm`` per SM on ``sms`` SMs, resident all at once;
        for the cluster plan, clusters in several nominal waves (``plan.persistent_grid``); with
        ``dw_cluster``, the clusters those CTAs make (one partial row each)."""
        if self.dw_cluster > 1:
            return max(1, sms * self.ctas_per_sm // self.dw_cluster)
        return persistent_grid(sms, self.ctas_per_sm, self.cluster_n)

    @property
    def cta_threads(self) -> int:
        """Threads of one CTA: a strip's threads times the strips it holds."""
        return self.threads * self.strips_per_cta

    @property
    def dw_smem_bytes(self) -> int:
        """Fused with chunks: the shared-memory fp32 dW accumulator (0 when it is in registers)."""
        if self.kind != "fused" or self.chunks == 1 or self.w_dtype is None or self.stages:
            return 0
        return self.chunks * self.cols_per_tile * 4

    @property
    def col_blocks(self) -> int:
        """dW kernel: CTAs across the width (the grid's x extent)."""
        return -(-self.N // self.cols_per_tile)


# ---------------------------------------------------------------------------------------------
# Strips and row groups: which rows each CTA owns.
# ---------------------------------------------------------------------------------------------

def strip_bounds(M: int, strips: int, s: int) -> Tuple[int, int]:
    """Rows ``[start, end)`` of strip ``s`` of ``strips``: contiguous, balanced to within one row,
    the ``M % strips`` remainder rows going one each to the first strips, and empty strips when
    ``M < strips``. The kernels compute exactly this (``q = M // G``, ``r = M % G``); the form
    ``s * q + min(s, r)`` never forms ``s * M``, which would overflow Int32 for large M."""
    if strips < 1 or not 0 <= s < strips:
        raise ValueError(f"strip {s} out of range for {strips} strips")
    q, r = divmod(M, strips)
    start = s * q + min(s, r)
    return start, start + q + (1 if s < r else 0)


def strip_partition(M: int, strips: int) -> List[Tuple[int, int]]:
    return [strip_bounds(M, strips, s) for s in range(strips)]


def fused_strips_rule(plan: Optional[BackwardPlan], sms: int, strips: int = 0) -> RowsRule:
    """The fused kernel's CTA count (= grid size = rows of dW partials) as a rule of M, each CTA
    holding ``plan.strips_per_cta`` strips (clusters, for the cluster plan and with
    ``dw_cluster``: a cluster of ``dw_cluster`` CTAs writes one partial row): ``strips``, or by
    default as many as fit on the GPU at once (``plan.resident_grid``; one per SM without a
    plan), never more than it takes to give every strip a row (a strip without rows would only
    add zeros)."""
    g = strips or (plan.resident_grid(sms) if plan is not None else sms)
    if g < 1:
        raise ValueError(f"strips must be positive, got {g}")
    return RowsRule(plan.strips_per_cta * plan.dw_cluster if plan is not None else 1, g)


def fused_strips(M: int, sms: int, plan: Optional[BackwardPlan] = None,
                 strips: Optional[int] = None) -> int:
    """``fused_strips_rule`` at M rows."""
    if strips is not None and strips < 1:
        raise ValueError(f"strips must be positive, got {strips}")
    return fused_strips_rule(plan, sms, strips or 0).of(M)


def dw_row_groups_rule(plan: BackwardPlan, sms: int, groups: int = 0) -> RowsRule:
    """Row groups of the split path's dW kernel as a rule of M: ``groups``, or enough CTAs for
    DW_CTAS_PER_SM per SM across the column blocks, with at least DW_MIN_ROWS_PER_GROUP rows in
    each group."""
    if groups:
        return RowsRule(1, groups)
    return RowsRule(DW_MIN_ROWS_PER_GROUP, -(-(sms * DW_CTAS_PER_SM) // plan.col_blocks))


def dw_row_groups(M: int, plan: BackwardPlan, sms: int) -> int:
    """``dw_row_groups_rule`` at M rows."""
    return dw_row_groups_rule(plan, sms).of(M)


# ---------------------------------------------------------------------------------------------
# Plans and eligibility.
# ---------------------------------------------------------------------------------------------

def vector_width(N: int, x_dtype: torch.dtype, aligned: bool) -> int:
    """16-byte copies when the row width and every tensor allow them, otherwise one element."""
    vec = COPY_BYTES // ELEM_BYTES[x_dtype]
    return vec if aligned and N % vec == 0 else 1


def _register_bytes(nbytes: int, vec: int) -> int:
    """Register bytes one element costs: a 16-bit element held alone (the scalar fallback) still
    takes a whole 32-bit register; in 16-byte fragments two share one."""
    return nbytes if vec > 1 else max(nbytes, 4)


def _check(N: int, x_dtype: torch.dtype, casting_mode: str):
    if x_dtype not in ELEM_BYTES:
        raise NotEligible(f"x dtype {x_dtype} is not supported")
    if N < 1:
        raise NotEligible("N must be positive")
    from ...reference import CASTING_MODES, check_casting_mode
    if check_casting_mode(casting_mode) != casting_mode:  # callers resolve an alias first
        raise ValueError(f"a kernel plan takes one of {CASTING_MODES}, got the alias "
                         f"{casting_mode!r}")


def plan_backward(kind: str, N: int, x_dtype: torch.dtype, w_dtype: Optional[torch.dtype],
                  casting_mode: str, aligned: bool, dh: bool = False) -> BackwardPlan:
    """The plan of one backward kernel; raises ``NotEligible`` with the reason. ``dh``: the
    fused add's backward (fused and dx kernels), which reads h's gradient beside dy when it
    forms dx (one more row chunk in registers)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    _check(N, x_dtype, casting_mode)
    vec = vector_width(N, x_dtype, aligned)
    common = dict(kind=kind, x_dtype=x_dtype, w_dtype=w_dtype, N=N, casting_mode=casting_mode,
                  vec=vec, dh=dh and kind != "dw")
    n_vecs = N // vec
    elem = ELEM_BYTES[x_dtype]
    x_bytes = _register_bytes(elem, vec)
    w_bytes = _register_bytes(ELEM_BYTES[w_dtype], vec) if w_dtype is not None else 0
    # A chunk holds at most MAX_COPIES_PER_CHUNK 16 bytes' worth of x per thread (the forward's
    # bound, which kept ptxas from spilling); on the fallback the same number of elements.
    cap_elems = MAX_COPIES_PER_CHUNK * COPY_BYTES // elem

    if kind == "dw":
        if w_dtype is None:
            raise NotEligible("no weight, no dw")
        # Vector path: one 16-byte block per thread per row. Fallback: 8 one-element blocks
        # strided by the warp, so a CTA still covers 256 columns with coalesced accesses.
        vecs = 1 if vec > 1 else 8
        return BackwardPlan(threads_per_row=DW_COL_THREADS, rows_per_cta=DW_ROW_LANES,
                            vecs_per_thread=vecs, dw_unroll=DW_UNROLL, **common)

    # fused and dx: one CTA on one row, the forward's threads-per-row rule (about
    # COPIES_PER_THREAD copies per thread, a power of two from one warp to MAX_THREADS).
    threads = row_threads(n_vecs)
    vecs_per_thread = -(-n_vecs // threads)
    if kind == "fused":
        # Per element of its row a thread holds x, dy, w and the fp32 dW accumulator, plus the
        # fp32 x_hat and m that the compiler keeps live across the row reduction; a row that
        # does not fit goes through registers in column chunks (``_wide_fused``).
        per_elem = ((3 if dh else 2) * x_bytes + w_bytes + (4 if w_dtype is not None else 0)
                    + FP32_LIVE)
        max_elems = min(cap_elems, elems_in_registers(threads, per_elem))
        if vecs_per_thread * vec > max_elems:
            return _wide_fused(threads, vecs_per_thread, x_bytes, w_bytes, cap_elems, common)
        # Prefetching the next row costs a second copy of x and dy; take it where it fits and
        # costs no strip per SM: one strip less per SM loses more than the prefetch hides
        # (docs/design-record.md, 'Backward: next-row prefetch').
        most = MAX_ONE_WARP_STRIPS_PER_SM if threads == 32 else MAX_FUSED_CTAS_PER_SM

        def strips_per_sm(elem_bytes: int) -> int:
            return resident_ctas(threads, vecs_per_thread * vec * elem_bytes, most=most)
        with_prefetch = per_elem + 2 * x_bytes
        prefetch = (vecs_per_thread * vec <= elems_in_registers(threads, with_prefetch)
                    and strips_per_sm(with_prefetch) == strips_per_sm(per_elem))
        # A row of fewer copies than a warp has lanes (a per-head row: 128 bf16 are 16 copies)
        # takes a power-of-two group of lanes, and the strip's warp walks its rows that many at a
        # time, as the forward's warp-per-row does: with one row per warp half the lanes idled.
        lanes = min(threads, 1 << (n_vecs - 1).bit_length())
        strips = strips_per_sm(with_prefetch if prefetch else per_elem)
        per_cta = ONE_WARP_STRIPS_PER_CTA if threads == 32 else 1
        return BackwardPlan(threads_per_row=lanes, rows_per_cta=threads // lanes,
                            vecs_per_thread=vecs_per_thread, prefetch=prefetch,
                            ctas_per_sm=max(1, strips // per_cta), strips_per_cta=per_cta,
                            **common)

    # dx: x, dy (and dh), w and the fp32 x_hat and m per element; wider rows take column chunks.
    per_elem = (3 if dh else 2) * x_bytes + w_bytes + FP32_LIVE
    max_vecs = max(1, min(cap_elems, elems_in_registers(threads, per_elem)) // vec)
    vecs_per_thread, chunks = chunked(vecs_per_thread, max_vecs)
    return BackwardPlan(threads_per_row=threads, rows_per_cta=1, vecs_per_thread=vecs_per_thread,
                        chunks=chunks, **common)


def _wide_fused(threads: int, vecs_per_thread: int, x_bytes: int, w_bytes: int, cap_elems: int,
                common: dict) -> BackwardPlan:
    """The fused plan of a row too wide for registers: x and dy stream through them in column
    chunks (two passes, like the dx kernel: the second re-reads a row the first just read, mostly
    from L2), and the fp32 dW accumulator moves to shared memory, N x 4 bytes per CTA."""
    vec = common["vec"]
    if common["dh"]:
        raise NotEligible("the fused add's wide fused kernel spills under the launch bound its "
                          "two CTAs per SM need (ptxas -v): split")
    per_elem = 2 * x_bytes + w_bytes + FP32_LIVE
    max_vecs = max(1, min(cap_elems, elems_in_registers(threads, per_elem)) // vec)
    vecs_per_thread, chunks = chunked(vecs_per_thread, max_vecs)
    # Two CTAs per SM where shared memory allows, the kernel's launch bound holding ptxas to
    # the 128 registers that takes: left to itself ptxas leaves one CTA per SM, which is slower
    # (docs/design-record.md, 'Backward: wide rows under a launch bound').
    plan = BackwardPlan(threads_per_row=threads, rows_per_cta=1, vecs_per_thread=vecs_per_thread,
                        chunks=chunks, ctas_per_sm=WIDE_FUSED_CTAS_PER_SM, **common)
    dw_smem = plan.dw_smem_bytes  # 0 without a weight: nothing to accumulate
    if dw_smem > FUSED_SMEM_BYTES:
        raise NotEligible(
            f"fused keeps an fp32 dW row per CTA: {dw_smem} bytes of shared memory at N="
            f"{common['N']}, over {FUSED_SMEM_BYTES} (use split)")
    if dw_smem:
        fit = SM_SMEM_BYTES // (dw_smem + 1024)
        plan = dataclasses.replace(plan, ctas_per_sm=max(1, min(WIDE_FUSED_CTAS_PER_SM, fit)))
    return plan


def plan_cluster_backward(N: int, x_dtype: torch.dtype, w_dtype: Optional[torch.dtype],
                          casting_mode: str, aligned: bool, dh: bool = False,
                          arch: Optional[str] = None) -> BackwardPlan:
    """The ``cluster`` plan: the fused backward of a row too wide for one CTA's registers, its
    columns split over the CTAs of a thread-block cluster. A cluster walks a strip of rows; each
    CTA keeps its column slice of w and of the dW accumulator in registers, and per row the CTAs'
    partial sums of ``m * x_hat`` meet in distributed shared memory. The row is read once, where
    the chunked fused plan reads it twice (the second time mostly from L2). The cluster takes as
    many CTAs as give each thread the copies the fused plan holds at N = 4096 (two CTAs per SM),
    at most MAX_CLUSTER."""
    if arch is not None and arch not in CLUSTER_ARCHS:
        raise NotEligible(f"thread-block clusters need Hopper or later, not {arch}")
    if dh:
        raise NotEligible("the cluster backward serves rms_norm alone, not the fused add")
    _check(N, x_dtype, casting_mode)
    vec = vector_width(N, x_dtype, aligned)
    if vec == 1:
        raise NotEligible("the cluster backward needs 16-byte copies (aligned rows, N % vec == 0)")
    try:
        fits = plan_backward("fused", N, x_dtype, w_dtype, casting_mode, aligned).chunks == 1
    except NotEligible:  # too wide even for the chunked fused plan
        fits = False
    if fits:
        raise NotEligible("the row fits one CTA's registers: the fused plan holds it")
    n_vecs = N // vec
    want = -(-n_vecs // (MAX_THREADS * COPIES_PER_THREAD))
    cluster_n = min(MAX_CLUSTER, max(2, 1 << (want - 1).bit_length()))
    vecs_per_thread = -(-n_vecs // (cluster_n * MAX_THREADS))
    elem = ELEM_BYTES[x_dtype]
    w_bytes = ELEM_BYTES[w_dtype] if w_dtype is not None else 0
    per_elem = 2 * elem + w_bytes + (4 if w_dtype is not None else 0) + FP32_LIVE
    if vecs_per_thread * vec > elems_in_registers(MAX_THREADS, per_elem):
        raise NotEligible(f"the row needs more than a cluster of {MAX_CLUSTER} CTAs' registers")
    # The next row's x and dy in flight while this row's sums cross the cluster, where they fit.
    with_prefetch = per_elem + 2 * elem
    prefetch = vecs_per_thread * vec <= elems_in_registers(MAX_THREADS, with_prefetch)
    return BackwardPlan(kind="fused", x_dtype=x_dtype, w_dtype=w_dtype, N=N,
                        casting_mode=casting_mode, vec=vec, threads_per_row=MAX_THREADS,
                        rows_per_cta=1, vecs_per_thread=vecs_per_thread, chunks=1,
                        prefetch=prefetch,
                        ctas_per_sm=resident_ctas(
                            MAX_THREADS,
                            vecs_per_thread * vec * (with_prefetch if prefetch else per_elem),
                            most=MAX_FUSED_CTAS_PER_SM),
                        cluster_n=cluster_n)


def plan_split(N: int, x_dtype: torch.dtype, w_dtype: Optional[torch.dtype], casting_mode: str,
               aligned: bool, dh: bool = False) -> Tuple[BackwardPlan, Optional[BackwardPlan]]:
    """(dx plan, dW plan or None without a weight)."""
    dx = plan_backward("dx", N, x_dtype, w_dtype, casting_mode, aligned, dh)
    dw = None
    if w_dtype is not None:
        dw = plan_backward("dw", N, x_dtype, w_dtype, casting_mode, aligned)
    return dx, dw


def backward_uses_pdl(arch: Optional[str]) -> bool:
    """Do the backward kernels (fused or dx + dw) and the dW reduction launch with programmatic
    dependent launch on ``arch`` (when ``settings.pdl`` allows it)? Each kernel then overlaps
    its launch with the previous one's drain (plan/forward.py, ``uses_pdl``). All of them or none: the
    reduction alone on PDL gains nothing, since the kernel before it must release it early.
    Measured on Hopper only (docs/design-record.md, 'Backward: PDL on Hopper')."""
    return arch in PDL_ARCHS


# CTAs of a thread-block cluster that sum their fused strips' dW rows on chip (device/dw_cluster.py):
# two halve the partial rows, which pays at few rows and costs nothing at many; four and eight
# lose (docs/design-record.md, 'Backward: paired dW exchange').
DW_CLUSTER = 2


def with_dw_cluster(plan: Optional[BackwardPlan], arch: Optional[str]) -> Optional[BackwardPlan]:
    """``plan`` with its CTAs' dW rows summed in clusters of DW_CLUSTER where that applies, else
    ``plan`` itself: a fused plan with a weight whose row stays in one CTA's registers (one
    chunk, one row and one strip a CTA), 16-byte copies of whole groups of four fp32 (the
    exchange's stores), N a multiple of DW_CLUSTER copies, the receive slots fitting shared
    memory beside the plan's other CTAs on the SM, and clusters on ``arch``."""
    if (plan is None or plan.kind != "fused" or plan.w_dtype is None or arch not in CLUSTER_ARCHS
            or plan.chunks != 1 or plan.stages or plan.cluster_n != 1 or plan.rows_per_cta != 1
            or plan.strips_per_cta != 1 or plan.vec % 4 or plan.N % (DW_CLUSTER * plan.vec)
            or plan.ctas_per_sm * (plan.N * 4 + 1024) > SM_SMEM_BYTES):
        return plan
    return dataclasses.replace(plan, dw_cluster=DW_CLUSTER)


# A row that the fused plan takes in at least this many column chunks goes to a cluster under
# `auto`: each chunk past the first re-reads the row, mostly from L2, against one exchange per row
# in a cluster: the cluster wins from 3 chunks and loses at 2
# (docs/design-record.md, 'Backward: clusters from three chunks'). The forward's `auto` takes no
# cluster: its chunked row wins at every width measured (plan/forward.py, WIDE_THREADS).
AUTO_CLUSTER_MIN_CHUNKS = 3


def clusters_pay(chunks, cluster_plan) -> bool:
    """Whether ``auto`` takes the cluster plan: ``chunks()`` is the fused plan's column chunks
    (raising NotEligible where there is no fused plan); ``cluster_plan()`` raises where the row
    has no cluster plan."""
    try:
        cluster_plan()
    except NotEligible:
        return False
    try:
        return chunks() >= AUTO_CLUSTER_MIN_CHUNKS
    except NotEligible:
        return True


def auto_mode(N: int, x_dtype: torch.dtype, w_dtype: Optional[torch.dtype], casting_mode: str,
              aligned: bool, dh: bool = False, arch: Optional[str] = None) -> str:
    """``cluster`` where ``clusters_pay`` (rows the fused plan takes in many column chunks,
    or cannot take, on an architecture with clusters); ``staged`` where the fused plan takes the
    row in column chunks and two rows of x and dy fit shared memory: the row then comes from DRAM
    once, where the chunks read it a second time, mostly from L2
    (docs/design-record.md, 'Backward: the staged ring'); for the fused add (``dh``), ``staged``
    where its fused plan holds no next row in registers or has no plan
    (docs/design-record.md, 'Backward: the staged ring for the fused add'); else ``fused`` whenever
    there is a weight and a fused plan exists (the row in registers, or in column chunks with dW
    in shared memory): it reads x and dy once where split reads them twice, and wins at every
    shape (docs/design-record.md, 'Backward: fused strips over split'). Without a weight there
    is no dW to accumulate, and ``split`` is the dx kernel alone (one CTA per row)."""
    if w_dtype is None:
        return "split"
    if arch in CLUSTER_ARCHS and not dh and clusters_pay(
            lambda: plan_backward("fused", N, x_dtype, w_dtype, casting_mode, aligned).chunks,
            lambda: plan_cluster_backward(N, x_dtype, w_dtype, casting_mode, aligned,
                                          arch=arch)):
        return "cluster"
    try:
        fused = plan_backward("fused", N, x_dtype, w_dtype, casting_mode, aligned, dh)
    except NotEligible:
        fused = None
    # the fused add's fused plan holds no next row where dh takes its room (or has no plan)
    stage = (fused is None or not fused.prefetch) if dh else (fused is not None
                                                               and fused.chunks > 1)
    if stage:
        try:
            plan_staged_backward(N, x_dtype, w_dtype, casting_mode, aligned, dh)
            return "staged"
        except NotEligible:
            pass
    return "split" if fused is None else "fused"


def plan_staged_backward(N: int, x_dtype: torch.dtype, w_dtype: Optional[torch.dtype],
                         casting_mode: str, aligned: bool, dh: bool = False,
                         arch: Optional[str] = None) -> BackwardPlan:
    """The ``staged`` plan: the fused backward with each strip's next rows of x and dy (and the
    fused add's dh) copied into shared memory by ``cp.async``, ``stages`` rows at a time, so what
    is in flight is bounded by shared memory instead of registers. MAX_THREADS threads a strip,
    one 16-byte copy each per column chunk (N a multiple of a chunk); registers hold w and the
    fp32 dW accumulator only (x and dy are read back from shared memory in both passes, dh in
    the second). As many strips an SM as the registers allow, as many stages as their shared
    memory allows (at least two). ``arch`` is accepted for the plans' common signature:
    ``cp.async`` is on every target."""
    _check(N, x_dtype, casting_mode)
    vec = vector_width(N, x_dtype, aligned)
    if vec == 1:
        raise NotEligible("the staged backward needs 16-byte copies (aligned rows, N % vec == 0)")
    n_vecs = N // vec
    if n_vecs % MAX_THREADS:
        raise NotEligible(f"the staged backward needs N a multiple of {MAX_THREADS * vec}")
    elem = ELEM_BYTES[x_dtype]
    w_bytes = ELEM_BYTES[w_dtype] if w_dtype is not None else 0
    per_elem = w_bytes + (4 if w_dtype is not None else 0)  # w and the dW accumulator
    elems = n_vecs // MAX_THREADS * vec
    if elems > elems_in_registers(MAX_THREADS, max(per_elem, 1)):
        raise NotEligible("w and the dW accumulator of the row do not fit a CTA's registers")
    # + 16 registers: a chunk's x and dy in fp32 while it is worked on (ptxas at 4096 bf16: 80),
    # + 8 more for dh's (held to 80 at 4096, ptxas spilled)
    ctas = resident_ctas(MAX_THREADS, elems * per_elem, extra_regs=24 if dh else 16,
                         most=MAX_FUSED_CTAS_PER_SM)
    rows = 3 if dh else 2  # a row of x, one of dy (and one of dh) a stage
    held = "x, dy and dh" if dh else "x and dy"
    ctas, stages = staged_fit(ctas, rows * N * elem, f"two stages of a row each of {held}")
    return BackwardPlan(kind="fused", x_dtype=x_dtype, w_dtype=w_dtype, N=N,
                        casting_mode=casting_mode, vec=vec, threads_per_row=MAX_THREADS,
                        rows_per_cta=1, vecs_per_thread=1, chunks=n_vecs // MAX_THREADS,
                        ctas_per_sm=ctas, stages=stages, dh=dh)

