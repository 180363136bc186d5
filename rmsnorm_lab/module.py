"""``RMSNorm``: a drop-in for ``torch.nn.RMSNorm`` on the lab's kernels.

Same constructor and state dict as ``torch.nn.RMSNorm`` (``normalized_shape``, ``eps``,
``elementwise_affine``, ``device``, ``dtype``; one parameter ``weight``), plus the lab's knobs as
keywords: ``offset``, ``casting_mode``, ``backend`` (None: ``settings.backend`` at call time) and
``in_place`` (see ``rms_norm``).

Differences from torch, on purpose:

* Only the last dimension is normalized: ``normalized_shape`` is an int or a 1-tuple; a
  multi-dimensional one is a ValueError (flatten those dimensions into one first).
* ``eps=None`` means what it means in torch: the machine epsilon of the type the statistics are
  computed in. torch computes in fp32 for fp16/bf16 (its "opmath" type), and so does this lab, so
  None is ``torch.finfo(torch.float32).eps`` for every dtype the lab supports.
* ``weight`` starts at ones, as torch's does, also when ``offset != 0``: the scale is then
  ``offset + 1`` until a checkpoint is loaded. Gemma-style checkpoints store ``w - 1`` for use
  with ``offset=1.0``; initialise with ``nn.init.zeros_(m.weight)`` for an identity scale.
"""

from __future__ import annotations

import numbers
from typing import Optional, Tuple, Union

import torch
from torch import nn

from .api import rms_norm
from .reference import check_casting_mode
from .registry import BACKENDS

#: What ``eps=None`` resolves to: fp32's machine epsilon, as torch's rms_norm uses for fp32, bf16
#: and fp16 inputs (the statistics are computed in fp32).
DEFAULT_EPS = torch.finfo(torch.float32).eps


class RMSNorm(nn.Module):
    __constants__ = ["normalized_shape", "eps", "elementwise_affine", "offset", "casting_mode",
                     "backend", "in_place"]
    normalized_shape: Tuple[int]
    eps: Optional[float]
    elementwise_affine: bool

    def __init__(self, normalized_shape: Union[int, Tuple[int], torch.Size],
                 eps: Optional[float] = None, elementwise_affine: bool = True,
                 device=None, dtype=None, *, offset: float = 0.0, casting_mode: str = "llama",
                 backend: Optional[str] = None, in_place: bool = False) -> None:
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (int(normalized_shape),)
        normalized_shape = tuple(normalized_shape)
        if len(normalized_shape) != 1:
            raise ValueError(
                f"normalized_shape must be an int or a 1-tuple: rmsnorm_lab normalizes only the "
                f"last dimension; got {normalized_shape}. Reshape the input so that the "
                "normalized dimensions are one (e.g. x.flatten(-k)) and pass their product")
        check_casting_mode(casting_mode)
        if backend is not None and backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS} or None, got {backend!r}")
        self.normalized_shape = normalized_shape
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.offset = float(offset)
        self.casting_mode = casting_mode
        self.backend = backend
        self.in_place = bool(in_place)
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 0 or x.shape[-1] != self.normalized_shape[0]:
            raise ValueError(f"RMSNorm{self.normalized_shape}: x's last dimension must be "
                             f"{self.normalized_shape[0]}, got shape {tuple(x.shape)}")
        eps = DEFAULT_EPS if self.eps is None else self.eps
        return rms_norm(x, self.weight, eps, offset=self.offset, casting_mode=self.casting_mode,
                        backend=self.backend, in_place=self.in_place)

    def forward_with_residual(self, x: torch.Tensor, residual: torch.Tensor):
        """``(y, h)``: ``h = x + residual`` and ``y`` its RMSNorm, in one kernel (``rms_norm(...,
        residual=)``); ``FusedAddRMSNorm``'s forward."""
        if x.dim() == 0 or x.shape[-1] != self.normalized_shape[0]:
            raise ValueError(f"{type(self).__name__}{self.normalized_shape}: x's last dimension "
                             f"must be {self.normalized_shape[0]}, got shape {tuple(x.shape)}")
        eps = DEFAULT_EPS if self.eps is None else self.eps
        return rms_norm(x, self.weight, eps, residual=residual, offset=self.offset,
                        casting_mode=self.casting_mode, backend=self.backend)

    def extra_repr(self) -> str:
        """torch's text, then the lab's options that differ from their defaults."""
        s = (f"{self.normalized_shape}, eps={self.eps}, "
             f"elementwise_affine={self.elementwise_affine}")
        if self.offset != 0.0:
            s += f", offset={self.offset}"
        if self.casting_mode != "llama":
            s += f", casting_mode={self.casting_mode!r}"
        if self.backend is not None:
            s += f", backend={self.backend!r}"
        if self.in_place:
            s += ", in_place=True"
        return s


class FusedAddRMSNorm(RMSNorm):
    """The fused residual add of a decoder block: ``forward(x, residual)`` returns ``(y, h)``
    with ``h = x + residual`` and ``y = RMSNorm(h)``, in one kernel (``rms_norm(...,
    residual=)``). Same constructor, parameters and state dict as ``RMSNorm``."""

    forward = RMSNorm.forward_with_residual
