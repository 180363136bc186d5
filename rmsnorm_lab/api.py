"""The functional entry point: ``rms_norm(x, weight, eps, *, offset, casting_mode, backend)``.

Validation lives here, once, so every backend sees well-formed arguments and a user sees an
error that names the argument at fault.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import reference
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
        if weight.device != x.device:
            raise ValueError(f"weight is on {weight.device} but x is on {x.device}")
    reference.check_casting_mode(casting_mode)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend != "torch" and x.device.type != "cuda":
        raise ValueError(f"backend={backend!r} needs CUDA tensors, but x is on {x.device}; "
                         "use backend='torch' on the CPU")


def rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor] = None, eps: float = 1e-6, *,
             offset: float = 0.0, casting_mode: str = "llama",
             backend: Optional[str] = None) -> torch.Tensor:
    """RMSNorm over the last dimension of ``x`` (any leading shape); see ``reference`` for the
    exact rounding of each casting mode. ``backend`` defaults to ``settings.backend``."""
    backend = backend or settings.backend
    validate(x, weight, casting_mode, backend)
    if x.numel() == 0:
        return torch.empty_like(x)
    if backend == "torch":
        return reference.rms_norm(x, weight, eps, offset, casting_mode)
    from . import launch
    return launch.forward(x, weight, eps, offset, casting_mode, backend, need_rstd=False)[0]
