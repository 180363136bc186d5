"""The autograd path with the Triton backend, under the interpreter on CPU tensors.

Every test here is marked ``interpret``; run in its own process, as tests/run.sh does:

    TRITON_INTERPRET=1 python3 -m pytest -q -m interpret tests/library/test_autograd_interpret.py

``api.rms_norm`` refuses CPU tensors for a GPU backend, so these drive the layer below it
(``RMSNormFunction`` and ``launch.backward``) directly.
"""

import pytest
import torch

from rmsnorm_lab import dispatch, reference
from rmsnorm_lab.autograd import RMSNormFunction
# The interpreter fixes (module-scoped, autouse) and the comparisons of the Triton tests.
from test_triton_interpret import assert_grads_close, interpreter_fixes  # noqa: F401

pytestmark = pytest.mark.interpret

EPS = 1e-6
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def fresh(shape, dtype=torch.float32):
    return torch.randn(shape, dtype=torch.float32).to(dtype)


@pytest.mark.parametrize("with_weight", [True, False])
@pytest.mark.parametrize("mode", reference.CASTING_MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_function_grads_match_reference(dtype, mode, with_weight):
    x = fresh((2, 5, 48), dtype).requires_grad_()
    w = fresh((48,), dtype).requires_grad_() if with_weight else None
    dy = fresh((2, 5, 48), dtype)
    y = RMSNormFunction.apply(x, w, EPS, 1.0, mode, "triton", False)
    y.backward(dy)
    xd, wd = x.detach(), (w.detach() if w is not None else None)
    _, rstd = reference.rms_norm_forward(xd, wd, EPS, 1.0, mode)
    dx_ref, dw_ref = reference.rms_norm_backward(dy, xd, wd, rstd, 1.0, mode)
    assert_grads_close(x.grad.reshape(-1, 48), w.grad if w is not None else None,
                       dx_ref.reshape(-1, 48), dw_ref, wd)


@pytest.mark.parametrize("with_weight", [True, False])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m", [1, 9])
def test_backward_into_dy_matches_out_of_place(m, dtype, with_weight):
    # The kernel reads a whole row of dy before writing that row of dx: writing dx over dy
    # gives bit-identical results to a separate dx.
    x, dy = fresh((m, 96), dtype), fresh((m, 96), dtype)
    w = fresh((96,), dtype) if with_weight else None
    rstd = reference.rstd_of(x, EPS)
    dx, dw = dispatch.backward(dy, x, w, rstd, 0.0, "llama", "triton")
    buf = dy.clone()
    dx2, dw2 = dispatch.backward(buf, x, w, rstd, 0.0, "llama", "triton", dx_out=buf)
    assert dx2 is buf
    assert torch.equal(buf, dx)
    if with_weight:
        assert torch.equal(dw2, dw)
    else:
        assert dw2 is None


def test_function_in_place_writes_into_the_gradient():
    x = fresh((6, 40), torch.bfloat16).requires_grad_()
    w = fresh((40,), torch.bfloat16).requires_grad_()
    dy = fresh((6, 40), torch.bfloat16)
    y = RMSNormFunction.apply(x, w, EPS, 0.0, "llama", "triton", False)
    dx_ref, dw_ref = torch.autograd.grad(y, (x, w), dy)
    y = RMSNormFunction.apply(x, w, EPS, 0.0, "llama", "triton", True)
    g = dy.clone()
    dx, dw = torch.autograd.grad(y, (x, w), g)
    assert dx.data_ptr() == g.data_ptr()
    assert torch.equal(dx, dx_ref) and torch.equal(dw, dw_ref)
