"""A tensor seen as (M, N) rows, the shape every kernel of the lab addresses."""

from __future__ import annotations

from typing import Optional

import torch

#: the kernels index with 32-bit arithmetic: a tensor spanning this many elements is out of reach
INT32_LIMIT = 2**31


def rows_without_copy(x: torch.Tensor) -> bool:
    """Can a row kernel address x as it is (``as_rows`` succeeds)? A unit last stride, and
    leading dimensions that collapse into one row index."""
    if x.shape[-1] > 1 and x.stride(-1) != 1:
        return False
    if x.dim() <= 2:
        return True
    try:
        x.view(-1, x.shape[-1])
    except RuntimeError:
        return False
    return True


def as_rows(x: torch.Tensor, name: str = "x") -> torch.Tensor:
    """x as an (M, N) view without copying; refuses layouts a row kernel cannot address."""
    if x.dim() == 2 and x.stride(1) == 1:  # already rows: no view to make on the hot path
        return x
    if x.stride(-1) != 1 and x.shape[-1] != 1:
        raise ValueError(f"{name} must have a contiguous last dimension (stride 1), "
                         f"got strides {tuple(x.stride())}")
    try:
        return x.view(-1, x.shape[-1])
    except RuntimeError:
        raise ValueError(f"{name} with shape {tuple(x.shape)} and strides {tuple(x.stride())} "
                         "cannot be viewed as rows of a 2-D matrix without a copy; pass "
                         f"{name}.contiguous()") from None


def grad_rows(dy: torch.Tensor, n: int) -> torch.Tensor:
    """The incoming gradient as (M, N) rows. Autograd hands over whatever layout the next op's
    backward produced (the gradient of ``y.sum()`` is an expanded, stride-0 tensor), so a layout
    a row kernel cannot address is copied rather than refused."""
    if dy.dim() == 2 and dy.stride(1) == 1:  # already rows
        return dy
    if dy.stride(-1) != 1 and n > 1:
        dy = dy.contiguous()
    try:
        return dy.view(-1, n)
    except RuntimeError:
        return dy.contiguous().view(-1, n)


def kernel_grad_rows(dy: torch.Tensor, n: int, aligned: bool) -> torch.Tensor:
    """``grad_rows``, then a contiguous copy where the kernels assume 16-byte aligned rows
    (``aligned``) and dy's are not, or where dy spans more than 32-bit indices reach. The native
    node asks for this when dy is not laid out as x's contiguous rows."""
    dy2 = grad_rows(dy, n)
    m = dy2.shape[0]
    misaligned = aligned and ((dy2.data_ptr() | dy2.stride(0) * dy2.element_size()) & 15)
    too_wide = m > 0 and (m - 1) * dy2.stride(0) + n >= INT32_LIMIT
    return dy2.clone(memory_format=torch.contiguous_format) if misaligned or too_wide else dy2


def check_weight(weight: Optional[torch.Tensor], n: int) -> None:
    """Refuse a weight the kernels cannot read as a contiguous (n,) vector."""
    if weight is not None and weight.stride(0) != 1 and n > 1:
        raise ValueError(f"weight must be contiguous, got stride {weight.stride(0)}")


def same_layout(x: torch.Tensor, residual: torch.Tensor) -> bool:
    """Is the fused add's residual laid out exactly as x (what the native node takes: its
    kernels address both with x's row stride)?"""
    return residual.shape == x.shape and residual.stride() == x.stride()
