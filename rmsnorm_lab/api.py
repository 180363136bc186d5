"""The functional entry point: ``rms_norm(x, weight, eps, *, offset, casting_mode, backend)``.

Validation lives here, once, so every backend sees well-formed arguments and a user sees an
error that names the argument at fault. A call the native extension has planned before skips it:
its key can only have been inserted after this validation passed for the same key.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import autograd as _autograd
from . import launch, reference
from .settings import BACKENDS, settings

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def validate(x: torch.Tensor, weight: Optional[torch.Tensor], casting_mode: str,
             backend: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"x must be float32, bfloat16 or float16, got {x.dtype}")
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (the normalized width)")
    if weight is not None:
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"weight must be a torch.Tensor or None, got {type(weight).__name__}")
        if weight.dtype not in FLOAT_DTYPES:
            raise TypeError(f"weight must be float32, bfloat16 or float16, got {weight.dtype}")
        if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
            raise ValueError(f"weight must have shape ({x.shape[-1]},) to match x's last "
                             f"dimension, got {tuple(weight.shape)}")
        if weight.get_device() != x.get_device():  # ints: no torch.device objects per call
            raise ValueError(f"weight is on {weight.device} but x is on {x.device}")
    reference.check_casting_mode(casting_mode)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend != "torch" and not x.is_cuda:
        raise ValueError(f"backend={backend!r} needs CUDA tensors, but x is on {x.device}; "
                         "use backend='torch' on the CPU")


def rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: float = 1e-6, *,
             offset: float = 0.0, casting_mode: str = "llama",
             backend: Optional[str] = None, in_place: bool = False) -> torch.Tensor:
    """RMSNorm over the last dimension of ``x`` (any leading shape); see ``reference`` for the
    exact rounding of each casting mode. ``backend`` defaults to ``settings.backend``.

    Differentiable: when grad mode is on and ``x`` or ``weight`` requires grad, the call is
    recorded for autograd (``rstd`` is saved, fp32); otherwise nothing beyond ``y`` is kept.
    Under ``torch.compile`` it goes through the ``rmsnorm_lab::rms_norm_fwd``/``_bwd`` custom ops
    (see ``rmsnorm_lab.autograd``), so ``fullgraph=True`` traces it.

    On the default path (CuTe, ``tvm_ffi``, native extension) the first call of each key (shape,
    strides, dtypes, alignment, casting mode, eps, offset, settings) is validated and planned in
    Python; later calls with the same key run from the extension's call memo without Python
    (``autograd.fast_call``).

    ``in_place=True`` makes the backward write dx into the incoming gradient's storage and return
    that tensor as x's gradient, saving one activation-sized buffer. Only safe when nothing else
    reads that gradient (``y`` feeds one op whose backward makes a fresh gradient, e.g. a linear
    layer; not ``y + r``, whose backward hands the same tensor to both branches). The backward
    raises ValueError when the gradient is not a contiguous tensor of x's shape and dtype.
    Without autograd it has no effect. There is no double backward (``create_graph=True``
    raises).
    """
    fast = _autograd.fast_call  # a call planned before: all in C++
    if (fast is not None and backend in (None, "cute") and not in_place
            and not torch.compiler.is_compiling()):
        y = fast(x, weight, eps, offset, casting_mode)
        if y is not None:
            return y
    backend = backend or settings.backend
    validate(x, weight, casting_mode, backend)
    if torch.is_grad_enabled() and (x.requires_grad
                                    or (weight is not None and weight.requires_grad)):
        return _autograd.rms_norm_autograd(x, weight, eps, offset, casting_mode, backend,
                                           in_place)
    if x.numel() == 0:
        return torch.empty_like(x)
    if backend == "torch":
        return reference.rms_norm(x, weight, eps, offset, casting_mode)
    if torch.compiler.is_compiling():  # the kernels' Python is opaque to Dynamo: one op node
        return _autograd.rms_norm_fwd(x, weight, float(eps), float(offset), casting_mode,
                                      backend)[0]
    y = _autograd.native_rms_norm(x, weight, eps, offset, casting_mode, backend, in_place=False)
    if y is not None:
        return y
    return launch.forward(x, weight, eps, offset, casting_mode, backend, need_rstd=False)[0]
