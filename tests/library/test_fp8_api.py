"""``rms_norm_fp8`` on the CPU: the unfused chain it equals, its arguments and errors, the custom
op (opcheck, fake tensors, dispatch modes) and torch.compile(fullgraph=True)."""

import pytest
import torch

from rmsnorm_lab import reference as ref
from rmsnorm_lab import rms_norm, rms_norm_fp8
from rmsnorm_lab.autograd import rms_norm_fp8_op

FP8 = torch.float8_e4m3fn
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def fresh(shape, dtype=torch.float32, requires_grad=False):
    return torch.randn(shape, dtype=torch.float32).to(dtype).requires_grad_(requires_grad)


def bits(q):
    return q.view(torch.uint8)


def assert_same(got, expect):
    """Tuples of outputs, bit for bit (fp8 compared as bytes)."""
    assert len(got) == len(expect)
    for g, e in zip(got, expect):
        assert g.dtype == e.dtype and g.shape == e.shape
        if g.dtype == FP8:
            g, e = bits(g), bits(e)
        assert torch.equal(g, e)


def chain(x, w, eps=None, *, scale=None, residual=None, scale_ub=None, offset=0.0,
          casting_mode="torch"):
    """The unfused chain: the lab's norm in x's dtype, then the quantizer."""
    if residual is None:
        return ref.quantize_fp8(rms_norm(x, w, eps, offset=offset, casting_mode=casting_mode),
                                scale, scale_ub)
    y, h = rms_norm(x, w, eps, residual=residual, offset=offset, casting_mode=casting_mode)
    return (*ref.quantize_fp8(y, scale, scale_ub), h)


# ---------------------------------------------------------------- the chain

@pytest.mark.parametrize("quant", ["per_token", "static", "bounded"])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("mode", ref.CASTING_MODE_NAMES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_equals_the_norm_then_the_quantizer(dtype, mode, with_residual, quant):
    x, w = fresh((2, 5, 48), dtype), fresh((48,), dtype)
    r = fresh((2, 5, 48), dtype) if with_residual else None
    kw = dict(scale=torch.tensor(0.01) if quant == "static" else None,
              scale_ub=torch.tensor([2.0]) if quant == "bounded" else None,
              residual=r, offset=0.5, casting_mode=mode)
    got = rms_norm_fp8(x, w, 1e-5, **kw)
    assert len(got) == (3 if with_residual else 2)
    assert got[0].is_contiguous() and got[0].dtype == FP8 and got[0].shape == x.shape
    assert_same(got, chain(x, w, 1e-5, **kw))
    assert_same(got, rms_norm_fp8(x, w, 1e-5, backend="torch", **kw))


def test_defaults_eps_none_and_no_weight():
    x = fresh((4, 32), torch.bfloat16)
    assert_same(rms_norm_fp8(x), chain(x, None, torch.finfo(torch.float32).eps))


def test_a_float_scale_is_converted():
    x, w = fresh((3, 16)), fresh((16,))
    y_q, s = rms_norm_fp8(x, w, scale=0.125)
    assert s.dtype == torch.float32 and s.shape == () and float(s) == 0.125
    assert_same((y_q,), (rms_norm_fp8(x, w, scale=torch.tensor([0.125]))[0],))
    assert_same(rms_norm_fp8(x, scale_ub=3), rms_norm_fp8(x, scale_ub=torch.tensor(3.0)))


def test_the_static_scale_comes_back_as_given():
    scale = torch.tensor([0.5])
    assert rms_norm_fp8(fresh((2, 8)), scale=scale)[1] is scale


def test_layouts_rows_are_taken_as_they_are_and_others_copied():
    base = fresh((6, 80), torch.float16)
    x = base[:, 8:72]  # row stride 80
    xt = fresh((64, 6), torch.float16).t()  # last dimension not unit-stride
    w = fresh((64,), torch.float16)
    for t in (x, xt):
        assert_same(rms_norm_fp8(t, w), chain(t.contiguous(), w))
    y_q, s, h = rms_norm_fp8(x, w, residual=xt)
    assert h.is_contiguous() and torch.equal(h, x + xt)


@pytest.mark.parametrize("shape", [(0, 16), (2, 0, 16), (3, 0)])
@pytest.mark.parametrize("static", [False, True])
def test_empty_inputs(shape, static):
    x = torch.empty(shape, dtype=torch.bfloat16)
    scale = torch.tensor(1.0) if static else None
    y_q, s, h = rms_norm_fp8(x, scale=scale, residual=torch.empty_like(x))
    assert y_q.shape == shape and y_q.dtype == FP8 and h.shape == shape
    if static:
        assert s is scale
    else:  # a row of no elements has amax 0: the smallest scale
        assert s.shape == shape[:-1] and bool((s == ref.rms_norm_fp8(
            torch.zeros(1, 1))[1]).all())


def test_autocast_leaves_the_arithmetic_in_xs_dtype():
    x = fresh((3, 32), torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = rms_norm_fp8(x)
    assert_same(got, chain(x, None))


def test_inference_mode_and_no_grad_take_leaves_that_require_grad():
    x, w = fresh((3, 16), requires_grad=True), fresh((16,), requires_grad=True)
    with torch.no_grad():
        a = rms_norm_fp8(x, w)
    with torch.inference_mode():
        b = rms_norm_fp8(x, w)
    assert_same(a, b)
    assert not a[0].requires_grad and not a[1].requires_grad


# ---------------------------------------------------------------- errors

@pytest.mark.parametrize("which", ["x", "weight", "residual", "scale"])
def test_a_gradient_required_is_refused(which):
    x, w, r = fresh((3, 16)), fresh((16,)), fresh((3, 16))
    scale = torch.tensor(0.5)
    {"x": x, "weight": w, "residual": r, "scale": scale}[which].requires_grad_()
    with pytest.raises(RuntimeError, match=rf"inference only.*{which} requires grad.*no_grad"):
        rms_norm_fp8(x, w, residual=r, scale=scale)


@pytest.mark.parametrize("scale, error, match", [
    (torch.tensor(0.5, dtype=torch.float64), TypeError, "scale must be float32"),
    (torch.tensor(1, dtype=torch.int32), TypeError, "scale must be float32"),
    (torch.tensor([0.5, 0.5]), ValueError, "one element"),
    (torch.tensor([[0.5]]), ValueError, "one element"),
    (torch.empty(1, device="meta"), ValueError, "scale is on meta but x is on cpu"),
    ("0.5", TypeError, "float32 tensor of one element, or a float"),
    (True, TypeError, "float32 tensor of one element, or a float"),
    (0.0, ValueError, "positive and finite"),
    (-1.0, ValueError, "positive and finite"),
    (float("inf"), ValueError, "positive and finite"),
    (float("nan"), ValueError, "positive and finite"),
])
def test_a_bad_scale_is_refused(scale, error, match):
    with pytest.raises(error, match=match):
        rms_norm_fp8(fresh((2, 8)), scale=scale)
    if not isinstance(scale, bool):
        with pytest.raises(error, match=match.replace("scale", "scale_ub")):
            rms_norm_fp8(fresh((2, 8)), scale_ub=scale)


def test_scale_ub_with_a_static_scale_is_refused():
    with pytest.raises(ValueError, match="scale_ub bounds the per-token scales"):
        rms_norm_fp8(fresh((2, 8)), scale=torch.tensor(1.0), scale_ub=torch.tensor(1.0))


@pytest.mark.parametrize("x_dtype, w_dtype, name", [
    (torch.float64, None, "x"), (torch.float32, torch.float64, "weight"),
    (torch.int32, None, "x"), (torch.float8_e4m3fn, None, "x")])
def test_an_unsupported_dtype_is_refused(x_dtype, w_dtype, name):
    x = torch.ones(2, 8, dtype=x_dtype)
    w = torch.ones(8, dtype=w_dtype) if w_dtype else None
    with pytest.raises(TypeError, match=f"{name} must be float32, bfloat16 or float16 for "
                                        "rms_norm_fp8"):
        rms_norm_fp8(x, w)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(backend="triton"), ValueError, "needs CUDA tensors"),
    (dict(backend="cute"), ValueError, "needs CUDA tensors"),
    (dict(backend="numpy"), ValueError, "backend must be one of"),
    (dict(casting_mode="fp8"), ValueError, "casting_mode must be one of"),
    (dict(residual=torch.ones(2, 7)), ValueError, "residual must match x"),
    (dict(eps="small"), TypeError, "eps must be a float"),
])
def test_other_arguments_are_checked_as_rms_norms(kwargs, error, match):
    eps = kwargs.pop("eps", None)
    with pytest.raises(error, match=match):
        rms_norm_fp8(torch.ones(2, 8), torch.ones(8), eps, **kwargs)


def test_weight_of_the_wrong_width_is_refused():
    with pytest.raises(ValueError, match=r"weight must have shape \(8,\)"):
        rms_norm_fp8(torch.ones(2, 8), torch.ones(7))


# ---------------------------------------------------------------- the custom op

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("quant", ["per_token", "static", "bounded"])
def test_opcheck(quant, with_residual, dtype):
    x, w = fresh((4, 24), dtype), fresh((24,), dtype)
    r = fresh((4, 24), dtype) if with_residual else None
    scale = torch.tensor(0.02) if quant == "static" else None
    ub = torch.tensor([1.5]) if quant == "bounded" else None
    torch.library.opcheck(rms_norm_fp8_op, (x, r, w, scale, ub, 1e-6, 1.0, "llama", "torch"))


@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("static", [False, True])
def test_fake_tensors_get_shapes_and_dtypes(static, with_residual):
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    with FakeTensorMode():
        x, w = torch.empty(3, 7, 64, dtype=torch.float16), torch.empty(64, dtype=torch.float16)
        scale = torch.empty(1) if static else None
        out = rms_norm_fp8(x, w, scale=scale, residual=x if with_residual else None)
    assert all(isinstance(t, FakeTensor) for t in out)
    assert out[0].shape == (3, 7, 64) and out[0].dtype == FP8
    if static:
        assert out[1] is scale
    else:
        assert out[1].shape == (3, 7) and out[1].dtype == torch.float32
    assert len(out) == (3 if with_residual else 2)
    if with_residual:
        assert out[2].shape == (3, 7, 64) and out[2].dtype == torch.float16


def test_meta_tensors_get_shapes_and_dtypes():
    x = torch.empty(5, 128, dtype=torch.bfloat16, device="meta")
    y_q, s = rms_norm_fp8(x, backend="cute")
    assert y_q.is_meta and y_q.shape == (5, 128) and y_q.dtype == FP8
    assert s.shape == (5,) and s.dtype == torch.float32


def test_a_dispatch_mode_sees_the_one_op():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    x = fresh((3, 16))
    with Seen() as seen:
        got = rms_norm_fp8(x, scale=torch.tensor(0.5))
    assert "rmsnorm_lab.rms_norm_fp8.default" in seen.ops
    assert_same(got[:1], chain(x, None, scale=torch.tensor(0.5))[:1])


def test_vmap_runs_the_reference():
    x, w = fresh((3, 4, 32)), fresh((32,))
    y_q, scales = torch.vmap(lambda t: tuple(rms_norm_fp8(t, w)))(x)
    assert_same((y_q, scales), rms_norm_fp8(x, w))


# ---------------------------------------------------------------- torch.compile (CPU)

def _graph_ops(fn):
    """torch.compile(fullgraph=True) with a backend that keeps the ops Dynamo recorded."""
    ops = []

    def keep(gm, example_inputs):
        ops.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward
    return torch.compile(fn, fullgraph=True, backend=keep), ops


@pytest.mark.parametrize("compile_backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("quant", ["per_token", "static", "float", "bounded"])
@pytest.mark.usefixtures("kernels_under_compile")
def test_compile_fullgraph_parity(compile_backend, quant):
    torch._dynamo.reset()

    def f(x, w, r):
        kw = {"static": dict(scale=torch.tensor(0.05)), "float": dict(scale=0.05),
              "bounded": dict(scale_ub=torch.tensor([1.0])), "per_token": {}}[quant]
        y_q, s, h = rms_norm_fp8(x, w, 1e-6, residual=r, casting_mode="llama", **kw)
        return y_q, s, h * 2

    x, w, r = fresh((4, 6, 32), torch.bfloat16), fresh((32,), torch.bfloat16), \
        fresh((4, 6, 32), torch.bfloat16)
    compiled = torch.compile(f, fullgraph=True, backend=compile_backend)
    assert_same(compiled(x, w, r), f(x, w, r))


@pytest.mark.usefixtures("kernels_under_compile")
def test_compile_records_the_custom_op():
    torch._dynamo.reset()
    compiled, ops = _graph_ops(lambda x, w: rms_norm_fp8(x, w, scale=torch.tensor(0.1)))
    x, w = fresh((6, 32)), fresh((32,))
    assert_same(compiled(x, w)[:1], rms_norm_fp8(x, w, scale=torch.tensor(0.1))[:1])
    assert any("rms_norm_fp8" in op for op in ops), ops


@pytest.mark.usefixtures("kernels_under_compile")
def test_compile_dynamic_shapes():
    torch._dynamo.reset()
    compiled = torch.compile(lambda a: rms_norm_fp8(a), fullgraph=True, backend="aot_eager",
                             dynamic=True)
    for m in (3, 5, 9):
        x = fresh((m, 16), torch.float16)
        assert_same(compiled(x), chain(x, None))


def test_under_compile_it_decomposes_by_default():
    """The default ``settings.under_compile``: the norm and the quantization as torch ops in
    the graph (no lab op), the reference's codes and scales."""
    torch._dynamo.reset()
    compiled, ops = _graph_ops(lambda x, w: rms_norm_fp8(x, w, 1e-6))
    x, w = fresh((6, 32), torch.bfloat16), fresh((32,), torch.bfloat16)
    assert_same(compiled(x, w), chain(x, w, 1e-6))
    assert ops and not any("rmsnorm_lab" in op for op in ops), ops
    torch._dynamo.reset()
