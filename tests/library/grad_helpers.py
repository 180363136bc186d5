"""Helpers shared by the autograd tests (CPU: test_autograd.py; GPU: test_gpu_autograd.py)."""

import torch

from rmsnorm_lab import reference, rms_norm

EPS = 1e-6
MODES = reference.CASTING_MODES
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def fresh(shape, dtype=torch.float32, device="cpu", requires_grad=False):
    t = torch.randn(shape, dtype=torch.float32, device=device).to(dtype)
    return t.requires_grad_(requires_grad)


def naive64(x, w, eps, offset):
    """The textbook formula in float64, differentiated by torch."""
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * (offset + w) if w is not None else y


def grads(x, w, dy, **kw):
    """``(y, dx, dw)`` of ``rms_norm`` by autograd, on fresh leaves."""
    x = x.detach().clone().requires_grad_()
    w = w.detach().clone().requires_grad_() if w is not None else None
    y = rms_norm(x, w, EPS, **kw)
    y.backward(dy)
    return y.detach(), x.grad, (w.grad if w is not None else None)
