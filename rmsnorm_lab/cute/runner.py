"""Compile cache and launches for the CuTe forward kernels.

The compiled kernel takes raw device pointers plus the dynamic sizes (M, row strides, grid), so
one compilation serves every M and every row stride; what the kernel bakes in (dtypes, N, casting
mode, the thread mapping, the target architecture) is the cache key.
"""

from __future__ import annotations

import os
from typing import Dict, Optional, Tuple

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_ptr

from .forward import TORCH_TO_CUTE, RMSNormForward
from .plan import ForwardPlan, auto_variant, is_aligned, plan_forward

_COMPILED: Dict[Tuple, object] = {}


def target_arch(device: Optional[torch.device] = None) -> str:
    """``sm_90a`` on an H100/H200, ``sm_100a`` on a B200; without a GPU, ``CUTE_DSL_ARCH``."""
    if device is not None and device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"sm_{major}{minor}a"
    return os.environ.get("CUTE_DSL_ARCH", "sm_100a")


def _placeholder_args(plan: ForwardPlan):
    """Arguments of the right types for ``cute.compile`` (the values are never launched)."""
    align = 16 if plan.vec > 1 else torch.tensor([], dtype=plan.x_dtype).element_size()
    x_type = TORCH_TO_CUTE[plan.x_dtype]
    w_type = TORCH_TO_CUTE[plan.w_dtype] if plan.w_dtype is not None else x_type
    i32, f32 = cutlass.Int32, cutlass.Float32
    return (make_ptr(x_type, 0, assumed_align=align), make_ptr(w_type, 0, assumed_align=align),
            make_ptr(x_type, 0, assumed_align=align), make_ptr(cutlass.Float32, 0, assumed_align=4),
            i32(1), i32(plan.N), i32(plan.N), i32(1), f32(1e-6), f32(0.0), cuda.CUstream(0))


def compile_forward(plan: ForwardPlan, arch: str, keep_ptx_dir: Optional[str] = None):
    """Compile (or fetch from the cache) the forward kernel for ``plan`` on ``arch``."""
    key = (plan, arch)
    fn = _COMPILED.get(key)
    if fn is None or keep_ptx_dir is not None:
        options = f"--gpu-arch {arch}"
        if keep_ptx_dir is not None:
            options += f" --keep-ptx --dump-dir {keep_ptx_dir}"
        fn = cute.compile(RMSNormForward(plan), *_placeholder_args(plan), options=options)
        _COMPILED[key] = fn
    return fn


def choose_plan(x2: torch.Tensor, y: torch.Tensor, weight: Optional[torch.Tensor],
                casting_mode: str, need_rstd: bool, variant: str) -> ForwardPlan:
    N = x2.shape[1]
    aligned = is_aligned(x2) and is_aligned(y) and (weight is None or weight.data_ptr() % 16 == 0)
    if variant == "auto":
        variant = auto_variant(N, aligned, x2.dtype)
    w_dtype = weight.dtype if weight is not None else None
    return plan_forward(variant, N, x2.dtype, w_dtype, casting_mode, need_rstd, aligned)


def forward(x2: torch.Tensor, weight: Optional[torch.Tensor], eps: float, offset: float,
            casting_mode: str, need_rstd: bool, variant: str, sms: int):
    M, N = x2.shape
    y = torch.empty((M, N), dtype=x2.dtype, device=x2.device)
    rstd = torch.empty((M,), dtype=torch.float32, device=x2.device) if need_rstd else None
    plan = choose_plan(x2, y, weight, casting_mode, need_rstd, variant)
    launch(plan, x2, weight, y, rstd, eps, offset, sms)
    return y, rstd


def launch(plan: ForwardPlan, x2: torch.Tensor, weight: Optional[torch.Tensor], y: torch.Tensor,
           rstd: Optional[torch.Tensor], eps: float, offset: float, sms: int) -> None:
    """Launch ``plan`` on the current stream (compiling it on first use)."""
    kernel = compile_forward(plan, target_arch(x2.device))
    align = 16 if plan.vec > 1 else x2.element_size()
    x_type = TORCH_TO_CUTE[x2.dtype]
    w_src = weight if weight is not None else x2
    stream = cuda.CUstream(torch.cuda.current_stream(x2.device).cuda_stream)
    M = x2.shape[0]
    kernel(make_ptr(x_type, x2.data_ptr(), assumed_align=align),
           make_ptr(TORCH_TO_CUTE[w_src.dtype], w_src.data_ptr(), assumed_align=align),
           make_ptr(x_type, y.data_ptr(), assumed_align=align),
           make_ptr(cutlass.Float32, rstd.data_ptr() if rstd is not None else y.data_ptr(),
                    assumed_align=4),
           M, x2.stride(0), y.stride(0), plan.grid(M, sms), eps, offset, stream)
