"""``rms_norm`` and ``RMSNorm`` as drop-ins under real use, on the CPU: the path a call takes,
CPU tensors, any layout, and torch's machinery (fake and meta tensors, dispatch modes,
functorch transforms, forward-mode AD). tests/library/test_gpu_dropin.py runs the CUDA side."""

import itertools

import pytest
import torch
from torch.autograd import forward_ad

from rmsnorm_lab import RMSNorm, api, reference, rms_norm

EPS = 1e-6


def test_choose_path_covers_every_combination():
    seen = set()
    for compiling, machinery, native, training, empty, decompose in itertools.product(
            (False, True), (None, "transform", "dispatcher"), (False, True), (False, True),
            (False, True), (False, True)):
        path = api.choose_path(compiling=compiling, machinery=machinery, native=native,
                               training=training, empty=empty, decompose=decompose)
        seen.add(path)
        if machinery == "transform" or (compiling and decompose):
            assert path == "reference"
        elif compiling or machinery == "dispatcher":
            assert path == "custom_op"
        elif native:
            assert path == "native"
        elif training:
            assert path == "python_node"
        else:
            assert path == ("empty" if empty else "kernels")
    assert seen == set(api.PATHS)


def test_module_runs_on_the_cpu_as_torchs_does():
    x = torch.randn(2, 3, 8, requires_grad=True)
    ours, theirs = RMSNorm(8), torch.nn.RMSNorm(8)
    y = ours(x)
    torch.testing.assert_close(y, theirs(x))
    y.sum().backward()
    assert x.grad is not None and ours.weight.grad is not None


def test_an_explicit_cuda_backend_on_the_cpu_is_refused():
    for backend in ("cute", "triton"):
        with pytest.raises(ValueError, match="needs CUDA tensors"):
            rms_norm(torch.randn(4, 8), None, backend=backend)


@pytest.mark.parametrize("make", [
    lambda: torch.randn(4, 16, 3).transpose(1, 2),            # last dim not unit-stride
    lambda: torch.randn(3, 4, 8).permute(1, 0, 2),            # rows that do not collapse
    lambda: torch.randn(6, 32)[:, ::2],                       # every other column
], ids=["transposed", "permuted", "strided columns"])
def test_any_layout_is_computed_with_a_copy_where_the_kernels_need_one(make):
    x = make().requires_grad_()
    prepared, _, _ = api._as_torch_would_compute(x, None)
    assert prepared.stride(-1) == 1 and prepared.is_contiguous()
    y = rms_norm(x, None, EPS)
    torch.testing.assert_close(y, reference.rms_norm(x.detach(), None, EPS))
    y.backward(torch.ones_like(y))
    assert x.grad.shape == x.shape


def test_row_strided_inputs_and_weights_are_not_copied_unless_needed():
    x = torch.randn(6, 32)[:, :16]  # rows of 16 with a row stride of 32: the kernels take it
    assert api._as_torch_would_compute(x, None)[0] is x
    w = torch.randn(32)[::2]
    assert api._as_torch_would_compute(x, w)[1].stride(0) == 1


def test_fake_tensors_get_the_ops_fake_implementation():
    """A memory estimator's fake tensors: shapes and dtypes out, no kernel. (Fake CUDA tensors
    that require grad need a CUDA build of torch: autograd asks for a device guard.)"""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    with FakeTensorMode():
        x = torch.empty(4, 8, device="cuda", dtype=torch.bfloat16)
        y = rms_norm(x, torch.empty(8, device="cuda", dtype=torch.bfloat16), backend="cute")
        assert isinstance(y, FakeTensor) and y.shape == (4, 8) and y.device.type == "cuda"
        x = torch.empty(4, 8, dtype=torch.bfloat16, requires_grad=True)
        y = rms_norm(x, torch.empty(8, dtype=torch.bfloat16))
        assert isinstance(y, FakeTensor) and y.dtype == torch.bfloat16
        y.sum().backward()  # the backward op's fake implementation
        assert x.grad.shape == (4, 8)


def test_meta_tensors_and_dispatch_modes_see_the_op():
    from torch.utils._python_dispatch import TorchDispatchMode
    y = rms_norm(torch.empty(4, 8, device="meta"), torch.empty(8, device="meta"))
    assert y.device.type == "meta" and y.shape == (4, 8)
    ops = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.append(str(func))
            return func(*args, **(kwargs or {}))
    x = torch.randn(4, 8)
    with Record():
        rms_norm(x, None)
    assert any("rmsnorm_lab.rms_norm_fwd" in op for op in ops)


def test_functorch_transforms_and_forward_ad_differentiate_the_reference_math():
    w = torch.randn(8)
    x = torch.randn(3, 4, 8)
    batched = torch.func.vmap(lambda t: rms_norm(t, w))(x)
    torch.testing.assert_close(batched, reference.rms_norm(x, w, EPS))
    grad = torch.func.grad(lambda t: rms_norm(t, w).sum())(x[0])
    x0 = x[0].clone().requires_grad_()
    reference.rms_norm(x0, w, EPS).sum().backward()
    torch.testing.assert_close(grad, x0.grad)
    tangent = torch.randn(4, 8)
    with forward_ad.dual_level():
        out = rms_norm(forward_ad.make_dual(x[0], tangent), w)
        jvp = forward_ad.unpack_dual(out).tangent
    _, expected = torch.func.jvp(lambda t: reference.rms_norm(t, w, EPS), (x[0],), (tangent,))
    torch.testing.assert_close(jvp, expected)


def test_sparse_and_nested_inputs_are_refused_by_name():
    with pytest.raises(TypeError, match="x must be a dense .*sparse"):
        rms_norm(torch.randn(4, 8).to_sparse(), None)
    nested = torch.nested.nested_tensor([torch.randn(2, 8), torch.randn(3, 8)])
    with pytest.raises(TypeError, match="x must be a dense .*nested"):
        rms_norm(nested, None)


# --- torch's defaults and torch's call -------------------------------------------------------

def test_eps_and_rounding_default_as_torch_in_the_function_and_the_module():
    import inspect
    assert inspect.signature(rms_norm).parameters["eps"].default is None
    assert inspect.signature(RMSNorm).parameters["eps"].default is None
    assert inspect.signature(rms_norm).parameters["casting_mode"].default == "torch"
    assert inspect.signature(RMSNorm).parameters["casting_mode"].default == "torch"
    F = torch.nn.functional
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = (1e-4 * torch.randn(16, 256)).to(dtype)  # eps matters at this scale
        w = torch.randn(256).to(dtype)
        assert torch.equal(rms_norm(x, w), F.rms_norm(x, (256,), w)), dtype
        assert torch.equal(rms_norm(x, None), F.rms_norm(x, (256,))), dtype


@pytest.mark.parametrize("shape", [(64,), [64], torch.Size([64]), 64],
                         ids=["tuple", "list", "Size", "int"])
def test_torchs_call_shape_gives_torchs_result(shape):
    F = torch.nn.functional
    x, w = torch.randn(3, 5, 64).to(torch.bfloat16), torch.randn(64).to(torch.bfloat16)
    expect = F.rms_norm(x, (64,), w, 1e-5)
    assert torch.equal(rms_norm(x, shape, w, 1e-5), expect)
    assert torch.equal(rms_norm(x, shape, w), F.rms_norm(x, (64,), w))
    assert torch.equal(rms_norm(x, shape), F.rms_norm(x, (64,)))
    assert torch.equal(rms_norm(x, shape, None, 1e-5), F.rms_norm(x, (64,), None, 1e-5))
    assert torch.equal(rms_norm(x, shape, eps=1e-5), F.rms_norm(x, (64,), eps=1e-5))
    assert torch.equal(rms_norm(x, normalized_shape=shape, weight=w, eps=1e-5), expect)
    xr = x.clone().requires_grad_()
    rms_norm(xr, shape, w, 1e-5).float().sum().backward()
    assert xr.grad.shape == x.shape


def test_torchs_call_shape_refuses_what_it_cannot_normalize():
    x, w = torch.randn(4, 8), torch.randn(8)
    for shape in ((4,), (4, 8), [], 9, (8.0,)):
        with pytest.raises(ValueError, match=r"normalized_shape must be \(x.shape\[-1\],\) = "
                                             r"\(8,\)"):
            rms_norm(x, shape, w)
    with pytest.raises(ValueError, match="normalized_shape"):
        rms_norm(x, normalized_shape=(2, 4), weight=w)
    with pytest.raises(TypeError, match="at most 4 positional"):
        rms_norm(x, (8,), w, 1e-5, 1e-5)
    with pytest.raises(TypeError, match="torch's 4"):
        rms_norm(x, w, 1e-5, 1e-5)
    with pytest.raises(TypeError, match="normalized_shape twice"):
        rms_norm(x, (8,), w, normalized_shape=(8,))
    with pytest.raises(TypeError, match="weight must be a torch.Tensor or None, got str"):
        rms_norm(x, "w")
    with pytest.raises(TypeError, match="eps must be a float or None, got str"):
        rms_norm(x, w, "1e-6")


def test_float64_runs_on_the_torch_backend_as_torch_computes_it():
    F = torch.nn.functional
    x = (1e-9 * torch.randn(4, 32)).double()  # fp64's epsilon for eps=None, as torch
    w = torch.randn(32, dtype=torch.float64)
    torch.testing.assert_close(rms_norm(x, w), F.rms_norm(x, (32,), w), rtol=1e-12, atol=0)
    torch.testing.assert_close(RMSNorm(32, dtype=torch.float64)(x), F.rms_norm(x, (32,)),
                               rtol=1e-12, atol=0)
    y, h = rms_norm(x, w, residual=x)
    assert y.dtype == h.dtype == torch.float64
    with torch.no_grad():  # the custom op's fake implementation: rstd in the compute type
        from torch._subclasses.fake_tensor import FakeTensorMode
        with FakeTensorMode():
            xf = torch.empty(4, 32, dtype=torch.float64, requires_grad=True)
            assert rms_norm(xf, None).dtype == torch.float64
    for backend in ("cute", "triton"):
        with pytest.raises(TypeError, match=f"x is float64, which backend='{backend}' does not "
                                            "take"):
            rms_norm(x, w, backend=backend)
        with pytest.raises(TypeError, match="weight is float64"):
            rms_norm(torch.empty(4, 32, device="meta"), torch.empty(32, dtype=torch.float64,
                                                                    device="meta"),
                     backend=backend)
