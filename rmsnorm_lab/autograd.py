"""Autograd for ``rms_norm``: one forward and one backward, reached two ways.

``forward_impl`` / ``backward_impl`` do the work (a backend's kernels, or the reference for
``backend="torch"``). Three wrappers put them on the autograd tape:

* **Eager, CuTe on the tvm_ffi path** (``settings.autograd_node == "native"``, the default): the
  native node (csrc/native_node.cpp, cute/native_launch.py), a hand-written C++ autograd node. Its
  backward runs without Python, as torch's own RMSNorm does: on an H200's host an *empty* Python
  Function alone cost 81 µs for forward + backward through the engine (results/NOTES.md §14).
  A repeated call reaches it without Python through the extension's call memo (``fast_call``).
* **Eager, everything else**: ``RMSNormFunction``, a plain ``torch.autograd.Function``, where
  the custom op below costs ~50 µs per training call through its dispatcher and autograd
  wrapper. ``settings.autograd_node = "python"`` puts CuTe calls here too (to measure the node).
* **torch.compile**: the ``torch.library`` custom ops ``rmsnorm_lab::rms_norm_fwd`` → ``(y,
  rstd)`` and ``rmsnorm_lab::rms_norm_bwd`` → ``(dx, dw)``, with fake (meta) implementations and
  ``register_autograd``, so Dynamo records each as one opaque node and
  ``torch.compile(fullgraph=True)`` traces ``rms_norm`` without a graph break. ``rms_norm`` picks
  them whenever ``torch.compiler.is_compiling()``.

All three save ``(x, weight, rstd)`` and run the same kernels (the native node's backward is the
C++ twin of ``backward_runner.backward``). There is no double
backward: ``backward(create_graph=True)`` raises rather than silently dropping second-order
terms. Custom-op schemas cannot return ``Optional[Tensor]``, so without a weight the backward op
returns an empty ``dw`` and the autograd formula maps it to None.

``in_place=True`` writes dx into the storage of the incoming gradient dy and hands dy back as dx,
so a training step holds one fewer activation-sized buffer. The Triton kernel writes dx there
directly; the CuTe runner and the reference compute dx in a buffer of their own and it is copied
over (same result, no memory saved yet: the CuTe split backward's dW kernel reads dy after the dx
kernel, so writing dx over dy needs care there). This is safe only when nothing else reads that
gradient afterwards, which this library cannot see: autograd passes the *same* gradient tensor to
every input of some ops (``y + r`` gives y and r one tensor; if the other branch's backward runs
after this one it reads dx instead of dy). Use it when ``y`` feeds a single op whose backward makes
a fresh gradient (a matmul/linear, as in a transformer block), and never pass your own tensor to
``y.backward(g)`` unless you accept that ``g`` is overwritten. The backward refuses with a
ValueError when dy is not a contiguous tensor of x's shape and dtype (e.g. the gradient of
``y.sum()``, an expanded stride-0 tensor) or requires grad itself. Under ``torch.compile`` the
mutating op ``rmsnorm_lab::rms_norm_bwd_inplace`` is used, which the compiler functionalizes;
buffer reuse is then the compiler's decision.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import launch, reference
from .settings import settings


# ----------------------------------------------------------------------------- the work

def forward_impl(x: Tensor, weight: Optional[Tensor], eps: float, offset: float,
                 casting_mode: str, backend: str) -> Tuple[Tensor, Tensor]:
    """``(y, rstd)``: y contiguous in x's shape and dtype, rstd fp32 ``x.shape[:-1]``."""
    if x.numel() == 0:
        return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
                torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device))
    if backend == "torch":
        y, rstd = reference.rms_norm_forward(x, weight, eps, offset, casting_mode)
        return y.contiguous(), rstd.contiguous()
    y, rstd = launch.forward(x, weight, eps, offset, casting_mode, backend, need_rstd=True)
    return y, rstd


def backward_impl(dy: Tensor, x: Tensor, weight: Optional[Tensor], rstd: Tensor, offset: float,
                  casting_mode: str, backend: str, dx_out: Optional[Tensor] = None
                  ) -> Tuple[Tensor, Optional[Tensor]]:
    """``(dx, dw)``; dx is ``dx_out`` when given (written into its storage)."""
    if x.numel() == 0:
        dx = dx_out if dx_out is not None else torch.empty(x.shape, dtype=x.dtype,
                                                            device=x.device)
        return dx, (torch.zeros_like(weight) if weight is not None else None)
    return launch.backward(dy, x, weight, rstd, offset, casting_mode, backend, dx_out=dx_out)


def check_in_place(dy: Tensor, x: Tensor) -> None:
    """Refuse ``in_place=True`` where dy's storage cannot, or must not, receive dx."""
    if dy.requires_grad:
        raise ValueError("rms_norm(in_place=True) cannot overwrite the incoming gradient: it is "
                         "part of a graph (backward(create_graph=True)); use in_place=False")
    if dy.shape != x.shape or dy.dtype != x.dtype or not dy.is_contiguous():
        raise ValueError(
            "rms_norm(in_place=True) writes dx into the incoming gradient dy, which must be a "
            f"contiguous {x.dtype} tensor of x's shape {tuple(x.shape)}; got {dy.dtype} "
            f"{tuple(dy.shape)} with strides {tuple(dy.stride())} (the gradient of y.sum(), for "
            "one, is an expanded stride-0 tensor). Use in_place=False for this graph")


def _empty_dw(x: Tensor) -> Tensor:
    return x.new_empty(0)


# ----------------------------------------------------------------------------- custom ops

@torch.library.custom_op("rmsnorm_lab::rms_norm_fwd", mutates_args=())
def rms_norm_fwd(x: Tensor, weight: Optional[Tensor], eps: float, offset: float,
                 casting_mode: str, backend: str, in_place: bool = False
                 ) -> Tuple[Tensor, Tensor]:
    """``(y, rstd)``. ``in_place`` does not change the forward; it rides along for the backward."""
    return forward_impl(x, weight, eps, offset, casting_mode, backend)


@rms_norm_fwd.register_fake
def _rms_norm_fwd_fake(x, weight, eps, offset, casting_mode, backend, in_place=False):
    return x.new_empty(x.shape), x.new_empty(x.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("rmsnorm_lab::rms_norm_bwd", mutates_args=())
def rms_norm_bwd(dy: Tensor, x: Tensor, weight: Optional[Tensor], rstd: Tensor, offset: float,
                 casting_mode: str, backend: str) -> Tuple[Tensor, Tensor]:
    """``(dx, dw)``; dw is an empty tensor of x's dtype when there is no weight."""
    dx, dw = backward_impl(dy, x, weight, rstd, offset, casting_mode, backend)
    return dx, (dw if dw is not None else _empty_dw(x))


@rms_norm_bwd.register_fake
def _rms_norm_bwd_fake(dy, x, weight, rstd, offset, casting_mode, backend):
    dw = weight.new_empty(weight.shape) if weight is not None else _empty_dw(x)
    return x.new_empty(x.shape), dw


@torch.library.custom_op("rmsnorm_lab::rms_norm_bwd_inplace", mutates_args=("dy",))
def rms_norm_bwd_inplace(dy: Tensor, x: Tensor, weight: Optional[Tensor], rstd: Tensor,
                         offset: float, casting_mode: str, backend: str) -> Tensor:
    """Writes dx into ``dy`` (contiguous, x's shape and dtype); returns dw (empty without a
    weight)."""
    _, dw = backward_impl(dy, x, weight, rstd, offset, casting_mode, backend, dx_out=dy)
    return dw if dw is not None else _empty_dw(x)


@rms_norm_bwd_inplace.register_fake
def _rms_norm_bwd_inplace_fake(dy, x, weight, rstd, offset, casting_mode, backend):
    return weight.new_empty(weight.shape) if weight is not None else _empty_dw(x)


# ----------------------------------------------------------------------------- autograd

def _backward(dy: Tensor, x: Tensor, weight: Optional[Tensor], rstd: Tensor, offset: float,
              casting_mode: str, backend: str, in_place: bool, use_ops: bool):
    """The backward body both wrappers share: ``(dx, dw or None)``."""
    if in_place:
        check_in_place(dy, x)
        if use_ops:
            dw = rms_norm_bwd_inplace(dy, x, weight, rstd, offset, casting_mode, backend)
            dw = dw if weight is not None else None
        else:
            _, dw = backward_impl(dy, x, weight, rstd, offset, casting_mode, backend, dx_out=dy)
        return dy, dw
    if use_ops:
        dx, dw = rms_norm_bwd(dy, x, weight, rstd, offset, casting_mode, backend)
        return dx, (dw if weight is not None else None)
    return backward_impl(dy, x, weight, rstd, offset, casting_mode, backend)


def _setup_context(ctx, inputs, output):
    x, weight, _eps, offset, casting_mode, backend, in_place = inputs
    _, rstd = output
    ctx.save_for_backward(x, weight, rstd)
    ctx.mark_non_differentiable(rstd)
    ctx.args = (offset, casting_mode, backend, in_place)


def _op_backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = _backward(dy, x, weight, rstd, *ctx.args, use_ops=True)
    return dx, dw, None, None, None, None, None


rms_norm_fwd.register_autograd(_op_backward, setup_context=_setup_context)


class RMSNormFunction(torch.autograd.Function):
    """The eager training path: the same work as the custom ops, without their dispatch cost."""

    @staticmethod
    def forward(ctx, x, weight, eps, offset, casting_mode, backend, in_place):
        y, rstd = forward_impl(x, weight, eps, offset, casting_mode, backend)
        ctx.save_for_backward(x, weight, rstd)
        ctx.args = (offset, casting_mode, backend, in_place)
        return y

    @staticmethod
    def backward(ctx, dy):
        if torch.is_grad_enabled():  # backward(create_graph=True): the kernels have no backward
            raise RuntimeError("rms_norm has no double backward: its backward cannot run under "
                               "backward(create_graph=True)")
        x, weight, rstd = ctx.saved_tensors
        dx, dw = _backward(dy, x, weight, rstd, *ctx.args, use_ops=False)
        return dx, dw, None, None, None, None, None


def rms_norm_autograd(x: Tensor, weight: Optional[Tensor], eps: float, offset: float,
                      casting_mode: str, backend: str, in_place: bool) -> Tensor:
    """``y`` on the autograd tape (arguments already validated by ``api.rms_norm``)."""
    if torch.compiler.is_compiling():
        return rms_norm_fwd(x, weight, float(eps), float(offset), casting_mode, backend,
                            bool(in_place))[0]
    y = native_rms_norm(x, weight, eps, offset, casting_mode, backend, in_place)
    if y is not None:
        return y
    return RMSNormFunction.apply(x, weight, eps, offset, casting_mode, backend, in_place)


def native_rms_norm(x: Tensor, weight: Optional[Tensor], eps: float, offset: float,
                    casting_mode: str, backend: str, in_place: bool) -> Optional[Tensor]:
    """y through the native extension (on its tape node for a training call) when the call goes
    there (``native_node_for``), else None. Planned once per call key; the next call with that
    key is served by ``fast_call`` before ``api.rms_norm`` gets this far."""
    native = native_node_for(x, backend, in_place)
    if native is None:
        return None
    extension, native_launch = native
    if settings.settings_per_call:
        launch.per_call_settings_cost()
    return native_launch.rms_norm(extension, x, weight, eps, offset, casting_mode)


def native_node_for(x: Tensor, backend: str, in_place: bool):
    """(extension, cute.native_launch) when this call goes through the native extension (a
    training call then goes on its tape node), else None. The native node decides its backward
    (``settings.backward``, ``fused_strips``) at the forward; the Python node reads them when its
    backward runs."""
    if _routed_to_native(backend) and not in_place and x.numel():
        return _native_path()
    return None


def _routed_to_native(backend: str) -> bool:
    """Whether the toggles send calls of ``backend`` to the native extension."""
    return (backend == "cute" and settings.autograd_node == "native"
            and settings.launch_path == "tvm_ffi")


_native = None  # (extension, cute.native_launch) once loaded; False where it cannot be built

#: The whole host path of a call the native extension has planned before:
#: ``fast_call(x, weight, eps, offset, casting_mode)`` is the extension's ``CallMemo.call``
#: (y, on the tape for a training call; None when the memo does not know the call and
#: ``api.rms_norm`` goes on). Set once the extension is loaded and while the toggles route
#: ``backend=None`` calls to it (``_update_fast_call``, run on every settings change).
fast_call = None


def _update_fast_call() -> None:
    global fast_call
    fast_call = None
    if _routed_to_native(settings.backend) and not settings.settings_per_call and _native:
        extension, native_launch = _native
        fast_call = native_launch.memo(extension).call


def _native_path():
    """The native node's extension and launch module (built on first use), or None after one
    warning."""
    global _native
    if _native is None:
        from . import native_node
        extension = native_node.load_or_warn()
        if extension is None:
            _native = False
        else:
            from .cute import native_launch
            from .settings import on_change
            _native = (extension, native_launch)
            on_change(_update_fast_call)
            _update_fast_call()
    return _native or None
