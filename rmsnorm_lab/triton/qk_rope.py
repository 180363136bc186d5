"""Qwen3's attention prologue in one Triton kernel each way: every head of q and of k normalized
over its head dimension (its own weight, q's or k's), then rotated by the token's cos and sin
(transformers' half-rotation RoPE, in x's dtype as the model rounds it: reference.rope).

Forward: a program a (token, head) row, q's heads first, then k's; the row is held as its two
halves, the pair a rotation mixes. Backward: a fixed grid of programs (one an SM), each walking a
contiguous run of tokens and, for each, all its q and k heads: rope's transpose in fp32, then the
norm's backward; dW of q and of k accumulated in registers and written as one partial row each a
program, summed over the programs in order (no atomics: bitwise reproducible).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from ..reference import check_casting_mode
from .backward import _num_programs
from .forward import FLOAT_DTYPES, _normalize, shifted_weight


#: the forward's compile options: no fp fusion, so ``_rope_half``'s products stay apart
FORWARD_OPTIONS = {"enable_fp_fusion": False}


@triton.jit
def _rope_half(a, b, c, s, SIGN: tl.constexpr, dtype: tl.constexpr):
    """``a * c + SIGN * b * s`` in ``dtype`` as eager torch rounds it: each product, then the
    sum (a sign flipped after its rounding is the same value). The kernel is compiled without
    fp fusion: the compiler would fold a product into the sum (an FMA for fp32; for 16-bit, a
    bf16/fp16 ``fma.rn``, once it narrows the fp32 product and sum to x's dtype), one rounding
    fewer than eager torch's."""
    p = (a.to(tl.float32) * c.to(tl.float32)).to(dtype)
    r = (b.to(tl.float32) * s.to(tl.float32)).to(dtype)
    return (p.to(tl.float32) + SIGN * r.to(tl.float32)).to(dtype)


@triton.jit
def _halves(P, cols, mask, D: tl.constexpr):
    """A row of D at ``P`` as its two halves, the pair a rotation mixes (0 past the mask)."""
    return (tl.load(P + cols, mask=mask, other=0.0),
            tl.load(P + D // 2 + cols, mask=mask, other=0.0))


@triton.jit
def _qk_norm_rope_fwd(Q, K, WQ, WK, COS, SIN, QO, KO, QR, KR,
                      q_tok, q_head, k_tok, k_head, c_tok, s_tok, HQ, HK, eps,
                      D: tl.constexpr, HALF_BLOCK: tl.constexpr, CASTING_MODE: tl.constexpr,
                      STORE_RSTD: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    cols = tl.arange(0, HALF_BLOCK)
    mask = cols < D // 2
    if h < HQ:
        x_row = Q + t * q_tok + h * q_head
        w_row = WQ
        o_row = QO + (t * HQ + h) * D
    else:
        x_row = K + t * k_tok + (h - HQ) * k_head
        w_row = WK
        o_row = KO + (t * HK + h - HQ) * D
    x1, x2 = _halves(x_row, cols, mask, D)
    x1f, x2f = x1.to(tl.float32), x2.to(tl.float32)
    rstd = tl.rsqrt((tl.sum(x1f * x1f, axis=0) + tl.sum(x2f * x2f, axis=0)) / D + eps)
    if STORE_RSTD:
        if h < HQ:
            tl.store(QR + t * HQ + h, rstd)
        else:
            tl.store(KR + t * HK + h - HQ, rstd)
    w1, w2 = _halves(w_row, cols, mask, D)
    n1 = _normalize(x1, rstd, w1, 0.0, CASTING_MODE, True)
    n2 = _normalize(x2, rstd, w2, 0.0, CASTING_MODE, True)
    dtype = x1.dtype
    c1, c2 = _halves(COS + t * c_tok, cols, mask, D)
    s1, s2 = _halves(SIN + t * s_tok, cols, mask, D)
    c1, c2, s1, s2 = c1.to(dtype), c2.to(dtype), s1.to(dtype), s2.to(dtype)
    # rotate_half(n) = [-n2, n1]
    tl.store(o_row + cols, _rope_half(n1, n2, c1, s1, -1.0, dtype), mask=mask)
    tl.store(o_row + D // 2 + cols, _rope_half(n2, n1, c2, s2, 1.0, dtype), mask=mask)


@triton.jit
def _heads_backward(DO, X, R, DX, W, t, H, x_tok, x_head, c1, c2, s1, s2, cols, mask,
                    D: tl.constexpr, CASTING_MODE: tl.constexpr):
    """dx of token t's H heads of one tensor (stored; its output gradient and dx contiguous
    (T, H, D), rstd (T, H)), and their ``(dn * x_hat)`` halves summed, for dW: for each row rope's
    transpose, then the norm's backward (reference.qk_norm_rope_backward)."""
    dtype = X.dtype.element_ty
    w1, w2 = _halves(W, cols, mask, D)
    ws1 = shifted_weight(w1, 0.0, dtype, CASTING_MODE)
    ws2 = shifted_weight(w2, 0.0, dtype, CASTING_MODE)
    acc1 = tl.zeros_like(c1)
    acc2 = tl.zeros_like(c1)
    for h in range(H):
        at = (t * H + h) * D
        dy1, dy2 = _halves(DO + at, cols, mask, D)
        dy1, dy2 = dy1.to(tl.float32), dy2.to(tl.float32)
        # rope's transpose: dy * cos + [g2, -g1] with g = dy * sin
        dn1 = dy1 * c1 + dy2 * s2
        dn2 = dy2 * c2 - dy1 * s1
        rstd = tl.load(R + t * H + h)
        x1, x2 = _halves(X + t * x_tok + h * x_head, cols, mask, D)
        x_hat1, x_hat2 = x1.to(tl.float32) * rstd, x2.to(tl.float32) * rstd
        m1, m2 = dn1 * ws1, dn2 * ws2
        if CASTING_MODE == "none":
            m1, m2 = m1.to(dtype).to(tl.float32), m2.to(dtype).to(tl.float32)
        mean = (tl.sum(m1 * x_hat1, axis=0) + tl.sum(m2 * x_hat2, axis=0)) / D
        tl.store(DX + at + cols, (rstd * (m1 - x_hat1 * mean)).to(dtype), mask=mask)
        tl.store(DX + at + D // 2 + cols, (rstd * (m2 - x_hat2 * mean)).to(dtype), mask=mask)
        if CASTING_MODE != "gemma":  # dW reads x_hat as the forward rounded it
            x_hat1, x_hat2 = x_hat1.to(dtype).to(tl.float32), x_hat2.to(dtype).to(tl.float32)
        acc1 += dn1 * x_hat1
        acc2 += dn2 * x_hat2
    return acc1, acc2


@triton.jit
def _qk_norm_rope_bwd(DQO, DKO, Q, K, WQ, WK, COS, SIN, QR, KR, DQ, DK, DWQ_P, DWK_P,
                      q_tok, q_head, k_tok, k_head, c_tok, s_tok, T, HQ, HK, tokens_per_program,
                      D: tl.constexpr, HALF_BLOCK: tl.constexpr, CASTING_MODE: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, HALF_BLOCK)
    mask = cols < D // 2
    t_start = pid.to(tl.int64) * tokens_per_program
    t_end = tl.minimum(t_start + tokens_per_program, T)
    dtype = Q.dtype.element_ty
    dwq1 = tl.zeros([HALF_BLOCK], dtype=tl.float32)
    dwq2 = tl.zeros([HALF_BLOCK], dtype=tl.float32)
    dwk1 = tl.zeros([HALF_BLOCK], dtype=tl.float32)
    dwk2 = tl.zeros([HALF_BLOCK], dtype=tl.float32)
    for t in range(t_start, t_end):
        # cos and sin as the forward took them: in x's dtype
        c1, c2 = _halves(COS + t * c_tok, cols, mask, D)
        s1, s2 = _halves(SIN + t * s_tok, cols, mask, D)
        c1, c2 = c1.to(dtype).to(tl.float32), c2.to(dtype).to(tl.float32)
        s1, s2 = s1.to(dtype).to(tl.float32), s2.to(dtype).to(tl.float32)
        a1, a2 = _heads_backward(DQO, Q, QR, DQ, WQ, t, HQ, q_tok, q_head, c1, c2, s1, s2, cols,
                                 mask, D, CASTING_MODE)
        dwq1 += a1
        dwq2 += a2
        a1, a2 = _heads_backward(DKO, K, KR, DK, WK, t, HK, k_tok, k_head, c1, c2, s1, s2, cols,
                                 mask, D, CASTING_MODE)
        dwk1 += a1
        dwk2 += a2
    tl.store(DWQ_P + pid * D + cols, dwq1, mask=mask)
    tl.store(DWQ_P + pid * D + D // 2 + cols, dwq2, mask=mask)
    tl.store(DWK_P + pid * D + cols, dwk1, mask=mask)
    tl.store(DWK_P + pid * D + D // 2 + cols, dwk2, mask=mask)


def _heads(name: str, t: torch.Tensor) -> torch.Tensor:
    """``t`` (..., H, D) as (T, H, D) rows of unit stride (a view where the leading dimensions
    allow one)."""
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32, bfloat16 or float16, got {t.dtype}")
    if t.dim() < 3:
        raise ValueError(f"{name} must be (..., heads, head_dim), got shape {tuple(t.shape)}")
    t3 = t.reshape(-1, t.shape[-2], t.shape[-1])
    return t3 if t3.stride(-1) == 1 else t3.contiguous()


def _rows(name: str, t: torch.Tensor, T: int, D: int) -> torch.Tensor:
    t2 = t.reshape(-1, t.shape[-1])
    if t2.shape != (T, D):
        raise ValueError(f"{name} must be (..., {D}) with one row a token ({T}), got shape "
                         f"{tuple(t.shape)}")
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _check(q3, k3, q_weight, k_weight) -> int:
    D = q3.shape[-1]
    if k3.shape[0] != q3.shape[0] or k3.shape[-1] != D or k3.dtype != q3.dtype:
        raise ValueError(f"k must have q's tokens, head_dim and dtype: q {tuple(q3.shape)} "
                         f"{q3.dtype}, k {tuple(k3.shape)} {k3.dtype}")
    if D % 2:
        raise ValueError(f"the rotary embedding rotates halves of the head: head_dim must be "
                         f"even, got {D}")
    for name, w in (("q_weight", q_weight), ("k_weight", k_weight)):
        if not isinstance(w, torch.Tensor) or w.shape != (D,) or w.stride(0) != 1:
            raise ValueError(f"{name} must be a contiguous ({D},) tensor")
    if q_weight.dtype != k_weight.dtype:
        raise TypeError(f"q_weight and k_weight must share a dtype, got {q_weight.dtype} and "
                        f"{k_weight.dtype}")
    return D


def triton_qk_norm_rope_forward(q, k, q_weight, k_weight, cos, sin, eps: float,
                                casting_mode: str, need_rstd: bool
                                ) -> Tuple[torch.Tensor, torch.Tensor,
                                           Optional[torch.Tensor], Optional[torch.Tensor]]:
    """``(q_out, k_out, q_rstd, k_rstd)``: q (..., Hq, D) and k (..., Hk, D) normalized per head
    and rotated (reference.qk_norm_rope_forward); outputs contiguous in q's and k's shapes, rstd
    fp32 (..., H) when ``need_rstd``. cos and sin: (..., D), one row a token."""
    casting_mode = check_casting_mode(casting_mode)
    q3, k3 = _heads("q", q), _heads("k", k)
    D = _check(q3, k3, q_weight, k_weight)
    T, HQ, HK = q3.shape[0], q3.shape[1], k3.shape[1]
    c2, s2 = _rows("cos", cos, T, D), _rows("sin", sin, T, D)
    qo = torch.empty((T, HQ, D), dtype=q.dtype, device=q.device)
    ko = torch.empty((T, HK, D), dtype=k.dtype, device=k.device)
    qr = torch.empty((T, HQ), dtype=torch.float32, device=q.device) if need_rstd else None
    kr = torch.empty((T, HK), dtype=torch.float32, device=q.device) if need_rstd else None
    if T:
        half = triton.next_power_of_2(max(D // 2, 1))
        _qk_norm_rope_fwd[(T, HQ + HK)](
            q3, k3, q_weight, k_weight, c2, s2, qo, ko, qr, kr,
            q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), c2.stride(0), s2.stride(0),
            HQ, HK, eps, D=D, HALF_BLOCK=half, CASTING_MODE=casting_mode,
            STORE_RSTD=need_rstd, num_warps=1 if half <= 64 else 2, **FORWARD_OPTIONS)
    lead = q.shape[:-2]
    return (qo.view(q.shape), ko.view(k.shape), qr.view(*lead, HQ) if need_rstd else None,
            kr.view(*lead, HK) if need_rstd else None)


def triton_qk_norm_rope_backward(dq_out, dk_out, q, k, q_weight, k_weight, cos, sin, q_rstd,
                                 k_rstd, casting_mode: str
                                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                            torch.Tensor]:
    """``(dq, dk, dq_weight, dk_weight)`` (reference.qk_norm_rope_backward): dq and dk in q's
    and k's shapes and dtype, the weights' gradients in their dtype, deterministic."""
    casting_mode = check_casting_mode(casting_mode)
    q3, k3 = _heads("q", q), _heads("k", k)
    D = _check(q3, k3, q_weight, k_weight)
    T, HQ, HK = q3.shape[0], q3.shape[1], k3.shape[1]
    dqo = dq_out.reshape(T, HQ, D).contiguous()
    dko = dk_out.reshape(T, HK, D).contiguous()
    c2, s2 = _rows("cos", cos, T, D), _rows("sin", sin, T, D)
    dq = torch.empty((T, HQ, D), dtype=q.dtype, device=q.device)
    dk = torch.empty((T, HK, D), dtype=k.dtype, device=k.device)
    P = _num_programs(q.device, T) if T else 0
    dwq_p = torch.zeros((max(P, 1), D), dtype=torch.float32, device=q.device)
    dwk_p = torch.zeros((max(P, 1), D), dtype=torch.float32, device=q.device)
    if T:
        half = triton.next_power_of_2(max(D // 2, 1))
        _qk_norm_rope_bwd[(P,)](
            dqo, dko, q3, k3, q_weight, k_weight, c2, s2,
            q_rstd.reshape(T, HQ).contiguous(), k_rstd.reshape(T, HK).contiguous(),
            dq, dk, dwq_p, dwk_p,
            q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), c2.stride(0), s2.stride(0),
            T, HQ, HK, -(-T // P), D=D, HALF_BLOCK=half, CASTING_MODE=casting_mode,
            num_warps=1 if half <= 64 else 2)
    return (dq.view(q.shape), dk.view(k.shape), dwq_p.sum(0).to(q_weight.dtype),
            dwk_p.sum(0).to(k_weight.dtype))
