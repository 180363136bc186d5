"""The Triton fp8-output kernel (``triton/quant.py``) under the interpreter, on CPU tensors.

Run in its own process, as tests/run.sh does:

    TRITON_INTERPRET=1 python3 -m pytest -q -m interpret tests/library/test_fp8_interpret.py

The interpreter runs the kernel and stores float8_e4m3fn into CPU tensors, but its fp32 ->
float8e4nv convert (Triton 3.6, ``_convert_float``) is not the GPU's: it rounds halfway cases away
from zero (1.0625 gives 1.125, not 1.0), drops the carry out of the mantissa when the exponent's
low bit is set (7.82 gives 4.0, not 8.0), and truncates subnormals (0.00146 gives 0, not 2**-9).
The fixture below converts that one cast with torch (round to nearest even, as the GPU's
``cvt.rn.satfinite``); the kernel clamps before it converts, so torch's handling of values past
448 never matters. With that, the kernel equals the reference bit for bit: y_q against the
quantizer applied to the interpreted forward's y (the same statistics, summed in the same order),
scales and h exactly. Against the reference's own y the two differ where an fp32 sum in another
order tips a rounding of y (as the forward's tests allow).
"""

import numpy as np
import pytest
import torch

import triton.language as tl
from triton.runtime import interpreter as triton_interpreter

from rmsnorm_lab import dispatch
from rmsnorm_lab import reference as ref
from rmsnorm_lab.triton import forward, quant
from rmsnorm_lab.triton.forward import triton_fused_add_forward, triton_rms_norm_forward
from rmsnorm_lab.triton.quant import triton_rms_norm_fp8
# The interpreter fixes of the Triton tests (module-scoped, autouse).
from test_triton_interpret import interpreter_fixes  # noqa: F401

pytestmark = pytest.mark.interpret

FP8 = torch.float8_e4m3fn
EPS = 1e-6
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
QUANTS = ["per_token", "static", "bounded"]


def _fp8_cast_rtne(original):
    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.float8e4nv:
            f32 = torch.from_numpy(np.array(src.data, dtype=np.float32, copy=True))
            q = f32.to(FP8).view(torch.uint8).numpy()
            return triton_interpreter.TensorHandle(q, dst_type.scalar)
        return original(self, src, dst_type, rounding_mode)
    return create_fp_to_fp


@pytest.fixture(scope="module", autouse=True)
def fp8_cast_fix(interpreter_fixes):  # noqa: F811
    with pytest.MonkeyPatch.context() as mp:
        builder = triton_interpreter.InterpreterBuilder
        mp.setattr(builder, "create_fp_to_fp", _fp8_cast_rtne(builder.create_fp_to_fp))
        yield


def fresh(shape, dtype=torch.float32):
    return torch.randn(shape, dtype=torch.float32).to(dtype)


def bits(q):
    return q.view(torch.uint8)


def scales_for(quant_kind):
    """``(scale, scale_ub)`` of a kind of quantization."""
    if quant_kind == "static":
        return torch.tensor(0.01), None
    return None, (torch.tensor([1.5]) if quant_kind == "bounded" else None)


def chain(x, residual, w, offset, mode, scale, scale_ub):
    """The interpreted forward's y (or the fused add's), then the reference quantizer."""
    if residual is None:
        y, _ = triton_rms_norm_forward(x, w, EPS, offset, mode, need_rstd=False)
        h = None
    else:
        y, h, _ = triton_fused_add_forward(x, residual, w, EPS, offset, mode, need_rstd=False)
    y_q, scales = ref.quantize_fp8(y, scale, scale_ub)
    return y_q, (scales if scale is None else None), h


def assert_same(got, expect):
    for g, e in zip(got, expect):
        if e is None:
            assert g is None
            continue
        assert g.dtype == e.dtype and g.shape == e.shape and g.is_contiguous()
        assert torch.equal(bits(g) if g.dtype == FP8 else g, bits(e) if e.dtype == FP8 else e)


# ---------------------------------------------------------------- the kernel, bit for bit

@pytest.mark.parametrize("quant_kind", QUANTS)
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("mode", ref.CASTING_MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernel_equals_the_forward_then_the_quantizer(dtype, mode, with_residual, quant_kind):
    scale, ub = scales_for(quant_kind)
    for shape in [(1, 1), (3, 17), (5, 1023)]:
        for with_weight, offset in ((True, 0.0), (True, 1.0), (False, 0.0)):
            x = fresh(shape, dtype)
            r = fresh((shape[0], shape[1] + 3), dtype)[:, :shape[1]] if with_residual else None
            w = fresh(shape[-1:], dtype) if with_weight else None
            got = triton_rms_norm_fp8(x, r, w, EPS, offset, mode, scale, ub)
            assert_same(got, chain(x, r, w, offset, mode, scale, ub))


@pytest.mark.parametrize("x_dtype, w_dtype", [(torch.bfloat16, torch.float32),
                                              (torch.float16, torch.bfloat16),
                                              (torch.float32, torch.float16)])
@pytest.mark.parametrize("quant_kind", QUANTS)
def test_weight_dtype_may_differ_from_x(x_dtype, w_dtype, quant_kind):
    scale, ub = scales_for(quant_kind)
    x, w = fresh((4, 96), x_dtype), fresh((96,), w_dtype)
    for mode in ref.CASTING_MODES:
        got = triton_rms_norm_fp8(x, None, w, EPS, 1.0, mode, scale, ub)
        assert_same(got, chain(x, None, w, 1.0, mode, scale, ub))


@pytest.mark.parametrize("quant_kind", QUANTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernel_against_the_reference(dtype, quant_kind):
    """Against the reference's own y: h exactly; y_q and the scales equal wherever the two y
    agree, which is nearly everywhere."""
    scale, ub = scales_for(quant_kind)
    x, r, w = fresh((16, 256), dtype), fresh((16, 256), dtype), fresh((256,), dtype)
    y_q, scales, h = triton_rms_norm_fp8(x, r, w, EPS, 0.0, "llama", scale, ub)
    y_q_ref, scales_ref, h_ref = ref.rms_norm_fp8(x, w, EPS, 0.0, "llama", scale, r, ub)
    assert torch.equal(h, h_ref)
    same = (bits(y_q) == bits(y_q_ref)).float().mean().item()
    assert same >= 0.99, same
    if scale is None:
        torch.testing.assert_close(scales, scales_ref, rtol=2 ** -7, atol=0)


@pytest.mark.parametrize("quant_kind", QUANTS)
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_chunked_kernel_for_wide_rows(monkeypatch, dtype, with_residual, quant_kind):
    """Rows past MAX_FUSED_BLOCK (lowered here: 200 columns in 32-wide chunks, the last one
    masked) take the chunked kernel; the fused one is removed so a wrong choice fails."""
    monkeypatch.setattr(forward, "MAX_FUSED_BLOCK", 64)
    monkeypatch.setattr(forward, "LOOP_BLOCK", 32)
    monkeypatch.setattr(quant, "_rms_norm_fp8_fused", None)
    scale, ub = scales_for(quant_kind)
    x, w = fresh((3, 200), dtype), fresh((200,), dtype)
    r = fresh((3, 200), dtype) if with_residual else None
    got = triton_rms_norm_fp8(x, r, w, EPS, 1.0, "llama", scale, ub)
    assert_same(got, chain(x, r, w, 1.0, "llama", scale, ub))


def test_dispatch_reshapes_leading_dimensions():
    x, w = fresh((2, 3, 40), torch.bfloat16), fresh((40,), torch.bfloat16)
    y_q, scales, h = dispatch.fp8_forward(x, x, w, EPS, 0.0, "gemma", None, None, "triton")
    assert y_q.shape == (2, 3, 40) and scales.shape == (2, 3) and h.shape == (2, 3, 40)
    expect = ref.rms_norm_fp8(x.view(6, 40), w, EPS, 0.0, "gemma", None, x.view(6, 40))
    assert torch.equal(h.view(6, 40), expect[2])


# ---------------------------------------------------------------- edges, exactly

@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf * 0
@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("quant_kind", ["per_token", "static"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_zeros_nan_and_inf_rows(monkeypatch, dtype, quant_kind, chunked):
    """A row of zeros (the smallest scale, zeros), a row with a NaN (all +448), a row with
    +-inf (zeros, and +448 at the infinities), a plain row."""
    if chunked:
        monkeypatch.setattr(forward, "MAX_FUSED_BLOCK", 16)
        monkeypatch.setattr(forward, "LOOP_BLOCK", 16)
    scale, _ = scales_for(quant_kind)
    x = fresh((4, 40), dtype)
    x[0] = 0
    x[1, 7] = float("nan")
    x[2, 3], x[2, 30] = float("inf"), float("-inf")
    w = fresh((40,), dtype)
    y_q, scales, _ = triton_rms_norm_fp8(x, None, w, EPS, 0.0, "llama", scale, None)
    y_q_ref, scales_ref = ref.rms_norm_fp8(x, w, EPS, 0.0, "llama", scale)
    assert torch.equal(bits(y_q[:3]), bits(y_q_ref[:3]))
    assert bool((y_q[1].float() == 448).all()) and y_q[2, 3].float() == 448
    if scale is None:
        assert torch.equal(scales[:3], scales_ref[:3])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_saturation_and_ties(dtype):
    ties = [1.0625, 1.1875, -1.0625, 9.5, 10.5, 2 ** -10, 3 * 2 ** -10, 0.0146484375]
    x = torch.ones(2, len(ties), dtype=dtype)
    w = torch.tensor(ties, dtype=dtype)
    y_q, _, _ = triton_rms_norm_fp8(x, None, w, 0.0, 0.0, "llama", torch.ones(1), None)
    assert y_q.float()[0].tolist() == [1.0, 1.25, -1.0, 10.0, 10.0, 0.0, 2 ** -8, 0.015625]
    y_q, _, _ = triton_rms_norm_fp8(x, None, w, 0.0, 0.0, "llama", torch.tensor(1e-6), None)
    assert y_q.float()[0].tolist() == [448.0, 448.0, -448.0, 448.0, 448.0, 448.0, 448.0, 448.0]
