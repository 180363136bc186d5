"""The fused residual add with the CuTe and Triton kernels on a GPU (pytest -m gpu): y, h and
every gradient against the float64 reference on fresh inputs, outputs poisoned first, in a CUDA
graph and under torch.compile."""

import pytest
import torch

from rmsnorm_lab import reference, rms_norm, settings

pytestmark = pytest.mark.gpu

EPS = 1e-6
SHAPES = [(1, 4096), (3, 1023), (131, 4096), (2, 7, 8192), (4096, 128), (1001, 64),
          (65, 16384)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 3e-3}


def rel(a, b):
    assert not torch.isnan(a).any()
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def poison():
    torch.empty(256 << 20, dtype=torch.float32, device="cuda").fill_(float("nan"))


def check(backend, shape, dtype, mode, with_weight, backward="auto"):
    g = lambda s: torch.randn(s, device="cuda").to(dtype)  # noqa: E731
    x, r = g(shape), g(shape)
    w = g(shape[-1:]) if with_weight else None
    dy, dh = g(shape), g(shape)
    leaves = [t.clone().requires_grad_() if t is not None else None for t in (x, r, w)]
    poison()
    with settings.override(backward=backward):
        y, h = rms_norm(leaves[0], leaves[2], EPS, residual=leaves[1], casting_mode=mode,
                        backend=backend)
        torch.autograd.backward((y, h), (dy, dh))
    torch.cuda.synchronize()
    h_ref = reference.add_residual(x, r)
    assert torch.equal(h, h_ref)  # one fp32 add, one rounding: bit-exact
    y_ref, rstd = reference.rms_norm_forward(h_ref, w, EPS, 0.0, mode)
    d_ref, dw_ref = reference.rms_norm_backward(dy, h_ref, w, rstd, 0.0, mode, dh=dh)
    assert rel(y, y_ref) < TOL[dtype]
    assert rel(leaves[0].grad, d_ref) < TOL[dtype]
    assert torch.equal(leaves[0].grad, leaves[1].grad)
    if with_weight:
        assert rel(leaves[2].grad, dw_ref) < 10 * TOL[dtype]


@pytest.mark.parametrize("backend", ["cute", "triton"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", ["llama", "gemma", "none"])
def test_matches_the_reference(backend, shape, dtype, mode):
    check(backend, shape, dtype, mode, with_weight=True)


@pytest.mark.parametrize("backward", ["fused", "split"])
@pytest.mark.parametrize("with_weight", [True, False])
def test_both_cute_backwards_with_and_without_weight(backward, with_weight):
    check("cute", (257, 4096), torch.bfloat16, "llama", with_weight, backward)


# staged: the backward's rows of h, dy and dh ringed through shared memory (N a multiple of 256
# copies; a strip shorter than the ring; rows left over by the strips)
@pytest.mark.parametrize("shape", [(257, 4096), (3, 2048), (1000, 8192)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("with_weight", [True, False])
def test_the_staged_backward(shape, dtype, with_weight):
    check("cute", shape, dtype, "llama", with_weight, "staged")


@pytest.mark.parametrize("backend", ["cute", "triton"])
@pytest.mark.usefixtures("kernels_under_compile")
def test_in_a_cuda_graph_and_under_compile(backend, capture_on_side_stream):
    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    r, w = torch.randn_like(x), torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    expect_y, expect_h = rms_norm(x, w, EPS, residual=r, backend=backend)
    graph, (y, h) = capture_on_side_stream(lambda: rms_norm(x, w, EPS, residual=r,
                                                            backend=backend))
    y.fill_(float("nan"))
    h.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, expect_y) and torch.equal(h, expect_h)

    def block(a, b):
        yy, hh = rms_norm(a, w, EPS, residual=b, backend=backend)
        return yy * 2, hh
    cy, ch = torch.compile(block, fullgraph=True)(x, r)
    torch.testing.assert_close(cy, expect_y * 2)
    assert torch.equal(ch, expect_h)
