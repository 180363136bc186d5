"""The fused residual add's benchmark ops, ``fwd-add`` and ``bwd-add`` (``h = x + r; y =
norm(h)``, as a decoder block computes it), their peers, and the ceilings that move their bytes.

Implementations are ``fn(x, r, w) -> (y, h)``, differentiable for ``bwd-add``. Rows go to
``results/<gpu>/fwd-add.csv`` and ``bwd-add.csv`` with op ``fwd`` and ``bwd`` and impl names
ending in ``+add`` (``cute.auto+add``, ``torch.native+add``: torch's add, then ``F.rms_norm``).

Bytes: the forward reads x, r and w and writes h and y (``4·M·N·s + N·s_w``); the backward reads
dy, dh (h's own gradient) and h, writes one gradient for x and r (they are the same tensor), and
reads rstd and w and writes dW (``4·M·N·s + 4·M + 2·N·s_w``). The same-shape ceilings move those
bytes with no arithmetic: ``copy2r2w`` (two in, two out) and ``copy3r1w`` (three in, one out).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import torch

from rmsnorm_lab import reference

EPS = 1e-6
#: per-head norms (Qwen3's q/k norms): rows of one attention head, tokens x heads of them
PER_HEAD_SHAPES: List[Tuple[int, int]] = [(65536, 128), (262144, 128)]
ADD_SWEEP: List[Tuple[int, int]] = (
    [(M, 4096) for M in (1024, 4096, 16384, 65536)] + [(16384, 2048), (16384, 8192)]
    + PER_HEAD_SHAPES
)
QUICK_ADD_SWEEP: List[Tuple[int, int]] = [(16384, 4096), (65536, 128)]
AddFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Tuple[torch.Tensor, torch.Tensor]]


def inputs(M: int, N: int, dtype: torch.dtype) -> tuple:
    x = torch.randn(M, N, dtype=dtype, device="cuda")
    r = torch.randn(M, N, dtype=dtype, device="cuda")
    w = (1 + 0.1 * torch.randn(N, device="cuda")).to(dtype)
    return x, r, w


def grad_inputs(M: int, N: int, dtype: torch.dtype) -> tuple:
    x, r, w = inputs(M, N, dtype)
    dy, dh = torch.randn_like(x), torch.randn_like(x)
    return x.requires_grad_(), r.requires_grad_(), w.requires_grad_(), dy, dh


def fwd_reference(args: tuple) -> tuple:
    x, r, w = (t.detach() for t in args[:3])
    y, h, _ = reference.fused_add_rms_norm_forward(x, r, w, EPS, 0.0, "llama")
    return y, h


def bwd_reference(args: tuple) -> tuple:
    x, r, w, dy, dh = (t.detach() for t in args)
    y, h, rstd = reference.fused_add_rms_norm_forward(x, r, w, EPS, 0.0, "llama")
    d, dw = reference.rms_norm_backward(dy, h, w, rstd, 0.0, "llama", dh=dh)
    return d, d, dw


def fwd_bytes(args: tuple) -> int:
    x, w = args[0], args[2]
    return 4 * x.numel() * x.element_size() + w.numel() * w.element_size()


def bwd_bytes(args: tuple) -> int:
    x, w = args[0], args[2]
    M = x.numel() // x.shape[-1]
    return 4 * x.numel() * x.element_size() + 4 * M + 2 * w.numel() * w.element_size()


def fwd_run(impl: AddFn, args: tuple):
    return impl(*args[:3])


def bwd_prepare(impl: AddFn, args: tuple) -> tuple:
    """The forward once, outside the timed region, its graph kept."""
    x, r, w, dy, dh = args
    with torch.enable_grad():
        y, h = impl(x, r, w)  # without autograd support the timed grad raises: a failed check
    return y, h, x, r, w, dy, dh


def bwd_run(impl: AddFn, bound: tuple) -> tuple:
    y, h, x, r, w, dy, dh = bound
    return torch.autograd.grad((y, h), (x, r, w), (dy, dh), retain_graph=True)


# ------------------------------------------------------------------------------------ peers

def torch_native(eps: float) -> Optional[AddFn]:
    """torch eager: the add, then ``F.rms_norm`` (two kernels, h read back)."""
    rms_norm = torch.nn.functional.rms_norm

    def run(x, r, w):
        h = x + r
        return rms_norm(h, (h.shape[-1],), w, eps), h
    return run


def torch_compile(eps: float) -> Optional[AddFn]:
    """torch.compile of the add and the norm: Inductor fuses them into one kernel."""
    from .peers import torch_compile as compiled_norm
    compiled_norm(eps)  # the same dynamo settings as the plain norm's peer

    def block(x, r, w):
        h = x + r
        return reference.rms_norm(h, w, eps, 0.0, "llama"), h
    return torch.compile(block, dynamic=False)


def liger_triton(eps: float) -> Optional[AddFn]:
    try:
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction
    except Exception:  # noqa: BLE001 - not installed, or broken here: not a peer
        return None
    apply = LigerFusedAddRMSNormFunction.apply
    # forward(X, R, W, eps, offset=0.0, casting_mode="llama", in_place=False) -> (Y, S)
    return lambda x, r, w: apply(x, r, w, eps, 0.0, "llama", False)


class InPlaceAdd:
    """FlashInfer's ``fused_add_rmsnorm`` as vLLM and SGLang call it: in place, y written over x
    and h over the residual, the same bytes as an out-of-place kernel (x, r, w read; y, h
    written). So that the benchmark's shared inputs stay intact for the other implementations,
    the first call on a pair of inputs takes private copies of them, and every later call on the
    same pair runs in place on those copies: its first result is checked, and the timed calls
    each normalize the previous call's output, at the same cost. Copies of one shape at a time
    are kept."""

    def __init__(self, kernel: Callable, eps: float):
        self.kernel, self.eps = kernel, eps
        self.copies: Dict[tuple, Tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, x: torch.Tensor, r: torch.Tensor, w: torch.Tensor):
        key = (x.data_ptr(), r.data_ptr(), tuple(x.shape), x.dtype)
        if key not in self.copies:
            if any(k[2:] != key[2:] for k in self.copies):
                self.copies.clear()
            self.copies[key] = (x.clone(), r.clone())
        xs, rs = self.copies[key]
        self.kernel(xs, rs, w, self.eps)
        return xs, rs


def flashinfer(eps: float) -> Optional[AddFn]:
    """FlashInfer's fused add (inference only: a forward peer), in place on private copies."""
    try:
        from flashinfer.norm import fused_add_rmsnorm
    except Exception:  # noqa: BLE001
        return None
    return InPlaceAdd(fused_add_rmsnorm, eps)


FORWARD_PEERS: Dict[str, Callable[[float], Optional[AddFn]]] = {
    "liger.triton+add": liger_triton,
    "flashinfer+add": flashinfer,
    "torch.native+add": torch_native,
    "torch.compile+add": torch_compile,
}
#: the differentiable peers (FlashInfer's kernels have no backward)
BACKWARD_PEERS = {name: make for name, make in FORWARD_PEERS.items() if make is not flashinfer}


# ------------------------------------------------------------------------------------ ceilings

def _copy2r2w():
    import triton
    import triton.language as tl

    @triton.jit
    def copy2r2w(A, B, C, D, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(C + offs, tl.load(A + offs, mask=mask), mask=mask)
        tl.store(D + offs, tl.load(B + offs, mask=mask), mask=mask)

    def run(a, b, c, d):
        n = a.numel()
        copy2r2w[(triton.cdiv(n, 4096),)](a, b, c, d, n, BLOCK=4096, num_warps=8)
    return run


#: same-shape ceiling name -> (tensors read, tensors written, the kernel's factory)
SAME_SHAPE = {
    "copy2r2w": (2, 2, _copy2r2w),
    "copy3r1w": (3, 1, lambda: lambda a, b, c, d: torch.addcmul(a, b, c, out=d)),
}
