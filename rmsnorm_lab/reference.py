"""The oracle: RMSNorm forward and backward in plain PyTorch, for every casting mode.

Every kernel in the lab is tested against these functions, so the rounding points are written
down here once.

Forward, for rows ``x`` of width N::

    rstd = 1 / sqrt(mean(x**2) + eps)          # accumulated in fp32, saved in fp32
    y    = (x * rstd) * (offset + w)

Casting modes (after Liger-Kernel's definitions):

``llama``  ``x_hat = x * rstd`` is computed in fp32 and rounded to x's dtype; then
           ``y = x_hat * (offset + w)`` is computed in fp32 and rounded to x's dtype.
           ``offset + w`` stays in fp32 (no extra rounding of the shifted weight).
``gemma``  everything in fp32; only ``y`` is rounded to x's dtype.
``none``   works in x's dtype: ``rstd`` (fp32 sum) is rounded to x's dtype, and each product
           ``x * rstd``, ``offset + w`` and ``x_hat * (offset + w)`` is rounded to x's dtype.

Backward, with ``m = dy * (offset + w)`` and ``x_hat = x * rstd``::

    dx = rstd * (m - x_hat * mean(m * x_hat))   # fp32 inside, rounded to x's dtype
    dw = sum_rows(dy * x_hat)                   # fp32 accumulation, rounded to w's dtype

Rounding points in the backward: ``gemma`` uses fp32 throughout. ``llama`` uses the rounded
``x_hat`` (the value the forward multiplied by the weight) for ``dw``. ``none`` additionally rounds
``m`` to x's dtype, as its forward did every product in that dtype. For fp32 inputs the three modes
agree to fp32 rounding.

The fused residual add (``rms_norm(x, w, residual=r)``, a decoder block's ``h = x + r; y =
norm(h)``)::

    h  = x + r                                  # fp32 sum rounded to x's dtype: the model's add
    y  = norm(h)                                # as above, of the rounded h
    dx = dr = dh + dx_norm                      # fp32 sum rounded to x's dtype

where ``dh`` is the gradient arriving at the returned ``h`` (the next block's residual) and
``dx_norm`` the norm's dx before its rounding; dW as above, of h.

``y`` has x's dtype; ``dw`` has w's dtype. Without a weight, ``w`` is taken as ones and there is no
``dw``. ``offset`` (e.g. 1.0 for Gemma, whose checkpoints store ``w - 1``) applies only with a
weight.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

CASTING_MODES = ("llama", "gemma", "none")


def check_casting_mode(casting_mode: str) -> str:
    if casting_mode not in CASTING_MODES:
        raise ValueError(f"casting_mode must be one of {CASTING_MODES}, got {casting_mode!r}")
    return casting_mode


def _shifted_weight(weight: Optional[torch.Tensor], offset: float, n: int, like: torch.Tensor):
    """``offset + w`` in fp32 (ones when there is no weight)."""
    if weight is None:
        return torch.ones(n, dtype=torch.float32, device=like.device)
    return weight.float() + offset


def rstd_of(x: torch.Tensor, eps: float) -> torch.Tensor:
    """fp32 ``1/sqrt(mean(x^2) + eps)`` per row: shape ``x.shape[:-1]``."""
    xf = x.float()
    return torch.rsqrt(xf.pow(2).mean(dim=-1) + eps)


def rms_norm_forward(
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: float = 1e-6,
    offset: float = 0.0,
    casting_mode: str = "llama",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(y, rstd)``: y in x's dtype, rstd in fp32 with shape ``x.shape[:-1]``."""
    check_casting_mode(casting_mode)
    dtype = x.dtype
    n = x.shape[-1]
    rstd = rstd_of(x, eps)
    r = rstd.unsqueeze(-1)
    ws = _shifted_weight(weight, offset, n, x)
    if casting_mode == "gemma":
        y = (x.float() * r * ws).to(dtype)
    elif casting_mode == "llama":
        x_hat = (x.float() * r).to(dtype)
        y = (x_hat.float() * ws).to(dtype)
    else:  # none: every product rounded to x's dtype
        x_hat = (x.float() * r.to(dtype).float()).to(dtype)
        y = (x_hat.float() * ws.to(dtype).float()).to(dtype)
    return y, rstd


def rms_norm_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    rstd: torch.Tensor,
    offset: float = 0.0,
    casting_mode: str = "llama",
    dh: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Returns ``(dx, dw)``: dx in x's dtype, dw in w's dtype (None without a weight). With
    ``dh`` (the fused add's: see the module's docstring) dx is ``dh + dx`` before the rounding."""
    check_casting_mode(casting_mode)
    dtype = x.dtype
    n = x.shape[-1]
    r = rstd.float().unsqueeze(-1)
    ws = _shifted_weight(weight, offset, n, x)
    xf, dyf = x.float(), dy.float()
    x_hat = xf * r
    if casting_mode == "none":
        m = (dyf * ws.to(dtype).float()).to(dtype).float()
    else:
        m = dyf * ws
    dx = r * (m - x_hat * (m * x_hat).mean(dim=-1, keepdim=True))
    if dh is not None:
        dx = dx + dh.float()
    dx = dx.to(dtype)
    dw = None
    if weight is not None:
        x_hat_w = x_hat if casting_mode == "gemma" else x_hat.to(dtype).float()
        dw = (dyf * x_hat_w).reshape(-1, n).sum(dim=0).to(weight.dtype)
    return dx, dw


def rms_norm(x, weight=None, eps=1e-6, offset=0.0, casting_mode="llama") -> torch.Tensor:
    """Forward only: ``y``."""
    return rms_norm_forward(x, weight, eps, offset, casting_mode)[0]


def add_residual(x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``h = x + residual``, summed in fp32 and rounded to x's dtype (what ``x + residual``
    gives in torch for two tensors of one floating dtype)."""
    return (x.float() + residual.float()).to(x.dtype)


def fused_add_rms_norm_forward(x, residual, weight=None, eps=1e-6, offset=0.0,
                               casting_mode="llama"):
    """``(y, h, rstd)`` of the fused residual add: ``h = x + residual``, ``y = norm(h)``."""
    h = add_residual(x, residual)
    y, rstd = rms_norm_forward(h, weight, eps, offset, casting_mode)
    return y, h, rstd
