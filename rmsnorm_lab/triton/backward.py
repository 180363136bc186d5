"""RMSNorm backward in Triton, Liger-style: a fixed grid of P programs, one per SM.

Each program walks a contiguous block of rows. For each row it computes ``dx`` whole (the row is
in registers, so the row reduction ``mean(m * x_hat)`` needs no second pass over memory) and adds
``dy * x_hat`` into an fp32 ``dW`` accumulator that stays in registers across its rows. Each
program writes its one partial row to a ``(P, N)`` fp32 buffer, and a final ``sum(0)`` over P rows
(not M) gives ``dw``: no atomics, and the reduction over M is done almost entirely in registers.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
import triton
import triton.language as tl

from ..reference import check_casting_mode
from .forward import check_rows, check_weight, num_warps_for, shifted_weight

#: Widest row the backward holds in one block (it has no chunked variant).
MAX_BLOCK = 65536
#: Programs per launch off CUDA, i.e. under TRITON_INTERPRET=1: a few, so that tests still cover
#: programs owning several rows and a last program owning fewer.
INTERPRET_PROGRAMS = 4

_sm_count: Dict[int, int] = {}


def _num_programs(device: torch.device, m: int) -> int:
    """One program per SM on CUDA (cached per device), never more programs than rows."""
    if device.type != "cuda":
        return min(m, INTERPRET_PROGRAMS)
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _sm_count:
        _sm_count[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return min(m, _sm_count[index])


@triton.jit
def _rms_norm_bwd(DY, X, W, RSTD, DX, DW_PARTIAL, DH,
                  dy_row_stride, x_row_stride, dh_row_stride, M, N, rows_per_program, offset,
                  BLOCK: tl.constexpr, CASTING_MODE: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                  HAS_DH: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    # int64 rows: row * stride overflows int32 once a tensor passes 2**31 elements.
    row_start = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)

    # The weight is the same for every row: load it, shifted and rounded, once per program.
    if HAS_WEIGHT:
        w = tl.load(W + cols, mask=mask, other=0.0)
        ws = shifted_weight(w, offset, X.dtype.element_ty, CASTING_MODE)
        dw_acc = tl.zeros([BLOCK], dtype=tl.float32)

    for row in range(row_start, row_end):
        x = tl.load(X + row * x_row_stride + cols, mask=mask, other=0.0)
        dyf = tl.load(DY + row * dy_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row)
        # The backward's x_hat uses the fp32 rstd in every mode (the reference does too).
        x_hat = x.to(tl.float32) * rstd

        if HAS_WEIGHT:
            m = dyf * ws
            if CASTING_MODE == "none":
                m = m.to(x.dtype).to(tl.float32)
            # dW sees the x_hat the forward multiplied by w: rounded to x's dtype except in gemma.
            if CASTING_MODE == "gemma":
                dw_acc += dyf * x_hat
            else:
                dw_acc += dyf * x_hat.to(x.dtype).to(tl.float32)
        else:  # w = ones: m = dy (rounding dy to its own dtype changes nothing)
            m = dyf

        # Masked lanes have x_hat = 0, so they add nothing to the sum; divide by the true N.
        c = tl.sum(m * x_hat, axis=0) / N
        dx = rstd * (m - x_hat * c)
        if HAS_DH:  # the fused add: h's own gradient joins before the rounding
            dx += tl.load(DH + row * dh_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + row * N + cols, dx.to(x.dtype), mask=mask)

    if HAS_WEIGHT:
        tl.store(DW_PARTIAL + pid * N + cols, dw_acc, mask=mask)


def triton_rms_norm_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    rstd: torch.Tensor,
    offset: float,
    casting_mode: str,
    dx: Optional[torch.Tensor] = None,
    dh: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Gradients of RMSNorm over the rows of a 2-D ``x``: returns ``(dx, dw)``. With ``dh`` (the
    fused add's gradient at h, rows like dy) dx is ``dh + dx`` before its rounding.

    ``dx`` is a new contiguous ``(M, N)`` tensor of x's dtype, or the given ``dx`` (contiguous,
    x's shape and dtype), which may be ``dy`` itself: a program reads a whole row of dy before it
    writes that row of dx. ``dw`` has weight's dtype, or is None without a weight. ``rstd`` is the
    forward's fp32 ``(M,)``.
    """
    casting_mode = check_casting_mode(casting_mode)  # an alias: the mode it names
    check_rows("x", x)
    M, N = x.shape
    check_rows("dy", dy, N)
    if dy.shape[0] != M:
        raise ValueError(f"dy must have shape {(M, N)} like x, got {tuple(dy.shape)}")
    if dy.dtype != x.dtype:
        raise TypeError(f"dy must have x's dtype {x.dtype}, got {dy.dtype}")
    if rstd.dtype != torch.float32 or rstd.shape != (M,):
        raise ValueError(f"rstd must be float32 of shape ({M},), got {rstd.dtype} "
                         f"{tuple(rstd.shape)}")
    check_weight(weight, N, x.device)
    if dh is not None:
        check_rows("dh", dh, N)
        if dh.shape[0] != M or dh.dtype != x.dtype:
            raise ValueError(f"dh must be a {x.dtype} tensor of shape {(M, N)}, got {dh.dtype} "
                             f"{tuple(dh.shape)}")
    block = triton.next_power_of_2(N)
    if block > MAX_BLOCK:
        raise NotImplementedError(f"the Triton backward holds a row in one block of at most "
                                  f"{MAX_BLOCK} elements; N={N} is too wide")

    if dx is None:
        dx = torch.empty((M, N), dtype=x.dtype, device=x.device)
    elif dx.shape != (M, N) or dx.dtype != x.dtype or (N > 1 and dx.stride() != (N, 1)):
        raise ValueError(f"dx must be a contiguous ({M}, {N}) {x.dtype} tensor, got "
                         f"{dx.dtype} {tuple(dx.shape)} strides {dx.stride()}")
    if M == 0:
        dw = torch.zeros_like(weight) if weight is not None else None
        return dx, dw

    programs = _num_programs(x.device, M)
    rows_per_program = triton.cdiv(M, programs)
    # Only the programs that own a row run: the last one may own fewer, none owns zero.
    programs = triton.cdiv(M, rows_per_program)
    dw_partial = (torch.empty((programs, N), dtype=torch.float32, device=x.device)
                  if weight is not None else None)
    _rms_norm_bwd[(programs,)](
        dy, x, weight, rstd.contiguous(), dx, dw_partial, dh,
        dy.stride(0), x.stride(0), dh.stride(0) if dh is not None else 0, M, N,
        rows_per_program, offset,
        BLOCK=block, CASTING_MODE=casting_mode, HAS_WEIGHT=weight is not None,
        HAS_DH=dh is not None, num_warps=num_warps_for(block),
    )
    dw = dw_partial.sum(0).to(weight.dtype) if weight is not None else None
    return dx, dw
