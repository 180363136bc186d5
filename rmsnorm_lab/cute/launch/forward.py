"""Launching the CuTe forward kernels: the compile cache, the launch of a call's rows.

What a kernel bakes in (dtypes, N, casting mode, thread mapping, target architecture) is its plan,
the compile-cache key; M and the row strides are runtime values, so one compilation serves them
all. The kernels are compiled with TVM-FFI (``--enable-tvm-ffi``): torch tensors are passed as
they are and the kernel runs on torch's current stream.

``forward_launch`` is the planning entry: a call's ``ForwardLaunch`` (its plan, its grid as a rule
of M, its kernel compiled on first use, stand-ins for an absent weight or rstd), found with one
dict probe per call (docs/design-record.md, 'Host: one dict probe per call'). The Python path
(``forward``, ``fused_add_forward``, ``fp8_forward``) and the native node (native/launch.py) both
launch from it.
A forward launcher (``lab.forward_launcher``) may take the last step, the launch itself, to
measure other ways of reaching the compiled kernel (the host lesson's launch paths).
"""

from __future__ import annotations

import importlib
from typing import Callable, Dict, Optional, Tuple

import cutlass
import torch
from cutlass.cute.runtime import make_fake_stream

from ...common import nvtx
from ...registry import variant
from ...settings import Snapshot
from ..dtypes import TORCH_TO_CUTE
from ..kernels.forward import RMSNormFusedAddForward
from ..kernels.forward_quant import RMSNormFp8Forward, RMSNormNvfp4Forward
from ..plan.auto import auto_variant, row_class
from ..plan.forward import (INT32_LIMIT, ForwardPlan, RowsRule, check_int32_addressable,
                            plan_forward)
from .compile import (assumed_align, compile_tvm_ffi, fake_rows, fake_rstd, fake_vector,
                      target_arch)

_COMPILED: Dict[Tuple, object] = {}
_LAUNCHES: Dict[Tuple, "ForwardLaunch"] = {}

#: ``launcher(launch, x2, w, y, rstd, grid, eps, offset)``: what the host lesson's launch paths
#: receive in place of the TVM-FFI call (``forward(..., launcher=)``)
Launcher = Callable[..., None]


def kernel_object(plan: ForwardPlan):
    """The kernel class instance that ``plan`` compiles to: its variant's class as the registry
    names it, or the fp8 output's or the fused residual add's, whose plans the row variants
    serve."""
    if plan.quant == "nvfp4":
        return RMSNormNvfp4Forward(plan)
    if plan.quant:
        return RMSNormFp8Forward(plan)
    if plan.residual:
        return RMSNormFusedAddForward(plan)
    module, name = variant(plan.variant).kernel.rsplit(".", 1)
    return getattr(importlib.import_module(f"..kernels.{module}", __package__), name)(plan)


def fake_args(plan: ForwardPlan):
    """Typed stand-ins for ``cute.compile``: x and y are (M, N):(ld, 1) with M and the row
    strides symbolic and N static; w is (N,); rstd is (M,); the fused add's residual and h are
    rows like x's. The stream is TVM-FFI's environment stream. The fp8 output's: x, residual, w,
    q (fp8 rows, aligned to a copy of ``vec`` bytes), h, the scale(s) and the amax bound."""
    align = assumed_align(plan.vec, plan.x_dtype)
    x_type = TORCH_TO_CUTE[plan.x_dtype]
    w_dtype = plan.w_dtype if plan.w_dtype is not None else plan.x_dtype
    x = fake_rows(x_type, "M", "ldx", align, plan.N)
    y = fake_rows(x_type, "M", "ldy", align, plan.N)
    w = fake_vector(TORCH_TO_CUTE[w_dtype], "Nw", assumed_align(plan.vec, w_dtype))
    scalars = (cutlass.Int32(1), cutlass.Float32(1e-6), cutlass.Float32(0.0),
               make_fake_stream(use_tvm_ffi_env_stream=True))
    if plan.quant == "nvfp4":
        r = fake_rows(x_type, "M", "ldr", align, plan.N)
        h = fake_rows(x_type, "M", "ldh", align, plan.N)
        q = fake_rows(cutlass.Int32, "M", "ldq", 4, plan.N // 8)
        return (x, r, w, q, h, fake_vector(cutlass.Float32, "G", 4),
                fake_vector(cutlass.Float8E4M3FN, "S", 16)) + scalars
    if plan.quant:
        r = fake_rows(x_type, "M", "ldr", align, plan.N)
        h = fake_rows(x_type, "M", "ldh", align, plan.N)
        q = fake_rows(cutlass.Float8E4M3FN, "M", "ldq", plan.vec, plan.N)
        scales = fake_vector(cutlass.Float32, "S", 4)
        scale_ub = fake_vector(cutlass.Float32, "U", 4)
        return (x, r, w, q, h, scales, scale_ub) + scalars
    if not plan.residual:
        return (x, w, y, fake_rstd()) + scalars
    r = fake_rows(x_type, "M", "ldr", align, plan.N)
    h = fake_rows(x_type, "M", "ldh", align, plan.N)
    return (x, r, w, y, h, fake_rstd()) + scalars


def compile_forward(plan: ForwardPlan, arch: str, keep_ptx_dir: Optional[str] = None):
    """The TVM-FFI compilation of ``plan`` for ``arch`` (cached; the PTX reader calls it too)."""
    return compile_tvm_ffi(_COMPILED, (plan, arch), arch, plan.variant,
                           lambda: (kernel_object(plan), fake_args(plan)), keep_ptx_dir)


def clear_caches() -> None:
    """Forget every compilation and launch (tests, and measurements from a cold start)."""
    _COMPILED.clear()
    _LAUNCHES.clear()


class ForwardLaunch:
    """What launching one configuration needs: the plan, its grid as a rule of M for this
    device's SMs, the kernel (compiled on first use: ``compiled()``), and zero-length stand-ins
    for an absent weight or rstd (the kernel never reads them)."""
    __slots__ = ("plan", "arch", "grid", "kernel", "no_weight", "no_rstd")

    def __init__(self, plan: ForwardPlan, device: torch.device, sms: int):
        self.plan = plan
        self.arch = target_arch(device)
        self.grid: RowsRule = plan.grid(sms)
        self.kernel = None
        self.no_weight = torch.empty((0,), dtype=plan.x_dtype, device=device)
        self.no_rstd = torch.empty((0,), dtype=torch.float32, device=device)

    def compiled(self):
        """The TVM-FFI kernel, compiled on first use (hot paths read ``kernel`` and call this
        only while it is None)."""
        if self.kernel is None:
            self.kernel = compile_forward(self.plan, self.arch)
        return self.kernel


def forward_launch(x2: torch.Tensor, weight: Optional[torch.Tensor], casting_mode: str,
                   need_rstd: bool, snap: Snapshot, sms: int,
                   residual: Optional[torch.Tensor] = None, quant: str = "",
                   scale_ub: bool = False, offset: bool = True) -> ForwardLaunch:
    """The launch of rows ``x2`` with ``weight`` (and the fused add's ``residual`` rows) under
    the settings ``snap``; ``casting_mode`` is a kernel's (an alias resolved by the caller). y
    (and h) are not looked at: the caching allocator hands out contiguous outputs 512-byte
    aligned, so the inputs alone decide the alignment. ``quant``, ``scale_ub``: y as fp8;
    ``offset``: False where the call's offset is 0 (``plan_forward``)."""
    M, N = x2.shape
    ptrs = x2.data_ptr() | (weight.data_ptr() if weight is not None else 0)
    strides = x2.stride(0)
    if residual is not None:
        ptrs |= residual.data_ptr()
        strides |= residual.stride(0)
    aligned = (ptrs & 15) == 0 and (strides * x2.element_size()) & 15 == 0
    w_dtype = weight.dtype if weight is not None else None
    variant = snap.forward_variant
    rows = row_class(M) if variant == "auto" else 0  # auto's only use of M
    key = (variant, N, x2.dtype, w_dtype, casting_mode, need_rstd, aligned, x2.get_device(),
           rows, snap.pdl, residual is not None, quant, scale_ub, offset)
    launch = _LAUNCHES.get(key)
    if launch is None:
        chosen = (auto_variant(N, aligned, x2.dtype, M, residual=residual is not None,
                               quant=quant) if variant == "auto" else variant)
        plan = plan_forward(chosen, N, x2.dtype, w_dtype, casting_mode, need_rstd, aligned,
                            arch=target_arch(x2.device), pdl=snap.pdl,
                            residual=residual is not None, row_class=rows, quant=quant,
                            scale_ub=scale_ub, offset=offset)
        launch = _LAUNCHES[key] = ForwardLaunch(plan, x2.device, sms)
    return launch


def forward(x2: torch.Tensor, weight: Optional[torch.Tensor], eps: float, offset: float,
            casting_mode: str, need_rstd: bool, snap: Snapshot, sms: int,
            launcher: Optional[Launcher] = None):
    """``(y, rstd)`` of 2-D rows ``x2`` (rstd None unless ``need_rstd``); ``launcher``: the
    launch step, where not the TVM-FFI call."""
    M = x2.shape[0]
    if M * x2.stride(0) >= INT32_LIMIT:  # the plain test inline: this is the launch path
        check_int32_addressable(M, x2.stride(0), x2.shape[1])
    # empty_like: it skips torch.empty's device and dtype argument parsing
    # (docs/design-record.md, 'Host: one dict probe per call')
    y = torch.empty_like(x2, memory_format=torch.contiguous_format)
    rstd = x2.new_empty((M,), dtype=torch.float32) if need_rstd else None
    launch = forward_launch(x2, weight, casting_mode, need_rstd, snap, sms)
    w = weight if weight is not None else launch.no_weight
    r = rstd if rstd is not None else launch.no_rstd
    grid = launch.grid.of(M)
    if launcher is not None:
        launcher(launch, x2, w, y, r, grid, eps, offset)
        return y, rstd
    kernel = launch.kernel
    if kernel is None:
        kernel = launch.compiled()
    with nvtx.range("launch", launch.plan.variant, x2.shape, on=snap.nvtx):
        kernel(x2, w, y, r, grid, eps, offset)
    return y, rstd


def fused_add_forward(x2: torch.Tensor, r2: torch.Tensor, weight: Optional[torch.Tensor],
                      eps: float, offset: float, casting_mode: str, need_rstd: bool,
                      snap: Snapshot, sms: int):
    """``(y, h, rstd)`` of the fused residual add over 2-D rows ``x2`` and ``r2`` (same shape
    and dtype): ``h = x2 + r2`` rounded to x's dtype, y its RMSNorm."""
    M = x2.shape[0]
    for t in (x2, r2):
        if M * t.stride(0) >= INT32_LIMIT:
            check_int32_addressable(M, t.stride(0), t.shape[1])
    y = torch.empty_like(x2, memory_format=torch.contiguous_format)
    h = torch.empty_like(x2, memory_format=torch.contiguous_format)
    rstd = x2.new_empty((M,), dtype=torch.float32) if need_rstd else None
    launch = forward_launch(x2, weight, casting_mode, need_rstd, snap, sms, residual=r2)
    kernel = launch.kernel
    if kernel is None:
        kernel = launch.compiled()
    w = weight if weight is not None else launch.no_weight
    with nvtx.range("launch", launch.plan.variant, x2.shape, on=snap.nvtx):
        kernel(x2, r2, w, y, h, rstd if rstd is not None else launch.no_rstd,
               launch.grid.of(M), eps, offset)
    return y, h, rstd


def fp8_forward(x2: torch.Tensor, r2: Optional[torch.Tensor], weight: Optional[torch.Tensor],
                eps: float, offset: float, casting_mode: str, scale: Optional[torch.Tensor],
                scale_ub: Optional[torch.Tensor], snap: Snapshot, sms: int):
    """``(y_q, scales, h)`` of 2-D rows ``x2`` written as float8_e4m3fn: with a static
    ``scale`` (one fp32 element on x's device; scales None), or a scale per row (fp32 ``(M,)``,
    its amax bounded by ``scale_ub`` when given); h = x2 + r2 with a residual, else None.
    Checked by the caller (api.rms_norm_fp8): shapes, dtypes, devices."""
    M = x2.shape[0]
    for t in (x2, r2):
        if t is not None and M * t.stride(0) >= INT32_LIMIT:
            check_int32_addressable(M, t.stride(0), t.shape[1])
    quant = "static" if scale is not None else "token"
    launch = forward_launch(x2, weight, casting_mode, False, snap, sms, residual=r2, quant=quant,
                            scale_ub=scale_ub is not None, offset=offset != 0.0)
    kernel = launch.kernel
    if kernel is None:
        kernel = launch.compiled()
    h = torch.empty_like(x2, memory_format=torch.contiguous_format) if r2 is not None else None
    y_q = torch.empty(x2.shape, dtype=torch.float8_e4m3fn, device=x2.device)
    scales = x2.new_empty((M,), dtype=torch.float32) if scale is None else None
    # absent tensors go as stand-ins the kernel never reads (its plan has none of them); the
    # scales as the (S,) vectors the kernel was compiled for: a shape-() scale viewed
    with nvtx.range("launch", launch.plan.variant, x2.shape, on=snap.nvtx):
        kernel(x2, r2 if r2 is not None else x2, weight if weight is not None else
               launch.no_weight, y_q, h if h is not None else x2,
               scale.view(1) if scale is not None else scales,
               scale_ub.view(1) if scale_ub is not None else launch.no_rstd,
               launch.grid.of(M), eps, offset)
    return y_q, scales, h
