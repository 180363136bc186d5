"""The fused residual add, ``rms_norm(x, w, residual=r) -> (y, h)``, on the CPU: the math
against float64 autograd, each output's gradient alone, the custom op and torch.compile, the
module, and bad arguments (tests/library/test_gpu_fused_add.py runs the CuTe and Triton kernels)."""

import pytest
import torch

from rmsnorm_lab import FusedAddRMSNorm, reference, rms_norm
from rmsnorm_lab import autograd as ag

EPS = 1e-6


def naive64(x, r, w, offset):
    h = x + r
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
    return (y * (offset + w) if w is not None else y), h


@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("with_weight", [True, False])
def test_values_and_gradients_match_float64_autograd(with_weight, offset):
    x, r = torch.randn(2, 5, 64), torch.randn(2, 5, 64)
    w = torch.randn(64) if with_weight else None
    leaves = [t.clone().requires_grad_() for t in (x, r)]
    wl = w.clone().requires_grad_() if w is not None else None
    y, h = rms_norm(leaves[0], wl, EPS, residual=leaves[1], offset=offset, casting_mode="gemma")
    dy, dh = torch.randn_like(y), torch.randn_like(h)
    torch.autograd.backward((y, h), (dy, dh))
    x64, r64 = (t.double().requires_grad_() for t in (x, r))
    w64 = w.double().requires_grad_() if w is not None else None
    y64, h64 = naive64(x64, r64, w64, offset)
    torch.autograd.backward((y64, h64), (dy.double(), dh.double()))
    torch.testing.assert_close(y.double(), y64, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h.double(), h64, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(leaves[0].grad.double(), x64.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(leaves[1].grad.double(), r64.grad, rtol=1e-5, atol=1e-5)
    if w is not None:
        torch.testing.assert_close(wl.grad.double(), w64.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_h_is_the_models_own_add_bit_for_bit(dtype):
    x, r = torch.randn(16, 128).to(dtype), torch.randn(16, 128).to(dtype)
    y, h = rms_norm(x, None, EPS, residual=r)
    assert torch.equal(h, x + r)
    assert torch.equal(y, reference.rms_norm(x + r, None, EPS))


def test_each_output_alone_gets_its_gradient():
    x, r = torch.randn(3, 32, requires_grad=True), torch.randn(3, 32, requires_grad=True)
    w = torch.randn(32, requires_grad=True)
    _, h = rms_norm(x, w, EPS, residual=r)
    h.sum().backward()  # y unused: x and r get h's gradient alone, w a zero one
    assert torch.equal(x.grad, torch.ones_like(x)) and torch.equal(r.grad, x.grad)
    assert w.grad is None or not w.grad.any()
    x.grad = r.grad = None
    y, _ = rms_norm(x, w, EPS, residual=r)
    y.sum().backward()  # h unused
    expect_x = torch.autograd.grad(reference.rms_norm(x + r, w, EPS).sum(), x)[0]
    torch.testing.assert_close(x.grad, expect_x)


def test_custom_op_and_compile_fullgraph():
    x, r, w = torch.randn(4, 64), torch.randn(4, 64), torch.randn(64)
    torch.library.opcheck(ag.fused_add_rms_norm_fwd, (x, r, w, EPS, 0.0, "llama", "torch"))
    dy, dh = torch.randn(4, 64), torch.randn(4, 64)
    h = x + r
    rstd = reference.rstd_of(h, EPS)
    torch.library.opcheck(ag.rms_norm_bwd, (dy, h, w, rstd, 0.0, "llama", "torch", dh))

    def step(a, b, weight):
        y, hh = rms_norm(a, weight, EPS, residual=b, backend="torch")
        return (y * 2 + hh).sum()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    leaves = [t.clone().requires_grad_() for t in (x, r, w)]
    compiled(*leaves).backward()
    ref_leaves = [t.clone().requires_grad_() for t in (x, r, w)]
    step(*ref_leaves).backward()
    for a, b in zip(leaves, ref_leaves):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-5)


def test_module_and_its_state_dict():
    m = FusedAddRMSNorm(16, eps=1e-5, offset=1.0, casting_mode="gemma")
    assert list(m.state_dict()) == ["weight"]
    x, r = torch.randn(2, 16), torch.randn(2, 16)
    y, h = m(x, r)
    torch.testing.assert_close(y, reference.rms_norm(x + r, m.weight.detach(), 1e-5, 1.0,
                                                     "gemma"))


def test_bad_residuals_are_refused_by_name():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="residual must match x"):
        rms_norm(x, None, residual=torch.randn(2, 9))
    with pytest.raises(ValueError, match="residual must match x"):
        rms_norm(x, None, residual=torch.randn(2, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="in_place=True is not available with a residual"):
        rms_norm(x, None, residual=torch.randn(2, 8), in_place=True)
    with pytest.raises(TypeError, match="residual must be a torch.Tensor"):
        rms_norm(x, None, residual=3.0)
