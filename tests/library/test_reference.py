"""The oracle against float64 autograd, and its rounding points."""

import pytest
import torch

from rmsnorm_lab import reference as ref

MODES = ref.CASTING_MODES


def naive_forward_f64(x, w, eps, offset):
    x = x.double()
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    y = x * rstd
    return y * (offset + w.double()) if w is not None else y


def fresh(shape, dtype=torch.float32, seed=None):
    g = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2**31)
    return torch.randn(shape, generator=g, dtype=torch.float32).to(dtype)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("with_weight", [True, False])
@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (8, 1023), (2, 5, 64)])
def test_forward_fp32_matches_float64(mode, with_weight, offset, shape):
    x = fresh(shape)
    w = fresh(shape[-1:]) if with_weight else None
    y, rstd = ref.rms_norm_forward(x, w, 1e-6, offset, mode)
    expect = naive_forward_f64(x, w, 1e-6, offset if with_weight else 0.0)
    assert y.dtype == torch.float32 and rstd.dtype == torch.float32
    assert rstd.shape == shape[:-1]
    torch.testing.assert_close(y.double(), expect, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("with_weight", [True, False])
@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("shape", [(1, 7), (5, 33), (2, 3, 128)])
def test_backward_matches_float64_autograd(mode, with_weight, offset, shape):
    x = fresh(shape)
    w = fresh(shape[-1:]) if with_weight else None
    dy = fresh(shape)
    y, rstd = ref.rms_norm_forward(x, w, 1e-6, offset, mode)
    dx, dw = ref.rms_norm_backward(dy, x, w, rstd, offset, mode)

    x64 = x.double().requires_grad_()
    w64 = w.double().requires_grad_() if w is not None else None
    naive_forward_f64(x64, w64, 1e-6, offset if w is not None else 0.0).backward(dy.double())
    torch.testing.assert_close(dx.double(), x64.grad, rtol=1e-4, atol=1e-5)
    if w is None:
        assert dw is None
    else:
        torch.testing.assert_close(dw.double(), w64.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", MODES)
def test_low_precision_close_to_float64(dtype, mode):
    x = fresh((64, 512), dtype)
    w = fresh((512,), dtype)
    y, rstd = ref.rms_norm_forward(x, w, 1e-6, 0.0, mode)
    assert y.dtype == dtype and rstd.dtype == torch.float32
    expect = naive_forward_f64(x, w, 1e-6, 0.0)
    rel = (y.double() - expect).norm() / expect.norm()
    assert rel < 1e-2


def test_rounding_points_differ_between_modes():
    # bf16 has 8 mantissa bits: the modes round at different points, so they must disagree
    # somewhere on random data, and gemma (one rounding) must be the closest to float64.
    x = fresh((256, 1024), torch.bfloat16)
    w = fresh((1024,), torch.bfloat16)
    ys = {m: ref.rms_norm_forward(x, w, 1e-6, 0.5, m)[0] for m in MODES}
    assert not torch.equal(ys["llama"], ys["gemma"])
    assert not torch.equal(ys["none"], ys["llama"])
    expect = naive_forward_f64(x, w, 1e-6, 0.5)
    err = {m: (y.double() - expect).norm().item() for m, y in ys.items()}
    assert err["gemma"] < err["llama"] < err["none"]


def test_llama_rounds_normalized_x_before_weight():
    x = fresh((16, 256), torch.bfloat16)
    w = fresh((256,), torch.float32)
    y, rstd = ref.rms_norm_forward(x, w, 1e-6, 0.0, "llama")
    x_hat = (x.float() * rstd[:, None]).to(torch.bfloat16)
    assert torch.equal(y, (x_hat.float() * w).to(torch.bfloat16))


def test_weightless_ignores_offset_and_has_no_dw():
    x = fresh((4, 64))
    y0, _ = ref.rms_norm_forward(x, None, 1e-6, 0.0)
    y1, _ = ref.rms_norm_forward(x, None, 1e-6, 3.0)
    assert torch.equal(y0, y1)


def test_nan_and_inf_propagate_per_row():
    x = fresh((3, 32))
    x[1, 5] = float("nan")
    x[2, 0] = float("inf")
    y, _ = ref.rms_norm_forward(x, None)
    assert torch.isfinite(y[0]).all()
    assert torch.isnan(y[1]).all()
    assert not torch.isfinite(y[2]).all()


def test_bad_casting_mode_is_named():
    with pytest.raises(ValueError, match="casting_mode"):
        ref.rms_norm_forward(torch.ones(2, 4), None, casting_mode="fp8")


def test_a_given_rstd_is_applied_as_is_and_none_mode_rounds_it_first():
    """``rstd=``: the rows' rstd to apply (a kernel's, whose products a test checks alone). In
    "none" mode rstd is rounded to x's dtype first, so two fp32 rstd values either side of a
    rounding point of that dtype move most of the row by an ulp: why the kernels' tests of that
    mode pass their own rstd."""
    x = fresh((1, 1024), torch.float16, seed=0)
    y, r = ref.rms_norm_forward(x, None, 1e-6, 0.0, "none")
    assert torch.equal(ref.rms_norm_forward(x, None, 1e-6, 0.0, "none", rstd=r)[0], y)
    r16 = r.to(torch.float16).float()
    up = torch.nextafter(r.to(torch.float16), torch.tensor(float("inf"), dtype=torch.float16))
    mid = (r16 + up.float()) / 2  # exact in fp32: a tie of fp16's rounding
    below, above = (torch.nextafter(mid, mid + s) for s in (-1.0, 1.0))
    y_below, y_above = (ref.rms_norm_forward(x, None, 1e-6, 0.0, "none", rstd=v)[0]
                        for v in (below, above))
    assert (y_below != y_above).float().mean() > 0.5
