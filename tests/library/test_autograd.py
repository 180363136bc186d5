"""Autograd of ``rms_norm`` on the CPU: the eager Function, the custom ops, torch.compile,
in_place, with ``backend="torch"`` (the reference behind the same autograd wrappers);
tests/library/test_gpu_autograd.py runs the CuTe and Triton kernels (``pytest -m gpu``).
"""

import pytest
import torch

from grad_helpers import DTYPES, EPS, MODES, fresh, grads, naive64  # noqa: F401
from rmsnorm_lab import autograd as ag
from rmsnorm_lab import RMSNorm, dispatch, reference, rms_norm, settings

SHAPES = [(1, 1), (3, 17), (2, 5, 64)]


# ------------------------------------------------------------------ eager, CPU (backend torch)

@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("with_weight", [True, False])
@pytest.mark.parametrize("mode", MODES)
def test_grads_match_float64_autograd(mode, with_weight, offset, shape):
    x = fresh(shape)
    w = fresh(shape[-1:]) if with_weight else None
    dy = fresh(shape)
    y, dx, dw = grads(x, w, dy, offset=offset, casting_mode=mode, backend="torch")
    x64 = x.double().requires_grad_()
    w64 = w.double().requires_grad_() if w is not None else None
    y64 = naive64(x64, w64, EPS, offset)
    y64.backward(dy.double())
    torch.testing.assert_close(y.double(), y64.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dx.double(), x64.grad, rtol=1e-4, atol=1e-4)
    if with_weight:
        torch.testing.assert_close(dw.double(), w64.grad, rtol=1e-4, atol=1e-4)
    else:
        assert dw is None


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("with_weight", [True, False])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_grads_match_reference_backward(dtype, mode, with_weight, shape):
    x = fresh(shape, dtype)
    w = fresh(shape[-1:], dtype) if with_weight else None
    dy = fresh(shape, dtype)
    y, dx, dw = grads(x, w, dy, offset=1.0, casting_mode=mode, backend="torch")
    y_ref, rstd = reference.rms_norm_forward(x, w, EPS, 1.0, mode)
    dx_ref, dw_ref = reference.rms_norm_backward(dy, x, w, rstd, 1.0, mode)
    assert y.dtype == dtype and dx.dtype == dtype and dx.shape == x.shape
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
    torch.testing.assert_close(dx, dx_ref, rtol=0, atol=0)
    if with_weight:
        assert dw.dtype == w.dtype
        torch.testing.assert_close(dw, dw_ref, rtol=0, atol=0)


def test_mixed_weight_dtype_grads():
    x, w, dy = fresh((4, 96), torch.bfloat16), fresh((96,)), fresh((4, 96), torch.bfloat16)
    _, dx, dw = grads(x, w, dy, backend="torch", casting_mode="llama")
    rstd = reference.rstd_of(x, EPS)
    dx_ref, dw_ref = reference.rms_norm_backward(dy, x, w, rstd, 0.0, "llama")
    assert dx.dtype == torch.bfloat16 and dw.dtype == torch.float32
    torch.testing.assert_close(dx, dx_ref, rtol=0, atol=0)
    torch.testing.assert_close(dw, dw_ref, rtol=0, atol=0)


def test_only_weight_or_only_x_requires_grad():
    x, w, dy = fresh((3, 16)), fresh((16,)), fresh((3, 16))
    _, dx_ref, dw_ref = grads(x, w, dy, backend="torch")
    wr = w.clone().requires_grad_()
    rms_norm(x, wr, EPS, backend="torch").backward(dy)
    torch.testing.assert_close(wr.grad, dw_ref, rtol=0, atol=0)
    xr = x.clone().requires_grad_()
    rms_norm(xr, w, EPS, backend="torch").backward(dy)
    torch.testing.assert_close(xr.grad, dx_ref, rtol=0, atol=0)


def test_inference_path_records_nothing():
    x, w = fresh((3, 16)), fresh((16,))
    assert rms_norm(x, w, backend="torch").grad_fn is None
    xr = x.clone().requires_grad_()
    with torch.no_grad():
        y = rms_norm(xr, w, backend="torch")
    assert y.grad_fn is None and not y.requires_grad
    y_grad = rms_norm(xr, w, backend="torch")
    assert isinstance(y_grad.grad_fn, torch.autograd.function.BackwardCFunction)
    torch.testing.assert_close(y_grad.detach(), y, rtol=0, atol=0)


def test_expanded_incoming_gradient():
    # The gradient of y.sum() is a stride-0 expanded tensor: copied into rows, not refused.
    x, w = fresh((4, 24), requires_grad=True), fresh((24,), requires_grad=True)
    rms_norm(x, w, backend="torch").sum().backward()
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    rms_norm(x2, w2, backend="torch").backward(torch.ones(4, 24))
    torch.testing.assert_close(x.grad, x2.grad, rtol=0, atol=0)
    torch.testing.assert_close(w.grad, w2.grad, rtol=0, atol=0)


def test_empty_input_is_differentiable():
    x, w = torch.empty((0, 8), requires_grad=True), fresh((8,), requires_grad=True)
    y = rms_norm(x, w, backend="torch")
    assert y.shape == (0, 8) and y.requires_grad
    y.sum().backward()
    assert x.grad.shape == (0, 8) and torch.equal(w.grad, torch.zeros(8))


def test_grad_flows_through_settings_backend():
    x, dy = fresh((2, 8)), fresh((2, 8))
    with settings.override(backend="torch"):
        _, dx, _ = grads(x, None, dy)
    _, dx_ref, _ = grads(x, None, dy, backend="torch")
    torch.testing.assert_close(dx, dx_ref, rtol=0, atol=0)


def test_double_backward_is_refused_clearly():
    x = fresh((3, 8), requires_grad=True)
    y = rms_norm(x, None, backend="torch")
    with pytest.raises(RuntimeError, match="no double backward"):
        torch.autograd.grad(y, x, fresh((3, 8)), create_graph=True)


# ------------------------------------------------------------------ the custom ops

@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("with_weight", [True, False])
@pytest.mark.parametrize("mode", MODES)
def test_opcheck_forward(mode, with_weight, requires_grad):
    x = fresh((2, 3, 32), requires_grad=requires_grad)
    w = fresh((32,), requires_grad=requires_grad) if with_weight else None
    torch.library.opcheck(ag.rms_norm_fwd, (x, w, EPS, 0.5, mode, "torch", False))


@pytest.mark.parametrize("with_weight", [True, False])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_opcheck_backward_ops(dtype, with_weight):
    x, dy = fresh((5, 48), dtype), fresh((5, 48), dtype)
    w = fresh((48,), dtype) if with_weight else None
    rstd = reference.rstd_of(x, EPS)
    torch.library.opcheck(ag.rms_norm_bwd, (dy, x, w, rstd, 1.0, "llama", "torch"))
    torch.library.opcheck(ag.rms_norm_bwd_inplace, (dy.clone(), x, w, rstd, 1.0, "llama",
                                                    "torch"))


@pytest.mark.parametrize("with_weight", [True, False])
def test_backward_op_results(with_weight):
    x, dy = fresh((5, 48)), fresh((5, 48))
    w = fresh((48,)) if with_weight else None
    rstd = reference.rstd_of(x, EPS)
    dx_ref, dw_ref = reference.rms_norm_backward(dy, x, w, rstd, 1.0, "none")
    dx, dw = ag.rms_norm_bwd(dy, x, w, rstd, 1.0, "none", "torch")
    torch.testing.assert_close(dx, dx_ref, rtol=0, atol=0)
    if with_weight:
        torch.testing.assert_close(dw, dw_ref, rtol=0, atol=0)
    else:
        assert dw.numel() == 0  # custom ops cannot return None: an empty dw stands for it
    dy_buf = dy.clone()
    dw2 = ag.rms_norm_bwd_inplace(dy_buf, x, w, rstd, 1.0, "none", "torch")
    torch.testing.assert_close(dy_buf, dx_ref, rtol=0, atol=0)
    if with_weight:
        torch.testing.assert_close(dw2, dw_ref, rtol=0, atol=0)


@pytest.mark.parametrize("with_weight", [True, False])
def test_custom_op_autograd_matches_eager_function(with_weight):
    x, dy = fresh((3, 4, 40)), fresh((3, 4, 40))
    w = fresh((40,)) if with_weight else None
    _, dx_ref, dw_ref = grads(x, w, dy, offset=1.0, casting_mode="gemma", backend="torch")
    xr = x.clone().requires_grad_()
    wr = w.clone().requires_grad_() if w is not None else None
    y, rstd = ag.rms_norm_fwd(xr, wr, EPS, 1.0, "gemma", "torch", False)
    assert not rstd.requires_grad and rstd.dtype == torch.float32 and rstd.shape == (3, 4)
    y.backward(dy)
    torch.testing.assert_close(xr.grad, dx_ref, rtol=0, atol=0)
    if with_weight:
        torch.testing.assert_close(wr.grad, dw_ref, rtol=0, atol=0)


def test_launch_backward_torch_backend_and_dx_out():
    x, dy, w = fresh((2, 3, 16)), fresh((2, 3, 16)), fresh((16,))
    rstd = reference.rstd_of(x, EPS)
    dx, dw = dispatch.backward(dy, x, w, rstd, 0.0, "llama", "torch")
    dx_ref, dw_ref = reference.rms_norm_backward(dy, x, w, rstd, 0.0, "llama")
    assert dx.shape == x.shape and dx.is_contiguous()
    torch.testing.assert_close(dx, dx_ref, rtol=0, atol=0)
    torch.testing.assert_close(dw, dw_ref, rtol=0, atol=0)
    buf = dy.clone()
    dx2, _ = dispatch.backward(buf, x, w, rstd, 0.0, "llama", "torch", dx_out=buf)
    assert dx2 is buf
    torch.testing.assert_close(buf, dx_ref, rtol=0, atol=0)
    with pytest.raises(ValueError, match="backend"):
        dispatch.backward(dy, x, w, rstd, 0.0, "llama", "numpy")


# ------------------------------------------------------------------ torch.compile (CPU)

def _compile_capture(fn):
    """torch.compile(fullgraph=True) through AOTAutograd, keeping the forward/backward graphs."""
    from torch._dynamo.backends.common import aot_autograd
    from functorch.compile import make_boxed_func

    graphs = {}

    def keep(kind):
        def compiler(gm, example_inputs):
            graphs[kind] = [n.target for n in gm.graph.nodes if n.op == "call_function"]
            return make_boxed_func(gm.forward)
        return compiler

    backend = aot_autograd(fw_compiler=keep("fw"), bw_compiler=keep("bw"))
    return torch.compile(fn, fullgraph=True, backend=backend), graphs


def _names(targets):
    return {str(t) for t in targets}


@pytest.mark.parametrize("with_weight", [True, False])
@pytest.mark.parametrize("compile_backend", ["eager", "aot_eager"])
@pytest.mark.usefixtures("kernels_under_compile")
def test_compile_fullgraph_parity(compile_backend, with_weight):
    torch._dynamo.reset()

    def f(x, w):
        return rms_norm(x, w, EPS, offset=1.0, casting_mode="llama", backend="torch") * 3.0

    compiled = torch.compile(f, fullgraph=True, backend=compile_backend)
    x, dy = fresh((4, 8, 32)), fresh((4, 8, 32))
    w = fresh((32,)) if with_weight else None
    xc = x.clone().requires_grad_()
    wc = w.clone().requires_grad_() if w is not None else None
    y = compiled(xc, wc)
    y.backward(dy)
    xe = x.clone().requires_grad_()
    we = w.clone().requires_grad_() if w is not None else None
    ye = f(xe, we)
    ye.backward(dy)
    torch.testing.assert_close(y, ye, rtol=0, atol=0)
    torch.testing.assert_close(xc.grad, xe.grad, rtol=0, atol=0)
    if with_weight:
        torch.testing.assert_close(wc.grad, we.grad, rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, w), f(x, w), rtol=0, atol=0)


@pytest.mark.usefixtures("kernels_under_compile")
def test_compile_dynamic_shapes():
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b: rms_norm(a, b, EPS, backend="torch"),
                             fullgraph=True, backend="aot_eager", dynamic=True)
    for m in (3, 5, 9):
        x, w, dy = fresh((m, 16)), fresh((16,)), fresh((m, 16))
        xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
        compiled(xc, wc).backward(dy)
        _, dx, dw = grads(x, w, dy, backend="torch")
        torch.testing.assert_close(xc.grad, dx, rtol=0, atol=0)
        torch.testing.assert_close(wc.grad, dw, rtol=0, atol=0)


@pytest.mark.usefixtures("kernels_under_compile")
def test_compile_records_the_custom_ops():
    torch._dynamo.reset()
    lin = torch.nn.Linear(32, 8)

    def f(x, w):
        return lin(rms_norm(x, w, EPS, backend="torch"))

    compiled, graphs = _compile_capture(f)
    x, w = fresh((6, 32), requires_grad=True), fresh((32,), requires_grad=True)
    compiled(x, w).sum().backward()
    assert "rmsnorm_lab.rms_norm_fwd.default" in _names(graphs["fw"])
    assert "rmsnorm_lab.rms_norm_bwd.default" in _names(graphs["bw"])


@pytest.mark.usefixtures("kernels_under_compile")
def test_compile_module_in_a_model():
    torch._dynamo.reset()
    from rmsnorm_lab import RMSNorm
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), RMSNorm(32, backend="torch"),
                                torch.nn.Linear(32, 4))
    x = fresh((5, 16))
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    compiled(x).square().sum().backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).square().sum().backward()
    for g, e in zip(got, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------ in_place (CPU)

def _linear_after_norm(x, w, lin, in_place):
    return lin(rms_norm(x, w, EPS, backend="torch", in_place=in_place))


def test_in_place_writes_dx_into_dy():
    x, w, dy = fresh((4, 32), requires_grad=True), fresh((32,), requires_grad=True), fresh((4, 32))
    y = rms_norm(x, w, EPS, backend="torch", in_place=True)
    g = dy.clone()
    dx, dw = torch.autograd.grad(y, (x, w), g)
    dx_ref, dw_ref = reference.rms_norm_backward(dy, x.detach(), w.detach(),
                                                 reference.rstd_of(x.detach(), EPS), 0.0, "llama")
    assert dx.data_ptr() == g.data_ptr(), "dx should live in the incoming gradient's storage"
    torch.testing.assert_close(dx, dx_ref, rtol=0, atol=0)
    torch.testing.assert_close(dw, dw_ref, rtol=0, atol=0)


@pytest.mark.parametrize("with_weight", [True, False])
def test_in_place_matches_out_of_place_in_a_model(with_weight):
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 8)
    x = fresh((2, 3, 32))
    w = fresh((32,)) if with_weight else None
    results = []
    for in_place in (False, True):
        xr = x.clone().requires_grad_()
        wr = w.clone().requires_grad_() if w is not None else None
        _linear_after_norm(xr, wr, lin, in_place).square().sum().backward()
        results.append((xr.grad, wr.grad if wr is not None else None))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=0)
    if with_weight:
        torch.testing.assert_close(results[0][1], results[1][1], rtol=0, atol=0)


def test_in_place_refuses_unsafe_gradients():
    x = fresh((4, 32), requires_grad=True)
    with pytest.raises(ValueError, match="in_place=True.*contiguous"):
        rms_norm(x, None, backend="torch", in_place=True).sum().backward()   # expanded dy
    y = rms_norm(x, None, backend="torch", in_place=True)
    with pytest.raises(ValueError, match="in_place=True.*contiguous"):
        y.backward(fresh((32, 4)).t())                                       # transposed dy
    y = rms_norm(x, None, backend="torch", in_place=True)
    g = fresh((4, 32), requires_grad=True)
    with pytest.raises((ValueError, RuntimeError), match="create_graph"):
        torch.autograd.grad(y, x, g, create_graph=True)


def test_in_place_without_grad_is_a_no_op():
    x, w = fresh((3, 16)), fresh((16,))
    torch.testing.assert_close(rms_norm(x, w, backend="torch", in_place=True),
                               reference.rms_norm(x, w), rtol=0, atol=0)


@pytest.mark.usefixtures("kernels_under_compile")
def test_in_place_under_compile():
    torch._dynamo.reset()
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 8)
    compiled, graphs = _compile_capture(lambda x, w: _linear_after_norm(x, w, lin, True))
    x, w = fresh((6, 32)), fresh((32,))
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    compiled(xc, wc).square().sum().backward()
    xe, we = x.clone().requires_grad_(), w.clone().requires_grad_()
    _linear_after_norm(xe, we, lin, False).square().sum().backward()
    torch.testing.assert_close(xc.grad, xe.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(wc.grad, we.grad, rtol=1e-6, atol=1e-6)
    assert "rmsnorm_lab.rms_norm_fwd.default" in _names(graphs["fw"])


# --- float64 on the CPU: torch's gradcheck --------------------------------------------------

@pytest.mark.parametrize("mode", ["torch", "llama", "gemma", "none"])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_gradcheck_in_float64_on_the_cpu(mode, offset):
    """float64 runs on the torch backend (the kernels refuse it by name), so torch's
    finite-difference check applies to the lab's autograd: the Python node's backward, the
    fused add's, and the module's."""
    torch.manual_seed(0)
    x = torch.randn(3, 2, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(16, dtype=torch.float64, requires_grad=True)
    r = torch.randn(3, 2, 16, dtype=torch.float64, requires_grad=True)
    kw = dict(offset=offset, casting_mode=mode)
    assert torch.autograd.gradcheck(lambda a, b: rms_norm(a, b, 1e-6, **kw), (x, w))
    assert torch.autograd.gradcheck(lambda a: rms_norm(a, None, **kw), (x,))
    assert torch.autograd.gradcheck(lambda a, b, c: rms_norm(a, c, residual=b, **kw), (x, r, w))
    m = RMSNorm(16, dtype=torch.float64, **kw)
    assert torch.autograd.gradcheck(m, (x,))
    y = rms_norm(x, w, **kw)
    assert y.dtype == torch.float64 and "RMSNormFunction" in y.grad_fn.name()


def test_the_python_node_runs_its_backward_under_its_forwards_settings(monkeypatch):
    """A call takes the settings once: the Python node's backward gets the snapshot its forward
    took, as the native node's launch does, whatever is in force when backward() runs."""
    from rmsnorm_lab import autograd as lab_autograd
    from rmsnorm_lab import settings
    seen = []
    real = lab_autograd.backward_impl

    def spy(*args, **kwargs):
        seen.append((kwargs["snap"].backward, kwargs["snap"].pdl))
        return real(*args, **kwargs)
    monkeypatch.setattr(lab_autograd, "backward_impl", spy)
    x = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    with settings.override(backward="split", pdl=False):
        y = rms_norm(x, None, backend="torch")
    with settings.override(backward="fused"):
        y.sum().backward()
    assert seen == [("split", False)]


# ------------------------------------------ torch.compile steps aside by default (CPU)

def test_under_compile_the_op_decomposes_by_default_and_the_setting_recompiles():
    """``settings.under_compile``: ``decompose`` (the default) leaves no lab op in the graph,
    only torch ops Inductor can fuse, and trains as torch's autograd of the reference does;
    ``kernel`` records the lab's op. Changing the setting recompiles (Dynamo guards on it)."""
    from rmsnorm_lab import settings
    torch._dynamo.reset()
    assert settings.under_compile == "decompose"
    lin = torch.nn.Linear(32, 8)
    compiled, graphs = _compile_capture(lambda x, w: lin(rms_norm(x, w, EPS, residual=x * 2)[0]))
    x, w = fresh((6, 32)), fresh((32,))
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    compiled(xc, wc).square().sum().backward()
    assert not any("rmsnorm_lab" in n for n in _names(graphs["fw"]) | _names(graphs["bw"]))
    xe, we = x.clone().requires_grad_(), w.clone().requires_grad_()
    lin(reference.rms_norm(xe + xe * 2, we, EPS)).square().sum().backward()
    torch.testing.assert_close(xc.grad, xe.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(wc.grad, we.grad, rtol=1e-6, atol=1e-6)
    with settings.override(under_compile="kernel"):
        compiled(x.clone().requires_grad_(), w.clone().requires_grad_()).sum().backward()
    assert "rmsnorm_lab.fused_add_rms_norm_fwd.default" in _names(graphs["fw"])
    torch._dynamo.reset()
