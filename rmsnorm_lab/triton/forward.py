"""RMSNorm forward in Triton: one program per row.

A row of up to ``MAX_FUSED_BLOCK`` elements is loaded once into registers, reduced to ``rstd`` and
normalized from those registers. A wider row cannot sit in one block's registers, so that kernel
walks the row in ``LOOP_BLOCK``-wide chunks twice: once summing squares, once normalizing.

With a residual (``HAS_RESIDUAL``) the row is first ``h = x + residual``, rounded to x's dtype
and stored: the fused residual add of a decoder block, one pass over x, the residual and h.

Rounding follows ``rmsnorm_lab.reference`` exactly; the shared pieces (``shifted_weight``) are also
used by the backward.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ..reference import check_casting_mode

#: Widest power-of-two row the single-pass kernel holds in registers; wider rows use the two-pass
#: kernel. A module constant so that tests can lower it and reach the two-pass path with small N.
MAX_FUSED_BLOCK = 65536
#: Chunk width of the two-pass kernel: wide enough for full-width 16-byte loads across 16 warps,
#: small enough that a chunk never spills registers.
LOOP_BLOCK = 8192

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def num_warps_for(block: int) -> int:
    """Warps for one program that owns a ``block``-wide row (or chunk).

    The row is spread over the program's threads, so the warp count sets each thread's share of
    it, held in registers: 4 warps keep that share at 16 elements or fewer below 2048 columns.
    Wider rows get 8, then 16 warps, so that the share (and the register pressure) grows more
    slowly than the row and more loads are in flight for it. Even 16 warps leave a 65536-wide row
    at 128 elements a thread, which spills; past that the two-pass kernel takes over.
    """
    if block < 2048:
        return 4
    if block <= 8192:
        return 8
    return 16


def check_rows(name: str, t: torch.Tensor, n: Optional[int] = None) -> None:
    """``t`` must be a 2-D float tensor whose rows are unit-stride (the row stride is free)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be a 2-D (M, N) tensor, got shape {tuple(t.shape)}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32, bfloat16 or float16, got {t.dtype}")
    if t.shape[1] > 1 and t.stride(1) != 1:
        raise ValueError(f"{name} must have a unit-stride last dimension, got strides {t.stride()}")
    if n is not None and t.shape[1] != n:
        raise ValueError(f"{name} must have {n} columns, got shape {tuple(t.shape)}")


def check_weight(weight: Optional[torch.Tensor], n: int, device: torch.device) -> None:
    if weight is None:
        return
    if weight.dtype not in FLOAT_DTYPES:
        raise TypeError(f"weight must be float32, bfloat16 or float16, got {weight.dtype}")
    if weight.dim() != 1 or weight.shape[0] != n:
        raise ValueError(f"weight must have shape ({n},), got {tuple(weight.shape)}")
    if n > 1 and weight.stride(0) != 1:
        raise ValueError(f"weight must be contiguous, got stride {weight.stride(0)}")
    if weight.device != device:
        raise ValueError(f"weight is on {weight.device} but x is on {device}")


@triton.jit
def shifted_weight(w, offset, dtype: tl.constexpr, CASTING_MODE: tl.constexpr):
    """``offset + w`` in fp32; ``none`` rounds it to x's dtype, as it does every product."""
    ws = w.to(tl.float32) + offset
    if CASTING_MODE == "none":
        ws = ws.to(dtype).to(tl.float32)
    return ws


@triton.jit
def _normalize(x, rstd, w, offset, CASTING_MODE: tl.constexpr, HAS_WEIGHT: tl.constexpr):
    """``y`` in x's dtype from a row (or chunk) ``x`` in its own dtype and the row's fp32 rstd.

    The order of the fp32 products is the reference's: ``(x * rstd) * (offset + w)``.
    """
    dtype = x.dtype
    xf = x.to(tl.float32)
    if CASTING_MODE == "none":
        x_hat = (xf * rstd.to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    elif CASTING_MODE == "llama":
        x_hat = (xf * rstd).to(dtype).to(tl.float32)
    else:  # gemma: fp32 until y
        x_hat = xf * rstd
    if HAS_WEIGHT:
        y = x_hat * shifted_weight(w, offset, dtype, CASTING_MODE)
    else:  # w = ones: y is x_hat (already rounded where the mode rounds it)
        y = x_hat
    return y.to(dtype)


@triton.jit
def _add_residual(x, R, H, row, r_row_stride, N, cols, mask, HAS_RESIDUAL: tl.constexpr):
    """``h = x + residual`` rounded to x's dtype, stored to H (the rows of x untouched without
    a residual)."""
    if HAS_RESIDUAL:
        r = tl.load(R + row * r_row_stride + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(H + row * N + cols, x, mask=mask)
    return x


@triton.jit
def _row_and_rstd(X, R, H, row, x_row_stride, r_row_stride, N, eps, BLOCK: tl.constexpr,
                  HAS_RESIDUAL: tl.constexpr):
    """``(x, cols, mask, rstd)`` of a row held in one BLOCK (x is h, stored, with a residual).
    Masked lanes hold 0, so they add nothing to the sum of squares; it is divided by the true N."""
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * x_row_stride + cols, mask=mask, other=0.0)
    x = _add_residual(x, R, H, row, r_row_stride, N, cols, mask, HAS_RESIDUAL)
    xf = x.to(tl.float32)
    return x, cols, mask, tl.rsqrt(tl.sum(xf * xf, axis=0) / N + eps)


@triton.jit
def _looped_rstd(x_row, R, H, row, r_row_stride, N, eps, BLOCK: tl.constexpr,
                 HAS_RESIDUAL: tl.constexpr):
    """rstd of a row read in BLOCK-wide pieces (h stored, with a residual): per-lane partial sums
    of squares, reduced across lanes once at the end."""
    sum_sq = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < N, other=0.0)
        x = _add_residual(x, R, H, row, r_row_stride, N, cols, cols < N, HAS_RESIDUAL)
        xf = x.to(tl.float32)
        sum_sq += xf * xf
    return tl.rsqrt(tl.sum(sum_sq, axis=0) / N + eps)


@triton.jit
def _rms_norm_fwd_fused(X, Y, W, RSTD, R, H, x_row_stride, r_row_stride, N, eps, offset,
                        BLOCK: tl.constexpr, CASTING_MODE: tl.constexpr,
                        HAS_WEIGHT: tl.constexpr, STORE_RSTD: tl.constexpr,
                        HAS_RESIDUAL: tl.constexpr):
    # int64 row index: row * stride overflows int32 once a tensor passes 2**31 elements.
    row = tl.program_id(0).to(tl.int64)
    x, cols, mask, rstd = _row_and_rstd(X, R, H, row, x_row_stride, r_row_stride, N, eps, BLOCK,
                                        HAS_RESIDUAL)
    if STORE_RSTD:
        tl.store(RSTD + row, rstd)
    if HAS_WEIGHT:
        w = tl.load(W + cols, mask=mask, other=0.0)
    else:
        w = None
    y = _normalize(x, rstd, w, offset, CASTING_MODE, HAS_WEIGHT)
    tl.store(Y + row * N + cols, y, mask=mask)


@triton.jit
def _rms_norm_fwd_looped(X, Y, W, RSTD, R, H, x_row_stride, r_row_stride, N, eps, offset,
                         BLOCK: tl.constexpr, CASTING_MODE: tl.constexpr,
                         HAS_WEIGHT: tl.constexpr, STORE_RSTD: tl.constexpr,
                         HAS_RESIDUAL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * x_row_stride
    y_row = Y + row * N

    # Pass 1: the sum of squares (and h stored, with a residual).
    rstd = _looped_rstd(x_row, R, H, row, r_row_stride, N, eps, BLOCK, HAS_RESIDUAL)
    if STORE_RSTD:
        tl.store(RSTD + row, rstd)

    # Pass 2: re-read x, or h (mostly from L2, which the first pass just filled), and normalize.
    if HAS_RESIDUAL:
        x_row = H + row * N
    for start in range(0, N, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(x_row + cols, mask=mask, other=0.0)
        if HAS_WEIGHT:
            w = tl.load(W + cols, mask=mask, other=0.0)
        else:
            w = None
        y = _normalize(x, rstd, w, offset, CASTING_MODE, HAS_WEIGHT)
        tl.store(y_row + cols, y, mask=mask)


def triton_rms_norm_forward(
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    offset: float,
    casting_mode: str,
    need_rstd: bool,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """RMSNorm of the rows of a 2-D ``x``: returns ``(y, rstd)``, ``rstd`` None unless asked for.

    ``y`` is a new contiguous ``(M, N)`` tensor of x's dtype; ``rstd`` is fp32 ``(M,)``.
    """
    y, rstd, _ = _forward(x, None, weight, eps, offset, casting_mode, need_rstd)
    return y, rstd


def triton_fused_add_forward(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: Optional[torch.Tensor],
    eps: float,
    offset: float,
    casting_mode: str,
    need_rstd: bool,
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """The fused residual add over the rows of 2-D ``x`` and ``residual`` (same shape and
    dtype): returns ``(y, h, rstd)`` with ``h = x + residual`` (rounded to x's dtype) and
    ``y`` its RMSNorm; ``h`` and ``y`` new contiguous tensors."""
    check_rows("residual", residual, x.shape[1] if x.dim() == 2 else None)
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(f"residual must have x's shape {tuple(x.shape)} and dtype {x.dtype}, "
                         f"got {tuple(residual.shape)} {residual.dtype}")
    y, rstd, h = _forward(x, residual, weight, eps, offset, casting_mode, need_rstd)
    return y, h, rstd


def row_kernel(N: int, fused, looped):
    """``(kernel, BLOCK)`` for rows of N: ``fused`` with the row in one block up to
    MAX_FUSED_BLOCK, else ``looped`` over LOOP_BLOCK-wide chunks."""
    block = triton.next_power_of_2(N)
    return (fused, block) if block <= MAX_FUSED_BLOCK else (looped, LOOP_BLOCK)


def _forward(x, residual, weight, eps, offset, casting_mode, need_rstd):
    casting_mode = check_casting_mode(casting_mode)  # an alias: the mode it names
    check_rows("x", x)
    M, N = x.shape
    if N == 0:
        raise ValueError("x must have at least one column")
    check_weight(weight, N, x.device)

    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    rstd = torch.empty(M, dtype=torch.float32, device=x.device) if need_rstd else None
    h = torch.empty((M, N), dtype=x.dtype, device=x.device) if residual is not None else None
    if M == 0:
        return y, rstd, h

    kernel, block = row_kernel(N, _rms_norm_fwd_fused, _rms_norm_fwd_looped)
    # Absent tensors are passed as None: Triton makes them constexpr, so no pointer is bound.
    kernel[(M,)](
        x, y, weight, rstd, residual, h, x.stride(0),
        residual.stride(0) if residual is not None else 0, N, eps, offset,
        BLOCK=block, CASTING_MODE=casting_mode,
        HAS_WEIGHT=weight is not None, STORE_RSTD=need_rstd,
        HAS_RESIDUAL=residual is not None,
        num_warps=num_warps_for(block),
    )
    return y, rstd, h
