"""The q/k-norm + RoPE Triton kernels on a GPU (run with: pytest -m gpu): the forward against
transformers' arithmetic bit for bit (rows of small integers, whose sums are exact in any order)
and within an ulp on random rows, Qwen3's shapes and a fused qkv projection's views; the backward
against float64, deterministic; both captured in a CUDA graph."""

import pytest
import torch

from rmsnorm_lab import reference as R
from rmsnorm_lab.triton.qk_rope import (triton_qk_norm_rope_backward,
                                        triton_qk_norm_rope_forward)

pytestmark = pytest.mark.gpu

EPS = 1e-6


def inputs(T, Hq, Hk, D, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(T, Hq, D, device="cuda", generator=g).to(dtype)
    k = torch.randn(T, Hk, D, device="cuda", generator=g).to(dtype)
    wq = (1 + 0.1 * torch.randn(D, device="cuda", generator=g)).to(dtype)
    wk = (1 + 0.1 * torch.randn(D, device="cuda", generator=g)).to(dtype)
    inv = 1.0 / (1e6 ** (torch.arange(0, D, 2, device="cuda", dtype=torch.float32) / D))
    freqs = torch.outer(torch.arange(T, device="cuda", dtype=torch.float32), inv)
    emb = torch.cat((freqs, freqs), -1)
    return q, k, wq, wk, emb.cos().to(dtype), emb.sin().to(dtype)


def assert_bit_for_bit_where_rstd_agrees(got, expect):
    """rstd within an ulp of the reference's (a head of 96 divides its sum of squares otherwise
    than torch's mean does), and the rotated rows bit for bit wherever their rstd is the
    reference's: every row for heads of a power of two."""
    for g, e in zip(got[2:], expect[2:]):
        torch.testing.assert_close(g, e, rtol=2.4e-7, atol=0)
    for g, e, g_rstd, e_rstd in zip(got[:2], expect[:2], got[2:], expect[2:]):
        agree = g_rstd == e_rstd
        assert agree.float().mean().item() > 0.5
        assert torch.equal(g[agree], e[agree])


def assert_within_a_rounding(got, expect):
    """Random rows: fp32 sums in another order move rstd by an ulp here and there, which tips a
    16-bit rounding in a few values and moves every fp32 value of that row by about an ulp."""
    for g, e in zip(got, expect):
        if g.dtype == torch.float32:
            torch.testing.assert_close(g, e, rtol=1e-6, atol=2e-6)
        else:
            same = (g == e).float().mean().item()
            assert same > 0.98, same


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("T,Hq,Hk,D", [(1, 32, 8, 128), (61, 32, 8, 128), (257, 16, 2, 64),
                                       (33, 8, 8, 256)])
def test_forward_equals_transformers_arithmetic(dtype, T, Hq, Hk, D):
    q, k, wq, wk, cos, sin = inputs(T, Hq, Hk, D, dtype)
    qi = torch.randint(-4, 5, q.shape, device="cuda").to(dtype)
    ki = torch.randint(-4, 5, k.shape, device="cuda").to(dtype)
    got = triton_qk_norm_rope_forward(qi, ki, wq, wk, cos, sin, EPS, "llama", True)
    expect = R.qk_norm_rope_forward(qi, ki, wq, wk, cos, sin, EPS, "llama")
    assert_bit_for_bit_where_rstd_agrees(got, expect)
    got = triton_qk_norm_rope_forward(q, k, wq, wk, cos, sin, EPS, "llama", False)
    assert_within_a_rounding(got[:2], R.qk_norm_rope(q, k, wq, wk, cos, sin, EPS, "llama"))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_backward_against_float64_and_deterministic(dtype):
    q, k, wq, wk, cos, sin = inputs(1024, 32, 8, 128, dtype)
    _, _, qr, kr = triton_qk_norm_rope_forward(q, k, wq, wk, cos, sin, EPS, "llama", True)
    dqo, dko = torch.randn_like(q), torch.randn_like(k)
    got = triton_qk_norm_rope_backward(dqo, dko, q, k, wq, wk, cos, sin, qr, kr, "llama")
    again = triton_qk_norm_rope_backward(dqo, dko, q, k, wq, wk, cos, sin, qr, kr, "llama")
    assert all(torch.equal(a, b) for a, b in zip(got, again))
    d64 = [t.double() for t in (dqo, dko, q, k, wq, wk)]
    _, _, qr64, kr64 = R.qk_norm_rope_forward(d64[2], d64[3], d64[4], d64[5], cos, sin, EPS,
                                              "llama")
    expect = R.qk_norm_rope_backward(*d64, cos.double(), sin.double(), qr64, kr64, "llama")
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    for name, a, e in zip(("dq", "dk", "dwq", "dwk"), got, expect):
        assert float((a.double() - e).norm() / e.norm()) < tol, name


def test_in_a_cuda_graph(capture_on_side_stream):
    q, k, wq, wk, cos, sin = inputs(64, 16, 4, 128, torch.bfloat16)
    expect = triton_qk_norm_rope_forward(q, k, wq, wk, cos, sin, EPS, "llama", True)
    graph, out = capture_on_side_stream(
        lambda: triton_qk_norm_rope_forward(q, k, wq, wk, cos, sin, EPS, "llama", True))
    for t in out:
        t.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(out, expect))


@pytest.mark.usefixtures("kernels_under_compile")
def test_the_op_trains_and_compiles():
    """``qk_norm_rope`` (the default backend on CUDA) through autograd and under
    torch.compile(fullgraph=True) with Inductor: the same outputs and gradients as eager."""
    from rmsnorm_lab import qk_norm_rope
    q, k, wq, wk, cos, sin = inputs(128, 16, 4, 128, torch.bfloat16)
    q, k = q.view(2, 64, 16, 128), k.view(2, 64, 4, 128)
    cos, sin = cos.view(2, 64, 128), sin.view(2, 64, 128)

    def step(a, b, w1, w2):
        qo, ko = qk_norm_rope(a, b, w1, w2, cos, sin, EPS)
        return (qo.float().square().sum() + ko.float().sum())

    leaves = [t.clone().requires_grad_() for t in (q, k, wq, wk)]
    loss = step(*leaves)
    grads = torch.autograd.grad(loss, leaves)
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)
    leaves2 = [t.clone().requires_grad_() for t in (q, k, wq, wk)]
    loss2 = compiled(*leaves2)
    grads2 = torch.autograd.grad(loss2, leaves2)
    torch.testing.assert_close(loss2, loss, rtol=1e-5, atol=1e-3)
    for a, b in zip(grads2, grads):
        assert torch.equal(a, b)  # the same kernels on the same inputs


# ---------------------------------------------------------------- the CuTe forward

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("T,Hq,Hk,D", [(1, 32, 8, 128), (61, 32, 8, 128), (257, 16, 2, 64),
                                       (33, 8, 8, 256), (5, 4, 2, 96), (4096, 32, 8, 128)])
def test_cute_forward_equals_transformers_arithmetic(dtype, T, Hq, Hk, D):
    """The CuTe kernel (dispatch's ``cute``: it serves these rows) bit for bit on integer rows,
    and within a rounding here and there on random ones, rstd included."""
    from rmsnorm_lab import dispatch
    from rmsnorm_lab.cute.launch import qk_rope as cute_qk
    q, k, wq, wk, cos, sin = inputs(T, Hq, Hk, D, dtype)
    qi = torch.randint(-4, 5, q.shape, device="cuda").to(dtype)
    ki = torch.randint(-4, 5, k.shape, device="cuda").to(dtype)
    got = cute_qk.qk_norm_rope_forward(qi, ki, wq, wk, cos, sin, EPS, "llama", True, 132)
    expect = R.qk_norm_rope_forward(qi, ki, wq, wk, cos, sin, EPS, "llama")
    assert_bit_for_bit_where_rstd_agrees(got, expect)
    got = dispatch.qk_norm_rope_forward(q, k, wq, wk, cos, sin, EPS, "llama", "cute")
    expect = R.qk_norm_rope_forward(q, k, wq, wk, cos, sin, EPS, "llama")
    assert_within_a_rounding(got[:2], expect[:2])
    torch.testing.assert_close(got[2], expect[2], rtol=1e-5, atol=0)


def test_cute_forward_takes_batches_and_hands_views_to_triton(capture_on_side_stream):
    """(B, S, H, D) heads with cos and sin broadcast over the batch; q and k as views of a fused
    qkv projection (not rows of one stride) go to the Triton kernel, with the same values; the
    CuTe launch replays from a CUDA graph."""
    from rmsnorm_lab import qk_norm_rope
    q, k, wq, wk, cos, sin = inputs(128, 16, 4, 128, torch.bfloat16)
    q4, k4 = q.view(2, 64, 16, 128), k.view(2, 64, 4, 128)
    c3, s3 = cos[:64].unsqueeze(0), sin[:64].unsqueeze(0)  # one table for both sequences
    got = qk_norm_rope(q4, k4, wq, wk, c3, s3, EPS, backend="cute")
    expect = R.qk_norm_rope(q4, k4, wq, wk, c3.expand(2, 64, 128), s3.expand(2, 64, 128), EPS)
    for g, e in zip(got, expect):
        assert (g == e).float().mean().item() > 0.98
    qkv = torch.cat([q4.reshape(2, 64, -1), k4.reshape(2, 64, -1),
                     k4.reshape(2, 64, -1)], dim=-1)
    qv, kv = qkv[..., :2048].view(2, 64, 16, 128), qkv[..., 2048:2560].view(2, 64, 4, 128)
    views = qk_norm_rope(qv, kv, wq, wk, c3, s3, EPS, backend="cute")
    assert all(torch.equal(a, b) for a, b in zip(views, qk_norm_rope(
        qv.contiguous(), kv.contiguous(), wq, wk, c3, s3, EPS, backend="triton")))
    graph, out = capture_on_side_stream(
        lambda: qk_norm_rope(q4, k4, wq, wk, c3, s3, EPS, backend="cute"))
    for t in out:
        t.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(out, got))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("T,Hq,Hk,D", [(1024, 32, 8, 128), (7, 5, 3, 96), (33, 8, 2, 256),
                                       (1, 32, 8, 64)])
def test_cute_backward_against_float64_and_triton(dtype, T, Hq, Hk, D):
    """The CuTe backward (dx of q and k, both dW) within float64's tolerance, bitwise
    repeatable, and close to the Triton kernel's."""
    from rmsnorm_lab.cute.launch import qk_rope as cute_qk
    q, k, wq, wk, cos, sin = inputs(T, Hq, Hk, D, dtype)
    _, _, qr, kr = triton_qk_norm_rope_forward(q, k, wq, wk, cos, sin, EPS, "llama", True)
    dqo, dko = torch.randn_like(q), torch.randn_like(k)
    got = cute_qk.qk_norm_rope_backward(dqo, dko, q, k, wq, wk, cos, sin, qr, kr, "llama",
                                        True, 132)
    again = cute_qk.qk_norm_rope_backward(dqo, dko, q, k, wq, wk, cos, sin, qr, kr, "llama",
                                          True, 132)
    assert all(torch.equal(a, b) for a, b in zip(got, again))
    d64 = [t.double() for t in (dqo, dko, q, k, wq, wk)]
    _, _, qr64, kr64 = R.qk_norm_rope_forward(d64[2], d64[3], d64[4], d64[5], cos, sin, EPS,
                                              "llama")
    expect = R.qk_norm_rope_backward(*d64, cos.double(), sin.double(), qr64, kr64, "llama")
    triton = triton_qk_norm_rope_backward(dqo, dko, q, k, wq, wk, cos, sin, qr, kr, "llama")
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    for name, a, e, t in zip(("dq", "dk", "dwq", "dwk"), got, expect, triton):
        assert a.dtype == t.dtype and a.shape == t.shape, name
        assert float((a.double() - e).norm() / e.norm()) < tol, name
        assert float((a.double() - t.double()).norm() / e.norm()) < tol, name


def test_cute_training_step_through_the_op():
    """``qk_norm_rope`` on the cute backend trains (eager tape node) with the gradients of the
    triton backend's, within bf16's rounding."""
    from rmsnorm_lab import qk_norm_rope
    q, k, wq, wk, cos, sin = inputs(256, 16, 4, 128, torch.bfloat16)
    grads = {}
    for backend in ("cute", "triton"):
        leaves = [t.clone().requires_grad_() for t in (q, k, wq, wk)]
        qo, ko = qk_norm_rope(*leaves, cos, sin, EPS, backend=backend)
        (qo.float().square().sum() + ko.float().sum()).backward()
        grads[backend] = [t.grad for t in leaves]
    for a, b in zip(grads["cute"], grads["triton"]):
        assert float((a.double() - b.double()).norm() / b.double().norm()) < 1e-2
