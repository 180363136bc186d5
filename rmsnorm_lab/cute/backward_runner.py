"""Compile cache and launches for the CuTe backward kernels.

As in runner.py, the compiled kernels take raw device pointers plus the dynamic sizes (M, row
strides, grid), so one compilation serves every M, stride and strip count; the cache key is what
the kernel bakes in: the plan (dtypes, N, casting mode, thread mapping) and the target arch.

``backward`` returns ``(dx, dw)``. The last step of dW, ``dw_partial.sum(0)`` over the G strip (or
row-group) partial rows, is a torch reduction on the current stream: it reads G x N fp32 values,
small next to the 2 x M x N the kernels read, and keeps the kernels free of atomics.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_ptr

from ..reference import check_casting_mode
from .backward import RMSNormBackward, RMSNormBackwardDW
from .backward_plan import (MODES, BackwardPlan, auto_mode, dw_row_groups, fused_strips,
                            plan_backward, plan_split)
from .forward import TORCH_TO_CUTE
from .plan import is_aligned
from .runner import target_arch

_COMPILED: Dict[Tuple, object] = {}


def _align(plan: BackwardPlan, dtype=None) -> int:
    """Assumed pointer alignment: 16 bytes on the vector path, else the element's own size (a
    wider weight than x, fp32 w with bf16 x, needs its 4 bytes even on the fallback)."""
    return 16 if plan.vec > 1 else (dtype or plan.x_dtype).itemsize


def _placeholder_args(plan: BackwardPlan):
    """Arguments of the right types for ``cute.compile`` (never launched)."""
    align = _align(plan)
    x_type = TORCH_TO_CUTE[plan.x_dtype]
    w_type = TORCH_TO_CUTE[plan.w_dtype] if plan.w_dtype is not None else x_type
    f32, i32 = cutlass.Float32, cutlass.Int32
    p_x = make_ptr(x_type, 0, assumed_align=align)
    p_rstd = make_ptr(f32, 0, assumed_align=4)
    p_part = make_ptr(f32, 0, assumed_align=16 if plan.vec > 1 else 4)
    if plan.kind == "dw":
        return (p_x, p_x, p_rstd, p_part, i32(1), i32(plan.N), i32(plan.N), i32(1),
                cuda.CUstream(0))
    w_align = _align(plan, plan.w_dtype or plan.x_dtype)
    return (p_x, p_x, make_ptr(w_type, 0, assumed_align=w_align), p_rstd, p_x, p_part, i32(1),
            i32(plan.N), i32(plan.N), i32(plan.N), i32(1), f32(0.0), cuda.CUstream(0))


def _kernel_object(plan: BackwardPlan):
    return RMSNormBackwardDW(plan) if plan.kind == "dw" else RMSNormBackward(plan)


def compile_backward(plan: BackwardPlan, arch: str, keep_ptx_dir: Optional[str] = None):
    """Compile (or fetch from the cache) the backward kernel for ``plan`` on ``arch``."""
    key = (plan, arch)
    fn = _COMPILED.get(key)
    if fn is None or keep_ptx_dir is not None:
        options = f"--gpu-arch {arch}"
        if keep_ptx_dir is not None:
            options += f" --keep-ptx --dump-dir {keep_ptx_dir}"
        fn = cute.compile(_kernel_object(plan), *_placeholder_args(plan), options=options)
        _COMPILED[key] = fn
    return fn


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
    for name, t in (("dy", dy2), ("x", x2), ("rstd", rstd), ("weight", weight)):
        if t is not None and t.device != x2.device:
            raise ValueError(f"{name} is on {t.device}, x on {x2.device}")
    M, N = x2.shape
    for name, t in (("dy", dy2), ("x", x2)):
        # The kernels index with Int32 (row * row stride), like the forward's.
        if M and (M - 1) * t.stride(0) + N >= 2**31:
            raise ValueError(f"{name} spans 2**31 elements or more: Int32 indexing limit")


def choose_plans(dy2, x2, dx, weight, casting_mode: str, mode: str):
    """``(mode, plans)``: ``("fused", (fused,))`` or ``("split", (dx, dw or None))``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    check_casting_mode(casting_mode)
    M, N = x2.shape
    aligned = (is_aligned(x2) and is_aligned(dy2) and is_aligned(dx)
               and (weight is None or (weight.data_ptr() % 16 == 0 and weight.stride(0) == 1)))
    w_dtype = weight.dtype if weight is not None else None
    if mode == "auto":
        mode = auto_mode(M, N, x2.dtype, w_dtype, casting_mode, aligned)
    if mode == "fused":
        return mode, (plan_backward("fused", N, x2.dtype, w_dtype, casting_mode, aligned),)
    return mode, plan_split(N, x2.dtype, w_dtype, casting_mode, aligned)


def backward(dy2: torch.Tensor, x2: torch.Tensor, weight: Optional[torch.Tensor],
             rstd: torch.Tensor, offset: float, casting_mode: str, mode: str, sms: int,
             strips: Optional[int] = None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(dx, dw)`` for 2-D ``dy2``/``x2`` (last-dim stride 1) and fp32 ``rstd`` of shape (M,).
    ``mode``: fused | split | auto. ``strips``: the fused grid (default ``sms``) or, for split,
    the dW kernel's row groups (default from ``dw_row_groups``)."""
    _check_inputs(dy2, x2, weight, rstd)
    M, N = x2.shape
    dx = torch.empty((M, N), dtype=x2.dtype, device=x2.device)
    if M == 0:
        dw = torch.zeros_like(weight) if weight is not None else None
        return dx, dw
    if weight is not None and weight.stride(0) != 1:
        weight = weight.contiguous()
    mode, plans = choose_plans(dy2, x2, dx, weight, casting_mode, mode)
    arch = target_arch(x2.device)
    stream = cuda.CUstream(torch.cuda.current_stream(x2.device).cuda_stream)
    f32 = cutlass.Float32
    rstd_ptr = make_ptr(f32, rstd.data_ptr(), assumed_align=4)

    def ptr(plan, t):
        return make_ptr(TORCH_TO_CUTE[t.dtype], t.data_ptr(), assumed_align=_align(plan, t.dtype))

    def dxdw_launch(plan, grid, dw_partial):
        w_src = weight if weight is not None else x2
        part = dw_partial if dw_partial is not None else dx  # unused without a dW output
        compile_backward(plan, arch)(
            ptr(plan, dy2), ptr(plan, x2), ptr(plan, w_src), rstd_ptr, ptr(plan, dx),
            make_ptr(f32, part.data_ptr(), assumed_align=16 if plan.vec > 1 else 4),
            M, dy2.stride(0), x2.stride(0), dx.stride(0), grid, offset, stream)

    if mode == "fused":
        (plan,) = plans
        grid = fused_strips(M, sms, strips)
        dw_partial = None
        if weight is not None:
            dw_partial = torch.empty((grid, N), dtype=torch.float32, device=x2.device)
        dxdw_launch(plan, grid, dw_partial)
    else:
        dx_plan, dw_plan = plans
        dxdw_launch(dx_plan, M, None)
        dw_partial = None
        if dw_plan is not None:
            groups = dw_row_groups(M, dw_plan, sms) if strips is None else max(1, min(strips, M))
            dw_partial = torch.empty((groups, N), dtype=torch.float32, device=x2.device)
            compile_backward(dw_plan, arch)(
                ptr(dw_plan, dy2), ptr(dw_plan, x2), rstd_ptr,
                make_ptr(f32, dw_partial.data_ptr(), assumed_align=16 if dw_plan.vec > 1 else 4),
                M, dy2.stride(0), x2.stride(0), groups, stream)
    dw = dw_partial.sum(0).to(weight.dtype) if dw_partial is not None else None
    return dx, dw
