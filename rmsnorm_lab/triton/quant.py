"""RMSNorm written as float8_e4m3fn for the GEMM that reads it (inference only): one program a row.

A row of up to the forward's ``MAX_FUSED_BLOCK`` elements is loaded once and normalized in
registers to y in x's dtype with the forward's statistics and its ``_normalize``, then
quantized: with a static scale, ``y * (1 / scale)``; per token, the row's amax of ``|y|`` (NaN
skipped), its scale ``max(amax / 448, 1 / (448 * 512))`` stored, then ``y / scale``. A wider row
is walked in ``LOOP_BLOCK`` chunks: the sum of squares, then (per token) the amax, then the
quantized store, each pass recomputing y from x (or h).

With a residual the row is first ``h = x + residual``, rounded to x's dtype and stored, as in the
fused add. The arithmetic is ``reference.rms_norm_fp8``'s, with IEEE divisions (``div_rn``:
Triton's ``/`` on fp32 is approximate); docs/design-record.md, 'Forward: fp8 output'. y is the
Triton forward's wherever the fp32 sum of squares does not depend on its order: the fp8 store's
16-element vectors give the row another layout than the forward's (16 elements a thread against
its 16 bytes), so the sum runs in another order and rstd may differ in its last bit.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from .. import reference
from .forward import (_looped_rstd, _normalize, _row_and_rstd, check_rows, check_weight,
                      num_warps_for, row_kernel)

_FP8_MAX = tl.constexpr(reference.FP8_MAX)
_MIN_SCALE = tl.constexpr(reference.FP8_MIN_SCALE)


@triton.jit
def _saturate_fp8(v):
    """fp32 to float8_e4m3fn as vLLM: NaN to +448, clamped to +-448, rounded to nearest even
    (the convert saturates too, but keeps NaN)."""
    v = tl.where(v != v, _FP8_MAX, v)
    v = tl.minimum(tl.maximum(v, -_FP8_MAX), _FP8_MAX)
    return v.to(tl.float8e4nv)


@triton.jit
def _abs_skip_nan(y):
    """``|y|`` with NaN as 0: vLLM's amax starts at 0 and ``fmaxf`` passes over NaN."""
    a = tl.abs(y)
    return tl.where(a == a, a, 0.0)


@triton.jit
def _token_scale(amax, SCALE_UB, HAS_SCALE_UB: tl.constexpr):
    if HAS_SCALE_UB:
        amax = tl.minimum(amax, tl.load(SCALE_UB))
    return tl.maximum(tl.math.div_rn(amax, _FP8_MAX), _MIN_SCALE)


@triton.jit
def _y_of(x, W, cols, mask, rstd, offset, CASTING_MODE: tl.constexpr, HAS_WEIGHT: tl.constexpr):
    """y in x's dtype, as fp32."""
    if HAS_WEIGHT:
        w = tl.load(W + cols, mask=mask, other=0.0)
    else:
        w = None
    return _normalize(x, rstd, w, offset, CASTING_MODE, HAS_WEIGHT).to(tl.float32)


@triton.jit
def _rms_norm_fp8_fused(X, Q, W, SCALE, SCALES, SCALE_UB, R, H, x_row_stride, r_row_stride, N,
                        eps, offset, BLOCK: tl.constexpr, CASTING_MODE: tl.constexpr,
                        HAS_WEIGHT: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                        PER_TOKEN: tl.constexpr, HAS_SCALE_UB: tl.constexpr):
    # SCALE: the static scale (read); SCALES: the per-token scales (written), one per row.
    row = tl.program_id(0).to(tl.int64)
    # the forward's statistics, term for term (their order follows the row's layout)
    x, cols, mask, rstd = _row_and_rstd(X, R, H, row, x_row_stride, r_row_stride, N, eps, BLOCK,
                                        HAS_RESIDUAL)
    y = _y_of(x, W, cols, mask, rstd, offset, CASTING_MODE, HAS_WEIGHT)
    if PER_TOKEN:
        s = _token_scale(tl.max(_abs_skip_nan(y), axis=0), SCALE_UB, HAS_SCALE_UB)
        tl.store(SCALES + row, s)
        v = tl.math.div_rn(y, tl.broadcast_to(s, [BLOCK]))
    else:
        v = y * tl.math.div_rn(1.0, tl.load(SCALE))
    tl.store(Q + row * N + cols, _saturate_fp8(v), mask=mask)


@triton.jit
def _rms_norm_fp8_looped(X, Q, W, SCALE, SCALES, SCALE_UB, R, H, x_row_stride, r_row_stride, N,
                         eps, offset, BLOCK: tl.constexpr, CASTING_MODE: tl.constexpr,
                         HAS_WEIGHT: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                         PER_TOKEN: tl.constexpr, HAS_SCALE_UB: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * x_row_stride
    q_row = Q + row * N

    rstd = _looped_rstd(x_row, R, H, row, r_row_stride, N, eps, BLOCK, HAS_RESIDUAL)

    if HAS_RESIDUAL:  # later passes read h back (mostly from L2)
        x_row = H + row * N
    if PER_TOKEN:
        amax = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, N, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            mask = cols < N
            x = tl.load(x_row + cols, mask=mask, other=0.0)
            y = _y_of(x, W, cols, mask, rstd, offset, CASTING_MODE, HAS_WEIGHT)
            amax = tl.maximum(amax, _abs_skip_nan(y))
        s = _token_scale(tl.max(amax, axis=0), SCALE_UB, HAS_SCALE_UB)
        tl.store(SCALES + row, s)
    else:
        inv = tl.math.div_rn(1.0, tl.load(SCALE))
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(x_row + cols, mask=mask, other=0.0)
        y = _y_of(x, W, cols, mask, rstd, offset, CASTING_MODE, HAS_WEIGHT)
        if PER_TOKEN:
            v = tl.math.div_rn(y, tl.broadcast_to(s, [BLOCK]))
        else:
            v = y * inv
        tl.store(q_row + cols, _saturate_fp8(v), mask=mask)


def triton_rms_norm_fp8(
    x: torch.Tensor,
    residual: Optional[torch.Tensor],
    weight: Optional[torch.Tensor],
    eps: float,
    offset: float,
    casting_mode: str,
    scale: Optional[torch.Tensor],
    scale_ub: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """The rows of a 2-D ``x`` normalized and quantized: ``(y_q, scales, h)``, each allocated
    here. ``y_q`` a contiguous ``(M, N)`` float8_e4m3fn tensor; ``scales`` fp32 ``(M,)`` per
    token, None with a static ``scale`` (one fp32 element on x's device); ``h = x + residual``
    (contiguous) with a residual, else None. ``scale_ub`` (one fp32 element) bounds the
    per-token amax."""
    casting_mode = reference.check_casting_mode(casting_mode)
    check_rows("x", x)
    M, N = x.shape
    if N == 0:
        raise ValueError("x must have at least one column")
    check_weight(weight, N, x.device)
    if residual is not None:
        check_rows("residual", residual, N)
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise ValueError(f"residual must have x's shape {tuple(x.shape)} and dtype "
                             f"{x.dtype}, got {tuple(residual.shape)} {residual.dtype}")
    for name, t in (("scale", scale), ("scale_ub", scale_ub)):
        if t is not None and (t.dtype != torch.float32 or t.numel() != 1
                              or t.device != x.device):
            raise ValueError(f"{name} must be one float32 element on {x.device}, got "
                             f"{t.dtype} {tuple(t.shape)} on {t.device}")
    per_token = scale is None
    if not per_token and scale_ub is not None:
        raise ValueError("scale_ub bounds per-token scales; a static scale takes none")

    y_q = torch.empty((M, N), dtype=reference.FP8_DTYPE, device=x.device)
    scales = torch.empty(M, dtype=torch.float32, device=x.device) if per_token else None
    h = torch.empty((M, N), dtype=x.dtype, device=x.device) if residual is not None else None
    if M == 0:
        return y_q, scales, h

    kernel, block = row_kernel(N, _rms_norm_fp8_fused, _rms_norm_fp8_looped)
    # Absent tensors go as None: Triton makes them constexpr, so no pointer is bound.
    kernel[(M,)](
        x, y_q, weight, scale, scales, scale_ub, residual, h, x.stride(0),
        residual.stride(0) if residual is not None else 0, N, eps, offset,
        BLOCK=block, CASTING_MODE=casting_mode, HAS_WEIGHT=weight is not None,
        HAS_RESIDUAL=residual is not None, PER_TOKEN=per_token,
        HAS_SCALE_UB=scale_ub is not None,
        num_warps=num_warps_for(block),
    )
    return y_q, scales, h
