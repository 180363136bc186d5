"""The native tape node with the CuTe kernels on a GPU (run with: pytest -m gpu).

It launches the same compilations with the same grids as the Python node, so its y, dx and dW
must be bitwise equal to the Python node's; tests/library/test_autograd.py checks the default (native)
path against the reference as well.
"""

import pytest
import torch

from rmsnorm_lab import rms_norm, settings

pytestmark = pytest.mark.gpu

EPS = 1e-6
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SHAPES = [(1, 4096), (3, 1023), (127, 4096), (2, 33, 8192), (131, 16384)]


def fresh(shape, dtype):
    return torch.randn(shape, device="cuda", dtype=torch.float32).to(dtype)


def poison_allocator():
    """NaN in the caching allocator's free blocks: an output the node leaves unwritten shows."""
    big = torch.empty(256 << 20, dtype=torch.float32, device="cuda").fill_(float("nan"))
    del big


def run(node, x, w, dy, **kw):
    xg = x.clone().requires_grad_()
    wg = w.clone().requires_grad_() if w is not None else None
    poison_allocator()
    with settings.override(autograd_node=node):
        y = rms_norm(xg, wg, EPS, backend="cute", **kw)
        y.backward(dy)
    torch.cuda.synchronize()
    name = y.grad_fn.name()
    return y.detach(), xg.grad, (wg.grad if wg is not None else None), name


def same(a, b):
    if a is None or b is None:
        assert a is None and b is None
        return
    assert not torch.isnan(a).any()
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def check_parity(x, w, dy, dy_python=None, **kw):
    *native, native_name = run("native", x, w, dy, **kw)
    *python, python_name = run("python", x, w, dy if dy_python is None else dy_python, **kw)
    assert native_name == "RMSNormNativeBackward" and "RMSNormFunction" in python_name
    for a, b in zip(native, python):
        same(a, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("casting_mode", ["llama", "gemma", "none"])
@pytest.mark.parametrize("backward", ["fused", "split"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_bitwise_equal_to_python_node(dtype, casting_mode, backward, shape):
    for with_weight, offset in ((True, 0.0), (True, 1.0), (False, 0.0)):
        x, dy = fresh(shape, dtype), fresh(shape, dtype)
        w = fresh(shape[-1:], dtype) if with_weight else None
        with settings.override(backward=backward):
            check_parity(x, w, dy, offset=offset, casting_mode=casting_mode)


def test_mixed_weight_dtype():
    x, dy = fresh((300, 4096), torch.bfloat16), fresh((300, 4096), torch.bfloat16)
    check_parity(x, fresh((4096,), torch.float32), dy)


@pytest.mark.parametrize("kind", ["expanded", "misaligned", "row_strided"])
def test_awkward_incoming_gradients(kind):
    M, N = 129, 4096
    x, w = fresh((M, N), torch.bfloat16), fresh((N,), torch.bfloat16)
    if kind == "expanded":  # the gradient of y.sum(): stride 0
        dy = torch.ones((), device="cuda", dtype=torch.bfloat16).expand(M, N)
    elif kind == "misaligned":  # 2 bytes past a 16-byte boundary
        dy = fresh(M * N + 1, torch.bfloat16)[1:].view(M, N)
        # the native node copies it into an aligned tensor and runs the vector kernels; the
        # Python node runs the unaligned fallback on it, whose sums round differently (1 ulp in
        # a few elements on the H200), so the parity is with the Python node on that copy
        check_parity(x, w, dy, dy_python=dy.clone())
        return
    else:  # rows of a wider tensor
        dy = fresh((M, N + 64), torch.bfloat16)[:, :N]
    check_parity(x, w, dy)


def test_nvtx_ranges_on():
    from rmsnorm_lab.native import build as native_node
    assert native_node.load().has_nvtx()  # a GPU machine has NVTX's headers
    x, w, dy = fresh((64, 2048), torch.bfloat16), fresh((2048,), torch.bfloat16), \
        fresh((64, 2048), torch.bfloat16)
    with settings.override(nvtx=True):
        check_parity(x, w, dy)


@pytest.mark.parametrize("strips", [1, 7, 500])
def test_fused_strips_setting(strips):
    x, w, dy = fresh((300, 4096), torch.bfloat16), fresh((4096,), torch.bfloat16), \
        fresh((300, 4096), torch.bfloat16)
    with settings.override(fused_strips=strips, backward="fused"):
        check_parity(x, w, dy)


def test_other_paths_keep_the_python_node():
    from rmsnorm_lab import lab
    x = fresh((8, 4096), torch.bfloat16).requires_grad_()

    def tvm_ffi(launch, x2, w, y, rstd, grid, eps, offset):  # a forward launcher of its own
        launch.compiled()(x2, w, y, rstd, grid, eps, offset)
    with lab.forward_launcher(tvm_ffi):
        assert "RMSNormFunction" in rms_norm(x, None, backend="cute").grad_fn.name()
    assert "RMSNormFunction" in rms_norm(x, None, backend="triton").grad_fn.name()
    assert "RMSNormFunction" in rms_norm(x, None, backend="cute", in_place=True).grad_fn.name()
    assert rms_norm(x, None, backend="cute").grad_fn.name() == "RMSNormNativeBackward"


@pytest.mark.parametrize("variant", ["row", "persistent", "warp"])
def test_forward_variant_setting_reaches_the_node(variant):
    """The node memoizes each call shape's launch decision with the settings in its key: a
    changed forward variant or backward mode is a new decision, not a stale one."""
    x, w, dy = fresh((300, 2048), torch.bfloat16), fresh((2048,), torch.bfloat16), \
        fresh((300, 2048), torch.bfloat16)
    for backward in ("fused", "split"):
        with settings.override(forward_variant=variant, backward=backward):
            check_parity(x, w, dy)


def test_repeated_calls_are_served_by_the_call_memo(monkeypatch):
    """The second training call of a shape runs from the C++ call memo: neither the argument
    checks nor the planner run, and y, dx, dW are bitwise those of the first call."""
    from rmsnorm_lab import api
    from rmsnorm_lab.native import launch as native_launch
    x, w, dy = fresh((257, 4096), torch.bfloat16), fresh((4096,), torch.bfloat16), \
        fresh((257, 4096), torch.bfloat16)
    first = run("native", x, w, dy)

    def not_again(*args, **kwargs):
        raise AssertionError("the Python path ran for a memoized call")
    monkeypatch.setattr(api, "validate", not_again)
    monkeypatch.setattr(native_launch, "plan_launch", not_again)
    second = run("native", x, w, dy)
    assert second[3] == "RMSNormNativeBackward"
    for a, b in zip(first[:3], second[:3]):
        same(a, b)
    with settings.override(forward_variant="warp"), pytest.raises(AssertionError, match="Python"):
        run("native", x, w, dy)  # a setting a plan reads: not the memoized launch


@pytest.mark.parametrize("variant", ["auto", "row", "persistent", "warp", "fallback"])
def test_inference_through_the_memo_equals_the_python_launch(variant, monkeypatch):
    """An inference call goes through the extension too (its own launch: the forward without
    rstd, no backward compiled); repeated, it is served by the memo. Bitwise equal to the
    Python launch path's y, with the allocator poisoned first."""
    from rmsnorm_lab import api, dispatch
    from rmsnorm_lab.native import launch as native_launch
    x, w = fresh((3, 33, 4096), torch.bfloat16), fresh((4096,), torch.bfloat16)
    with settings.override(forward_variant=variant):
        expected = dispatch.forward(x, w, EPS, 0.0, "llama", "cute", False)[0]
        poison_allocator()
        first = rms_norm(x, w, EPS, casting_mode="llama")
        monkeypatch.setattr(api, "validate", lambda *a: pytest.fail("the Python path ran"))
        monkeypatch.setattr(native_launch, "plan_launch", lambda *a: pytest.fail("replanned"))
        poison_allocator()
        second = rms_norm(x, w, EPS, casting_mode="llama")
    torch.cuda.synchronize()
    assert first.grad_fn is None and second.shape == x.shape
    same(first, expected)
    same(second, expected)


@pytest.mark.parametrize("backward", ["fused", "split"])
def test_fused_add_native_equals_the_python_node_and_is_memoized(backward, monkeypatch):
    """The fused residual add on the native node: (y, h) and the gradients of x, the residual
    and the weight bitwise those of the Python node; repeated, served by the call memo."""
    from rmsnorm_lab import api
    from rmsnorm_lab.native import launch as native_launch
    x, r, dy, dh = (fresh((3, 33, 4096), torch.bfloat16) for _ in range(4))
    w = fresh((4096,), torch.bfloat16)

    def run_add(node):
        xg, rg, wg = (t.clone().requires_grad_() for t in (x, r, w))
        poison_allocator()
        with settings.override(autograd_node=node, backward=backward):
            y, h = rms_norm(xg, wg, EPS, residual=rg)
            torch.autograd.backward((y, h), (dy, dh))
        torch.cuda.synchronize()
        return (y.detach(), h.detach(), xg.grad, rg.grad, wg.grad), y.grad_fn.name()

    native, native_name = run_add("native")
    python, python_name = run_add("python")
    assert native_name == "RMSNormAddNativeBackward" and "FusedAdd" in python_name
    for a, b in zip(native, python):
        same(a, b)

    def not_again(*args, **kwargs):
        raise AssertionError("the Python path ran for a memoized call")
    monkeypatch.setattr(api, "validate", not_again)
    monkeypatch.setattr(native_launch, "plan_launch", not_again)
    again, _ = run_add("native")
    for a, b in zip(native, again):
        same(a, b)
