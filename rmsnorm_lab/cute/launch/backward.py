"""Launching the CuTe backward kernels: the compile cache, a call's steps.

Like the forward (launch/forward.py), the kernels are compiled once per plan with TVM-FFI
(``--enable-tvm-ffi``) against typed stand-ins whose M and row strides are symbolic, so one
compilation serves every M, stride and strip count, and torch tensors are passed as they are, on
torch's current stream. What a kernel bakes in (dtypes, N, casting mode, thread mapping, target
arch) is the compile-cache key.

``backward_launch`` is the planning entry: a configuration's ``BackwardLaunch`` (the mode, its
plans, kernels compiled on first use, stand-ins for absent tensors), found with one dict probe.
Its ``steps`` are the kernel calls of a backward, each argument named by a code (launch/args.py),
with the integers that follow the row count as rules of M: the Python launch (``backward``) and
the native node (native/launch.py) run the same steps. The last step of dW sums the G strip (or
row-group) fp32 partial rows in one more kernel (kernels/dw_reduce.py), which reads G x N fp32
values, small next to the 2 x M x N the kernels read, rounds once to the weight's dtype, and
keeps every kernel free of atomics (so dW is bitwise reproducible run to run).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Tuple

import cutlass
import torch
from cutlass.cute.runtime import make_fake_stream

from ...common import nvtx
from ...common.rows import kernel_grad_rows
from ...settings import Snapshot
from ..dtypes import TORCH_TO_CUTE
from ..kernels.backward import RMSNormBackward, RMSNormBackwardDh
from ..kernels.backward_cluster import RMSNormClusterBackward
from ..kernels.backward_dw import RMSNormBackwardDW
from ..kernels.backward_staged import RMSNormStagedBackward, RMSNormStagedBackwardDh
from ..kernels.dw_reduce import DwReduce, DwReducePair
from ..plan.backward import (MODES, BackwardPlan, RowsRule, auto_mode, backward_uses_pdl,
                             dw_row_groups_rule, fused_strips_rule, plan_backward,
                             plan_cluster_backward, plan_staged_backward, plan_split,
                             with_dw_cluster)
from .args import TENSOR_ARGS, Arg
from .compile import (assumed_align, compile_tvm_ffi, fake_rows, fake_rstd, fake_vector,
                      target_arch)

_COMPILED: Dict[Tuple, object] = {}
_LAUNCHES: Dict[Tuple, "BackwardLaunch"] = {}


def kernel_object(plan: BackwardPlan):
    """The kernel class instance that ``plan`` compiles to."""
    if plan.kind == "dw":
        return RMSNormBackwardDW(plan)
    if plan.cluster_n > 1:
        return RMSNormClusterBackward(plan)
    if plan.stages > 1:
        return RMSNormStagedBackwardDh(plan) if plan.dh else RMSNormStagedBackward(plan)
    return RMSNormBackwardDh(plan) if plan.dh else RMSNormBackward(plan)


def fake_args(plan: BackwardPlan):
    """Typed stand-ins for ``cute.compile``: (M, N):(ld, 1) rows with M, N and the row strides
    symbolic, the (N,) weight, (M,) rstd, (G, N) fp32 partials; TVM-FFI's environment stream."""
    align = assumed_align(plan.vec, plan.x_dtype)
    x_type = TORCH_TO_CUTE[plan.x_dtype]
    dy, x = fake_rows(x_type, "M", "lddy", align), fake_rows(x_type, "M", "ldx", align)
    part = fake_rows(cutlass.Float32, "G", "ldp", assumed_align(plan.vec, torch.float32))
    stream = make_fake_stream(use_tvm_ffi_env_stream=True)
    if plan.kind == "dw":
        return dy, x, fake_rstd(), part, stream
    w_dtype = plan.w_dtype or plan.x_dtype
    w = fake_vector(TORCH_TO_CUTE[w_dtype], "Nw", assumed_align(plan.vec, w_dtype))
    dx = fake_rows(x_type, "M", "lddx", align)
    scalars = (cutlass.Int32(1), cutlass.Float32(0.0), stream)
    if plan.dh:  # the fused add's: h's gradient after dx
        return (dy, x, w, fake_rstd(), dx, fake_rows(x_type, "M", "lddh", align), part) + scalars
    return (dy, x, w, fake_rstd(), dx, part) + scalars


def compile_backward(plan: BackwardPlan, arch: str, keep_ptx_dir: Optional[str] = None):
    """The TVM-FFI compilation of ``plan`` for ``arch`` (cached; the PTX reader calls it too)."""
    return compile_tvm_ffi(_COMPILED, (plan, arch), arch, plan.kind,
                           lambda: (kernel_object(plan), fake_args(plan)), keep_ptx_dir)


def compile_dw_reduce(N: int, w_dtype: torch.dtype, arch: str,
                      keep_ptx_dir: Optional[str] = None, pdl: bool = False, pair: bool = False):
    """The TVM-FFI compilation of the partial-row reduction for width N into ``w_dtype``: (G, N)
    fp32 partials, the (N,) dW, the environment stream; ``pair``: two weights' partials side by
    side, (G, 2N), into two (N,) vectors (``DwReducePair``)."""
    dw = fake_vector(TORCH_TO_CUTE[w_dtype], "Nw", w_dtype.itemsize)
    args = ((fake_rows(cutlass.Float32, "G", "ldp", 4), dw)
            + ((fake_vector(TORCH_TO_CUTE[w_dtype], "Nw2", w_dtype.itemsize),) if pair else ())
            + (make_fake_stream(use_tvm_ffi_env_stream=True),))
    kind = DwReducePair if pair else DwReduce
    return compile_tvm_ffi(_COMPILED, ("dw_reduce", N, w_dtype, arch, pdl, pair), arch,
                           "dw_reduce", lambda: (kind(N, TORCH_TO_CUTE[w_dtype], pdl), args),
                           keep_ptx_dir)


def clear_caches() -> None:
    """Forget every compilation and launch (tests, and measurements from a cold start)."""
    _COMPILED.clear()
    _LAUNCHES.clear()


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


@dataclasses.dataclass(frozen=True)
class Step:
    """One kernel call of a backward: the compiled kernel, its arguments as codes, the rule of
    the integer passed as ``Arg.COUNT`` (the fused strips, or split's M) and its NVTX range."""
    kernel: object
    args: Tuple[Arg, ...]
    count: Optional[RowsRule] = None
    stage: str = "launch"
    name: str = ""
    on_partials: bool = False  # the NVTX shape is (partial rows, N) rather than (M, N)


class BackwardLaunch:
    """One configuration's backward: the mode, the chosen family's plan (``fused``) and the split
    pair (``dx``, ``dw``) that serves a backward needing dx alone or dW alone, their kernels
    compiled on first use, and the stand-ins passed for tensors a kernel does not read (no
    weight; no dW partials)."""
    __slots__ = ("mode", "fused", "dx", "dw", "kernels", "arch", "no_weight", "no_partials",
                 "reduce")

    def __init__(self, mode: str, fused: Optional[BackwardPlan], dx: BackwardPlan,
                 dw: Optional[BackwardPlan], device: torch.device, x_dtype: torch.dtype):
        self.mode = mode
        self.fused, self.dx, self.dw = fused, dx, dw
        self.kernels: Dict[str, object] = {}
        self.arch = target_arch(device)
        self.no_weight = torch.empty((0,), dtype=x_dtype, device=device)
        self.no_partials = torch.empty((1, 1), dtype=torch.float32, device=device)
        self.reduce = None  # the dW partial reduction, compiled on first use

    @property
    def plans(self) -> Tuple[BackwardPlan, ...]:
        """The chosen family's plans: (fused,) or (dx, dw) (dx alone without a weight)."""
        if self.mode in FUSED_MODES:
            return (self.fused,)
        return (self.dx,) if self.dw is None else (self.dx, self.dw)

    @property
    def aligned(self) -> bool:
        """Do the kernels assume 16-byte aligned rows (of dy, and the fused add's dh)?"""
        return self.dx.vec > 1

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

    def steps(self, sms: int, w_dtype: Optional[torch.dtype], fused_strips: int = 0,
              dw_groups: int = 0, need_dx: bool = True, need_dw: bool = True
              ) -> Tuple[Tuple[Step, ...], Optional[RowsRule]]:
        """``(steps, partial_rows)``: the kernel calls of a backward, in order, and the rule of
        the rows of fp32 dW partials they write (None: no dW). Only what is needed runs: without
        a weight or without ``need_dw``, the dx kernel alone; without ``need_dx``, the dW kernel
        and the reduction. ``fused_strips``: the fused grid, in CTAs (clusters for ``cluster``;
        0: ``plan.backward.fused_strips_rule``'s); ``dw_groups``: the dW kernel's row groups (0:
        ``dw_row_groups_rule``'s)."""
        dw_needed = w_dtype is not None and need_dw
        dh = (Arg.DH,) if self.dx.dh else ()  # the fused add's h gradient, after dx
        tensors = (Arg.DY, Arg.X, Arg.W, Arg.RSTD, Arg.DX) + dh
        if self.mode in FUSED_MODES and need_dx and (dw_needed or w_dtype is None):
            grid = fused_strips_rule(self.fused, sms, fused_strips)
            steps = [Step(self.kernel("fused"), tensors + (
                Arg.PARTIALS if dw_needed else Arg.NO_PARTIALS, Arg.COUNT, Arg.OFFSET),
                grid, name="fused")]
            partial_rows = grid if dw_needed else None
        else:
            steps = []
            if need_dx or not dw_needed:
                steps.append(Step(self.kernel("dx"), tensors + (
                    Arg.NO_PARTIALS, Arg.COUNT, Arg.OFFSET), RowsRule(), name="split"))
            partial_rows = None
            if dw_needed:
                partial_rows = dw_row_groups_rule(self.dw, sms, dw_groups)
                steps.append(Step(self.kernel("dw"), (Arg.DY, Arg.X, Arg.RSTD, Arg.PARTIALS),
                                  name="split"))
        if dw_needed:
            steps.append(Step(self.dw_reduce(w_dtype), (Arg.PARTIALS, Arg.DW), stage="reduce",
                              name=self.mode, on_partials=True))
        return tuple(steps), partial_rows


def backward_launch(dy2: torch.Tensor, x2: torch.Tensor, weight: Optional[torch.Tensor],
                    casting_mode: str, mode: str, pdl: bool, dh: bool = False
                    ) -> BackwardLaunch:
    """The backward of rows ``x2`` with gradient rows ``dy2`` in ``mode`` (fused | split |
    cluster | staged | auto), with PDL where ``pdl`` allows it; ``casting_mode`` is a kernel's.
    dx, freshly allocated and contiguous, is aligned whenever the plan's vector width divides
    N, which the plan checks; ``dh``: the fused add's backward (its dh is copied to aligned
    rows where it is not: ``kernel_grad_rows``)."""
    N = x2.shape[1]
    ptrs = dy2.data_ptr() | x2.data_ptr() | (weight.data_ptr() if weight is not None else 0)
    strides = (dy2.stride(0) | x2.stride(0)) * x2.element_size()
    aligned = ((ptrs | strides) & 15) == 0
    w_dtype = weight.dtype if weight is not None else None
    # auto_mode decides from what the key holds (not from M), so one launch serves every M
    key = (mode, N, x2.dtype, w_dtype, casting_mode, aligned, x2.get_device(), pdl, dh)
    launch = _LAUNCHES.get(key)
    if launch is None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        arch = target_arch(x2.device)
        chosen = auto_mode(N, x2.dtype, w_dtype, casting_mode, aligned, dh,
                           arch) if mode == "auto" else mode
        fused = None
        if chosen == "fused":
            fused = plan_backward("fused", N, x2.dtype, w_dtype, casting_mode, aligned, dh)
        elif chosen == "cluster":
            fused = plan_cluster_backward(N, x2.dtype, w_dtype, casting_mode, aligned, dh, arch)
        elif chosen == "staged":
            fused = plan_staged_backward(N, x2.dtype, w_dtype, casting_mode, aligned, dh)
        fused = with_dw_cluster(fused, arch)
        dx, dw = plan_split(N, x2.dtype, w_dtype, casting_mode, aligned, dh)
        if pdl and backward_uses_pdl(arch):
            fused, dx, dw = (dataclasses.replace(p, pdl=True) if p is not None else None
                             for p in (fused, dx, dw))
        launch = _LAUNCHES[key] = BackwardLaunch(chosen, fused, dx, dw, x2.device, x2.dtype)
    return launch


def run_steps(steps: Tuple[Step, ...], tensors: tuple, offset: float, shape: Tuple[int, int],
              partial_rows: int, nvtx_on: bool) -> None:
    """Call each step's kernel with its arguments: ``tensors`` indexed by the codes up to
    ``Arg.DH``, the step's count rule at M, the offset."""
    M, N = shape
    for step in steps:
        args = [tensors[c] if c < TENSOR_ARGS else (step.count.of(M) if c == Arg.COUNT
                                                     else offset) for c in step.args]
        with nvtx.range(step.stage, step.name, (partial_rows if step.on_partials else M, N),
                        on=nvtx_on):
            step.kernel(*args)


def backward(dy2: torch.Tensor, x2: torch.Tensor, weight: Optional[torch.Tensor],
             rstd: torch.Tensor, offset: float, casting_mode: str, mode: str, sms: int,
             snap: Snapshot, strips: Optional[int] = None, need_dx: bool = True,
             need_dw: bool = True, dh2: Optional[torch.Tensor] = None
             ) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """``(dx, dw)`` for 2-D ``dy2``/``x2`` (last-dim stride 1) and fp32 ``rstd`` of shape (M,),
    in ``mode`` (``backward_launch``'s), with PDL, NVTX and the fused strips as ``snap`` says.
    ``strips``: the fused grid or the dW kernel's row groups (default: ``snap.fused_strips``
    for the fused grid, the plans' rules otherwise). ``need_dx``/``need_dw`` as in
    ``BackwardLaunch.steps``; what is not computed is None. ``dh2``: the fused add's gradient at
    h (rows like dy2), added to dx."""
    _check_inputs(dy2, x2, weight, rstd)
    M, N = x2.shape
    if M == 0:
        dx = torch.empty_like(x2, memory_format=torch.contiguous_format) if need_dx else None
        return dx, (torch.zeros_like(weight) if weight is not None and need_dw else None)
    if weight is not None and weight.stride(0) != 1:
        weight = weight.contiguous()
    launch = backward_launch(dy2, x2, weight, casting_mode, mode, snap.pdl, dh=dh2 is not None)
    if dh2 is not None:
        dh2 = kernel_grad_rows(dh2, N, launch.aligned)
    w_dtype = weight.dtype if weight is not None else None
    steps, rule = launch.steps(sms, w_dtype, strips or snap.fused_strips, strips or 0, need_dx,
                               need_dw)
    writes_dx = any(Arg.DX in step.args for step in steps)
    # empty_like: cheaper than torch.empty's argument parsing
    dx = torch.empty_like(x2, memory_format=torch.contiguous_format) if writes_dx else None
    partial_rows = rule.of(M) if rule is not None else 0
    partials = x2.new_empty((partial_rows, N), dtype=torch.float32) if partial_rows else None
    dw = torch.empty_like(weight) if partial_rows else None
    tensors = (dy2, x2, weight if weight is not None else launch.no_weight, rstd, dx, partials,
               launch.no_partials, dw, dh2)
    run_steps(steps, tensors, offset, (M, N), partial_rows, snap.nvtx)
    return dx, dw
