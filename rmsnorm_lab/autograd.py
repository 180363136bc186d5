"""Autograd for ``rms_norm``: one forward and one backward (``dispatch.forward`` and
``dispatch.backward``), put on the tape three ways:

* **Eager, CuTe on the tvm_ffi path** (the default): the native node (rmsnorm_lab/native/), a
  hand-written C++ autograd node whose backward runs without Python, as torch's own RMSNorm
  does (docs/design-record.md, 'Host: the native tape node'). ``dispatch`` routes calls there;
  this module is not involved.
* **Eager, everything else**: ``RMSNormFunction``, a plain ``torch.autograd.Function`` (the
  custom op below costs more per training call through its dispatcher and autograd wrapper).
  ``settings.experiments.autograd_node = "python"`` puts CuTe calls here too, to measure the
  node.
* **torch.compile**: the ``torch.library`` custom ops ``rmsnorm_lab::rms_norm_fwd`` → ``(y,
  rstd)`` and ``rmsnorm_lab::rms_norm_bwd`` → ``(dx, dw)``, with fake (meta) implementations and
  ``register_autograd``, so Dynamo records each as one opaque node and
  ``torch.compile(fullgraph=True)`` traces ``rms_norm`` without a graph break. ``rms_norm`` picks
  them whenever ``torch.compiler.is_compiling()``.

All three save ``(x, weight, rstd)`` and run the same kernels (the native node runs the steps
``cute.launch.backward.BackwardLaunch.steps`` decides). The eager nodes run their backward under
the settings snapshot of their forward (the native node fixes its backward when it plans the
forward, and the Python node keeps the snapshot on its context); the custom ops read the
settings in force when each op runs. There is no double
backward: ``backward(create_graph=True)`` raises rather than silently dropping second-order
terms. Custom-op schemas cannot return ``Optional[Tensor]``, so without a weight the backward op
returns an empty ``dw`` and the autograd formula maps it to None.

``in_place=True`` writes dx into the storage of the incoming gradient dy and hands dy back as dx,
so a training step holds one fewer activation-sized buffer. The Triton kernel writes dx there
directly; the CuTe launch and the reference compute dx in a buffer of their own and it is copied
over (same result, no memory saved on that path: the CuTe split backward's dW kernel reads dy after
the dx kernel, so writing dx over dy needs care there). This is safe only when nothing else reads
that gradient afterwards, which this library cannot see: autograd passes the *same* gradient tensor
to every input of some ops (``y + r`` gives y and r one tensor; if the other branch's backward runs
after this one it reads dx instead of dy). Use it when ``y`` feeds a single op whose backward makes
a fresh gradient (a matmul/linear, as in a transformer block), and never pass your own tensor to
``y.backward(g)`` unless you accept that ``g`` is overwritten. The backward refuses with a
ValueError when dy is not a contiguous tensor of x's shape and dtype (e.g. the gradient of
``y.sum()``, an expanded stride-0 tensor) or requires grad itself. Under ``torch.compile`` the
mutating op ``rmsnorm_lab::rms_norm_bwd_inplace`` is used, which the compiler functionalizes;
buffer reuse is then the compiler's decision.

``rmsnorm_lab::rms_norm_fp8`` is the fp8-output norm's op (``api.rms_norm_fp8``): inference
only, so it has a fake implementation and no autograd formula.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import dispatch
from .reference import FP8_DTYPE, compute_dtype
from .settings import Snapshot, snapshot


# ----------------------------------------------------------------------------- the work

def forward_impl(x: Tensor, weight: Optional[Tensor], eps: float, offset: float,
                 casting_mode: str, backend: str, snap: Optional[Snapshot] = None
                 ) -> Tuple[Tensor, Tensor]:
    """``(y, rstd)``: y contiguous in x's shape and dtype, rstd fp32 ``x.shape[:-1]``."""
    return dispatch.forward(x, weight, eps, offset, casting_mode, backend, need_rstd=True,
                            snap=snap)


def backward_impl(dy: Tensor, x: Tensor, weight: Optional[Tensor], rstd: Tensor, offset: float,
                  casting_mode: str, backend: str, dx_out: Optional[Tensor] = None,
                  need_dw: bool = True, snap: Optional[Snapshot] = None
                  ) -> Tuple[Tensor, Optional[Tensor]]:
    """``(dx, dw)``; dx is ``dx_out`` when given (written into its storage); dw is None when
    ``need_dw`` is off."""
    return dispatch.backward(dy, x, weight, rstd, offset, casting_mode, backend, dx_out=dx_out,
                             need_dw=need_dw, snap=snap)


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
    return x.new_empty(x.shape), x.new_empty(x.shape[:-1], dtype=compute_dtype(x.dtype))


@torch.library.custom_op("rmsnorm_lab::rms_norm_bwd", mutates_args=())
def rms_norm_bwd(dy: Tensor, x: Tensor, weight: Optional[Tensor], rstd: Tensor, offset: float,
                 casting_mode: str, backend: str, dh: Optional[Tensor] = None
                 ) -> Tuple[Tensor, Tensor]:
    """``(dx, dw)``; dw is an empty tensor of x's dtype when there is no weight. ``dh``: the
    fused add's gradient at h (x is h), added to dx."""
    dx, dw = dispatch.backward(dy, x, weight, rstd, offset, casting_mode, backend, dh=dh)
    return dx, (dw if dw is not None else _empty_dw(x))


@rms_norm_bwd.register_fake
def _rms_norm_bwd_fake(dy, x, weight, rstd, offset, casting_mode, backend, dh=None):
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
              casting_mode: str, backend: str, in_place: bool, use_ops: bool,
              need_dw: bool = True, snap: Optional[Snapshot] = None):
    """The backward body both wrappers share: ``(dx, dw or None)``; the eager path computes no
    dW where none is needed (the ops always return it: the compiler drops what is unused)."""
    if in_place:
        check_in_place(dy, x)
        if use_ops:
            dw = rms_norm_bwd_inplace(dy, x, weight, rstd, offset, casting_mode, backend)
            dw = dw if weight is not None else None
        else:
            _, dw = backward_impl(dy, x, weight, rstd, offset, casting_mode, backend, dx_out=dy,
                                  need_dw=need_dw, snap=snap)
        return dy, dw
    if use_ops:
        dx, dw = rms_norm_bwd(dy, x, weight, rstd, offset, casting_mode, backend)
        return dx, (dw if weight is not None else None)
    return backward_impl(dy, x, weight, rstd, offset, casting_mode, backend, need_dw=need_dw,
                         snap=snap)


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
    """The eager training path: the same work as the custom ops, without their dispatch cost.
    ``snap``: the settings of the call (None: those in force), which its backward runs under
    too."""

    @staticmethod
    def forward(ctx, x, weight, eps, offset, casting_mode, backend, in_place, snap=None):
        snap = snap or snapshot()
        y, rstd = forward_impl(x, weight, eps, offset, casting_mode, backend, snap)
        ctx.save_for_backward(x, weight, rstd)
        ctx.args = (offset, casting_mode, backend, in_place)
        ctx.snap = snap
        return y

    @staticmethod
    def backward(ctx, dy):
        if torch.is_grad_enabled():  # backward(create_graph=True): the kernels have no backward
            raise RuntimeError("rms_norm has no double backward: its backward cannot run under "
                               "backward(create_graph=True)")
        x, weight, rstd = ctx.saved_tensors
        dx, dw = _backward(dy, x, weight, rstd, *ctx.args, use_ops=False,
                           need_dw=ctx.needs_input_grad[1], snap=ctx.snap)
        return dx, dw, None, None, None, None, None, None


# ----------------------------------------------------------------------------- the fused add

@torch.library.custom_op("rmsnorm_lab::fused_add_rms_norm_fwd", mutates_args=())
def fused_add_rms_norm_fwd(x: Tensor, residual: Tensor, weight: Optional[Tensor], eps: float,
                           offset: float, casting_mode: str, backend: str
                           ) -> Tuple[Tensor, Tensor, Tensor]:
    """``(y, h, rstd)`` of the fused residual add."""
    return dispatch.fused_add_forward(x, residual, weight, eps, offset, casting_mode, backend,
                                      need_rstd=True)


@fused_add_rms_norm_fwd.register_fake
def _fused_add_fwd_fake(x, residual, weight, eps, offset, casting_mode, backend):
    return (x.new_empty(x.shape), x.new_empty(x.shape),
            x.new_empty(x.shape[:-1], dtype=compute_dtype(x.dtype)))


def _fused_add_grads(dy, dh, h, weight, rstd, offset, casting_mode, backend, use_ops: bool,
                     snap: Optional[Snapshot] = None):
    """``(d, dw)``: the gradient of x and of the residual (one tensor: ``h = x + residual``)
    and dW. An output that got no gradient (None) contributes nothing."""
    if dy is None:  # y unused: h's gradient alone, and no dW
        return dh, (torch.zeros_like(weight) if weight is not None else None)
    if use_ops:
        d, dw = rms_norm_bwd(dy, h, weight, rstd, offset, casting_mode, backend, dh)
        return d, (dw if weight is not None else None)
    return dispatch.backward(dy, h, weight, rstd, offset, casting_mode, backend, dh=dh,
                             snap=snap)


def _fused_add_setup_context(ctx, inputs, output):
    _x, _residual, weight, _eps, offset, casting_mode, backend = inputs
    _, h, rstd = output
    ctx.save_for_backward(h, weight, rstd)
    ctx.mark_non_differentiable(rstd)
    ctx.args = (offset, casting_mode, backend)


def _fused_add_op_backward(ctx, dy, dh, _drstd):
    h, weight, rstd = ctx.saved_tensors
    d, dw = _fused_add_grads(dy, dh, h, weight, rstd, *ctx.args, use_ops=True)
    return d, d, dw, None, None, None, None


fused_add_rms_norm_fwd.register_autograd(_fused_add_op_backward,
                                         setup_context=_fused_add_setup_context)


class FusedAddRMSNormFunction(torch.autograd.Function):
    """The fused residual add on the eager tape: ``(y, h)`` from ``(x, residual)``; x and the
    residual get one and the same gradient, ``dh + dx_norm``, computed in one backward pass."""

    @staticmethod
    def forward(ctx, x, residual, weight, eps, offset, casting_mode, backend, snap=None):
        snap = snap or snapshot()
        y, h, rstd = dispatch.fused_add_forward(x, residual, weight, eps, offset, casting_mode,
                                                backend, need_rstd=True, snap=snap)
        ctx.save_for_backward(h, weight, rstd)
        ctx.args = (offset, casting_mode, backend)
        ctx.snap = snap
        return y, h

    @staticmethod
    def backward(ctx, dy, dh):
        if torch.is_grad_enabled():
            raise RuntimeError("rms_norm has no double backward: its backward cannot run under "
                               "backward(create_graph=True)")
        h, weight, rstd = ctx.saved_tensors
        d, dw = _fused_add_grads(dy, dh, h, weight, rstd, *ctx.args, use_ops=False,
                                 snap=ctx.snap)
        if not ctx.needs_input_grad[2]:
            dw = None
        return d, d, dw, None, None, None, None, None


# ----------------------------------------------------------------------------- the fp8 output

@torch.library.custom_op("rmsnorm_lab::rms_norm_fp8", mutates_args=())
def rms_norm_fp8_op(x: Tensor, residual: Optional[Tensor], weight: Optional[Tensor],
                    scale: Optional[Tensor], scale_ub: Optional[Tensor], eps: float,
                    offset: float, casting_mode: str, backend: str
                    ) -> Tuple[Tensor, Tensor, Tensor]:
    """``(y_q, scales, h)`` of ``rms_norm_fp8`` (inference only: no autograd formula). A schema
    returns no optional tensors, so a static scale gives empty scales (the op must not return
    its input) and no residual an empty h."""
    y_q, scales, h = dispatch.fp8_forward(x, residual, weight, eps, offset, casting_mode, scale,
                                          scale_ub, backend)
    return (y_q, scales if scales is not None else x.new_empty(0, dtype=torch.float32),
            h if h is not None else x.new_empty(0))


@rms_norm_fp8_op.register_fake
def _rms_norm_fp8_fake(x, residual, weight, scale, scale_ub, eps, offset, casting_mode, backend):
    scales = x.new_empty(x.shape[:-1] if scale is None else (0,), dtype=torch.float32)
    h = x.new_empty(x.shape if residual is not None else (0,))
    return x.new_empty(x.shape, dtype=FP8_DTYPE), scales, h


def fp8_custom_op(call) -> tuple:
    """``(y_q, scales, h)`` of a ``route.Fp8Call`` through the custom op (scales None with a
    static scale, h None without a residual)."""
    y_q, scales, h = rms_norm_fp8_op(call.x, call.residual, call.weight, call.scale,
                                     call.scale_ub, float(call.eps), float(call.offset),
                                     call.casting_mode, call.backend)
    return (y_q, scales if call.scale is None else None,
            h if call.residual is not None else None)


# ----------------------------------------------------------------------------- the paths

def python_node(call) -> object:
    """y (with a residual, ``(y, h)``) of a validated ``route.Call`` on the Python node's tape."""
    if call.residual is None:
        return RMSNormFunction.apply(call.x, call.weight, call.eps, call.offset,
                                     call.casting_mode, call.backend, call.in_place, call.snap)
    return FusedAddRMSNormFunction.apply(call.x, call.residual, call.weight, call.eps,
                                         call.offset, call.casting_mode, call.backend, call.snap)


def custom_op(call) -> object:
    """y (with a residual, ``(y, h)``) of a ``route.Call`` through the custom ops, which Dynamo
    records as one node each (under torch.compile, or for torch's dispatcher)."""
    if call.residual is None:
        return rms_norm_fwd(call.x, call.weight, float(call.eps), float(call.offset),
                            call.casting_mode, call.backend, bool(call.in_place))[0]
    y, h, _ = fused_add_rms_norm_fwd(call.x, call.residual, call.weight, float(call.eps),
                                     float(call.offset), call.casting_mode, call.backend)
    return y, h


# ----------------------------------------------------------------- q/k norms with RoPE

@torch.library.custom_op("rmsnorm_lab::qk_norm_rope", mutates_args=())
def qk_norm_rope_op(q: Tensor, k: Tensor, q_weight: Tensor, k_weight: Tensor, cos: Tensor,
                    sin: Tensor, eps: float, casting_mode: str, backend: str
                    ) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(q_out, k_out, q_rstd, k_rstd)`` of ``api.qk_norm_rope``; one op for eager calls,
    torch.compile and fake tensors alike, its backward ``qk_norm_rope_bwd``."""
    return dispatch.qk_norm_rope_forward(q, k, q_weight, k_weight, cos, sin, eps, casting_mode,
                                         backend)


@qk_norm_rope_op.register_fake
def _qk_norm_rope_fake(q, k, q_weight, k_weight, cos, sin, eps, casting_mode, backend):
    acc = compute_dtype(q.dtype)
    return (q.new_empty(q.shape), k.new_empty(k.shape), q.new_empty(q.shape[:-1], dtype=acc),
            k.new_empty(k.shape[:-1], dtype=acc))


@torch.library.custom_op("rmsnorm_lab::qk_norm_rope_bwd", mutates_args=())
def qk_norm_rope_bwd(dq_out: Tensor, dk_out: Tensor, q: Tensor, k: Tensor, q_weight: Tensor,
                     k_weight: Tensor, cos: Tensor, sin: Tensor, q_rstd: Tensor, k_rstd: Tensor,
                     casting_mode: str, backend: str) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    return dispatch.qk_norm_rope_backward(dq_out, dk_out, q, k, q_weight, k_weight, cos, sin,
                                          q_rstd, k_rstd, casting_mode, backend)


@qk_norm_rope_bwd.register_fake
def _qk_norm_rope_bwd_fake(dq_out, dk_out, q, k, q_weight, k_weight, cos, sin, q_rstd, k_rstd,
                           casting_mode, backend):
    return (q.new_empty(q.shape), k.new_empty(k.shape), q_weight.new_empty(q_weight.shape),
            k_weight.new_empty(k_weight.shape))


def _qk_setup_context(ctx, inputs, output):
    q, k, q_weight, k_weight, cos, sin, _eps, casting_mode, backend = inputs
    _, _, q_rstd, k_rstd = output
    ctx.save_for_backward(q, k, q_weight, k_weight, cos, sin, q_rstd, k_rstd)
    ctx.mark_non_differentiable(q_rstd, k_rstd)
    ctx.args = (casting_mode, backend)


def _qk_backward(ctx, dq_out, dk_out, backward):
    """Both tape nodes' backward: ``backward`` (the op's, or dispatch's) on the saved tensors;
    gradients to q, k and the weights, none to cos and sin (the positions' embedding is not a
    trained parameter) nor to the scalars."""
    if torch.is_grad_enabled():  # backward(create_graph=True): the kernels have no backward
        raise RuntimeError("qk_norm_rope has no double backward: its backward cannot run under "
                           "backward(create_graph=True)")
    q, k, q_weight, k_weight, cos, sin, q_rstd, k_rstd = ctx.saved_tensors
    if dq_out is None:
        dq_out = torch.zeros_like(q)
    if dk_out is None:
        dk_out = torch.zeros_like(k)
    dq, dk, dwq, dwk = backward(dq_out.contiguous(), dk_out.contiguous(), q, k, q_weight,
                                k_weight, cos, sin, q_rstd, k_rstd, *ctx.args)
    need = ctx.needs_input_grad
    return (dq if need[0] else None, dk if need[1] else None, dwq if need[2] else None,
            dwk if need[3] else None, None, None, None, None, None)


def _qk_op_backward(ctx, dq_out, dk_out, _dq_rstd, _dk_rstd):
    return _qk_backward(ctx, dq_out, dk_out, qk_norm_rope_bwd)


qk_norm_rope_op.register_autograd(_qk_op_backward, setup_context=_qk_setup_context)


class QkNormRopeFunction(torch.autograd.Function):
    """``qk_norm_rope``'s eager tape node: the op's kernels (dispatch) and backward, without the
    custom op's dispatcher and autograd layers (tens of microseconds of host time a training
    call); torch.compile, fake tensors and dispatch modes take the op."""

    @staticmethod
    def forward(ctx, q, k, q_weight, k_weight, cos, sin, eps, casting_mode, backend):
        q_out, k_out, q_rstd, k_rstd = dispatch.qk_norm_rope_forward(
            q, k, q_weight, k_weight, cos, sin, eps, casting_mode, backend)
        ctx.save_for_backward(q, k, q_weight, k_weight, cos, sin, q_rstd, k_rstd)
        ctx.args = (casting_mode, backend)
        return q_out, k_out

    @staticmethod
    def backward(ctx, dq_out, dk_out):
        return _qk_backward(ctx, dq_out, dk_out, dispatch.qk_norm_rope_backward)
