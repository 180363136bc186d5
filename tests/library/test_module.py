"""``rmsnorm_lab.RMSNorm`` against ``torch.nn.RMSNorm`` on the CPU (backend torch)."""

import pytest
import torch

from rmsnorm_lab import FusedAddRMSNorm, RMSNorm, reference, settings
from rmsnorm_lab.module import DEFAULT_EPS


def pair(n, eps=None, affine=True, dtype=None, **kw):
    torch.manual_seed(0)
    ours = RMSNorm(n, eps=eps, elementwise_affine=affine, dtype=dtype, backend="torch", **kw)
    theirs = torch.nn.RMSNorm(n, eps=eps, elementwise_affine=affine, dtype=dtype)
    if affine:
        with torch.no_grad():
            ours.weight.normal_()
            theirs.weight.copy_(ours.weight)
    return ours, theirs


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("eps", [None, 1e-6, 1e-2])
@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (2, 5, 64)])
def test_matches_torch_rmsnorm_fp32(shape, eps, affine):
    n = shape[-1]
    ours, theirs = pair(n, eps, affine)
    x = torch.randn(shape)
    dy = torch.randn(shape)
    xo, xt = x.clone().requires_grad_(), x.clone().requires_grad_()
    yo, yt = ours(xo), theirs(xt)
    torch.testing.assert_close(yo, yt, rtol=1e-5, atol=1e-5)
    yo.backward(dy)
    yt.backward(dy)
    torch.testing.assert_close(xo.grad, xt.grad, rtol=1e-4, atol=1e-4)
    if affine:
        torch.testing.assert_close(ours.weight.grad, theirs.weight.grad, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_eps_none_is_fp32_epsilon_for_half_types(dtype):
    # torch computes the statistics of half inputs in fp32 and takes fp32's epsilon for None;
    # tiny inputs make eps dominate, so a half-type epsilon would be obvious here.
    assert DEFAULT_EPS == torch.finfo(torch.float32).eps
    x = torch.full((2, 8), 1e-4).to(dtype)
    ours, theirs = pair(8, None, affine=False, dtype=dtype)
    torch.testing.assert_close(ours(x).float(), theirs(x).float(), rtol=1e-2, atol=1e-2)
    expect = reference.rms_norm(x, None, torch.finfo(torch.float32).eps)
    torch.testing.assert_close(ours(x), expect, rtol=0, atol=0)


def test_defaults_and_parameters_like_torch():
    ours, theirs = RMSNorm(32), torch.nn.RMSNorm(32)
    assert ours.normalized_shape == theirs.normalized_shape == (32,)
    assert ours.eps is None and ours.elementwise_affine
    assert torch.equal(ours.weight, torch.ones(32)) and ours.weight.requires_grad
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert RMSNorm(torch.Size([32])).normalized_shape == (32,)
    assert RMSNorm([32]).normalized_shape == (32,)
    assert RMSNorm(8, elementwise_affine=False).weight is None
    m = RMSNorm(8, dtype=torch.bfloat16)
    assert m.weight.dtype == torch.bfloat16
    # weight starts at ones also with an offset (scale offset + 1 until weights are loaded)
    assert torch.equal(RMSNorm(8, offset=1.0).weight, torch.ones(8))


def test_loads_a_torch_state_dict_and_back():
    theirs = torch.nn.RMSNorm(48, eps=1e-5)
    with torch.no_grad():
        theirs.weight.normal_()
    ours = RMSNorm(48, eps=1e-5, backend="torch")
    ours.load_state_dict(theirs.state_dict())
    assert torch.equal(ours.weight, theirs.weight)
    x = torch.randn(4, 48)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)
    back = torch.nn.RMSNorm(48, eps=1e-5)
    back.load_state_dict(ours.state_dict())
    assert torch.equal(back.weight, theirs.weight)
    assert set(ours.state_dict()) == set(theirs.state_dict()) == {"weight"}


def test_multi_dim_normalized_shape_is_refused():
    with pytest.raises(ValueError, match="only the last dimension"):
        RMSNorm((4, 8))
    with pytest.raises(ValueError, match="only the last dimension"):
        RMSNorm(torch.Size([2, 3, 4]))
    with pytest.raises(ValueError, match="only the last dimension"):
        RMSNorm(())


def test_bad_arguments():
    with pytest.raises(ValueError, match="casting_mode"):
        RMSNorm(8, casting_mode="fp8")
    with pytest.raises(ValueError, match="backend"):
        RMSNorm(8, backend="numpy")
    m = RMSNorm(8, backend="torch")
    with pytest.raises(ValueError, match="last dimension must be 8"):
        m(torch.randn(2, 9))


def test_lab_options_reach_rms_norm():
    torch.manual_seed(0)
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    m = RMSNorm(16, eps=1e-6, dtype=torch.bfloat16, offset=1.0, casting_mode="gemma",
                backend="torch")
    with torch.no_grad():
        m.weight.normal_()
    expect = reference.rms_norm(x, m.weight.detach(), 1e-6, 1.0, "gemma")
    with torch.no_grad():
        torch.testing.assert_close(m(x), expect, rtol=0, atol=0)


def test_backend_none_follows_settings():
    m = RMSNorm(8)
    assert m.backend is None
    with settings.override(backend="torch"):
        y = m(torch.randn(2, 8))
    assert y.shape == (2, 8)


def test_in_place_module_gradients():
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 4)
    x = torch.randn(5, 16)
    grads = []
    for in_place in (False, True):
        m = RMSNorm(16, backend="torch", in_place=in_place)
        xr = x.clone().requires_grad_()
        lin(m(xr)).square().sum().backward()
        grads.append((xr.grad, m.weight.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=0, atol=0)
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=0, atol=0)


def test_extra_repr():
    assert repr(RMSNorm(32)) == repr(torch.nn.RMSNorm(32))
    r = repr(RMSNorm(32, eps=1e-6, offset=1.0, casting_mode="gemma", backend="triton",
                     in_place=True))
    assert r == ("RMSNorm((32,), eps=1e-06, elementwise_affine=True, offset=1.0, "
                 "casting_mode='gemma', backend='triton', in_place=True)")


# --- rounding as the module it replaces ------------------------------------------------------

@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("eps", [None, 1e-6])
@pytest.mark.parametrize("w_dtype", ["same", torch.float32], ids=["same weight", "fp32 weight"])
def test_the_default_rounds_as_torch_rmsnorm_bit_for_bit(dtype, eps, w_dtype):
    """The drop-in's default is torch's rounding (fp32 throughout, one cast), not Llama's (x *
    rstd rounded before the weight multiply, one ulp off in about a quarter of the outputs)."""
    w_dtype = dtype if w_dtype == "same" else w_dtype
    torch.manual_seed(0)
    ours = RMSNorm(512, eps=eps, dtype=w_dtype)
    theirs = torch.nn.RMSNorm(512, eps=eps, dtype=w_dtype)
    with torch.no_grad():
        ours.weight.normal_()
        theirs.weight.copy_(ours.weight)
    x = torch.randn(64, 512).to(dtype)
    with torch.no_grad():
        assert torch.equal(ours(x), theirs(x))
        r = torch.randn_like(x)
        fused = FusedAddRMSNorm(512, eps=eps, dtype=w_dtype)
        fused.load_state_dict(theirs.state_dict())
        y, h = fused(x, r)
        assert torch.equal(h, x + r) and torch.equal(y, theirs(x + r))
    assert ours.casting_mode == "torch" and ours._casting_mode == "gemma"


def test_the_torch_mode_is_gemmas_arithmetic_under_its_own_name_everywhere(monkeypatch):
    from rmsnorm_lab import CASTING_MODE_NAMES, CASTING_MODES, api, dispatch, rms_norm
    assert CASTING_MODES == ("llama", "gemma", "none") and "torch" in CASTING_MODE_NAMES
    assert reference.check_casting_mode("torch") == "gemma"
    x, w = torch.randn(8, 64).to(torch.bfloat16), torch.randn(64).to(torch.bfloat16)
    gemma = reference.rms_norm(x, w, 1e-6, 0.5, "gemma")
    assert torch.equal(reference.rms_norm(x, w, 1e-6, 0.5, "torch"), gemma)
    assert not torch.equal(reference.rms_norm(x, w, 1e-6, 0.5, "llama"), gemma)
    assert torch.equal(rms_norm(x, w, 1e-6, offset=0.5, casting_mode="torch"), gemma)
    seen = []  # the mode the backends are handed: the one the kernels and compile keys know
    real = dispatch.forward

    def spy(*args, **kwargs):
        seen.append(args[4])
        return real(*args, **kwargs)
    monkeypatch.setattr(dispatch, "forward", spy)
    rms_norm(x, w)
    rms_norm(x.requires_grad_(), w)
    RMSNorm(64, casting_mode="torch")(x)
    assert seen == ["gemma"] * 3
    with pytest.raises(ValueError, match="'llama', 'gemma', 'none', 'torch'"):
        api.validate(x, w, "fp32", "torch")


def test_casting_mode_is_the_name_given_and_can_be_changed():
    m = RMSNorm(8, casting_mode="llama")
    assert m.casting_mode == "llama" and "casting_mode='llama'" in repr(m)
    m.casting_mode = "torch"
    assert m._casting_mode == "gemma" and repr(m) == repr(torch.nn.RMSNorm(8))
    with pytest.raises(ValueError, match="casting_mode"):
        m.casting_mode = "fp8"


def test_help_shows_the_lab_s_own_docstrings():
    import pydoc
    for cls in (RMSNorm, FusedAddRMSNorm):
        text = pydoc.render_doc(cls)
        assert "Base class for all neural network modules" not in text
        for word in ("normalized_shape", "eps", "casting_mode", "offset", "backend",
                     "torch.nn.RMSNorm"):
            assert word in cls.__doc__, (cls.__name__, word)
    assert "residual" in FusedAddRMSNorm.__doc__
    assert "bit for bit" in RMSNorm.__doc__ and "only the last dimension" in RMSNorm.__doc__
    assert "Define the computation" not in pydoc.render_doc(RMSNorm.forward)
