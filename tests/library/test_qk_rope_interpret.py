"""The q/k-norm + RoPE Triton kernels (``triton/qk_rope.py``) under the interpreter, on CPU
tensors (run as tests/run.sh does: TRITON_INTERPRET=1, its own process).

Forward: against the reference (transformers' arithmetic) bit for bit on rows whose sum of
squares is exact in any order (small integers), within an ulp of x's dtype on random rows. Backward:
against the float64 reference's gradients, dW summed over tokens and heads, and the same bits on
a second call (deterministic).
"""

import pytest
import torch

from rmsnorm_lab import reference as R
from rmsnorm_lab.triton.qk_rope import (triton_qk_norm_rope_backward,
                                        triton_qk_norm_rope_forward)
from test_qk_rope_reference import inputs
from test_triton_interpret import interpreter_fixes  # noqa: F401

pytestmark = pytest.mark.interpret

EPS = 1e-6
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def integer_rows(q, k):
    g = torch.Generator().manual_seed(3)
    return (torch.randint(-4, 5, q.shape, generator=g).to(q.dtype),
            torch.randint(-4, 5, k.shape, generator=g).to(k.dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", ["llama", "gemma", "none"])
@pytest.mark.parametrize("D", [64, 128, 96])
def test_forward_equals_the_reference(dtype, mode, D):
    q, k, wq, wk, cos, sin = inputs(B=2, S=3, Hq=4, Hk=2, D=D, dtype=dtype)
    q, k = integer_rows(q, k)
    got = triton_qk_norm_rope_forward(q, k, wq, wk, cos, sin, EPS, mode, need_rstd=True)
    expect = R.qk_norm_rope_forward(q, k, wq, wk, cos, sin, EPS, mode)
    for g, e in zip(got, expect):
        assert g.shape == e.shape and g.dtype == e.dtype
        assert torch.equal(g, e)


def test_views_of_a_fused_qkv_projection_and_random_rows():
    """q and k as views of one (B, S, (Hq + 2 Hk) * D) projection, cos and sin expanded over the
    batch: the kernel reads them where they are; random rows within one ulp."""
    B, S, Hq, Hk, D = 2, 5, 4, 2, 64
    q, k, wq, wk, cos, sin = inputs(B=B, S=S, Hq=Hq, Hk=Hk, D=D)
    qkv = torch.randn(B, S, (Hq + 2 * Hk) * D).to(torch.bfloat16)
    qv = qkv[..., : Hq * D].view(B, S, Hq, D)
    kv = qkv[..., Hq * D: (Hq + Hk) * D].view(B, S, Hk, D)
    cos1, sin1 = cos[:1].expand(B, S, D), sin[:1].expand(B, S, D)
    got = triton_qk_norm_rope_forward(qv, kv, wq, wk, cos1, sin1, EPS, "llama", False)
    expect = R.qk_norm_rope(qv, kv, wq, wk, cos1, sin1, EPS, "llama")
    for g, e in zip(got[:2], expect):
        assert g.is_contiguous() and g.shape == e.shape
        diff = (g.float() - e.float()).abs()
        assert float((diff / e.float().abs().clamp_min(1e-3)).max()) <= 2 ** -7


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", ["llama", "gemma", "none"])
def test_backward_against_float64(dtype, mode):
    q, k, wq, wk, cos, sin = inputs(B=3, S=7, Hq=4, Hk=2, D=64, dtype=dtype)
    _, _, qr, kr = triton_qk_norm_rope_forward(q, k, wq, wk, cos, sin, EPS, mode, True)
    g = torch.Generator().manual_seed(5)
    dqo = torch.randn(q.shape, generator=g).to(dtype)
    dko = torch.randn(k.shape, generator=g).to(dtype)
    got = triton_qk_norm_rope_backward(dqo, dko, q, k, wq, wk, cos, sin, qr, kr, mode)
    again = triton_qk_norm_rope_backward(dqo, dko, q, k, wq, wk, cos, sin, qr, kr, mode)
    assert all(torch.equal(a, b) for a, b in zip(got, again))  # deterministic
    d64 = [t.double() for t in (dqo, dko, q, k, wq, wk)]
    _, _, qr64, kr64 = R.qk_norm_rope_forward(d64[2], d64[3], d64[4], d64[5], cos, sin, EPS, mode)
    expect = R.qk_norm_rope_backward(*d64, cos.to(dtype).double(), sin.to(dtype).double(),
                                     qr64, kr64, mode)
    tol = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 5e-3}[dtype]
    for name, a, e in zip(("dq", "dk", "dwq", "dwk"), got, expect):
        assert a.dtype == dtype
        err = float((a.double() - e).norm() / e.norm())
        assert err < tol, (name, err)


def test_refusals():
    q, k, wq, wk, cos, sin = inputs(D=64)
    with pytest.raises(ValueError, match="head_dim must be even"):
        triton_qk_norm_rope_forward(q[..., :63], k[..., :63], wq[:63], wk[:63], cos[..., :63],
                                    sin[..., :63], EPS, "llama", False)
    with pytest.raises(ValueError, match="one row a token"):
        triton_qk_norm_rope_forward(q, k, wq, wk, cos[:, :2], sin[:, :2], EPS, "llama", False)
    with pytest.raises(TypeError, match="share a dtype"):
        triton_qk_norm_rope_forward(q, k, wq, wk.float(), cos, sin, EPS, "llama", False)


def test_the_op_on_the_triton_backend():
    """The custom op behind ``qk_norm_rope`` on the Triton backend (on CPU tensors the public
    call refuses it: CUDA only): the kernels' outputs, and through autograd their gradients, as
    the reference backend's."""
    from rmsnorm_lab.autograd import qk_norm_rope_op
    q, k, wq, wk, cos, sin = inputs(B=2, S=3, Hq=4, Hk=2, D=64, dtype=torch.float32)
    q, k = integer_rows(q, k)
    got_leaves = [t.clone().requires_grad_() for t in (q, k, wq, wk)]
    ref_leaves = [t.clone().requires_grad_() for t in (q, k, wq, wk)]
    got = qk_norm_rope_op(*got_leaves, cos, sin, EPS, "llama", "triton")[:2]
    expect = qk_norm_rope_op(*ref_leaves, cos, sin, EPS, "llama", "torch")[:2]
    assert all(torch.equal(a, b) for a, b in zip(got, expect))
    g = [torch.randn_like(t) for t in got]
    for a, b in zip(torch.autograd.grad(got, got_leaves, g),
                    torch.autograd.grad(expect, ref_leaves, g)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
