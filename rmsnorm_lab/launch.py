"""The launch layer: from validated torch tensors to a kernel launch on the current stream.

Per call it views x as rows, allocates outputs, picks a plan, finds the compiled kernel in the
compile cache (keyed on everything the kernel bakes in) and launches it. Host-side costs here are
the subject of notebooks/03: every lookup is a dict hit, and nothing reads the environment.
"""

from __future__ import annotations

import os
from typing import Callable, Dict, Optional, Tuple

import torch

from . import nvtx_ranges
from .settings import from_environ
from .settings import settings

_SM_COUNT: Dict[int, int] = {}
_cute_runner = None
_cute_backward = None


def sm_count(index: int) -> int:
    """Multiprocessor count of CUDA device ``index``: asked of the driver once per device, or on
    every call with ``settings.sm_count_cache`` off (to measure what the cache saves)."""
    if not settings.sm_count_cache:
        return torch.cuda.get_device_properties(index).multi_processor_count
    n = _SM_COUNT.get(index)
    if n is None:
        n = _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return n


def per_call_settings_cost() -> None:
    """What a launch path that consults the environment pays per call: parse and validate every
    ``RMSNORM_LAB_*`` variable. The values are not applied (``settings`` stays authoritative);
    ``settings.settings_per_call`` exists to measure this cost against reading once at import."""
    from_environ(os.environ)


def as_rows(x: torch.Tensor, name: str = "x") -> torch.Tensor:
    """x as an (M, N) view without copying; refuses layouts a row kernel cannot address."""
    if x.dim() == 2 and x.stride(1) == 1:  # already rows: a view would cost ~1 µs of the call
        return x
    if x.stride(-1) != 1 and x.shape[-1] != 1:
        raise ValueError(f"{name} must have a contiguous last dimension (stride 1), "
                         f"got strides {tuple(x.stride())}")
    try:
        return x.view(-1, x.shape[-1])
    except RuntimeError:
        raise ValueError(f"{name} with shape {tuple(x.shape)} and strides {tuple(x.stride())} "
                         "cannot be viewed as rows of a 2-D matrix without a copy; pass "
                         f"{name}.contiguous()") from None


def check_weight(weight: Optional[torch.Tensor], n: int) -> None:
    """Refuse a weight the kernels cannot read as a contiguous (n,) vector."""
    if weight is not None and weight.stride(0) != 1 and n > 1:
        raise ValueError(f"weight must be contiguous, got stride {weight.stride(0)}")


def forward(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, offset: float,
            casting_mode: str, backend: str, need_rstd: bool
            ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Returns ``(y, rstd)`` with y shaped like x, rstd (fp32, ``x.shape[:-1]``) or None."""
    x2 = as_rows(x)
    M, N = x2.shape
    check_weight(weight, N)
    if backend == "triton":
        from .triton.forward import triton_rms_norm_forward
        with nvtx_ranges.range("launch", "triton", x2.shape):
            y, rstd = triton_rms_norm_forward(x2, weight, eps, offset, casting_mode, need_rstd)
    else:
        global _cute_runner
        if _cute_runner is None:  # imported on first use: CUTLASS takes seconds to import
            from .cute import runner as _cute_runner
        if settings.settings_per_call:
            per_call_settings_cost()
        y, rstd = _cute_runner.forward(x2, weight, eps, offset, casting_mode, need_rstd,
                                       settings.forward_variant, sm_count(x2.get_device()))
    if x.dim() == 2:  # already rows: no views to make on the hot path
        return y, rstd
    return y.view(x.shape), (rstd.view(x.shape[:-1]) if rstd is not None else None)


def grad_rows(dy: torch.Tensor, n: int) -> torch.Tensor:
    """The incoming gradient as (M, N) rows. Autograd hands over whatever layout the next op's
    backward produced (the gradient of ``y.sum()`` is an expanded, stride-0 tensor), so a layout
    a row kernel cannot address is copied rather than refused."""
    if dy.dim() == 2 and dy.stride(1) == 1:  # already rows
        return dy
    if dy.stride(-1) != 1 and n > 1:
        dy = dy.contiguous()
    try:
        return dy.view(-1, n)
    except RuntimeError:
        return dy.contiguous().view(-1, n)


def backward(dy: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor],
             rstd: torch.Tensor, offset: float, casting_mode: str, backend: str,
             dx_out: Optional[torch.Tensor] = None
             ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Returns ``(dx, dw)``: dx shaped like x in x's dtype, dw in weight's dtype (None without a
    weight). ``rstd`` is the forward's fp32 ``x.shape[:-1]``.

    With ``dx_out`` (a contiguous tensor of x's shape and dtype, in practice ``dy`` itself) dx is
    written into its storage and ``dx_out`` is returned as dx. The Triton kernel writes it there
    directly (a program reads a whole row of dy before it writes that row of dx); the CuTe runner
    and the reference allocate dx and it is copied over.
    """
    x2 = as_rows(x)
    dy2 = grad_rows(dy, x2.shape[1])
    M, N = x2.shape
    rstd1 = rstd if rstd.dim() == 1 else rstd.reshape(M)
    check_weight(weight, N)
    if backend == "cute":
        global _cute_backward
        if _cute_backward is None:
            from .cute import backward_runner as _cute_backward
        dx2, dw = _cute_backward.backward(dy2, x2, weight, rstd1, offset, casting_mode,
                                          settings.backward, sm_count(x2.get_device()))
    elif backend == "triton":
        from .triton.backward import triton_rms_norm_backward
        with nvtx_ranges.range("launch", "triton", x2.shape):
            if dx_out is not None:
                return dx_out, triton_rms_norm_backward(dy2, x2, weight, rstd1, offset,
                                                        casting_mode, dx=dx_out.view(M, N))[1]
            dx2, dw = triton_rms_norm_backward(dy2, x2, weight, rstd1, offset, casting_mode)
    elif backend == "torch":
        from .reference import rms_norm_backward
        dx2, dw = rms_norm_backward(dy2, x2, weight, rstd1, offset, casting_mode)
        dx2 = dx2.contiguous()
    else:
        raise ValueError(f"backend must be one of ('cute', 'triton', 'torch'), got {backend!r}")
    if dx_out is not None:
        dx_out.view(M, N).copy_(dx2)
        return dx_out, dw
    return (dx2 if x2 is x else dx2.view(x.shape)), dw


def lab_impls(op: str) -> Dict[str, Callable]:
    """The lab's implementations of ``op`` for the benchmark, as ``fn(x, w) -> y``.

    ``fwd``: the CuTe forward variants, ``cute.auto-pdl`` (auto with ``settings.pdl`` off) and
    the Triton forward. ``bwd`` and ``full``: the same
    differentiable ``rms_norm`` (the benchmark takes the gradient), one entry per backward:
    ``cute.fused``, ``cute.split`` and ``cute.auto`` (``settings.backward`` pinned for that
    call on the tape node the library would use: ``_pinned_backward``), ``cute.auto-pdl`` (auto
    with ``settings.pdl`` off, forward and backward) and ``triton.split`` (the
    Triton backward: a dx+dW partials kernel and a torch sum). Eager times of ``bwd``/``full``
    recorded before the native node (commit fb6b2ed and earlier) were taken on the Python node."""
    from .api import rms_norm

    if op == "fwd":
        def cute_variant(variant: str, **toggles) -> Callable:
            def run(x, w):
                with settings.override(forward_variant=variant, **toggles):
                    return rms_norm(x, w, backend="cute")
            return run

        impls = {f"cute.{v}": cute_variant(v) for v in ("row", "persistent", "warp", "auto")}
        # auto with settings.pdl off: what programmatic dependent launch buys, in the same run
        impls["cute.auto-pdl"] = cute_variant("auto", pdl=False)
        impls["triton.row"] = lambda x, w: rms_norm(x, w, backend="triton")
        return impls
    if op in ("bwd", "full"):
        impls = {f"cute.{mode}": _pinned_backward(mode) for mode in ("fused", "split", "auto")}
        impls["cute.auto-pdl"] = _pinned_backward("auto", pdl=False)  # PDL off, same run
        impls["triton.split"] = lambda x, w: rms_norm(x, w, backend="triton")
        return impls
    raise ValueError(f"no lab implementations for op {op!r}; ops: fwd, bwd, full")


def _pinned_backward(mode: str, backend: str = "cute", **toggles) -> Callable:
    """``fn(x, w) -> y``: ``rms_norm(x, w, backend=backend)`` whose backward runs with
    ``settings.backward == mode``, on the tape node the library itself would use. The native
    node fixes its backward at the forward, so the forward runs under ``settings.override``; the
    Python node reads the toggle when its backward runs, so there ``api``'s own
    ``RMSNormFunction`` is subclassed only to wrap its backward in the override. ``toggles``
    (other settings, e.g. ``pdl=False``) hold for the forward and the backward alike."""
    from .api import rms_norm, validate
    from .autograd import RMSNormFunction, native_node_for

    class Pinned(RMSNormFunction):
        @staticmethod
        def backward(ctx, dy):
            with settings.override(backward=mode, **toggles):
                return RMSNormFunction.backward(ctx, dy)

    Pinned.__name__ = Pinned.__qualname__ = f"RMSNormFunction_{mode}"

    def run(x, w, eps: float = 1e-6):
        if not (torch.is_grad_enabled()
                and (x.requires_grad or (w is not None and w.requires_grad))):
            with settings.override(**toggles):
                return rms_norm(x, w, eps, backend=backend)  # no tape: a plain forward
        if native_node_for(x, backend, in_place=False) is not None:
            with settings.override(backward=mode, **toggles):
                return rms_norm(x, w, eps, backend=backend)
        validate(x, w, "llama", backend)  # what rms_norm checks before taping
        with settings.override(**toggles):  # the forward under the same toggles
            return Pinned.apply(x, w, eps, 0.0, "llama", backend, False)
    return run
