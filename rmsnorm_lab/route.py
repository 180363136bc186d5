"""The paths a validated call can take, and the one table that runs each.

``api.rms_norm`` validates a call once and builds a ``Call``: its tensors and arguments as the
kernels see them (the casting mode's alias resolved, eps and the backend chosen) and the settings
as one ``Snapshot``. ``choose_path`` decides, from a few facts about the call, which path serves
it, and ``PATHS[path](call)`` runs it: y, or ``(y, h)`` for the fused residual add, one table for
both. ``api.rms_norm_fp8`` (the norm written as fp8, inference only) builds an ``Fp8Call``; the
same ``choose_path`` picks its path, and ``FP8_PATHS`` runs it; ``api.qk_norm_rope`` likewise
builds a ``QkCall`` for ``QK_PATHS``.
"""

from __future__ import annotations

from typing import Callable, Dict, NamedTuple, Optional

import torch
from torch.autograd import forward_ad

from . import autograd, dispatch, reference
from .settings import Snapshot


class Call(NamedTuple):
    """One validated call of ``rms_norm``."""
    x: torch.Tensor
    weight: Optional[torch.Tensor]
    residual: Optional[torch.Tensor]  # the fused residual add's, or None
    eps: float
    offset: float
    casting_mode: str                 # a kernel's (``reference.CASTING_MODES``)
    backend: str
    in_place: bool
    snap: Snapshot


class Fp8Call(NamedTuple):
    """One validated call of ``rms_norm_fp8`` (inference only: no tape, no native node)."""
    x: torch.Tensor
    weight: Optional[torch.Tensor]
    residual: Optional[torch.Tensor]
    scale: Optional[torch.Tensor]     # the static scale (one fp32 element), or None: per token
    scale_ub: Optional[torch.Tensor]  # the per-token amax's bound, or None
    eps: float
    offset: float
    casting_mode: str
    backend: str
    snap: Snapshot


def torch_machinery(*tensors: Optional[torch.Tensor]) -> Optional[str]:
    """What torch must see of a call on ``tensors`` (None: absent), if anything. ``"transform"``: a tensor a functorch
    transform (vmap, grad, jvp) wrapped, or a forward-mode dual; the reference math then runs as
    torch ops, which every transform and forward-mode AD understand. ``"dispatcher"``: a tensor
    subclass (a FakeTensor, say), a meta tensor or an active dispatch mode; the custom op then
    runs, so a mode sees one op and a fake tensor gets the op's fake implementation. None: a
    plain call, for the kernels."""
    # a tensor is wrapped, or has a tangent, only inside a transform or a dual level: two
    # global tests spare a plain call the per-tensor ones
    if torch._C._functorch.maybe_current_level() is not None or forward_ad._current_level >= 0:
        for t in tensors:
            if t is not None and (torch._C._functorch.is_functorch_wrapped_tensor(t)
                                  or forward_ad.unpack_dual(t).tangent is not None):
                return "transform"
    if torch._C._len_torch_dispatch_stack() > 0:
        return "dispatcher"
    for t in tensors:
        if t is not None and (type(t) not in (torch.Tensor, torch.nn.Parameter) or t.is_meta
                              or torch._is_functional_tensor(t)):
            return "dispatcher"
    return None


def choose_path(*, compiling: bool, machinery: Optional[str], native: bool, training: bool,
                empty: bool, decompose: bool) -> str:
    """Which path serves a validated call:

    ``reference``    a functorch transform or forward-mode AD (``torch_machinery``), or under
                     torch.compile with ``decompose`` (``settings.under_compile``): the
                     reference math as torch ops, which Inductor fuses with its neighbours;
    ``custom_op``    under torch.compile, or when torch's dispatcher must see the call
                     (``torch_machinery``): the ``torch.library`` op, one opaque graph node;
    ``native``       the native node (``native``: the settings route this backend there, the call
                     is not ``in_place``, x is not empty, and the extension is built);
    ``python_node``  a training call anywhere else: ``autograd.RMSNormFunction``;
    ``empty``        an inference call on an empty x: an empty y;
    ``kernels``      any other inference call: ``dispatch.forward`` (the backend's kernels, or
                     the reference for ``backend="torch"``).
    """
    if machinery == "transform" or (compiling and decompose):
        return "reference"
    if compiling or machinery == "dispatcher":
        return "custom_op"
    if native:
        return "native"
    if training:
        return "python_node"
    return "empty" if empty else "kernels"


def _reference(c: Call):
    if c.residual is None:
        return reference.rms_norm(c.x, c.weight, c.eps, c.offset, c.casting_mode)
    h = c.x + c.residual
    return reference.rms_norm(h, c.weight, c.eps, c.offset, c.casting_mode), h


def _native(c: Call):
    return dispatch.native(c.x, c.residual, c.weight, c.eps, c.offset, c.casting_mode, c.snap)


def _empty(c: Call):
    y = torch.empty_like(c.x)
    return y if c.residual is None else (y, torch.empty_like(c.x))


def _kernels(c: Call):
    if c.residual is None:
        return dispatch.forward(c.x, c.weight, c.eps, c.offset, c.casting_mode, c.backend,
                                need_rstd=False, snap=c.snap)[0]
    y, h, _ = dispatch.fused_add_forward(c.x, c.residual, c.weight, c.eps, c.offset,
                                         c.casting_mode, c.backend, need_rstd=False,
                                         snap=c.snap)
    return y, h


#: path -> its work on a ``Call``: y, or (y, h) with a residual
PATHS: Dict[str, Callable[[Call], object]] = {
    "reference": _reference,
    "custom_op": autograd.custom_op,
    "native": _native,
    "python_node": autograd.python_node,
    "empty": _empty,
    "kernels": _kernels,
}


def _fp8_reference(c: Fp8Call):
    return dispatch.fp8_forward(c.x, c.residual, c.weight, c.eps, c.offset, c.casting_mode,
                                c.scale, c.scale_ub, "torch")


def _fp8_kernels(c: Fp8Call):
    return dispatch.fp8_forward(c.x, c.residual, c.weight, c.eps, c.offset, c.casting_mode,
                                c.scale, c.scale_ub, c.backend, c.snap)


#: ``choose_path``'s paths (an inference call takes no tape path) -> their work on an
#: ``Fp8Call``: ``(y_q, scales, h)``, scales None with a static scale, h None without a residual
FP8_PATHS: Dict[str, Callable[[Fp8Call], tuple]] = {
    "reference": _fp8_reference,
    "custom_op": autograd.fp8_custom_op,
    "empty": _fp8_kernels,
    "kernels": _fp8_kernels,
}


class QkCall(NamedTuple):
    """One validated call of ``qk_norm_rope``."""
    q: torch.Tensor
    k: torch.Tensor
    q_weight: torch.Tensor
    k_weight: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    eps: float
    casting_mode: str
    backend: str


def _qk_reference(c: QkCall):
    return reference.qk_norm_rope(*c[:8])


def _qk_custom_op(c: QkCall):
    return autograd.qk_norm_rope_op(*c)[:2]


def _qk_python_node(c: QkCall):
    return autograd.QkNormRopeFunction.apply(*c)


def _qk_kernels(c: QkCall):
    return dispatch.qk_norm_rope_forward(*c)[:2]


#: ``choose_path``'s paths (no native node; an empty call runs the kernels, which take it) ->
#: their work on a ``QkCall``: ``(q_out, k_out)``. The python node is the eager training call's:
#: the custom op's dispatcher and autograd layers cost tens of microseconds a call.
QK_PATHS: Dict[str, Callable[[QkCall], tuple]] = {
    "reference": _qk_reference,
    "custom_op": _qk_custom_op,
    "python_node": _qk_python_node,
    "kernels": _qk_kernels,
}
