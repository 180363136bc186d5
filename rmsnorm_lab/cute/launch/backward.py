"""Compile cache and launches for the CuTe backward kernels.

Like the forward (launch/forward.py), the kernels are compiled once per plan with TVM-FFI
(``--enable-tvm-ffi``) against typed stand-ins whose M and row strides are symbolic, so one
compilation serves every M, stride and strip count, and torch tensors are passed as they are, on
torch's current stream. What a kernel bakes in (dtypes, N, casting mode, thread mapping, target
arch) is the compile-cache key; everything a call needs beyond its tensors (mode, plans, kernels,
stand-ins for absent tensors) is found with one dict probe (``_Entry``).

``backward`` returns ``(dx, dw)``. The last step of dW sums the G strip (or row-group) fp32
partial rows in one more kernel (kernels/dw_reduce.py), which reads G x N fp32 values, small next to the
2 x M x N the kernels read, rounds once to the weight's dtype, and keeps every kernel free of
atomics (so dW is bitwise reproducible run to run).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Tuple

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

from ...common import nvtx
from ...common.rows import kernel_grad_rows
from ...reference import check_casting_mode
from ...settings import settings
from ..kernels.backward import RMSNormBackward, RMSNormBackwardDh
from ..kernels.backward_dw import RMSNormBackwardDW
from ..kernels.backward_cluster import RMSNormClusterBackward
from ..kernels.backward_staged import RMSNormStagedBackward, RMSNormStagedBackwardDh
from ..plan.backward import (DW_CTAS_PER_SM, DW_MIN_ROWS_PER_GROUP, MODES, BackwardPlan,
                            auto_mode, backward_uses_pdl, plan_backward, plan_cluster_backward,
                            plan_staged_backward, plan_split, with_dw_cluster)
from ..kernels.dw_reduce import DwReduce
from ..dtypes import TORCH_TO_CUTE
from .compile import compile_tvm_ffi, target_arch

_COMPILED: Dict[Tuple, object] = {}
_ENTRIES: Dict[Tuple, "_Entry"] = {}


def _align(plan: BackwardPlan, dtype=None) -> int:
    """Assumed pointer alignment: 16 bytes on the vector path, else the element's own size (a
    wider weight than x, fp32 w with bf16 x, needs its 4 bytes even on the fallback)."""
    return 16 if plan.vec > 1 else (dtype or plan.x_dtype).itemsize


def _fake_args(plan: BackwardPlan):
    """Typed stand-ins for ``cute.compile``: (M, N):(ld, 1) matrices with M and the row strides
    symbolic, (N,) weight, (M,) rstd, (G, N) fp32 partials; TVM-FFI's environment stream."""
    align = _align(plan)
    x_type = TORCH_TO_CUTE[plan.x_dtype]

    def matrix(dtype, rows: str, ld: str, a: int):
        return make_fake_tensor(dtype, (cute.sym_int64(symbol=rows), cute.sym_int64(symbol="N")),
                                stride=(cute.sym_int64(symbol=ld), 1), assumed_align=a)

    dy, x = matrix(x_type, "M", "lddy", align), matrix(x_type, "M", "ldx", align)
    rstd = make_fake_tensor(cutlass.Float32, (cute.sym_int64(symbol="Mr"),), stride=(1,),
                            assumed_align=4)
    part = matrix(cutlass.Float32, "G", "ldp", 16 if plan.vec > 1 else 4)
    stream = make_fake_stream(use_tvm_ffi_env_stream=True)
    if plan.kind == "dw":
        return dy, x, rstd, part, stream
    w_dtype = plan.w_dtype or plan.x_dtype
    w = make_fake_tensor(TORCH_TO_CUTE[w_dtype], (cute.sym_int64(symbol="Nw"),), stride=(1,),
                         assumed_align=_align(plan, w_dtype))
    dx = matrix(x_type, "M", "lddx", align)
    scalars = (cutlass.Int32(1), cutlass.Float32(0.0), stream)
    if plan.dh:  # the fused add's: h's gradient after dx
        return (dy, x, w, rstd, dx, matrix(x_type, "M", "lddh", align), part) + scalars
    return (dy, x, w, rstd, dx, part) + scalars


def _kernel_object(plan: BackwardPlan):
    if plan.kind == "dw":
        return RMSNormBackwardDW(plan)
    if plan.cluster_n > 1:
        return RMSNormClusterBackward(plan)
    if plan.stages > 1:
        return RMSNormStagedBackwardDh(plan) if plan.dh else RMSNormStagedBackward(plan)
    return RMSNormBackwardDh(plan) if plan.dh else RMSNormBackward(plan)


def compile_backward(plan: BackwardPlan, arch: str, keep_ptx_dir: Optional[str] = None):
    """The TVM-FFI compilation of ``plan`` for ``arch`` (cached; the PTX reader calls it too)."""
    return compile_tvm_ffi(_COMPILED, (plan, arch), arch, plan.kind,
                           lambda: (_kernel_object(plan), _fake_args(plan)), keep_ptx_dir)


def _dw_reduce_args(w_dtype: torch.dtype):
    """Stand-ins for ``DwReduce``: (G, N) fp32 partials, the (N,) dW, the environment stream."""
    part = make_fake_tensor(cutlass.Float32, (cute.sym_int64(symbol="G"),
                                              cute.sym_int64(symbol="N")),
                            stride=(cute.sym_int64(symbol="ldp"), 1), assumed_align=4)
    dw = make_fake_tensor(TORCH_TO_CUTE[w_dtype], (cute.sym_int64(symbol="Nw"),),
                          stride=(1,), assumed_align=w_dtype.itemsize)
    return part, dw, make_fake_stream(use_tvm_ffi_env_stream=True)


def compile_dw_reduce(N: int, w_dtype: torch.dtype, arch: str,
                      keep_ptx_dir: Optional[str] = None, pdl: bool = False):
    """The TVM-FFI compilation of the partial-row reduction for width N into ``w_dtype``."""
    return compile_tvm_ffi(
        _COMPILED, ("dw_reduce", N, w_dtype, arch, pdl), arch, "dw_reduce",
        lambda: (DwReduce(N, TORCH_TO_CUTE[w_dtype], pdl), _dw_reduce_args(w_dtype)),
        keep_ptx_dir)


def clear_caches() -> None:
    _COMPILED.clear()
    _ENTRIES.clear()


def _check_inputs(dy2, x2, weight, rstd):
    if x2.dim() != 2 or dy2.shape != x2.shape:
        raise ValueError(f"dy {tuple(dy2.shape)} and x {tuple(x2.shape)} must be the same (M, N)")
    if dy2.dtype != x2.dtype:
        raise TypeError(f"dy dtype {dy2.dtype} differs from x dtype {x2.dtype}")
    if x2.stride(1) != 1 or dy2.stride(1) != 1:
        raise ValueError("x and dy need a contiguous last dimension (stride 1)")
    if (rstd.dtype != torch.float32 or rstd.shape != (x2.shape[0],)
            or (x2.shape[0] > 1 and rstd.stride(0) != 1)):
        raise ValueError(f"rstd must be a contiguous fp32 tensor of shape ({x2.shape[0]},), got "
                         f"{rstd.dtype} {tuple(rstd.shape)}")
    if weight is not None and weight.shape != (x2.shape[1],):
        raise ValueError(f"weight shape {tuple(weight.shape)} does not match N={x2.shape[1]}")
    device = x2.get_device()  # ints: no torch.device objects per call
    for name, t in (("dy", dy2), ("rstd", rstd), ("weight", weight)):
        if t is not None and t.get_device() != device:
            raise ValueError(f"{name} is on {t.device}, x on {x2.device}")
    M, N = x2.shape
    for name, t in (("dy", dy2), ("x", x2)):
        # The kernels index with Int32 (row * row stride), like the forward's.
        if M and (M - 1) * t.stride(0) + N >= 2**31:
            raise ValueError(f"{name} spans 2**31 elements or more: Int32 indexing limit")


#: the backward modes whose one kernel computes dx and the strips' dW partials together
FUSED_MODES = ("fused", "cluster", "staged")


class _Entry:
    """One configuration's mode and plans (the chosen family's, and the split pair that serves a
    backward needing dx alone or dW alone), kernels compiled on first use, and the stand-ins
    passed for tensors a kernel does not read (no weight; no dW partials)."""
    __slots__ = ("mode", "fused", "dx", "dw", "kernels", "arch", "no_w", "no_part", "reduce")

    def __init__(self, mode: str, fused: Optional[BackwardPlan], dx: BackwardPlan,
                 dw: Optional[BackwardPlan], device: torch.device, x_dtype: torch.dtype):
        self.mode = mode
        self.fused, self.dx, self.dw = fused, dx, dw
        self.kernels: Dict[str, object] = {}
        self.arch = target_arch(device)
        self.no_w = torch.empty((0,), dtype=x_dtype, device=device)
        self.no_part = torch.empty((1, 1), dtype=torch.float32, device=device)
        self.reduce = None  # the dW partial reduction, compiled on first use

    @property
    def plans(self) -> Tuple[BackwardPlan, ...]:
        """The chosen family's plans: (fused,) or (dx, dw) (dx alone without a weight)."""
        if self.mode in FUSED_MODES:
            return (self.fused,)
        return (self.dx,) if self.dw is None else (self.dx, self.dw)

    def kernel(self, kind: str):
        """The compiled kernel of plan ``kind`` (fused | dx | dw)."""
        k = self.kernels.get(kind)
        if k is None:
            k = self.kernels[kind] = compile_backward(getattr(self, kind), self.arch)
        return k

    def dw_reduce(self, w_dtype: torch.dtype):
        """The partial-row reduction into ``w_dtype`` (the key's weight dtype), compiled on
        first use."""
        if self.reduce is None:
            self.reduce = compile_dw_reduce(self.dx.N, w_dtype, self.arch, pdl=self.dx.pdl)
        return self.reduce


def entry_for(dy2, x2, weight, casting_mode: str, mode: str, pdl: bool,
              dh: bool = False) -> _Entry:
    """The launch entry for these inputs (dx, freshly allocated and contiguous, is aligned
    whenever the plan's vector width divides N, which the plan checks); ``dh``: the fused add's
    backward (its dh is copied to aligned rows where it is not: ``kernel_grad_rows``)."""
    N = x2.shape[1]
    ptrs = dy2.data_ptr() | x2.data_ptr() | (weight.data_ptr() if weight is not None else 0)
    strides = (dy2.stride(0) | x2.stride(0)) * x2.element_size()
    aligned = ((ptrs | strides) & 15) == 0
    w_dtype = weight.dtype if weight is not None else None
    # auto_mode decides from what the key holds (not from M), so one entry serves every M
    key = (mode, N, x2.dtype, w_dtype, casting_mode, aligned, x2.get_device(), pdl, dh)
    entry = _ENTRIES.get(key)
    if entry is None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        casting_mode = check_casting_mode(casting_mode)  # an alias: the mode it names
        chosen = auto_mode(N, x2.dtype, w_dtype, casting_mode, aligned, dh,
                           target_arch(x2.device)) if mode == "auto" else mode
        fused = None
        if chosen == "fused":
            fused = plan_backward("fused", N, x2.dtype, w_dtype, casting_mode, aligned, dh)
        elif chosen == "cluster":
            fused = plan_cluster_backward(N, x2.dtype, w_dtype, casting_mode, aligned, dh,
                                          target_arch(x2.device))
        elif chosen == "staged":
            fused = plan_staged_backward(N, x2.dtype, w_dtype, casting_mode, aligned, dh)
        fused = with_dw_cluster(fused, target_arch(x2.device))
        dx, dw = plan_split(N, x2.dtype, w_dtype, casting_mode, aligned, dh)
        if pdl and backward_uses_pdl(target_arch(x2.device)):
            fused, dx, dw = (dataclasses.replace(p, pdl=True) if p is not None else None
                             for p in (fused, dx, dw))
        entry = _ENTRIES[key] = _Entry(chosen, fused, dx, dw, x2.device, x2.dtype)
    return entry


# What a backward step passes, by what each argument is. The native node (native/native_node.cpp)
# builds its argument lists from the same codes, so the order of the kernels and of their
# arguments is decided here only.
DY, X, W, RSTD, DX, PARTIALS, NO_PARTIALS, DW, DH, COUNT, OFFSET = range(11)


@dataclasses.dataclass(frozen=True)
class RowsRule:
    """An integer that follows the row count M: ``max(1, min(cap, ceil(M / per)))`` (cap 0: no
    cap). Grids, strip counts and partial rows are such rules, so one launch decision serves
    every M (the native node evaluates them per call)."""
    per: int = 1
    cap: int = 0

    def of(self, M: int) -> int:
        n = -(-M // self.per)
        return max(1, min(n, self.cap) if self.cap else n)


@dataclasses.dataclass(frozen=True)
class Step:
    """One kernel call of a backward: the compiled kernel, its arguments as codes, the rule of
    the integer passed as ``COUNT`` (the fused strips, or split's M) and its NVTX range."""
    kernel: object
    args: Tuple[int, ...]
    count: Optional[RowsRule] = None
    stage: str = "launch"
    name: str = ""
    on_partials: bool = False  # the NVTX shape is (partial rows, N) rather than (M, N)


def backward_steps(entry: _Entry, sms: int, w_dtype: Optional[torch.dtype],
                   fused_strips: int = 0, dw_groups: int = 0, need_dx: bool = True,
                   need_dw: bool = True) -> Tuple[Tuple[Step, ...], Optional[RowsRule]]:
    """``(steps, partial_rows)``: the kernel calls of a backward, in order, and the rule of the
    rows of fp32 dW partials they write (None: no dW). Only what is needed runs: without a
    weight or without ``need_dw``, the dx kernel alone; without ``need_dx``, the dW kernel and
    the reduction. ``fused_strips``: the fused grid, in CTAs (clusters for ``cluster``; 0: the
    plan's CTAs per SM times ``sms``);
    ``dw_groups``: the dW kernel's row groups (0: ``backward_plan.dw_row_groups``)."""
    dw_needed = w_dtype is not None and need_dw
    dh = (DH,) if entry.dx.dh else ()  # the fused add's h gradient, after dx
    if entry.mode in FUSED_MODES and need_dx and (dw_needed or w_dtype is None):
        # backward_plan.fused_strips as a rule of M (the native node evaluates it per call)
        plan = entry.fused
        grid = RowsRule(plan.strips_per_cta * plan.dw_cluster,
                        fused_strips or plan.resident_grid(sms))
        steps = [Step(entry.kernel("fused"), (DY, X, W, RSTD, DX) + dh
                      + (PARTIALS if dw_needed else NO_PARTIALS, COUNT, OFFSET),
                      grid, name="fused")]
        partial_rows = grid if dw_needed else None
    else:
        steps = []
        if need_dx or not dw_needed:
            steps.append(Step(entry.kernel("dx"), (DY, X, W, RSTD, DX) + dh
                              + (NO_PARTIALS, COUNT, OFFSET), RowsRule(), name="split"))
        partial_rows = None
        if dw_needed:
            want = -(-(sms * DW_CTAS_PER_SM) // entry.dw.col_blocks)
            partial_rows = (RowsRule(1, dw_groups) if dw_groups
                            else RowsRule(DW_MIN_ROWS_PER_GROUP, want))
            steps.append(Step(entry.kernel("dw"), (DY, X, RSTD, PARTIALS), name="split"))
    if dw_needed:
        steps.append(Step(entry.dw_reduce(w_dtype), (PARTIALS, DW), stage="reduce",
                          name=entry.mode, on_partials=True))
    return tuple(steps), partial_rows


def run_steps(steps: Tuple[Step, ...], values: tuple, offset: float, shape: Tuple[int, int],
              partial_rows: int) -> None:
    """Call each step's kernel with ``values`` (indexed by the argument codes up to DH)."""
    M, N = shape
    for step in steps:
        args = [values[c] if c < COUNT else (step.count.of(M) if c == COUNT else offset)
                for c in step.args]
        with nvtx.range(step.stage, step.name, (partial_rows if step.on_partials else M, N)):
            step.kernel(*args)


def backward(dy2: torch.Tensor, x2: torch.Tensor, weight: Optional[torch.Tensor],
             rstd: torch.Tensor, offset: float, casting_mode: str, mode: str, sms: int,
             strips: Optional[int] = None, need_dx: bool = True, need_dw: bool = True,
             dh2: Optional[torch.Tensor] = None
             ) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """``(dx, dw)`` for 2-D ``dy2``/``x2`` (last-dim stride 1) and fp32 ``rstd`` of shape (M,).
    ``mode``: fused | split | auto. ``strips``: the fused grid or the dW kernel's row groups
    (default: ``settings.experiments.fused_strips`` for the fused grid, the plans' rules
    otherwise). ``need_dx``/``need_dw`` as in ``backward_steps``; what is not computed is
    None. ``dh2``: the fused add's gradient at h (rows like dy2), added to dx."""
    _check_inputs(dy2, x2, weight, rstd)
    M, N = x2.shape
    if M == 0:
        dx = torch.empty_like(x2, memory_format=torch.contiguous_format) if need_dx else None
        return dx, (torch.zeros_like(weight) if weight is not None and need_dw else None)
    if weight is not None and weight.stride(0) != 1:
        weight = weight.contiguous()
    entry = entry_for(dy2, x2, weight, casting_mode, mode, settings.pdl, dh=dh2 is not None)
    if dh2 is not None:
        dh2 = kernel_grad_rows(dh2, N, entry.dx.vec > 1)
    w_dtype = weight.dtype if weight is not None else None
    steps, rule = backward_steps(entry, sms, w_dtype,
                                 strips or settings.experiments.fused_strips, strips or 0,
                                 need_dx, need_dw)
    writes_dx = any(DX in step.args for step in steps)
    # empty_like: cheaper than torch.empty's argument parsing
    dx = torch.empty_like(x2, memory_format=torch.contiguous_format) if writes_dx else None
    partial_rows = rule.of(M) if rule is not None else 0
    partials = x2.new_empty((partial_rows, N), dtype=torch.float32) if partial_rows else None
    dw = torch.empty_like(weight) if partial_rows else None
    values = (dy2, x2, weight if weight is not None else entry.no_w, rstd, dx, partials,
              entry.no_part, dw, dh2)
    run_steps(steps, values, offset, (M, N), partial_rows)
    return dx, dw
