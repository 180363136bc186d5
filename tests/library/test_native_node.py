"""The native tape node (csrc/native_node.cpp) on the CPU.

The node is built here with the machine's compiler, then driven with stand-in kernels: Python
functions behind TVM-FFI's C ABI, called exactly as the CuTe kernels are (same argument order,
DLTensor views, ints, floats). They compute with the reference formulas, so the node's
plumbing (saved tensors, shapes, gradient routing, the copies of awkward gradients, errors) is
checked against float64 autograd without a GPU. tests/library/test_gpu_native_node.py runs the real
kernels.
"""

import dataclasses
import gc
import warnings

import pytest
import torch

tvm_ffi = pytest.importorskip("tvm_ffi")

from native_standins import EPS, StandIns, file_launch, functions, make_launch  # noqa: E402
from rmsnorm_lab import settings  # noqa: E402
from rmsnorm_lab.native import build as native_node  # noqa: E402
from rmsnorm_lab.native.launch import ffi_handle  # noqa: E402


@pytest.fixture(scope="module")
def native():
    return native_node.load()


def call(native, k, x, w, **kw):
    fns = functions(k)
    return native.apply(x, w, make_launch(native, fns, x, w is not None, **kw)), fns


def reference_grads(x, w, dy, offset=0.0):
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_() if w is not None else None
    y = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS)
    if w64 is not None:
        y = y * (w64 + offset)
    y.backward(dy.double())
    return y.detach(), x64.grad, (w64.grad if w64 is not None else None)


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("shape", [(7, 16), (2, 3, 16)])
def test_forward_and_gradients_match_float64(native, split, shape):
    k = StandIns()
    x = torch.randn(shape, requires_grad=True)
    w = torch.randn(shape[-1], requires_grad=True)
    M = x.numel() // shape[-1]
    y, _ = call(native, k, x, w, split=split, grid=5, count=3, offset=0.5)
    assert y.shape == x.shape and y.grad_fn is not None
    dy = torch.randn(shape)
    y.backward(dy)
    y64, dx64, dw64 = reference_grads(x, w, dy, offset=0.5)
    torch.testing.assert_close(y.double(), y64, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad.double(), dx64, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.grad.double(), dw64, rtol=1e-5, atol=1e-5)
    (fwd,) = k.calls("forward")
    assert (fwd["grid"], fwd["eps"], fwd["offset"]) == (5, EPS, 0.5)
    assert fwd["x"]["shape"] == (M, shape[-1])  # the kernel sees rows
    (bwd,) = k.calls("backward")
    if split:  # dx kernel gets M and the stand-in partials; the dW kernel the real ones
        assert (bwd["count"], bwd["part_rows"]) == (M, 1)
        assert [c["part_rows"] for c in k.calls("dw")] == [3]
    else:
        assert (bwd["count"], bwd["part_rows"]) == (3, 3) and not k.calls("dw")
    assert [c["part_rows"] for c in k.calls("reduce")] == [3]


def test_without_weight_no_partials_and_no_reduce(native):
    k = StandIns()
    x = torch.randn(6, 8, requires_grad=True)
    y, _ = call(native, k, x, None)
    dy = torch.randn(6, 8)
    y.backward(dy)
    _, dx64, _ = reference_grads(x, None, dy)
    torch.testing.assert_close(x.grad.double(), dx64, rtol=1e-5, atol=1e-5)
    assert not k.calls("reduce") and k.calls("backward")[0]["part_rows"] == 1


def test_weight_alone_requiring_grad(native):
    k = StandIns()
    x = torch.randn(5, 8)
    w = torch.randn(8, requires_grad=True)
    y, _ = call(native, k, x, w)
    dy = torch.randn(5, 8)
    y.backward(dy)
    _, _, dw64 = reference_grads(x, w, dy)
    torch.testing.assert_close(w.grad.double(), dw64, rtol=1e-5, atol=1e-5)
    assert x.grad is None


def test_expanded_gradient_is_copied_to_rows(native):
    k = StandIns()
    x = torch.randn(4, 8, requires_grad=True)
    call(native, k, x, None)[0].sum().backward()  # dy: stride 0
    (bwd,) = k.calls("backward")
    assert bwd["dy"]["strides"] == (8, 1)
    _, dx64, _ = reference_grads(x, None, torch.ones(4, 8))
    torch.testing.assert_close(x.grad.double(), dx64, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("aligned", [True, False])
def test_misaligned_gradient_copied_only_for_aligned_kernels(native, aligned):
    k = StandIns()
    x = torch.randn(4, 8, requires_grad=True)
    y, _ = call(native, k, x, None, aligned=aligned)
    storage = torch.randn(4 * 8 + 1)
    dy = storage[1:].view(4, 8)  # 4 bytes past a 16-byte boundary
    assert dy.data_ptr() % 16 != 0
    y.backward(dy)
    seen = k.calls("backward")[0]["dy"]["ptr"]
    if aligned:
        assert seen % 16 == 0 and seen != dy.data_ptr()
    else:
        assert seen == dy.data_ptr()
    _, dx64, _ = reference_grads(x, None, dy)
    torch.testing.assert_close(x.grad.double(), dx64, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_dtypes_reach_the_kernel(native, dtype):
    k = StandIns()
    x = torch.randn(3, 8, dtype=dtype)
    w = torch.randn(8, dtype=dtype, requires_grad=True)
    y, _ = call(native, k, x, w)
    assert y.dtype == dtype and k.calls("forward")[0]["x"]["dtype"] == str(dtype).split(".")[1]
    y64, _, _ = reference_grads(x.float(), w.float(), torch.ones(3, 8))
    torch.testing.assert_close(y.double(), y64, rtol=1e-2, atol=1e-2)


def test_double_backward_refused(native):
    x = torch.randn(3, 8, requires_grad=True)
    y, _ = call(native, StandIns(), x, None)
    with pytest.raises(RuntimeError, match="no double backward"):
        torch.autograd.grad(y.sum(), x, create_graph=True)


def test_kernel_error_surfaces_with_its_kind(native):
    def failing(*args):
        raise ValueError("kernel refused")
    f = tvm_ffi.convert(failing)
    x = torch.randn(2, 8, requires_grad=True)
    launch = make_launch(native, {"forward": f, "backward": f, "dw": f, "reduce": f}, x, False)
    with pytest.raises(RuntimeError, match="ValueError: kernel refused"):
        native.apply(x, None, launch)


def test_launch_and_inputs_must_agree(native):
    fns = functions(StandIns())
    x = torch.randn(2, 8)
    with pytest.raises(RuntimeError, match="planned without a weight"):
        native.apply(x, torch.randn(8, requires_grad=True), make_launch(native, fns, x, False))
    with pytest.raises(RuntimeError, match="planned with a weight"):
        native.apply(x, None, make_launch(native, fns, x, True))
    with pytest.raises(RuntimeError, match="cannot record a training call"):
        native.apply(x.requires_grad_(), None, make_launch(native, fns, x, False, training=False))
    spec = make_launch(native, fns, x, True, spec_only=True)
    both = spec.backward[0]
    with pytest.raises(RuntimeError, match="a weight needs dW partial rows"):
        native.Launch(dataclasses.replace(spec, backward=(dataclasses.replace(
            both, partial_rows=None),) + spec.backward[1:]))
    with pytest.raises(RuntimeError, match="three backwards"):
        native.Launch(dataclasses.replace(spec, backward=spec.backward[:1]))
    with pytest.raises(RuntimeError, match="no forward kernel"):
        native.Launch(dataclasses.replace(spec, forward=0))
    with pytest.raises(RuntimeError, match="a step has no kernel"):
        native.Launch(dataclasses.replace(spec, backward=(dataclasses.replace(
            both, steps=(dataclasses.replace(both.steps[0], kernel=0),)),) + spec.backward[1:]))


def test_inference_launch_skips_rstd_and_the_tape(native):
    k = StandIns()
    x, w = torch.randn(3, 8), torch.randn(8)
    launch = make_launch(native, functions(k), x, True, training=False)
    assert not launch.training
    y = native.apply(x, w, launch)
    assert y.grad_fn is None
    y64, _, _ = reference_grads(x, w, torch.ones(3, 8))
    torch.testing.assert_close(y.double(), y64, rtol=1e-5, atol=1e-5)
    (fwd,) = k.calls("forward")
    assert fwd["rstd_rows"] == 0 and not k.calls("backward")


def test_inference_records_nothing(native):
    k = StandIns()
    x, w = torch.randn(3, 8), torch.randn(8)
    y, _ = call(native, k, x, w)
    assert y.grad_fn is None and not y.requires_grad
    with torch.no_grad():
        y, _ = call(native, k, x.requires_grad_(), w)
    assert y.grad_fn is None
    assert len(k.calls("forward")) == 2


def test_node_name_and_saved_tensors_released(native):
    x = torch.randn(3, 8, requires_grad=True)
    y, _ = call(native, StandIns(), x, None)
    assert y.grad_fn.name() == "RMSNormNativeBackward"
    assert y.grad_fn.next_functions[0][0].name() == "torch::autograd::AccumulateGrad"
    y.backward(torch.ones(3, 8))
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.backward(torch.ones(3, 8))


def test_saved_input_modified_in_place_is_caught(native):
    x = torch.randn(3, 8, requires_grad=True)
    x2 = x * 1  # a non-leaf that can be modified in place
    y, _ = call(native, StandIns(), x2, None)
    with torch.no_grad():
        x2.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward(torch.ones(3, 8))


def test_launch_holds_its_functions(native):
    """A Launch takes its own reference on each function: dropping Python's frees nothing."""
    k = StandIns()
    x = torch.randn(3, 8, requires_grad=True)
    launch = make_launch(native, functions(k), x, False)
    gc.collect()
    native.apply(x, None, launch).backward(torch.ones(3, 8))
    assert k.calls("forward") and k.calls("backward")


def test_build_failure_warns_once_and_falls_back(monkeypatch):
    monkeypatch.setattr(native_node, "_MODULE", None)
    monkeypatch.setattr(native_node, "_FAILURE", None)

    def no_compiler():
        raise OSError("c++: not found")
    monkeypatch.setattr(native_node, "_build", no_compiler)
    with pytest.warns(RuntimeWarning, match="c\\+\\+: not found.*Python autograd node"):
        assert native_node.load_or_warn() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native_node.load_or_warn() is None  # no second warning
    with pytest.raises(native_node.NativeNodeUnavailable, match="could not be built"):
        native_node.load()


def test_autograd_node_setting():
    assert settings.experiments.autograd_node == "native"
    with settings.override(autograd_node="python"):
        assert settings.experiments.autograd_node == "python"
    with pytest.raises(ValueError, match="autograd_node"):
        settings.experiments.autograd_node = "cpp"


def test_real_kernels_are_reached_through_the_c_abi(native):
    """The CuTe compilations themselves (for sm_90a, no GPU needed) called by the node: they
    decode every argument the node passes and refuse CPU tensors with their own message, which
    the node surfaces. The forward through ``native.launch``; the fused backward and the dW
    reduction behind a stand-in forward."""
    from rmsnorm_lab.native import launch as native_launch
    x = torch.randn(64, 4096, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(4096, dtype=torch.bfloat16, requires_grad=True)
    snap = native_launch.Snapshot("auto", "fused", True, False, 0, "native")
    spec = native_launch.plan_launch(x, w, EPS, 0.0, "llama", 132, True, snap)
    launch = native.Launch(spec)
    assert launch.forward_grid(64) == 64 and launch.steps(0) == 2
    with pytest.raises(RuntimeError, match=r"gX: Tensor\(\[n0, 4096\], bfloat16\).*"
                                           r"offset: float32.*expected device_type=cuda"):
        native.apply(x, w, launch)
    k = StandIns()
    fns = functions(k)
    stand_in_forward = dataclasses.replace(spec, forward=ffi_handle(fns["forward"]))
    y = native.apply(x, w, native.Launch(stand_in_forward))
    with pytest.raises(RuntimeError, match=r"gDy: Tensor.*gDwP: Tensor.*device_type=cuda"):
        y.backward(torch.randn(64, 4096, dtype=torch.bfloat16))


def test_only_the_gradients_asked_for_are_computed(native):
    """A frozen weight, or autograd.grad for x alone, runs the dx kernel only; a gradient for the
    weight alone runs the dW kernel and the reduction, not the dx kernel."""
    x = torch.randn(6, 8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    dy = torch.randn(6, 8)
    _, dx64, dw64 = reference_grads(x, w, dy)
    k = StandIns()
    y, _ = call(native, k, x, w)
    (dx,) = torch.autograd.grad(y, x, dy)
    assert [n for n, _ in k.log] == ["forward", "backward"]
    assert k.calls("backward")[0]["part_rows"] == 1  # the dx kernel: no partials
    torch.testing.assert_close(dx.double(), dx64, rtol=1e-5, atol=1e-5)
    k = StandIns()
    y, _ = call(native, k, x, w)
    (dw,) = torch.autograd.grad(y, w, dy)
    assert [n for n, _ in k.log] == ["forward", "dw", "reduce"]
    torch.testing.assert_close(dw.double(), dw64, rtol=1e-5, atol=1e-5)
    k = StandIns()
    frozen = w.detach()
    y, _ = call(native, k, x, frozen)  # planned with a weight, which needs no gradient
    y.backward(dy)
    assert [n for n, _ in k.log] == ["forward", "backward"]


def test_saved_tensor_replaced_through_data_is_refused(native):
    x = torch.randn(6, 8, requires_grad=True)
    y, _ = call(native, StandIns(), x, None)
    x.data = torch.randn(3, 8)
    with pytest.raises(RuntimeError, match="no longer has the forward's 6 rows of 8"):
        y.backward(torch.ones(6, 8))


def test_compiled_autograd_is_refused_clearly(native):
    from torch._dynamo import compiled_autograd
    x = torch.randn(6, 8, requires_grad=True)
    y, _ = call(native, StandIns(), x, None)
    with pytest.raises(RuntimeError, match="does not support compiled autograd"):
        with compiled_autograd._enable(lambda gm: gm):
            y.sum().backward()


# ------------------------------------------------------------------------ the fused residual add

def call_add(native, k, x, r, w, **kw):
    fns = functions(k)
    launch = make_launch(native, fns, x, w is not None, residual=True, **kw)
    return native.apply_add(x, r, w, launch), fns


def reference_add_grads(x, r, w, dy, dh):
    x64, r64 = (t.detach().double().requires_grad_() for t in (x, r))
    w64 = w.detach().double().requires_grad_()
    h = x64 + r64
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * w64
    torch.autograd.backward((y, h), (dy.double(), dh.double()))
    return y.detach(), h.detach(), x64.grad, r64.grad, w64.grad


@pytest.mark.parametrize("split", [False, True])
def test_fused_add_forward_and_gradients_match_float64(native, split):
    """(y, h) from one forward; x and the residual get one gradient, h's own plus the norm's,
    from the dx kernels (which are handed h's gradient); dW as for rms_norm."""
    k = StandIns()
    x, r = (torch.randn(2, 5, 16, requires_grad=True) for _ in range(2))
    w = torch.randn(16, requires_grad=True)
    (y, h), _ = call_add(native, k, x, r, w, split=split, count=3)
    assert y.grad_fn is h.grad_fn and y.grad_fn.name() == "RMSNormAddNativeBackward"
    dy, dh = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    torch.autograd.backward((y, h), (dy, dh))
    y64, h64, dx64, dr64, dw64 = reference_add_grads(x, r, w, dy, dh)
    for got, want in ((y, y64), (h, h64), (x.grad, dx64), (r.grad, dr64), (w.grad, dw64)):
        torch.testing.assert_close(got.detach().double(), want, rtol=1e-5, atol=1e-5)
    assert [c["r"]["shape"] for c in k.calls("forward_add")] == [(10, 16)]
    assert len(k.calls("backward_dh")) == 1


def test_fused_add_with_h_alone_used_passes_its_gradient_through(native):
    k = StandIns()
    x, r = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    (y, h), _ = call_add(native, k, x, r, w)
    dh = torch.randn(4, 8)
    h.backward(dh)
    torch.testing.assert_close(x.grad, dh)
    torch.testing.assert_close(r.grad, dh)
    assert torch.count_nonzero(w.grad) == 0 and not k.calls("backward_dh")


def test_fused_add_with_y_alone_used_gets_a_zero_h_gradient(native):
    k = StandIns()
    x, r = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    (y, h), _ = call_add(native, k, x, r, w)
    dy = torch.randn(4, 8)
    y.backward(dy)
    _, _, dx64, _, dw64 = reference_add_grads(x, r, w, dy, torch.zeros(4, 8))
    torch.testing.assert_close(x.grad.double(), dx64, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w.grad.double(), dw64, rtol=1e-5, atol=1e-5)


def test_fused_add_residual_alone_requiring_grad_is_a_training_call(native):
    """The memo's key counts the residual's requires_grad: a call whose residual alone needs a
    gradient is a training call, planned apart from the inference one."""
    k = StandIns()
    fns = functions(k)
    x, r, w = torch.randn(3, 8), torch.randn(3, 8, requires_grad=True), torch.randn(8)
    memo = native.CallMemo(8, 2048, 511)
    training = make_launch(native, fns, x, True, residual=True)
    assert file_launch(memo, x, w, EPS, 0.0, "llama", training, memo.settings, r)
    assert memo.find(x, w, EPS, 0.0, "llama", r) is training
    assert memo.find(x, w, EPS, 0.0, "llama", r.detach()) is None  # the inference key
    assert memo.find(x, w, EPS, 0.0, "llama") is None               # rms_norm's key
    y, h = memo.call_add(x, r, w, EPS, 0.0, "llama")
    h.sum().backward()
    torch.testing.assert_close(r.grad, torch.ones(3, 8))


def test_fused_add_memo_refuses_a_residual_laid_out_otherwise(native):
    k = StandIns()
    fns = functions(k)
    x, w = torch.randn(4, 8), torch.randn(8)
    r = torch.randn(8, 4).t()  # x's shape, other strides
    memo = native.CallMemo(8, 2048, 511)
    launch = make_launch(native, fns, x, True, residual=True, training=False)
    assert memo.call_add(x, r, w, EPS, 0.0, "llama") is None
    assert len(memo) == 0
    with pytest.raises(RuntimeError, match="laid out as x"):
        native.apply_add(x, r, w, launch)


def test_plain_and_fused_add_launches_are_not_interchangeable(native):
    k = StandIns()
    fns = functions(k)
    x, w = torch.randn(4, 8), torch.randn(8)
    with pytest.raises(RuntimeError, match="takes the residual"):
        native.apply(x, w, make_launch(native, fns, x, True, residual=True))
    with pytest.raises(RuntimeError, match="not a fused-add launch"):
        native.apply_add(x, torch.randn(4, 8), w, make_launch(native, fns, x, True))


def test_fused_add_real_kernels_are_reached_through_the_c_abi(native):
    """The fused add's CuTe compilations (sm_90a, no GPU needed) decode the nine forward
    arguments and the backward's, h's gradient among them, as the node passes them: each refuses
    the CPU tensors with its own message."""
    from rmsnorm_lab.native import launch as native_launch
    x, r = (torch.randn(64, 4096, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    w = torch.randn(4096, dtype=torch.bfloat16, requires_grad=True)
    snap = native_launch.Snapshot("auto", "fused", True, False, 0, "native")
    spec = native_launch.plan_launch(x, w, EPS, 0.0, "llama", 132, True, snap, residual=r)
    assert spec.residual and spec.backward[0].steps[0].args[5] == 8  # DH after DX
    launch = native.Launch(spec)
    with pytest.raises(RuntimeError, match=r"gX: Tensor\(\[n0, 4096\], bfloat16\).*"
                                           r"expected device_type=cuda"):
        native.apply_add(x, r, w, launch)
    k = StandIns()
    fns = functions(k)  # held: the launch keeps only their handles
    stand_in_forward = dataclasses.replace(spec, forward=ffi_handle(fns["forward_add"]))
    y, h = native.apply_add(x, r, w, native.Launch(stand_in_forward))
    with pytest.raises(RuntimeError, match=r"gDy: Tensor.*gDh: Tensor.*device_type=cuda"):
        torch.autograd.backward((y, h), (torch.randn_like(y), torch.randn_like(h)))
