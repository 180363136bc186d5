"""The q/k norms with RoPE, as the oracle writes them: against transformers' own arithmetic
(Qwen3's norm and ``apply_rotary_pos_emb``, written out as the model runs them) bit for bit, and
the backward against autograd in float64."""

import pytest
import torch

from rmsnorm_lab import reference as R


def qwen3_prologue(q, k, wq, wk, cos, sin, eps):
    """transformers' Qwen3 attention: Qwen3RMSNorm on each head, then apply_rotary_pos_emb with
    cos and sin in the model's dtype (unsqueezed over the heads)."""
    def norm(x, w):
        xf = x.to(torch.float32)
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return w * xf.to(x.dtype)

    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)
    c, s = cos.unsqueeze(-2).to(q.dtype), sin.unsqueeze(-2).to(q.dtype)
    qn, kn = norm(q, wq), norm(k, wk)
    return qn * c + rotate_half(qn) * s, kn * c + rotate_half(kn) * s


def inputs(B=2, S=5, Hq=4, Hk=2, D=64, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, S, Hq, D, generator=g).to(dtype)
    k = torch.randn(B, S, Hk, D, generator=g).to(dtype)
    wq = (1 + 0.1 * torch.randn(D, generator=g)).to(dtype)
    wk = (1 + 0.1 * torch.randn(D, generator=g)).to(dtype)
    pos = torch.arange(S, dtype=torch.float32)
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    freqs = torch.cat([torch.outer(pos, inv)] * 2, dim=-1)  # (S, D), transformers' layout
    cos = freqs.cos().unsqueeze(0).expand(B, S, D).to(dtype)
    sin = freqs.sin().unsqueeze(0).expand(B, S, D).to(dtype)
    return q, k, wq, wk, cos, sin


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("D", [64, 128, 256])
def test_equals_transformers_arithmetic_bit_for_bit(dtype, D):
    q, k, wq, wk, cos, sin = inputs(D=D, dtype=dtype)
    got = R.qk_norm_rope(q, k, wq, wk, cos, sin, 1e-6, "llama")
    expect = qwen3_prologue(q, k, wq, wk, cos, sin, 1e-6)
    assert torch.equal(got[0], expect[0]) and torch.equal(got[1], expect[1])


def test_the_backward_is_autograds_in_float64():
    q, k, wq, wk, cos, sin = (t.double() for t in inputs())
    leaves = [t.clone().requires_grad_() for t in (q, k, wq, wk)]
    out = R.qk_norm_rope(*leaves, cos, sin, 1e-6, "gemma")
    dq_out, dk_out = torch.randn_like(out[0]), torch.randn_like(out[1])
    expect = torch.autograd.grad(out, leaves, (dq_out, dk_out))
    _, _, q_rstd, k_rstd = R.qk_norm_rope_forward(q, k, wq, wk, cos, sin, 1e-6, "gemma")
    got = R.qk_norm_rope_backward(dq_out, dk_out, q, k, wq, wk, cos, sin, q_rstd, k_rstd,
                                  "gemma")
    for g, e in zip(got, expect):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-12)


def test_rope_backward_is_the_transpose():
    g = torch.Generator().manual_seed(1)
    x, dy = torch.randn(3, 8, generator=g, dtype=torch.float64), torch.randn(
        3, 8, generator=g, dtype=torch.float64)
    c, s = torch.randn(3, 8, generator=g, dtype=torch.float64), torch.randn(
        3, 8, generator=g, dtype=torch.float64)
    # <rope(x), dy> == <x, rope_backward(dy)>: rope is linear in x
    lhs = (R.rope(x, c, s) * dy).sum()
    rhs = (x * R.rope_backward(dy, c, s)).sum()
    assert float(lhs) == pytest.approx(float(rhs), rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_equals_transformers_qwen3_modules(dtype):
    """The modules themselves, where transformers is installed: Qwen3RMSNorm on q and k, then
    apply_rotary_pos_emb on the heads-first layout the attention hands it."""
    qwen3 = pytest.importorskip("transformers.models.qwen3.modeling_qwen3")
    q, k, wq, wk, cos, sin = inputs(D=128, dtype=dtype)
    q_norm, k_norm = qwen3.Qwen3RMSNorm(128, eps=1e-6), qwen3.Qwen3RMSNorm(128, eps=1e-6)
    with torch.no_grad():
        q_norm.weight.copy_(wq.float())
        k_norm.weight.copy_(wk.float())
    q_norm.to(dtype), k_norm.to(dtype)
    with torch.no_grad():
        qh, kh = q_norm(q).transpose(1, 2), k_norm(k).transpose(1, 2)
        eq, ek = qwen3.apply_rotary_pos_emb(qh, kh, cos, sin)
    got = R.qk_norm_rope(q, k, wq, wk, cos, sin, 1e-6, "llama")
    assert torch.equal(got[0], eq.transpose(1, 2)) and torch.equal(got[1], ek.transpose(1, 2))
