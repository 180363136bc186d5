"""The attention prologue's benchmark ops, ``fwd-qk-rope`` and ``bwd-qk-rope``: Qwen3's per-head
q/k norms and the rotary embedding after them (``qk_norm_rope``), against the chains a model runs
without the fusion.

Shapes are Qwen3 8B's heads: 32 query and 8 key heads (``HEADS``) of head dim N, so the sweep's
``M`` counts head rows, tokens x 40 (M = 320 is 8 decode tokens, 655360 a 16384-token prefill).
Implementations are ``fn(q, k, q_weight, k_weight, cos, sin) -> (q_out, k_out)`` with q (1, T, 32,
N), k (1, T, 8, N), cos and sin (1, T, N), all bf16, outputs in q's and k's (tokens, heads) order
(a chain that ends with the heads ahead of the tokens, as the model's does, hands back that
tensor's transpose: a view). Rows go to ``results/<gpu>/fwd-qk-rope.csv`` and ``bwd-qk-rope.csv``
with op ``fwd`` and ``bwd``:

* ``cute.qk+rope``, ``triton.qk+rope``: the lab's fused op (``qk_norm_rope``) on its backends
  (``cute``: the CuTe kernels, forward and backward, where their plan takes the rows);
* ``cute.auto+rope.eager``: the lab's norms (``rms_norm``, the CuTe kernel), then transformers'
  ``apply_rotary_pos_emb`` (the model's own code with ``patch`` and without the fusion);
* ``torch.eager+rope.eager``: transformers' ``Qwen3RMSNorm`` arithmetic and RoPE, eager (the model
  unpatched);
* ``torch.compile+rope``: Inductor on that chain (the reference's norm and RoPE), one kernel;
* ``liger.rope``: the lab's norms, then Liger's Triton RoPE, which rotates in place: the norms'
  outputs forward, the incoming gradients backward (it runs last, so the others' checks see
  gradients it has not yet turned).

Bytes: the forward reads q, k, cos, sin and both weights and writes q_out, k_out, ``2·M·N·s +
2·T·N·s + 2·N·s``; the backward reads the outputs' gradients, q, k, cos, sin, the rows' rstd and
both weights and writes dq, dk and both weights' gradients, ``3·M·N·s + 2·T·N·s + 4·M + 4·N·s``.
The same-shape ceilings are the plain norm's: ``copy`` and ``copy2r1w`` of the (M, N) rows (the
cos/sin reads, 1/20 of the rows' bytes, are not in them: compare bandwidths, not times).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import torch

from rmsnorm_lab import qk_norm_rope, reference, rms_norm

EPS = 1e-6
MODE = "llama"
#: query and key heads a token (Qwen3 8B; GQA, 4 query heads a key head)
HEADS = (32, 8)
ROWS_PER_TOKEN = sum(HEADS)
#: decode (8-64 tokens) and prefill (1k-16k tokens) at head dim 128; 16k tokens at 64 and 256
SWEEP: List[Tuple[int, int]] = (
    [(T * ROWS_PER_TOKEN, 128) for T in (8, 16, 32, 64, 1024, 4096, 16384)]
    + [(16384 * ROWS_PER_TOKEN, N) for N in (64, 256)]
)
#: host time per call: one decode token's heads
HOST_SHAPE = (ROWS_PER_TOKEN, 128)
QUICK_SWEEP: List[Tuple[int, int]] = [(8 * ROWS_PER_TOKEN, 128), (16384 * ROWS_PER_TOKEN, 128)]
QkFn = Callable[..., Tuple[torch.Tensor, torch.Tensor]]


def _rope_tables(T: int, N: int, dtype: torch.dtype, device: str
                 ) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (1, T, N) as transformers' default rotary embedding makes them (Qwen3's
    base, 10^6)."""
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, N, 2, device=device, dtype=torch.float32) / N))
    angles = torch.arange(T, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((angles, angles), dim=-1)[None]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def inputs(M: int, N: int, dtype: torch.dtype, device: str = "cuda") -> tuple:
    if M % ROWS_PER_TOKEN:
        raise ValueError(f"M counts head rows, tokens x {ROWS_PER_TOKEN}: {M} is not a multiple")
    T = M // ROWS_PER_TOKEN
    q = torch.randn(1, T, HEADS[0], N, dtype=dtype, device=device)
    k = torch.randn(1, T, HEADS[1], N, dtype=dtype, device=device)
    wq, wk = ((1 + 0.1 * torch.randn(N, device=device)).to(dtype) for _ in range(2))
    return (q, k, wq, wk, *_rope_tables(T, N, dtype, device))


def grad_inputs(M: int, N: int, dtype: torch.dtype, device: str = "cuda") -> tuple:
    q, k, wq, wk, cos, sin = inputs(M, N, dtype, device)
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    return (q.requires_grad_(), k.requires_grad_(), wq.requires_grad_(), wk.requires_grad_(),
            cos, sin, dq, dk)


def fwd_reference(args: tuple) -> tuple:
    return reference.qk_norm_rope(*(t.detach() for t in args[:6]), EPS, MODE)


def bwd_reference(args: tuple) -> tuple:
    q, k, wq, wk, cos, sin, dq, dk = (t.detach() for t in args)
    _, _, rq, rk = reference.qk_norm_rope_forward(q, k, wq, wk, cos, sin, EPS, MODE)
    return reference.qk_norm_rope_backward(dq, dk, q, k, wq, wk, cos, sin, rq, rk, MODE)


def _sizes(args: tuple) -> Tuple[int, int, int, int]:
    """``(T, rows, D, s)``: tokens, head rows of q and k together, head dim, element size."""
    q, k = args[0], args[1]
    D = q.shape[-1]
    return q.shape[1], (q.numel() + k.numel()) // D, D, q.element_size()


def fwd_bytes(args: tuple) -> int:
    T, rows, D, s = _sizes(args)
    return 2 * rows * D * s + 2 * T * D * s + 2 * D * s


def bwd_bytes(args: tuple) -> int:
    T, rows, D, s = _sizes(args)
    return 3 * rows * D * s + 2 * T * D * s + 4 * rows + 4 * D * s


def fwd_run(impl: QkFn, args: tuple):
    return impl(*args[:6])


def bwd_prepare(impl: QkFn, args: tuple) -> tuple:
    """The forward once, outside the timed region, its graph kept."""
    q, k, wq, wk, cos, sin, dq, dk = args
    with torch.enable_grad():
        q_out, k_out = impl(q, k, wq, wk, cos, sin)
    return q_out, k_out, q, k, wq, wk, dq, dk


def bwd_run(impl: QkFn, bound: tuple) -> tuple:
    q_out, k_out, q, k, wq, wk, dq, dk = bound
    return torch.autograd.grad((q_out, k_out), (q, k, wq, wk), (dq, dk), retain_graph=True)


# ------------------------------------------------------------------------- the lab's and peers

def _apply_rotary_pos_emb() -> Optional[Callable]:
    try:
        from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb
    except Exception:  # noqa: BLE001 - no transformers here: no chain that runs its RoPE
        return None
    return apply_rotary_pos_emb


def _norms_then_rope(norm: Callable, rotate: Callable) -> QkFn:
    """The chain a model runs without the fusion: ``norm(x, w)`` on q and on k (tokens, heads),
    then ``rotate`` in the model's order, heads ahead of the tokens, handed back as (tokens,
    heads)."""
    def run(q, k, wq, wk, cos, sin):
        q_out, k_out = rotate(norm(q, wq).transpose(1, 2), norm(k, wk).transpose(1, 2), cos,
                              sin)
        return q_out.transpose(1, 2), k_out.transpose(1, 2)
    return run


def _lab_norm(eps: float) -> Callable:
    return lambda x, w: rms_norm(x, w, eps, casting_mode=MODE)


def lab_impls() -> Dict[str, QkFn]:
    """The lab's fused op on each backend, and its norms before transformers' RoPE (that chain
    only where transformers imports)."""
    impls: Dict[str, QkFn] = {
        f"{backend}.qk+rope": (lambda b: lambda q, k, wq, wk, c, s: qk_norm_rope(
            q, k, wq, wk, c, s, EPS, casting_mode=MODE, backend=b))(backend)
        for backend in ("cute", "triton")}
    rotate = _apply_rotary_pos_emb()
    if rotate is not None:
        impls["cute.auto+rope.eager"] = _norms_then_rope(_lab_norm(EPS), rotate)
    return impls


def torch_eager(eps: float) -> Optional[QkFn]:
    """The model unpatched: Qwen3RMSNorm's arithmetic (the reference, ``llama``) and
    transformers' RoPE."""
    rotate = _apply_rotary_pos_emb()
    if rotate is None:
        return None
    return _norms_then_rope(lambda x, w: reference.rms_norm(x, w, eps, 0.0, MODE), rotate)


def torch_compile(eps: float) -> Optional[QkFn]:
    """Inductor on the reference's norms and RoPE (one compile per shape)."""
    from .peers import torch_compile as compiled_norm
    compiled_norm(eps)  # the same dynamo settings as the plain norm's peer
    chain = torch.compile(reference.qk_norm_rope, dynamic=False)
    return lambda q, k, wq, wk, c, s: chain(q, k, wq, wk, c, s, eps, MODE)


def liger_rope(eps: float) -> Optional[QkFn]:
    """The lab's norms, then Liger's Triton RoPE (``LigerRopeFunction``), which rotates the
    norms' outputs in place."""
    try:
        from liger_kernel.ops.rope import LigerRopeFunction
    except Exception:  # noqa: BLE001 - not installed, or broken here: not a peer
        return None

    return _norms_then_rope(_lab_norm(eps), LigerRopeFunction.apply)


PEERS: Dict[str, Callable[[float], Optional[QkFn]]] = {
    "torch.eager+rope.eager": torch_eager,
    "torch.compile+rope": torch_compile,
    "liger.rope": liger_rope,  # last: its backward rotates dq and dk in place
}
