"""``RMSNorm``: a drop-in for ``torch.nn.RMSNorm`` on the lab's kernels; ``FusedAddRMSNorm``:
the same norm with a decoder block's residual add fused in.

Same constructor and state dict as ``torch.nn.RMSNorm`` (``normalized_shape``, ``eps``,
``elementwise_affine``, ``device``, ``dtype``; one parameter ``weight``) and the same output,
bit for bit where the kernels compute what torch computes (the default ``casting_mode="torch"``),
plus the lab's knobs as keywords: ``offset``, ``casting_mode``, ``backend`` (None:
``settings.backend`` at call time) and ``in_place`` (see ``rms_norm``).

Differences from torch, on purpose:

* Only the last dimension is normalized: ``normalized_shape`` is an int or a 1-tuple; a
  multi-dimensional one is a ValueError (flatten those dimensions into one first).
* ``eps=None`` means what it means in torch: the machine epsilon of the type the statistics are
  computed in. torch computes in fp32 for fp16/bf16 (its "opmath" type), and so does this lab, so
  None is ``torch.finfo(torch.float32).eps`` for float32, bfloat16 and float16 (and fp64's for
  float64, which the ``torch`` backend alone takes).
* ``weight`` starts at ones, as torch's does, also when ``offset != 0``: the scale is then
  ``offset + 1`` until a checkpoint is loaded. Gemma-style checkpoints store ``w - 1`` for use
  with ``offset=1.0``; initialise with ``nn.init.zeros_(m.weight)`` for an identity scale.
* float64 runs on the ``torch`` backend only (CPU tensors, or ``backend="torch"``): the kernels
  compute float32, bfloat16 and float16.
"""

from __future__ import annotations

import numbers
from typing import Optional, Tuple, Union

import torch
from torch import nn

from .api import FP32_EPS, rms_norm
from .reference import DEFAULT_CASTING_MODE, check_casting_mode
from .registry import BACKENDS

#: What ``eps=None`` resolves to: fp32's machine epsilon, as torch's rms_norm uses for fp32, bf16
#: and fp16 inputs (the statistics are computed in fp32); ``rms_norm``'s own constant.
DEFAULT_EPS = FP32_EPS


class RMSNorm(nn.Module):
    r"""RMSNorm over the last dimension, on the lab's kernels: a drop-in for ``torch.nn.RMSNorm``.

    ``y = x / sqrt(mean(x**2, -1) + eps) * (offset + weight)``, in x's dtype.

    Args:
        normalized_shape: the width of the last dimension: an int, or a 1-tuple, 1-list or
            ``torch.Size`` (only the last dimension is normalized; a longer shape is a
            ValueError).
        eps: added to the mean square. None (the default, as torch) is the machine epsilon of
            the compute type: ``torch.finfo(torch.float32).eps`` for float32, bfloat16 and
            float16 inputs, fp64's for float64.
        elementwise_affine: a learnable ``weight`` of ``normalized_shape``, initialised to ones
            (False: no weight, a scale of one).
        device, dtype: of the weight, as torch's.

    Keyword-only, the lab's:
        offset: the scale is ``offset + weight`` (1.0 for Gemma checkpoints, which store
            ``w - 1``). Default 0.0.
        casting_mode: where the products are rounded to x's dtype (``rmsnorm_lab.reference``).
            ``"torch"`` (the default) rounds as ``torch.nn.RMSNorm``: fp32 throughout and one
            cast of y, so the outputs equal torch's bit for bit. ``"llama"`` rounds ``x * rstd``
            to x's dtype before the weight multiply, as transformers' Llama, Mistral and Qwen
            norms (about a quarter of bf16/fp16 outputs then differ from torch's by one ulp);
            ``"gemma"`` is torch's arithmetic under Liger-Kernel's name; ``"none"`` rounds every
            product to x's dtype.
        backend: ``"cute"``, ``"triton"`` or ``"torch"``; None (the default) is
            ``settings.backend`` at call time for CUDA tensors and ``"torch"`` (torch's math)
            for any other.
        in_place: the backward writes dx over the incoming gradient (``rms_norm``'s
            ``in_place``: safe only when that gradient has no other reader).

    What differs from ``torch.nn.RMSNorm``: only the last dimension can be normalized; float64
    runs on the ``torch`` backend only (the kernels compute float32, bfloat16 and float16); the
    lab's keywords above. The output has x's dtype, as torch's. The state dict (one key,
    ``weight``) loads both ways. ``forward_with_residual(x, residual)`` gives the fused residual
    add (``FusedAddRMSNorm``).

    Example::

        norm = RMSNorm(4096, device="cuda", dtype=torch.bfloat16)
        norm.load_state_dict(torch_norm.state_dict())
        y = norm(x)  # torch_norm(x), bit for bit
    """
    __constants__ = ["normalized_shape", "eps", "elementwise_affine", "offset", "casting_mode",
                     "backend", "in_place"]
    normalized_shape: Tuple[int]
    eps: Optional[float]
    elementwise_affine: bool

    def __init__(self, normalized_shape: Union[int, Tuple[int], torch.Size],
                 eps: Optional[float] = None, elementwise_affine: bool = True,
                 device=None, dtype=None, *, offset: float = 0.0,
                 casting_mode: str = DEFAULT_CASTING_MODE, backend: Optional[str] = None,
                 in_place: bool = False) -> None:
        """See the class docstring."""
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (int(normalized_shape),)
        normalized_shape = tuple(normalized_shape)
        if len(normalized_shape) != 1:
            raise ValueError(
                f"normalized_shape must be an int or a 1-tuple: rmsnorm_lab normalizes only the "
                f"last dimension; got {normalized_shape}. Reshape the input so that the "
                "normalized dimensions are one (e.g. x.flatten(-k)) and pass their product")
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

    @property
    def casting_mode(self) -> str:
        """The rounding, as named (``"torch"``, ``"llama"``, ``"gemma"`` or ``"none"``); set it
        to change the rounding of later calls."""
        return self._casting_name

    @casting_mode.setter
    def casting_mode(self, name: str) -> None:
        self._casting_mode = check_casting_mode(name)  # what the kernels see: an alias resolved
        self._casting_name = name

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``y``, x's shape and dtype: the RMSNorm of x's last dimension (``rms_norm``)."""
        if x.dim() == 0 or x.shape[-1] != self.normalized_shape[0]:
            raise ValueError(f"RMSNorm{self.normalized_shape}: x's last dimension must be "
                             f"{self.normalized_shape[0]}, got shape {tuple(x.shape)}")
        return rms_norm(x, self.weight, self.eps, offset=self.offset,
                        casting_mode=self._casting_mode, backend=self.backend,
                        in_place=self.in_place)

    def forward_with_residual(self, x: torch.Tensor, residual: torch.Tensor):
        """``(y, h)``: ``h = x + residual`` and ``y`` its RMSNorm, in one kernel (``rms_norm(...,
        residual=)``); ``FusedAddRMSNorm``'s forward."""
        if x.dim() == 0 or x.shape[-1] != self.normalized_shape[0]:
            raise ValueError(f"{type(self).__name__}{self.normalized_shape}: x's last dimension "
                             f"must be {self.normalized_shape[0]}, got shape {tuple(x.shape)}")
        return rms_norm(x, self.weight, self.eps, residual=residual, offset=self.offset,
                        casting_mode=self._casting_mode, backend=self.backend)

    def extra_repr(self) -> str:
        """torch's text, then the lab's options that differ from their defaults."""
        s = (f"{self.normalized_shape}, eps={self.eps}, "
             f"elementwise_affine={self.elementwise_affine}")
        if self.offset != 0.0:
            s += f", offset={self.offset}"
        if self.casting_mode != DEFAULT_CASTING_MODE:
            s += f", casting_mode={self.casting_mode!r}"
        if self.backend is not None:
            s += f", backend={self.backend!r}"
        if self.in_place:
            s += ", in_place=True"
        return s


class FusedAddRMSNorm(RMSNorm):
    """The residual add of a decoder block fused into the RMSNorm after it.

    ``forward(x, residual)`` returns ``(y, h)``: ``h = x + residual``, rounded to x's dtype as
    the model's own add, and ``y = RMSNorm(h)``, from one kernel that reads x and the residual
    once and writes h and y (``rms_norm(..., residual=)``). In the backward x and the residual
    get one gradient: h's incoming gradient plus the norm's, summed in fp32 and rounded once.

    Same constructor, arguments, parameter and state dict as ``RMSNorm`` (``normalized_shape``,
    ``eps=None``, ``elementwise_affine``, ``device``, ``dtype``; keywords ``offset``,
    ``casting_mode="torch"``, ``backend``; ``in_place`` is ignored: not available with a
    residual), so
    ``y`` equals ``torch.nn.RMSNorm(h)`` bit for bit by default. torch has no such module: the
    unfused equivalent is ``h = x + residual; y = norm(h)``.
    """

    forward = RMSNorm.forward_with_residual
