"""From validated arguments to a backend: the CuTe kernels (in Python or through the native
node), the Triton kernels, or the reference.

``forward``, ``fused_add_forward``, ``fp8_forward`` and ``backward`` serve the Python paths (the
``torch.autograd.Function``, the custom ops, inference calls off the native node); ``native`` is
the native node's entry, and ``fast_call`` the whole host path of a call the node has planned
before (the extension's call memo; None while the settings route calls elsewhere or the node is
not built). Each takes the call's settings as one ``Snapshot`` (``settings.snapshot()``; None
takes the snapshot in force, for callers outside ``rms_norm``).
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch

from . import reference
from .common import nvtx
from .common.device import sm_count
from .common.rows import as_rows, check_weight, grad_rows
from .registry import BACKENDS
from .settings import Snapshot, on_change, settings, snapshot

_cute_forward = None  # cute.launch.forward, imported on first use: CUTLASS takes seconds
_cute_backward = None
_cute_qk_rope = None  # cute.launch.qk_rope, likewise

#: what launches the CuTe forward's planned kernel instead of its TVM-FFI call (None: that
#: call): the host lesson's launch paths, installed by ``lab.forward_launcher``; calls go off
#: the native node while one is installed
_launcher: Optional[Callable] = None


def set_forward_launcher(launcher: Optional[Callable]) -> Optional[Callable]:
    """Install ``launcher`` (None: the TVM-FFI call); returns the one it replaces."""
    global _launcher
    previous, _launcher = _launcher, launcher
    _update_fast_call()
    return previous


def _cute():
    global _cute_forward
    if _cute_forward is None:
        from .cute.launch import forward as _cute_forward
    return _cute_forward


def _cute_qk():
    global _cute_qk_rope
    if _cute_qk_rope is None:
        from .cute.launch import qk_rope as _cute_qk_rope
    return _cute_qk_rope


def forward(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, offset: float,
            casting_mode: str, backend: str, need_rstd: bool, snap: Optional[Snapshot] = None
            ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(y, rstd)``: y contiguous in x's shape and dtype, rstd fp32 ``x.shape[:-1]`` (fp64 for
    the ``torch`` backend's float64 x; None unless ``need_rstd``)."""
    if x.numel() == 0:
        rstd = (x.new_empty(x.shape[:-1], dtype=reference.compute_dtype(x.dtype)) if need_rstd
                else None)
        return torch.empty(x.shape, dtype=x.dtype, device=x.device), rstd
    if backend == "torch":
        y, rstd = reference.rms_norm_forward(x, weight, eps, offset, casting_mode)
        return y.contiguous(), (rstd.contiguous() if need_rstd else None)
    x2 = as_rows(x)
    check_weight(weight, x2.shape[1])
    snap = snap or snapshot()
    if backend == "triton":
        from .triton.forward import triton_rms_norm_forward
        with nvtx.range("launch", "triton", x2.shape, on=snap.nvtx):
            y, rstd = triton_rms_norm_forward(x2, weight, eps, offset, casting_mode, need_rstd)
    else:
        y, rstd = (_cute_forward or _cute()).forward(
            x2, weight, eps, offset, casting_mode, need_rstd, snap, sm_count(x2.get_device()),
            _launcher)
    if x.dim() == 2:  # already rows: no views to make on the hot path
        return y, rstd
    return y.view(x.shape), (rstd.view(x.shape[:-1]) if rstd is not None else None)


def fused_add_forward(x: torch.Tensor, residual: torch.Tensor, weight: Optional[torch.Tensor],
                      eps: float, offset: float, casting_mode: str, backend: str,
                      need_rstd: bool, snap: Optional[Snapshot] = None
                      ) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """``(y, h, rstd)`` of the fused residual add: ``h = x + residual`` (x's shape and dtype,
    rounded once), y its RMSNorm, rstd fp32 ``x.shape[:-1]`` (None unless ``need_rstd``)."""
    if x.numel() == 0:
        rstd = (x.new_empty(x.shape[:-1], dtype=reference.compute_dtype(x.dtype)) if need_rstd
                else None)
        return torch.empty_like(x), torch.empty_like(x), rstd
    if backend == "torch":
        y, h, rstd = reference.fused_add_rms_norm_forward(x, residual, weight, eps, offset,
                                                          casting_mode)
        return y.contiguous(), h.contiguous(), (rstd.contiguous() if need_rstd else None)
    x2, r2 = as_rows(x), as_rows(residual, "residual")
    check_weight(weight, x2.shape[1])
    snap = snap or snapshot()
    if backend == "triton":
        from .triton.forward import triton_fused_add_forward
        with nvtx.range("launch", "triton", x2.shape, on=snap.nvtx):
            y, h, rstd = triton_fused_add_forward(x2, r2, weight, eps, offset, casting_mode,
                                                  need_rstd)
    else:
        y, h, rstd = (_cute_forward or _cute()).fused_add_forward(
            x2, r2, weight, eps, offset, casting_mode, need_rstd, snap,
            sm_count(x2.get_device()))
    if x.dim() == 2:
        return y, h, rstd
    return (y.view(x.shape), h.view(x.shape),
            rstd.view(x.shape[:-1]) if rstd is not None else None)


def fp8_forward(x: torch.Tensor, residual: Optional[torch.Tensor],
                weight: Optional[torch.Tensor], eps: float, offset: float, casting_mode: str,
                scale: Optional[torch.Tensor], scale_ub: Optional[torch.Tensor], backend: str,
                snap: Optional[Snapshot] = None
                ) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """``(y_q, scales, h)`` of ``rms_norm_fp8``: y_q float8_e4m3fn in x's shape; scales fp32
    ``x.shape[:-1]`` per token, None with a static ``scale``; h (``x + residual``, x's dtype)
    with a residual, else None."""
    if x.numel() == 0:
        scales = (torch.full(x.shape[:-1], reference.FP8_MIN_SCALE, dtype=torch.float32,
                             device=x.device) if scale is None else None)
        h = torch.empty_like(x) if residual is not None else None
        return torch.empty(x.shape, dtype=reference.FP8_DTYPE, device=x.device), scales, h
    if backend == "torch":
        y_q, scales, *h = reference.rms_norm_fp8(x, weight, eps, offset, casting_mode, scale,
                                                 residual, scale_ub)
        return (y_q.contiguous(), scales.contiguous() if scale is None else None,
                h[0].contiguous() if h else None)
    x2 = as_rows(x)
    r2 = as_rows(residual, "residual") if residual is not None else None
    check_weight(weight, x2.shape[1])
    snap = snap or snapshot()
    if backend == "triton":
        from .triton.quant import triton_rms_norm_fp8
        with nvtx.range("launch", "triton", x2.shape, on=snap.nvtx):
            y_q, scales, h = triton_rms_norm_fp8(x2, r2, weight, eps, offset, casting_mode,
                                                 scale, scale_ub)
    else:
        y_q, scales, h = (_cute_forward or _cute()).fp8_forward(
            x2, r2, weight, eps, offset, casting_mode, scale, scale_ub, snap,
            sm_count(x2.get_device()))
    if x.dim() == 2:
        return y_q, scales, h
    return (y_q.view(x.shape), scales.view(x.shape[:-1]) if scales is not None else None,
            h.view(x.shape) if h is not None else None)


def backward(dy: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor],
             rstd: torch.Tensor, offset: float, casting_mode: str, backend: str,
             dx_out: Optional[torch.Tensor] = None, need_dw: bool = True,
             dh: Optional[torch.Tensor] = None, snap: Optional[Snapshot] = None
             ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(dx, dw)``: dx shaped like x in x's dtype, dw in weight's dtype (None without a
    weight, or when ``need_dw`` is off: the CuTe backend then runs the dx kernel alone).
    ``rstd`` is the forward's fp32 ``x.shape[:-1]``. ``dh``: the fused add's gradient at h (x
    is then h), added to dx before its rounding.

    With ``dx_out`` (a contiguous tensor of x's shape and dtype, in practice ``dy`` itself) dx is
    written into its storage and ``dx_out`` is returned as dx. The Triton kernel writes it there
    directly (a program reads a whole row of dy before it writes that row of dx); the CuTe
    kernels and the reference compute dx in a buffer of their own and it is copied over.
    """
    if x.numel() == 0:
        dx = dx_out if dx_out is not None else torch.empty(x.shape, dtype=x.dtype,
                                                            device=x.device)
        return dx, (torch.zeros_like(weight) if weight is not None else None)
    x2 = as_rows(x)
    M, N = x2.shape
    dy2 = grad_rows(dy, N)
    dh2 = grad_rows(dh, N) if dh is not None else None
    rstd1 = rstd if rstd.dim() == 1 else rstd.reshape(M)
    check_weight(weight, N)
    snap = snap or snapshot()
    if backend == "cute":
        global _cute_backward
        if _cute_backward is None:
            from .cute.launch import backward as _cute_backward
        dx2, dw = _cute_backward.backward(dy2, x2, weight, rstd1, offset, casting_mode,
                                          snap.backward, sm_count(x2.get_device()), snap,
                                          need_dw=need_dw, dh2=dh2)
    elif backend == "triton":
        from .triton.backward import triton_rms_norm_backward
        with nvtx.range("launch", "triton", x2.shape, on=snap.nvtx):
            if dx_out is not None:
                return dx_out, triton_rms_norm_backward(dy2, x2, weight, rstd1, offset,
                                                        casting_mode, dx=dx_out.view(M, N),
                                                        dh=dh2)[1]
            dx2, dw = triton_rms_norm_backward(dy2, x2, weight, rstd1, offset, casting_mode,
                                               dh=dh2)
    elif backend == "torch":
        dx2, dw = reference.rms_norm_backward(dy2, x2, weight, rstd1, offset, casting_mode,
                                              dh=dh2)
        dx2 = dx2.contiguous()
    else:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    dw = dw if need_dw else None
    if dx_out is not None:
        dx_out.view(M, N).copy_(dx2)
        return dx_out, dw
    return (dx2 if x2 is x else dx2.view(x.shape)), dw


# ----------------------------------------------------------------------------- the native node

def routed_to_native(backend: str, snap: Optional[Snapshot] = None) -> bool:
    """Whether calls of ``backend`` go to the native node under the settings ``snap`` (None:
    those in force): CuTe calls, unless the Python node is chosen or a forward launcher of the
    host lesson's is installed."""
    return (backend == "cute" and (snap or snapshot()).autograd_node == "native"
            and _launcher is None)


_native = None  # (extension, native.launch) once loaded; False where it cannot be built

#: ``fast_call(x, weight, eps, offset, casting_mode)``: the extension's ``CallMemo.call`` (y, on
#: the tape for a training call; None when the memo does not know the call) while the settings
#: route ``backend=None`` calls to the native node; else None. Kept current on every change of
#: the settings.
fast_call = None
#: ``fast_add_call(x, residual, weight, eps, offset, casting_mode)``: the same for the fused
#: residual add (``CallMemo.call_add``: ``(y, h)`` or None).
fast_add_call = None


def _update_fast_call() -> None:
    global fast_call, fast_add_call
    fast_call = fast_add_call = None
    if routed_to_native(settings.backend) and _native:
        extension, native_launch = _native
        fast_call = native_launch.memo(extension).call
        fast_add_call = native_launch.memo(extension, residual=True).call_add


def native_node():
    """``(extension, native.launch)``, built on first use, or None (after one warning) where the
    extension cannot be built."""
    global _native
    if _native is None:
        from .native import build
        extension = build.load_or_warn()
        if extension is None:
            _native = False
        else:
            from .native import launch as native_launch
            _native = (extension, native_launch)
            on_change(_update_fast_call)
            _update_fast_call()
    return _native or None


def native(x: torch.Tensor, residual: Optional[torch.Tensor], weight: Optional[torch.Tensor],
           eps: float, offset: float, casting_mode: str, snap: Snapshot):
    """y (with ``residual``, laid out as x: ``(y, h)`` of the fused add) through the native
    node, on its tape for a training call; ``native_node()`` must have returned the node."""
    extension, native_launch = _native
    return native_launch.call(extension, x, residual, weight, eps, offset, casting_mode, snap)


def qk_norm_rope_forward(q, k, q_weight, k_weight, cos, sin, eps: float, casting_mode: str,
                         backend: str):
    """``(q_out, k_out, q_rstd, k_rstd)`` of ``qk_norm_rope`` (reference.qk_norm_rope_forward):
    outputs contiguous in q's and k's shapes, rstd fp32 ``(..., H)``. ``cute``: the CuTe kernel
    where its plan takes the rows (q's and k's heads rows of one stride, 16-byte aligned, half a
    head whole copies), else the ``triton`` kernel; ``torch`` is the reference."""
    if backend == "torch":
        qo, ko, qr, kr = reference.qk_norm_rope_forward(q, k, q_weight, k_weight, cos, sin, eps,
                                                        casting_mode)
        return qo.contiguous(), ko.contiguous(), qr, kr
    snap = snapshot()
    if backend == "cute":
        cute = _cute_qk_rope or _cute_qk()
        try:
            with nvtx.range("launch", "qk_rope", q.shape, on=snap.nvtx):
                return cute.qk_norm_rope_forward(q, k, q_weight, k_weight, cos, sin, eps,
                                                 casting_mode, snap.pdl,
                                                 sm_count(q.get_device()))
        except cute.NotEligible:
            pass
    from .triton.qk_rope import triton_qk_norm_rope_forward
    with nvtx.range("launch", "triton", q.shape, on=snap.nvtx):
        return triton_qk_norm_rope_forward(q, k, q_weight, k_weight, cos, sin, eps,
                                           casting_mode, need_rstd=True)


def qk_norm_rope_backward(dq_out, dk_out, q, k, q_weight, k_weight, cos, sin, q_rstd, k_rstd,
                          casting_mode: str, backend: str):
    """``(dq, dk, dq_weight, dk_weight)`` of ``qk_norm_rope`` (reference.qk_norm_rope_backward),
    deterministic on every backend; ``cute`` as the forward: the CuTe kernel where it takes the
    rows, else the Triton kernel."""
    if backend == "torch":
        return reference.qk_norm_rope_backward(dq_out, dk_out, q, k, q_weight, k_weight, cos,
                                               sin, q_rstd, k_rstd, casting_mode)
    if backend == "cute":
        cute = _cute_qk_rope or _cute_qk()
        snap = snapshot()
        try:
            with nvtx.range("launch", "qk_rope_backward", q.shape, on=snap.nvtx):
                return cute.qk_norm_rope_backward(dq_out, dk_out, q, k, q_weight, k_weight,
                                                  cos, sin, q_rstd, k_rstd, casting_mode,
                                                  snap.pdl, sm_count(q.get_device()))
        except cute.NotEligible:
            pass
    from .triton.qk_rope import triton_qk_norm_rope_backward
    return triton_qk_norm_rope_backward(dq_out, dk_out, q, k, q_weight, k_weight, cos, sin,
                                        q_rstd, k_rstd, casting_mode)
