"""The Triton kernels under the interpreter, on CPU tensors, against ``rmsnorm_lab.reference``.

Run in their own process (``triton.jit`` decides at import whether to interpret):

    TRITON_INTERPRET=1 python3 -m pytest -q -m interpret tests/library/test_triton_interpret.py

Two interpreter bugs (Triton 3.6) are patched for these tests only, by the ``interpreter_fixes``
fixture below; the kernels themselves are written for the GPU and are untouched:

* fp32 -> bf16 casts truncate in the interpreter (its ``cast_impl`` converts with no rounding
  mode), while GPUs round to nearest even, as torch does. Half of all bf16 outputs would be 1 ulp
  off. The fixture rounds that one cast with torch.
* With NumPy >= 2.4, ``range(start, stop)`` over runtime scalars fails ("only 0-dimensional arrays
  can be converted to Python scalars"): the interpreter's ``tensor.__index__`` calls ``int()`` on a
  1-element array (triton-lang/triton#9171, fixed upstream after 3.6). Both the backward's row
  loop and the two-pass forward loop need it. The fixture uses ``.item()`` instead.
"""

import numpy as np
import pytest
import torch

import triton.language as tl
from triton.runtime import interpreter as triton_interpreter

from rmsnorm_lab import reference as ref
from rmsnorm_lab.triton import backward, forward
from rmsnorm_lab.triton.backward import triton_rms_norm_backward
from rmsnorm_lab.triton.forward import triton_fused_add_forward, triton_rms_norm_forward

pytestmark = pytest.mark.interpret

EPS = 1e-6
MODES = ref.CASTING_MODES
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SHAPES = [(1, 1), (3, 17), (5, 1023), (2, 3, 64)]


# ---------------------------------------------------------------- interpreter fixes (see top)

def _cast_impl_rtne(original):
    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            f32 = torch.from_numpy(np.array(src.data, dtype=np.float32, copy=True))
            bits = f32.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            return triton_interpreter.TensorHandle(bits, dst_type.scalar)
        return original(self, src, dst_type)
    return cast_impl


def _patch_lang_tensor_index(original):
    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))
    return patch_lang_tensor


@pytest.fixture(scope="module", autouse=True)
def interpreter_fixes():
    if not isinstance(forward._rms_norm_fwd_fused, triton_interpreter.InterpretedFunction):
        pytest.skip("needs TRITON_INTERPRET=1 set before triton kernels are imported "
                    "(run this file in its own pytest process, as tests/run.sh does)")
    with pytest.MonkeyPatch.context() as mp:
        builder = triton_interpreter.InterpreterBuilder
        mp.setattr(builder, "cast_impl", _cast_impl_rtne(builder.cast_impl))
        mp.setattr(triton_interpreter, "_patch_lang_tensor",
                   _patch_lang_tensor_index(triton_interpreter._patch_lang_tensor))
        yield


# ---------------------------------------------------------------- comparisons

def fresh(shape, dtype=torch.float32):
    return torch.randn(shape, dtype=torch.float32).to(dtype)


def ordered_bits(t):
    """Bit patterns of a 16-bit float tensor as integers in the order of the values they encode,
    so that two values are k ulps apart when these differ by k (and -0 == +0)."""
    i = t.view(torch.int16).to(torch.int32)
    return torch.where(i < 0, -32768 - i, i)


def assert_no_new_nan(got, expect, what):
    new_nan = got.isnan() & ~expect.isnan()
    assert not new_nan.any(), f"{what}: {int(new_nan.sum())} NaNs where the reference has none"


def assert_bits_close(got, expect, what):
    """A 16-bit result against the reference, element by element: all but 0.1% of the elements
    bit-exact or 1 ulp away, and all but 1% bit-exact (each bound allowing at least one element).

    The kernels round at the reference's points, so they differ only where a last-bit difference
    in an fp32 sum (another summation order) tips a rounding: a few elements in 10**4, and where
    a difference cancels (dx's ``m - x_hat * mean``) such a tip can reach 2 ulps. A rounding
    point missed or added moves many more elements by 1 ulp, which the second bound catches.
    """
    assert got.dtype == expect.dtype and got.shape == expect.shape
    ulps = (ordered_bits(got) - ordered_bits(expect)).abs()
    beyond_one = int((ulps > 1).sum())
    assert beyond_one <= max(1, got.numel() // 1000), (
        f"{what}: {beyond_one} of {got.numel()} elements more than 1 ulp away (worst "
        f"{int(ulps.max())} ulps)")
    inexact = int((ulps != 0).sum())
    assert inexact <= max(1, got.numel() // 100), (f"{what}: {inexact} of {got.numel()} "
                                                   "elements not bit-exact")


def rel_norm_error(got, expect):
    got, expect = got.double(), expect.double()
    return ((got - expect).norm() / expect.norm().clamp_min(1e-30)).item()


def assert_y_close(y, y_ref):
    assert y.dtype == y_ref.dtype and y.shape == y_ref.shape and y.is_contiguous()
    assert_no_new_nan(y, y_ref, "y")
    if y.dtype == torch.float32:
        torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    else:
        assert_bits_close(y, y_ref, "y")


def assert_rstd_close(rstd, rstd_ref):
    assert rstd.dtype == torch.float32 and rstd.shape == rstd_ref.shape
    assert_no_new_nan(rstd, rstd_ref, "rstd")
    torch.testing.assert_close(rstd, rstd_ref, rtol=1e-5, atol=0)


def assert_grads_close(dx, dw, dx_ref, dw_ref, weight):
    assert dx.dtype == dx_ref.dtype and dx.shape == dx_ref.shape and dx.is_contiguous()
    assert_no_new_nan(dx, dx_ref, "dx")
    if dx.dtype == torch.float32:
        torch.testing.assert_close(dx, dx_ref, rtol=1e-5, atol=1e-5)
    else:
        assert rel_norm_error(dx, dx_ref) < 1e-2
        assert_bits_close(dx, dx_ref, "dx")
    if weight is None:
        assert dw is None
        return
    assert dw.dtype == weight.dtype and dw.shape == weight.shape
    assert_no_new_nan(dw, dw_ref, "dw")
    tol = 1e-4 if weight.dtype == torch.float32 else 1e-2
    assert rel_norm_error(dw, dw_ref) < tol


def check_forward(x, weight, offset, mode):
    """Forward of the 2-D view of ``x`` against the reference; returns (x2d, rstd)."""
    x2d = x.reshape(-1, x.shape[-1])
    y, rstd = triton_rms_norm_forward(x2d, weight, EPS, offset, mode, need_rstd=True)
    y_ref, rstd_ref = ref.rms_norm_forward(x2d, weight, EPS, offset, mode)
    assert_rstd_close(rstd, rstd_ref)
    if mode == "none":  # rstd is rounded to x's dtype first, so an fp32 ulp of it (another
        # order of the sum) can move a whole row by an ulp: y is checked with the kernel's rstd
        y_ref, _ = ref.rms_norm_forward(x2d, weight, EPS, offset, mode, rstd=rstd)
    assert_y_close(y, y_ref)
    return rstd


def check_backward(x, weight, offset, mode):
    x2d = x.reshape(-1, x.shape[-1])
    dy = fresh(x2d.shape, x.dtype)
    rstd = ref.rstd_of(x2d, EPS)
    dx, dw = triton_rms_norm_backward(dy, x2d, weight, rstd, offset, mode)
    dx_ref, dw_ref = ref.rms_norm_backward(dy, x2d, weight, rstd, offset, mode)
    assert_grads_close(dx, dw, dx_ref, dw_ref, weight)


# ---------------------------------------------------------------- forward

@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("with_weight", [True, False])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_matches_reference(dtype, mode, with_weight, offset, shape):
    x = fresh(shape, dtype)
    w = fresh(shape[-1:], dtype) if with_weight else None
    check_forward(x, w, offset, mode)


@pytest.mark.parametrize("x_dtype, w_dtype", [(torch.bfloat16, torch.float32),
                                              (torch.float16, torch.bfloat16),
                                              (torch.float32, torch.float16)])
@pytest.mark.parametrize("mode", MODES)
def test_weight_dtype_may_differ_from_x(x_dtype, w_dtype, mode):
    x = fresh((4, 96), x_dtype)
    w = fresh((96,), w_dtype)
    check_forward(x, w, 1.0, mode)
    check_backward(x, w, 1.0, mode)


@pytest.mark.parametrize("mode", MODES)
def test_forward_row_stride_larger_than_width(mode):
    x = fresh((6, 80), torch.bfloat16)[:, 5:55]  # row stride 80, width 50
    w = fresh((50,), torch.bfloat16)
    check_forward(x, w, 0.0, mode)


def test_forward_without_rstd_gives_same_y():
    x, w = fresh((3, 40), torch.float16), fresh((40,), torch.float16)
    y, rstd = triton_rms_norm_forward(x, w, EPS, 0.0, "llama", need_rstd=False)
    assert rstd is None
    y_ref, _ = ref.rms_norm_forward(x, w, EPS, 0.0, "llama")
    assert_y_close(y, y_ref)


@pytest.mark.parametrize("with_weight", [True, False])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_two_pass_path(monkeypatch, dtype, mode, with_weight):
    # Lower the threshold so that a 200-wide row takes the two-pass kernel, in 32-wide chunks
    # (200 is no multiple of 32: the last chunk is masked). The fused kernel is removed, so a
    # wrong dispatch fails loudly instead of passing on the other path.
    monkeypatch.setattr(forward, "MAX_FUSED_BLOCK", 64)
    monkeypatch.setattr(forward, "LOOP_BLOCK", 32)
    monkeypatch.setattr(forward, "_rms_norm_fwd_fused", None)
    x = fresh((3, 200), dtype)
    w = fresh((200,), dtype) if with_weight else None
    check_forward(x, w, 1.0, mode)


# ---------------------------------------------------------------- the fused residual add

@pytest.mark.parametrize("two_pass", [False, True])
@pytest.mark.parametrize("with_weight", [True, False])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_forward_matches_reference(monkeypatch, dtype, mode, with_weight, two_pass):
    """h = x + residual rounded to x's dtype (bit-exact: one fp32 add, one rounding), y its
    norm; the two-pass path stores h in pass 1 and normalizes it in pass 2."""
    if two_pass:
        monkeypatch.setattr(forward, "MAX_FUSED_BLOCK", 64)
        monkeypatch.setattr(forward, "LOOP_BLOCK", 32)
        monkeypatch.setattr(forward, "_rms_norm_fwd_fused", None)
    x = fresh((5, 200), dtype)
    r = fresh((8, 256), dtype)[:5, :200]  # a row-strided residual
    w = fresh((200,), dtype) if with_weight else None
    y, h, rstd = triton_fused_add_forward(x, r, w, EPS, 1.0, mode, need_rstd=True)
    y_ref, h_ref, rstd_ref = ref.fused_add_rms_norm_forward(x, r, w, EPS, 1.0, mode)
    assert torch.equal(h, h_ref)
    assert_y_close(y, y_ref)
    assert_rstd_close(rstd, rstd_ref)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_with_the_fused_adds_gradient(dtype, mode):
    x, w = fresh((6, 96), dtype), fresh((96,), dtype)
    dy, dh = fresh((6, 96), dtype), fresh((6, 96), dtype)
    rstd = ref.rstd_of(x, EPS)
    dx, dw = triton_rms_norm_backward(dy, x, w, rstd, 0.5, mode, dh=dh)
    dx_ref, dw_ref = ref.rms_norm_backward(dy, x, w, rstd, 0.5, mode, dh=dh)
    assert_grads_close(dx, dw, dx_ref, dw_ref, w)


def test_fused_add_refuses_a_residual_of_another_shape_or_dtype():
    x = fresh((4, 32), torch.bfloat16)
    with pytest.raises(ValueError, match="residual must have x's shape"):
        triton_fused_add_forward(x, fresh((4, 32)), None, EPS, 0.0, "llama", False)
    with pytest.raises(ValueError, match="residual"):
        triton_fused_add_forward(x, fresh((3, 32), torch.bfloat16), None, EPS, 0.0, "llama",
                                 False)


# ---------------------------------------------------------------- backward

@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("with_weight", [True, False])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_matches_reference(dtype, mode, with_weight, offset, shape):
    x = fresh(shape, dtype)
    w = fresh(shape[-1:], dtype) if with_weight else None
    check_backward(x, w, offset, mode)


@pytest.mark.parametrize("m", [1, 4, 9, 13])
def test_backward_rows_split_over_programs(m):
    # Under the interpreter P = min(M, 4): these give 1 row per program, 3 per program, and a
    # last program that owns fewer rows than the others (13 = 4 + 4 + 4 + 1).
    x, w = fresh((m, 48), torch.bfloat16), fresh((48,), torch.bfloat16)
    check_backward(x, w, 0.0, "llama")


@pytest.mark.parametrize("mode", MODES)
def test_backward_row_strides_larger_than_width(mode):
    x = fresh((5, 64), torch.float16)[:, :33]
    dy = fresh((5, 100), torch.float16)[:, 10:43]
    w = fresh((33,), torch.float16)
    rstd = ref.rstd_of(x, EPS)
    dx, dw = triton_rms_norm_backward(dy, x, w, rstd, 1.0, mode)
    dx_ref, dw_ref = ref.rms_norm_backward(dy, x, w, rstd, 1.0, mode)
    assert_grads_close(dx, dw, dx_ref, dw_ref, w)


# ---------------------------------------------------------------- argument checks

def test_forward_rejects_bad_arguments():
    x = fresh((2, 8))
    with pytest.raises(ValueError, match="x must be a 2-D"):
        triton_rms_norm_forward(x.reshape(1, 2, 8), None, EPS, 0.0, "llama", True)
    with pytest.raises(ValueError, match="unit-stride"):
        triton_rms_norm_forward(x.t(), None, EPS, 0.0, "llama", True)
    with pytest.raises(ValueError, match=r"weight must have shape \(8,\)"):
        triton_rms_norm_forward(x, fresh((7,)), EPS, 0.0, "llama", True)
    with pytest.raises(ValueError, match="casting_mode"):
        triton_rms_norm_forward(x, None, EPS, 0.0, "fp8", True)


def test_backward_rejects_bad_arguments():
    x = fresh((2, 8))
    rstd = ref.rstd_of(x, EPS)
    with pytest.raises(ValueError, match="dy must have 8 columns"):
        triton_rms_norm_backward(fresh((2, 9)), x, None, rstd, 0.0, "llama")
    with pytest.raises(ValueError, match="rstd must be float32"):
        triton_rms_norm_backward(x, x, None, rstd.half(), 0.0, "llama")
    wide = torch.zeros((1, backward.MAX_BLOCK + 1))
    with pytest.raises(NotImplementedError, match=f"N={backward.MAX_BLOCK + 1}"):
        triton_rms_norm_backward(wide, wide, None, torch.ones(1), 0.0, "llama")
