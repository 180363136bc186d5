"""Compile cache and launch paths for the CuTe forward kernels.

What the kernel bakes in (dtypes, N, casting mode, thread mapping, target architecture) is the
compile-cache key; M and the row strides are runtime values, so one compilation serves them all.
How torch tensors reach the compiled kernel is the launch path
(``settings.experiments.launch_path``), the subject of notebooks/03_host_overhead.ipynb:

``tvm_ffi``  compiled with ``--enable-tvm-ffi``; torch tensors are passed as they are and the
             kernel runs on torch's current stream (the TVM-FFI environment stream).
``cached``   compiled once; each tensor is marshaled with ``from_dlpack`` and the handle kept in a
             bounded FIFO cache keyed on (data_ptr, dtype, shape, stride).
``compiled`` compiled once; every tensor marshaled with ``from_dlpack`` on every call.
``jit``      the ``@cute.jit`` function called directly: CuTe DSL's own cache looks the
             compilation up from the argument types on every call.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Dict, Optional, Tuple

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import from_dlpack, make_fake_stream, make_fake_tensor

from ...common import nvtx
from ...reference import check_casting_mode
from ...settings import settings
from ..plan.auto import auto_variant, row_class
from .compile import COMPILE_LOCK, compile_locked, compile_tvm_ffi, target_arch
from ..kernels.forward import (TORCH_TO_CUTE, RMSNormClusterForward, RMSNormForward,
                      RMSNormFusedAddForward)
from ..kernels.forward_staged import RMSNormStagedForward
from ..plan.forward import INT32_LIMIT, ForwardPlan, check_int32_addressable, plan_forward


_COMPILED: Dict[Tuple, object] = {}
_HANDLES: "OrderedDict[Tuple, object]" = OrderedDict()
_ENTRIES: Dict[Tuple, "_Entry"] = {}


def _align(plan: ForwardPlan, dtype: Optional[torch.dtype] = None) -> int:
    """Byte alignment the kernel may assume for a tensor of ``dtype`` (default: x's): 16 on the
    vector path (checked by the plan's eligibility), one element on the fallback."""
    return 16 if plan.vec > 1 else torch.empty((), dtype=dtype or plan.x_dtype).element_size()


def _fake_args(plan: ForwardPlan):
    """Typed stand-ins for ``cute.compile``: x and y are (M, N):(ld, 1) with M and the row
    strides symbolic; w is (N,); rstd is (M,). The stream is TVM-FFI's environment stream."""
    align = _align(plan)
    x_type = TORCH_TO_CUTE[plan.x_dtype]
    w_type = TORCH_TO_CUTE[plan.w_dtype] if plan.w_dtype is not None else x_type
    M = cute.sym_int64(symbol="M")
    x = make_fake_tensor(x_type, (M, plan.N), stride=(cute.sym_int64(symbol="ldx"), 1),
                         assumed_align=align)
    y = make_fake_tensor(x_type, (M, plan.N), stride=(cute.sym_int64(symbol="ldy"), 1),
                         assumed_align=align)
    w = make_fake_tensor(w_type, (cute.sym_int64(symbol="Nw"),), stride=(1,),
                         assumed_align=_align(plan, plan.w_dtype))
    rstd = make_fake_tensor(cutlass.Float32, (cute.sym_int64(symbol="Mr"),), stride=(1,),
                            assumed_align=4)
    scalars = (cutlass.Int32(1), cutlass.Float32(1e-6), cutlass.Float32(0.0),
               make_fake_stream(use_tvm_ffi_env_stream=True))
    if not plan.residual:
        return (x, w, y, rstd) + scalars
    # the fused add: (x, residual, w, y, h, rstd, ...), residual and h rows like x's
    r = make_fake_tensor(x_type, (M, plan.N), stride=(cute.sym_int64(symbol="ldr"), 1),
                         assumed_align=align)
    h = make_fake_tensor(x_type, (M, plan.N), stride=(cute.sym_int64(symbol="ldh"), 1),
                         assumed_align=align)
    return (x, r, w, y, h, rstd) + scalars


def _kernel_object(plan: ForwardPlan):
    if plan.residual:
        return RMSNormFusedAddForward(plan)
    if plan.variant == "staged":
        return RMSNormStagedForward(plan)
    return RMSNormClusterForward(plan) if plan.cluster_n > 1 else RMSNormForward(plan)


def compile_forward(plan: ForwardPlan, arch: str, keep_ptx_dir: Optional[str] = None):
    """The TVM-FFI compilation of ``plan`` for ``arch`` (cached; the PTX reader calls it too)."""
    return compile_tvm_ffi(_COMPILED, (plan, arch), arch, plan.variant,
                           lambda: (_kernel_object(plan), _fake_args(plan)), keep_ptx_dir)


def _marshal(t: torch.Tensor, align: int):
    """A CuTe tensor handle for ``t`` with a dynamic layout (what from_dlpack costs per call)."""
    # detach: DLPack refuses tensors that require grad (the autograd path hands those over)
    return from_dlpack(t.detach(), assumed_align=align).mark_layout_dynamic(
        leading_dim=t.dim() - 1)


def _cached_handle(t: torch.Tensor, align: int, cap: int):
    """``_marshal`` through the bounded FIFO cache. A handle keeps its tensor's storage alive,
    so an unbounded cache keeps every tensor it ever saw: the cap bounds that memory."""
    key = (t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()))
    h = _HANDLES.get(key)
    if h is None:
        h = _marshal(t, align)
        if cap != 0:  # negative: unbounded (the failure mode the cap exists to prevent)
            if 0 < cap <= len(_HANDLES):
                _HANDLES.popitem(last=False)
            _HANDLES[key] = h
    return h


def clear_caches() -> None:
    """Forget every compilation and tensor handle (tests and the cache-cap benchmark)."""
    _COMPILED.clear()
    _HANDLES.clear()
    _ENTRIES.clear()


class _Entry:
    """Everything a launch of one configuration needs, looked up with one dict probe per call:
    building a plan and hashing the frozen plan each cost microseconds of Python, so neither
    happens on the hot path (docs/design-record.md, 'Host: one dict probe per call')."""
    __slots__ = ("plan", "arch", "ffi_kernel", "dlpack_kernel", "empty_w", "empty_rstd")

    def __init__(self, plan: ForwardPlan, device: torch.device):
        self.plan = plan
        self.arch = target_arch(device)
        self.ffi_kernel = None
        self.dlpack_kernel = None
        # zero-length stand-ins for an absent weight or rstd (the kernel never reads them)
        self.empty_w = torch.empty((0,), dtype=plan.x_dtype, device=device)
        self.empty_rstd = torch.empty((0,), dtype=torch.float32, device=device)

    def ffi(self):
        """The TVM-FFI compilation of this plan, compiled on first use (hot paths read
        ``ffi_kernel`` and call this only when it is still None)."""
        if self.ffi_kernel is None:
            self.ffi_kernel = compile_forward(self.plan, self.arch)
        return self.ffi_kernel


def entry_for(x2: torch.Tensor, weight: Optional[torch.Tensor], casting_mode: str,
              need_rstd: bool, variant: str, pdl: bool,
              residual: Optional[torch.Tensor] = None) -> _Entry:
    """The launch entry for x2, weight (and the fused add's residual rows). y (and h) are not
    looked at: the caching allocator hands out contiguous outputs 512-byte aligned, so only the
    inputs decide the alignment."""
    M, N = x2.shape
    ptrs = x2.data_ptr() | (weight.data_ptr() if weight is not None else 0)
    strides = x2.stride(0)
    if residual is not None:
        ptrs |= residual.data_ptr()
        strides |= residual.stride(0)
    aligned = (ptrs & 15) == 0 and (strides * x2.element_size()) & 15 == 0
    w_dtype = weight.dtype if weight is not None else None
    rows = row_class(M) if variant == "auto" else 0  # auto's only use of M
    key = (variant, N, x2.dtype, w_dtype, casting_mode, need_rstd, aligned, x2.get_device(),
           rows, pdl, residual is not None)
    entry = _ENTRIES.get(key)
    if entry is None:
        casting_mode = check_casting_mode(casting_mode)  # an alias: the mode it names
        chosen = (auto_variant(N, aligned, x2.dtype, M, residual=residual is not None)
                  if variant == "auto" else variant)
        plan = plan_forward(chosen, N, x2.dtype, w_dtype, casting_mode, need_rstd, aligned,
                            arch=target_arch(x2.device), pdl=pdl,
                            residual=residual is not None, row_class=rows)
        entry = _ENTRIES[key] = _Entry(plan, x2.device)
    return entry


def forward(x2: torch.Tensor, weight: Optional[torch.Tensor], eps: float, offset: float,
            casting_mode: str, need_rstd: bool, variant: str, sms: int):
    """``(y, rstd)`` of 2-D rows ``x2`` (rstd None unless ``need_rstd``)."""
    M, N = x2.shape
    if M * x2.stride(0) >= INT32_LIMIT:
        check_int32_addressable(M, x2.stride(0), N)
    # empty_like: it skips torch.empty's device and dtype argument parsing
    # (docs/design-record.md, 'Host: one dict probe per call')
    y = torch.empty_like(x2, memory_format=torch.contiguous_format)
    rstd = x2.new_empty((M,), dtype=torch.float32) if need_rstd else None
    entry = entry_for(x2, weight, casting_mode, need_rstd, variant, settings.pdl)
    plan = entry.plan
    w = weight if weight is not None else entry.empty_w
    r = rstd if rstd is not None else entry.empty_rstd
    grid = plan.grid(M, sms)
    if settings.experiments.launch_path == "tvm_ffi":
        kernel = entry.ffi_kernel
        if kernel is None:
            kernel = entry.ffi()
        with nvtx.range("launch", plan.variant, x2.shape):
            kernel(x2, w, y, r, grid, eps, offset)
    else:
        _launch_marshaled(entry, x2, w, y, r, grid, eps, offset)
    return y, rstd


def _launch_marshaled(entry: _Entry, x2, w, y, r, grid: int, eps: float, offset: float) -> None:
    """The ``cached``, ``compiled`` and ``jit`` paths: CuTe tensor handles from from_dlpack."""
    plan, path = entry.plan, settings.experiments.launch_path
    align, w_align = _align(plan), _align(plan, w.dtype)
    stream = cuda.CUstream(torch.cuda.current_stream(x2.device).cuda_stream)
    with nvtx.range("marshal", plan.variant, x2.shape):
        if path == "cached":
            cap = settings.experiments.tensor_cache_cap
            args = [_cached_handle(t, a, cap) for t, a in ((x2, align), (w, w_align),
                                                            (y, align), (r, 4))]
        else:
            args = [_marshal(x2, align), _marshal(w, w_align), _marshal(y, align), _marshal(r, 4)]
    if path == "jit":  # CuTe DSL's own cache, which may compile: under the compile lock
        with COMPILE_LOCK, nvtx.range("launch", plan.variant, x2.shape):
            _kernel_object(plan)(*args, grid, eps, offset, stream)
        return
    kernel = entry.dlpack_kernel
    if kernel is None:
        kernel = entry.dlpack_kernel = compile_locked(
            _kernel_object(plan), *args, cutlass.Int32(grid), cutlass.Float32(eps),
            cutlass.Float32(offset), stream, options=f"--gpu-arch {entry.arch}",
            label=plan.variant)
    with nvtx.range("launch", plan.variant, x2.shape):
        kernel(*args, grid, eps, offset, stream)


def fused_add_forward(x2: torch.Tensor, r2: torch.Tensor, weight: Optional[torch.Tensor],
                      eps: float, offset: float, casting_mode: str, need_rstd: bool,
                      variant: str, sms: int):
    """``(y, h, rstd)`` of the fused residual add over 2-D rows ``x2`` and ``r2`` (same shape
    and dtype): ``h = x2 + r2`` rounded to x's dtype, y its RMSNorm; on the ``tvm_ffi`` path
    (the measuring launch paths serve the plain forward only)."""
    M, N = x2.shape
    for t in (x2, r2):
        if M * t.stride(0) >= INT32_LIMIT:
            check_int32_addressable(M, t.stride(0), N)
    y = torch.empty_like(x2, memory_format=torch.contiguous_format)
    h = torch.empty_like(x2, memory_format=torch.contiguous_format)
    rstd = x2.new_empty((M,), dtype=torch.float32) if need_rstd else None
    entry = entry_for(x2, weight, casting_mode, need_rstd, variant, settings.pdl, residual=r2)
    plan = entry.plan
    kernel = entry.ffi_kernel
    if kernel is None:
        kernel = entry.ffi()
    w = weight if weight is not None else entry.empty_w
    with nvtx.range("launch", plan.variant, x2.shape):
        kernel(x2, r2, w, y, h, rstd if rstd is not None else entry.empty_rstd,
               plan.grid(M, sms), eps, offset)
    return y, h, rstd