"""``rms_norm_fp8`` on a GPU (run with: pytest -m gpu).

Bit for bit against the unfused chain: the same backend's norm in x's dtype (``rms_norm``),
then ``reference.quantize_fp8`` on the GPU. The CuTe kernel is the CuTe forward's tile with an
fp8 epilogue, so its chain holds bit for bit on random rows too, where both plans take the same
tile. The Triton kernel computes y with the forward's statistics and ``_normalize``, but its
fp32 sum of squares runs in another order (the fp8 store gives the row another layout), so the
exact comparison takes rows of small integers, whose sums are exact in any order; the weights
stay random. Random rows are held to one fp8 step of the reference (torch's sum, another order
again).
"""

import pytest
import torch

from rmsnorm_lab import reference, rms_norm, rms_norm_fp8, settings
from rmsnorm_lab.common.device import sm_count
from rmsnorm_lab.cute.launch.forward import forward_launch
from rmsnorm_lab.settings import snapshot

pytestmark = pytest.mark.gpu

FP8 = torch.float8_e4m3fn
EPS = 1e-6
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
MODES = ["llama", "gemma", "none"]
# odd N, N=1, M=1, per-head rows, model widths, the widest fused row, a chunked row, 3-D x
SHAPES = [(1, 1), (7, 1), (1, 4096), (3, 1023), (4096, 128), (333, 4096), (133, 8192),
          (64, 65536), (3, 100003), (2, 7, 1024)]
# (quantization, residual, weight, offset): the combinations each shape runs
CASES = [("per_token", False, True, 0.0), ("static", True, True, 1.0),
         ("bounded", True, False, 0.0), ("per_token", True, True, 0.0),
         ("static", False, False, 0.0), ("static", False, True, 0.0)]
BACKENDS = ["triton", "cute"]
#: scales within an ulp of x's dtype (a y at the row's max one ulp apart), with room
SCALE_REL = {torch.float32: 1e-6, torch.bfloat16: 2 ** -6, torch.float16: 2 ** -9}


def fresh(shape, dtype):
    return torch.randn(shape, device="cuda", dtype=torch.float32).to(dtype)


def integers(shape, dtype):
    """Rows of integers in [-4, 4]: every partial sum of squares (at most 64 * 100003 < 2**24)
    is exact in fp32, and so is a residual's sum, so rstd does not depend on the order."""
    return torch.randint(-4, 5, shape, device="cuda").to(dtype)


def poison_allocator():
    """Fill the caching allocator's free blocks with 0xFF bytes (NaN in fp8, bf16, fp16 and
    fp32), so an output the kernel leaves unwritten shows up."""
    big = torch.empty(256 << 20, dtype=torch.uint8, device="cuda").fill_(0xFF)
    del big


def bits(q):
    return q.view(torch.uint8)


def quant_args(kind):
    if kind == "static":
        return dict(scale=torch.tensor(0.02, device="cuda"))
    if kind == "bounded":
        return dict(scale_ub=torch.tensor([2.5], device="cuda"))
    return {}


def chain(x, w, backend, mode, offset, residual=None, scale=None, scale_ub=None, eps=EPS):
    if residual is None:
        y, h = rms_norm(x, w, eps, offset=offset, casting_mode=mode, backend=backend), None
    else:
        y, h = rms_norm(x, w, eps, residual=residual, offset=offset, casting_mode=mode,
                        backend=backend)
    y_q, scales = reference.quantize_fp8(y, scale, scale_ub)
    return (y_q, scales) if h is None else (y_q, scales, h)


def assert_same(got, expect):
    assert len(got) == len(expect)
    for g, e in zip(got, expect):
        assert g.dtype == e.dtype and g.shape == e.shape
        if g.dtype == FP8:
            assert g.is_contiguous()
            g, e = bits(g), bits(e)
        assert torch.equal(g, e)


def check_no_poison(out):
    """No NaN anywhere: the kernel never writes an fp8 NaN (it saturates), scales of finite
    rows are finite, and h of finite inputs is finite."""
    for t in out:
        assert not (t.float() if t.dtype == FP8 else t).isnan().any(), "unwritten output"


def shape_mode_dtype():
    """Every shape in every mode and dtype, but the widest odd row (the fallback, compiled for
    each case: over a minute a test) in each dtype and each mode once."""
    for shape in SHAPES:
        for i, mode in enumerate(MODES):
            for j, dtype in enumerate(DTYPES):
                if shape[-1] != 100003 or i == j:
                    yield pytest.param(shape, mode, dtype, id="-".join(
                        ["x".join(map(str, shape)), mode, str(dtype)]))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape, mode, dtype", list(shape_mode_dtype()))
def test_equals_the_chain_bit_for_bit(backend, dtype, mode, shape):
    N = shape[-1]
    for kind, with_residual, with_weight, offset in CASES:
        x = integers(shape, dtype)
        r = integers(shape, dtype) if with_residual else None
        w = fresh((N,), dtype) if with_weight else None
        kw = quant_args(kind)
        poison_allocator()
        got = rms_norm_fp8(x, w, EPS, residual=r, offset=offset, casting_mode=mode,
                           backend=backend, **kw)
        torch.cuda.synchronize()
        check_no_poison(got)
        if "scale" in kw:
            assert got[1] is kw["scale"]
        assert_same(got, chain(x, w, backend, mode, offset, r, **kw))


@pytest.mark.parametrize("x_dtype, w_dtype", [(torch.bfloat16, torch.float32),
                                              (torch.float16, torch.bfloat16),
                                              (torch.float32, torch.float16)])
@pytest.mark.parametrize("backend", BACKENDS)
def test_weight_dtype_may_differ_from_x(backend, x_dtype, w_dtype):
    x, w = integers((257, 4096), x_dtype), fresh((4096,), w_dtype)
    for mode in MODES:
        for kind in ("per_token", "static"):
            kw = quant_args(kind)
            got = rms_norm_fp8(x, w, EPS, offset=1.0, casting_mode=mode, backend=backend, **kw)
            assert_same(got, chain(x, w, backend, mode, 1.0, **kw))


def row_order(x, w, residual, quant):
    """What fixes the order of a row's sums in the CuTe forward's plan for these rows: the
    variant, the threads a row, the copies a thread, the chunks."""
    plan = forward_launch(x, w, "llama", False, snapshot(), sm_count(x.get_device()),
                          residual=residual, quant=quant).plan
    return plan.variant, plan.threads_per_row, plan.vecs_per_thread, plan.chunks


@pytest.mark.parametrize("kind", ["per_token", "static", "bounded"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(257, 4096), (4096, 128), (3000, 1024), (8192, 1024),
                                   (8192, 2048), (64, 8192), (16, 16384), (5, 1000)],
                         ids=lambda s: "x".join(map(str, s)))
def test_cute_equals_its_chain_on_random_rows(shape, dtype, kind):
    """The CuTe kernel quantizes exactly the y of the CuTe forward (same tile, same sum), on
    random rows: warp-per-row, the row kernel at few and many rows, the fallback, with and
    without the residual. (Rows the forward runs in its register-bound tiles, 16 KB rows at
    many rows and rows wider than the registers, take another tile here: within one step.)"""
    x, r = fresh(shape, dtype), fresh(shape, dtype)
    w = fresh(shape[-1:], dtype)
    kw = quant_args(kind)
    quant = "token" if kind != "static" else "static"
    same = [res for res in (None, r) if row_order(x, w, res, "") == row_order(x, w, res, quant)]
    if not same:  # the sums run in another order: test_random_rows_within_one_fp8_step
        pytest.skip("the fp8 plan takes another tile than the forward's at these rows")
    for res in same:
        poison_allocator()
        got = rms_norm_fp8(x, w, EPS, residual=res, casting_mode="llama", backend="cute", **kw)
        check_no_poison(got)
        assert_same(got, chain(x, w, "cute", "llama", 0.0, res, **kw))


@pytest.mark.parametrize("kind", ["per_token", "static", "bounded"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(257, 4096), (4096, 128), (16, 16384), (2, 70001),
                                   (8192, 8192), (8, 32768)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("backend", BACKENDS)
def test_random_rows_within_one_fp8_step(backend, shape, dtype, kind):
    """Random rows, against the chain and the reference: h exactly; y_q equal but where an
    fp32 sum in another order moved y by its last bit (then one fp8 step); scales within an
    ulp of x's dtype."""
    x, r = fresh(shape, dtype), fresh(shape, dtype)
    w = fresh(shape[-1:], dtype)
    kw = quant_args(kind)
    y_q, scales, h = rms_norm_fp8(x, w, EPS, residual=r, casting_mode="llama",
                                  backend=backend, **kw)
    ref_out = reference.rms_norm_fp8(x, w, EPS, 0.0, "llama", kw.get("scale"), r,
                                     kw.get("scale_ub"))
    for y_q_ref, scales_ref, h_ref in (ref_out, chain(x, w, backend, "llama", 0.0, r, **kw)):
        assert torch.equal(h, h_ref)
        steps = (reference.fp8_order(y_q) - reference.fp8_order(y_q_ref)).abs()
        assert int(steps.max()) <= 1
        assert (steps == 0).float().mean().item() >= 0.99
        if "scale" not in kw:
            torch.testing.assert_close(scales, scales_ref, rtol=SCALE_REL[dtype], atol=0)


@pytest.mark.parametrize("N", [40, 4096, 70001])
@pytest.mark.parametrize("kind", ["per_token", "static"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("backend", BACKENDS)
def test_zeros_nan_and_inf_rows(backend, dtype, kind, N):
    """A row of zeros (the smallest scale and zeros), a row with a NaN (+448 throughout), a
    row with +-inf (zeros, and +448 at each infinity: inf * rstd 0 is NaN), exactly as the
    reference, in the fused and the chunked kernel."""
    x = integers((4, N), dtype)
    x[0] = 0
    x[1, 7] = float("nan")
    x[2, 3], x[2, N - 1] = float("inf"), float("-inf")
    w = fresh((N,), dtype)
    kw = quant_args(kind)
    y_q, scales = rms_norm_fp8(x, w, EPS, casting_mode="llama", backend=backend, **kw)
    y_q_ref, scales_ref = reference.rms_norm_fp8(x, w, EPS, 0.0, "llama", kw.get("scale"))
    assert torch.equal(bits(y_q[:3]), bits(y_q_ref[:3]))
    assert bool((y_q[0].float() == 0).all()) and bool((y_q[1].float() == 448).all())
    assert y_q[2, 3].float() == 448 and y_q[2, N - 1].float() == 448
    if kind == "per_token":
        assert torch.equal(scales[:3], scales_ref[:3])
        assert float(scales[0]) == float(torch.tensor([1.0]) / (448 * 512))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("backend", BACKENDS)
def test_saturation_and_ties(backend, dtype):
    """Rows of ones normalize to exactly 1 (eps 0), so y is the weight: halfway values go to
    the even neighbour, and a tiny static scale saturates every nonzero value."""
    ties = [1.0625, 1.1875, -1.0625, 9.5, 10.5, 2 ** -10, 3 * 2 ** -10, 0.0146484375]
    x = torch.ones(3, len(ties), device="cuda", dtype=dtype)
    w = torch.tensor(ties, device="cuda", dtype=dtype)
    y_q, _ = rms_norm_fp8(x, w, 0.0, scale=torch.ones(1, device="cuda"), backend=backend,
                          casting_mode="llama")
    assert y_q.float()[0].tolist() == [1.0, 1.25, -1.0, 10.0, 10.0, 0.0, 2 ** -8, 0.015625]
    y_q, _ = rms_norm_fp8(x, w, 0.0, scale=1e-6, backend=backend)
    assert y_q.float()[0].tolist() == [448.0, 448.0, -448.0] + [448.0] * 5


def test_the_default_backend_on_cuda():
    """``settings.backend`` ("cute") serves a CUDA call."""
    x, w = fresh((100, 2048), torch.bfloat16), fresh((2048,), torch.bfloat16)
    with settings.override(backend="cute"):
        got = rms_norm_fp8(x, w)
    assert_same(got, rms_norm_fp8(x, w, backend="cute"))
    assert_same(got, chain(x, w, "cute", "torch", 0.0, eps=None))  # both torch's default eps


def test_a_variant_without_an_fp8_kernel_is_refused():
    x, w = fresh((100, 2048), torch.bfloat16), fresh((2048,), torch.bfloat16)
    with settings.override(forward_variant="persistent"):
        with pytest.raises(ValueError, match="fp8 output is written by the row"):
            rms_norm_fp8(x, w, backend="cute")


@pytest.mark.parametrize("kind", ["per_token", "static", "float", "bounded"])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_in_a_cuda_graph(backend, kind, with_residual, capture_on_side_stream):
    x = fresh((64, 4096), torch.bfloat16)
    r = fresh((64, 4096), torch.bfloat16) if with_residual else None
    w = fresh((4096,), torch.bfloat16)
    kw = {"float": dict(scale=0.03)}.get(kind) or quant_args(kind)

    def call():
        return rms_norm_fp8(x, w, EPS, residual=r, backend=backend, **kw)
    expect = call()
    graph, out = capture_on_side_stream(call)
    bits(out[0]).fill_(0xFF)
    for t in out[1:]:
        if kind in ("per_token", "bounded") or t is not out[1]:
            t.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_same(out, expect)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.usefixtures("kernels_under_compile")
def test_under_torch_compile(backend):
    x, r = fresh((32, 2048), torch.bfloat16), fresh((32, 2048), torch.bfloat16)
    w = fresh((2048,), torch.bfloat16)

    def block(a, b):
        y_q, scales, h = rms_norm_fp8(a, w, EPS, residual=b, casting_mode="llama",
                                      backend=backend)
        return y_q.float() * scales.unsqueeze(-1), h

    expect = block(x, r)
    got = torch.compile(block, fullgraph=True)(x, r)
    assert torch.equal(got[0], expect[0]) and torch.equal(got[1], expect[1])


def test_a_scaled_gemm_reads_it():
    """The per-token output feeds torch._scaled_mm's row-wise scaling as (M, 1) scales."""
    x, w = fresh((128, 4096), torch.bfloat16), fresh((4096,), torch.bfloat16)
    b = fresh((1024, 4096), torch.bfloat16) / 64
    b_scale = b.float().abs().amax() / 448
    b_q = (b.float() / b_scale).to(FP8)
    y_q, scales = rms_norm_fp8(x, w, EPS, casting_mode="llama")
    out = torch._scaled_mm(y_q, b_q.t(), scale_a=scales.unsqueeze(-1),
                           scale_b=b_scale.reshape(1, 1).expand(1, 1024).contiguous(),
                           out_dtype=torch.bfloat16)
    expect = rms_norm(x, w, EPS, casting_mode="llama").float() @ b.float().t()
    rel = ((out.float() - expect).norm() / expect.norm()).item()
    assert rel < 0.08, rel  # two fp8 roundings of about 3% each
