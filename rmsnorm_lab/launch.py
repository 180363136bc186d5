"""The launch layer: from validated torch tensors to a kernel launch on the current stream.

Per call it views x as rows, allocates outputs, picks a plan, finds the compiled kernel in the
compile cache (keyed on everything the kernel bakes in) and launches it. Host-side costs here are
the subject of notebooks/03: every lookup is a dict hit, and nothing reads the environment.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

import torch

from .settings import settings

_SM_COUNT: Dict[int, int] = {}


def sm_count(device: torch.device) -> int:
    """Multiprocessor count, asked of the driver once per device."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    n = _SM_COUNT.get(idx)
    if n is None:
        n = _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return n


def as_rows(x: torch.Tensor, name: str = "x") -> torch.Tensor:
    """x as an (M, N) view without copying; refuses layouts a row kernel cannot address."""
    if x.stride(-1) != 1 and x.shape[-1] != 1:
        raise ValueError(f"{name} must have a contiguous last dimension (stride 1), "
                         f"got strides {tuple(x.stride())}")
    try:
        return x.view(-1, x.shape[-1])
    except RuntimeError:
        raise ValueError(f"{name} with shape {tuple(x.shape)} and strides {tuple(x.stride())} "
                         "cannot be viewed as rows of a 2-D matrix without a copy; pass "
                         f"{name}.contiguous()") from None


def forward(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, offset: float,
            casting_mode: str, backend: str, need_rstd: bool
            ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Returns ``(y, rstd)`` with y shaped like x, rstd (fp32, ``x.shape[:-1]``) or None."""
    x2 = as_rows(x)
    M, N = x2.shape
    if weight is not None and weight.stride(0) != 1 and N > 1:
        raise ValueError(f"weight must be contiguous, got stride {weight.stride(0)}")
    if backend == "triton":
        from .triton.forward import triton_rms_norm_forward
        y, rstd = triton_rms_norm_forward(x2, weight, eps, offset, casting_mode, need_rstd)
    else:
        from .cute import runner
        y, rstd = runner.forward(x2, weight, eps, offset, casting_mode, need_rstd,
                                 settings.forward_variant, sm_count(x.device))
    y = y.view(x.shape)
    return y, (rstd.view(x.shape[:-1]) if rstd is not None else None)


def lab_impls(op: str) -> Dict[str, Callable]:
    """The lab's implementations of ``op`` for the benchmark, as ``fn(x, w) -> y``."""
    if op != "fwd":
        raise ValueError(f"no lab implementations for op {op!r} yet")
    from .api import rms_norm

    def cute_variant(variant: str) -> Callable:
        def run(x, w):
            with settings.override(forward_variant=variant):
                return rms_norm(x, w, backend="cute")
        return run

    impls = {f"cute.{v}": cute_variant(v) for v in ("row", "persistent", "warp", "auto")}
    impls["triton.row"] = lambda x, w: rms_norm(x, w, backend="triton")
    return impls
