"""Autograd of ``rms_norm`` with the CuTe and Triton kernels on a GPU (``pytest -m gpu``)."""

import pytest
import torch

from grad_helpers import DTYPES, EPS, MODES, fresh, grads, naive64  # noqa: F401
from rmsnorm_lab import autograd as ag  # noqa: F401
from rmsnorm_lab import dispatch, reference, rms_norm, settings  # noqa: F401


# ------------------------------------------------------------------ GPU: CuTe and Triton

GPU_BACKENDS = ["cute", "triton"]
GPU_SHAPES = [(1, 1), (1, 4096), (3, 1023), (127, 4096), (2, 7, 1024), (1000, 8192)]
# dx is compared with the reference's backward on the same inputs (same rounding points), dw
# too: they differ by fp32 summation order only (dw also by its order over rows).
DX_REL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}
DW_REL = {torch.float32: 1e-4, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def rel_err(got, expect, scale=None):
    """Relative norm error; ``scale`` floors the denominator where the result is a small
    difference of larger terms (dx of a 1-wide row is ~0: rstd * m * (1 - x_hat**2))."""
    got, expect = got.double(), expect.double()
    denom = expect.norm() if scale is None else torch.maximum(expect.norm(), scale)
    return ((got - expect).norm() / denom.clamp_min(1e-30)).item()


def cuda_case(shape, dtype, with_weight):
    x = fresh(shape, dtype, "cuda")
    w = fresh(shape[-1:], dtype, "cuda") if with_weight else None
    dy = fresh(shape, dtype, "cuda")
    return x, w, dy


def check_against_reference(x, w, dy, y, dx, dw, offset, mode):
    y_ref, rstd = reference.rms_norm_forward(x, w, EPS, offset, mode)
    dx_ref, dw_ref = reference.rms_norm_backward(dy, x, w, rstd, offset, mode)
    assert y.dtype == x.dtype and dx.dtype == x.dtype and dx.shape == x.shape
    assert not torch.isnan(dx).any() and not torch.isnan(y).any()
    assert rel_err(y, y_ref) <= DX_REL[x.dtype]
    ws = (w.double() + offset) if w is not None else 1.0
    terms = (dy.double() * ws * rstd.double().unsqueeze(-1)).norm()  # size of rstd * m
    err = rel_err(dx, dx_ref, terms)
    assert err <= DX_REL[x.dtype], f"dx rel err {err:.3g}"
    if w is None:
        assert dw is None
    else:
        assert dw.dtype == w.dtype and dw.shape == w.shape
        assert rel_err(dw, dw_ref) <= DW_REL[w.dtype], f"dw rel err {rel_err(dw, dw_ref):.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gpu_grads_match_reference(backend, dtype, mode, shape):
    for with_weight, offset in ((True, 0.0), (True, 1.0), (False, 0.0)):
        x, w, dy = cuda_case(shape, dtype, with_weight)
        y, dx, dw = grads(x, w, dy, offset=offset, casting_mode=mode, backend=backend)
        torch.cuda.synchronize()
        check_against_reference(x, w, dy, y, dx, dw, offset, mode)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["fused", "split", "auto"])
def test_gpu_cute_backward_modes(mode):
    x, w, dy = cuda_case((300, 4096), torch.bfloat16, True)
    with settings.override(backward=mode):
        y, dx, dw = grads(x, w, dy, backend="cute")
    check_against_reference(x, w, dy, y, dx, dw, 0.0, "torch")  # rms_norm's default


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("compile_backend", ["aot_eager", "inductor"])
@pytest.mark.usefixtures("kernels_under_compile")
def test_gpu_compile_fullgraph_parity(backend, compile_backend):
    torch._dynamo.reset()
    x, w, dy = cuda_case((64, 2048), torch.bfloat16, True)

    def f(a, b):
        return rms_norm(a, b, EPS, offset=1.0, backend=backend)

    compiled = torch.compile(f, fullgraph=True, backend=compile_backend)
    y, dx, dw = grads(x, w, dy, offset=1.0, backend=backend)
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    yc = compiled(xc, wc)
    yc.backward(dy)
    torch.testing.assert_close(yc, y, rtol=0, atol=0)
    torch.testing.assert_close(xc.grad, dx, rtol=0, atol=0)
    torch.testing.assert_close(wc.grad, dw, rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, w), y, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_gpu_cuda_graph_forward_backward_on_side_stream(backend):
    shape, dtype = (512, 4096), torch.bfloat16
    x = fresh(shape, dtype, "cuda", requires_grad=True)
    w = fresh(shape[-1:], dtype, "cuda", requires_grad=True)
    dy = fresh(shape, dtype, "cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (compile, caches) off the default stream
        for _ in range(2):
            rms_norm(x, w, EPS, backend=backend).backward(dy)
    torch.cuda.current_stream().wait_stream(side)
    x.grad = w.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # captures on a side stream of its own
        y = rms_norm(x, w, EPS, backend=backend)
        y.backward(dy)
    for _ in range(2):
        with torch.no_grad():
            x.copy_(fresh(shape, dtype, "cuda"))
            w.copy_(fresh(shape[-1:], dtype, "cuda"))
            dy.copy_(fresh(shape, dtype, "cuda"))
        graph.replay()
        torch.cuda.synchronize()
        check_against_reference(x.detach(), w.detach(), dy, y.detach(), x.grad, w.grad,
                                0.0, "torch")  # rms_norm's default


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_weight", [True, False])
def test_gpu_in_place(backend, dtype, with_weight):
    x, w, dy = cuda_case((257, 4096), dtype, with_weight)
    _, dx_ref, dw_ref = grads(x, w, dy, backend=backend)
    xr = x.clone().requires_grad_()
    wr = w.clone().requires_grad_() if w is not None else None
    y = rms_norm(xr, wr, EPS, backend=backend, in_place=True)
    g = dy.clone()
    out = torch.autograd.grad(y, (xr, wr) if wr is not None else (xr,), g)
    torch.cuda.synchronize()
    assert out[0].data_ptr() == g.data_ptr()
    torch.testing.assert_close(out[0], dx_ref, rtol=0, atol=0)
    if with_weight:
        torch.testing.assert_close(out[1], dw_ref, rtol=0, atol=0)
    with pytest.raises(ValueError, match="in_place=True"):
        rms_norm(xr, wr, EPS, backend=backend, in_place=True).sum().backward()


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_gpu_module_matches_torch_rmsnorm(backend):
    from rmsnorm_lab import RMSNorm
    x = fresh((64, 1024), torch.float32, "cuda")
    ours = RMSNorm(1024, eps=1e-6, device="cuda", backend=backend)
    theirs = torch.nn.RMSNorm(1024, eps=1e-6, device="cuda")
    with torch.no_grad():
        ours.weight.normal_()
        theirs.weight.copy_(ours.weight)
    xo, xt = x.clone().requires_grad_(), x.clone().requires_grad_()
    yo, yt = ours(xo), theirs(xt)
    dy = torch.randn_like(yo)
    yo.backward(dy)
    yt.backward(dy)
    torch.testing.assert_close(yo, yt, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xo.grad, xt.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ours.weight.grad, theirs.weight.grad, rtol=1e-4, atol=1e-3)
