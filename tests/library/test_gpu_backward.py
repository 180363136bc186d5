"""CuTe backward kernels on a GPU vs reference.rms_norm_backward (run with: pytest -m gpu)."""

import json
import os

import pytest
import torch

from rmsnorm_lab import reference
from rmsnorm_lab.cute.plan.backward import auto_mode
from rmsnorm_lab.lab import cute_backward as backward
from rmsnorm_lab.cute.plan.forward import NotEligible

pytestmark = pytest.mark.gpu

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
CASTING = ["llama", "gemma", "none"]
SHAPES = [(1, 4096), (3, 1023), (131, 4096), (127, 4096), (4096, 4096), (1000, 8192),
          (100003, 4096)]
BIG = (100003, 4096)  # bf16 only: the reference's fp32 temporaries for it are several GiB

# Relative error (Frobenius norm) against the reference on the same inputs. The kernels round at
# the reference's points; what differs is the fp32 summation order (row sums, dW partials), which
# after rounding dx to 16 bits flips a last bit here and there.
DX_REL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}
DW_REL = {torch.float32: 1e-4, torch.bfloat16: 1e-2, torch.float16: 1e-2}

# Where to append each case's relative errors (JSON lines), for the notes of a GPU run.
ERROR_LOG = os.environ.get("LAB_TEST_ERROR_LOG")


def sms():
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def fresh(shape, dtype):
    return torch.randn(shape, device="cuda", dtype=torch.float32).to(dtype)


def poison_allocator():
    """Fill the caching allocator's free blocks with NaN so an unwritten output (dx, or a dW
    partial row that no CTA wrote) shows up."""
    big = torch.empty(256 << 20, dtype=torch.float32, device="cuda").fill_(float("nan"))
    del big


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def inputs(shape, dtype, with_weight, w_dtype=None):
    x = fresh(shape, dtype)
    dy = fresh(shape, dtype)
    w = fresh((shape[-1],), w_dtype or dtype) if with_weight else None
    rstd = reference.rstd_of(x, 1e-6)
    return dy, x, w, rstd


def check(dx, dw, dy, x, w, rstd, offset, casting, label=""):
    torch.cuda.synchronize()
    ex_dx, ex_dw = reference.rms_norm_backward(dy, x, w, rstd, offset, casting)
    assert dx.shape == x.shape and dx.dtype == x.dtype
    assert not torch.isnan(dx).any(), f"{label}: unwritten (NaN-poisoned) or NaN dx"
    e_dx = rel(dx, ex_dx)
    e_dw = None
    if w is None:
        assert dw is None
    else:
        assert dw.shape == w.shape and dw.dtype == w.dtype
        assert not torch.isnan(dw).any(), f"{label}: NaN dw (an unwritten partial row?)"
        e_dw = rel(dw, ex_dw)
    if ERROR_LOG:
        with open(ERROR_LOG, "a") as f:
            f.write(json.dumps([label, str(x.dtype), casting, list(x.shape), w is not None,
                                offset, e_dx, e_dw]) + "\n")
    assert e_dx <= DX_REL[x.dtype], f"{label}: dx rel err {e_dx:.3g}"
    if w is not None:
        assert e_dw <= DW_REL[x.dtype], f"{label}: dw rel err {e_dw:.3g}"


@pytest.mark.parametrize("mode", ["fused", "split", "auto"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("casting", CASTING)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_backward_matches_reference(mode, dtype, casting, shape):
    if shape == BIG and dtype != torch.bfloat16:
        pytest.skip("the 100003-row shape runs in bf16 only")
    for with_weight, offset in ((True, 0.0), (True, 1.0), (False, 0.0)):
        dy, x, w, rstd = inputs(shape, dtype, with_weight)
        poison_allocator()
        dx, dw = backward(dy, x, w, rstd, offset, casting, mode, sms())
        check(dx, dw, dy, x, w, rstd, offset, casting,
              f"{mode} weight={with_weight} offset={offset}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(65536, 128), (5000, 256), (20000, 512), (999, 64)],
                         ids=lambda s: "x".join(map(str, s)))
def test_narrow_rows_with_many_strips_per_sm(dtype, shape):
    """Per-head widths: one-warp strips, up to 32 per SM, each writing its own dW partial row."""
    for with_weight, offset in ((True, 0.0), (False, 0.0)):
        dy, x, w, rstd = inputs(shape, dtype, with_weight)
        poison_allocator()
        dx, dw = backward(dy, x, w, rstd, offset, "llama", "auto", sms())
        check(dx, dw, dy, x, w, rstd, offset, "llama", f"narrow weight={with_weight}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(131, 4096), (4096, 4096), (3, 1023), (1000, 8192)],
                         ids=lambda s: "x".join(map(str, s)))
def test_fused_and_split_agree(dtype, shape):
    dy, x, w, rstd = inputs(shape, dtype, True)
    poison_allocator()
    f_dx, f_dw = backward(dy, x, w, rstd, 0.0, "llama", "fused", sms())
    poison_allocator()
    s_dx, s_dw = backward(dy, x, w, rstd, 0.0, "llama", "split", sms())
    torch.cuda.synchronize()
    # Same per-row arithmetic for dx (only the row-sum order can differ: none here, both use the
    # same thread mapping); dW sums the same products in a different order.
    assert rel(f_dx, s_dx) <= DX_REL[dtype] / 10
    assert rel(f_dw, s_dw) <= DW_REL[dtype]


@pytest.mark.parametrize("mode", ["fused", "split"])
@pytest.mark.parametrize("M,strips", [(131, 7), (131, 131), (5, 64), (4096, 1), (127, 132)])
def test_any_strip_or_row_group_count(mode, M, strips):
    """Remainder rows, one-row strips, more strips than rows (clamped), a single strip."""
    dy, x, w, rstd = inputs((M, 4096), torch.bfloat16, True)
    poison_allocator()
    dx, dw = backward(dy, x, w, rstd, 0.0, "gemma", mode, sms(), strips=strips)
    check(dx, dw, dy, x, w, rstd, 0.0, "gemma", f"{mode} strips={strips}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("M,N,strips", [(1001, 128, 7), (999, 64, 5), (77, 8, 3), (33, 16, 2),
                                        (4099, 32, 13), (65, 7, 4), (257, 24, 0), (3, 128, 0)])
def test_rows_narrower_than_a_warp_in_lane_groups(dtype, M, N, strips):
    """Lane groups of a one-warp strip: strips that start and end mid-group (odd row counts,
    a strip count that does not divide them), rows of 1 to 16 copies, the vec=1 fallback
    (N = 7, 24 in fp32), the plan's own strip count (0) and fewer rows than lane groups."""
    for with_weight, casting in ((True, "llama"), (True, "gemma"), (False, "llama")):
        dy, x, w, rstd = inputs((M, N), dtype, with_weight)
        poison_allocator()
        dx, dw = backward(dy, x, w, rstd, 0.0, casting, "fused", sms(), strips=strips or None)
        check(dx, dw, dy, x, w, rstd, 0.0, casting, f"lanes weight={with_weight} strips={strips}")


@pytest.mark.parametrize("N", [4096, 1023])  # vector path and the vec=1 fallback
def test_mixed_weight_dtype(N):
    for mode in ("fused", "split"):
        dy, x, w, rstd = inputs((257, N), torch.bfloat16, True, torch.float32)
        poison_allocator()
        dx, dw = backward(dy, x, w, rstd, 1.0, "llama", mode, sms())
        check(dx, dw, dy, x, w, rstd, 1.0, "llama", f"{mode} fp32 weight")


def test_row_strided_and_unaligned_inputs_take_the_right_path():
    N = 4096
    base = fresh((64, N + 8), torch.bfloat16)
    x = base[:, :N]                       # row stride N + 8: rows still 16-byte aligned
    dy = fresh((64, N), torch.bfloat16)
    w = fresh((N,), torch.bfloat16)
    rstd = reference.rstd_of(x, 1e-6)
    for mode in ("fused", "split"):
        dx, dw = backward(dy, x, w, rstd, 0.0, "llama", mode, sms())
        check(dx, dw, dy, x, w, rstd, 0.0, "llama", f"{mode} strided")
    flat = fresh((64 * N + 1,), torch.bfloat16)
    xu = flat[1:].view(64, N)              # base pointer off by 2 bytes: vec = 1 fallback
    assert xu.data_ptr() % 16                # not 16-byte aligned
    rstd = reference.rstd_of(xu, 1e-6)
    for mode in ("fused", "split", "auto"):
        poison_allocator()
        dx, dw = backward(dy, xu, w, rstd, 0.0, "none", mode, sms())
        check(dx, dw, dy, xu, w, rstd, 0.0, "none", f"{mode} unaligned")


def test_too_wide_for_fused_raises_and_auto_splits():
    dy, x, w, rstd = inputs((8, 65536), torch.bfloat16, True)
    with pytest.raises(NotEligible, match="use split"):
        backward(dy, x, w, rstd, 0.0, "llama", "fused", sms())
    assert auto_mode(65536, torch.bfloat16, torch.bfloat16, "llama", True) == "split"
    dx, dw = backward(dy, x, w, rstd, 0.0, "llama", "auto", sms())
    check(dx, dw, dy, x, w, rstd, 0.0, "llama", "auto wide")


def test_empty_and_bad_inputs():
    x = torch.empty((0, 4096), device="cuda", dtype=torch.bfloat16)
    w = fresh((4096,), torch.bfloat16)
    dx, dw = backward(x, x, w, torch.empty((0,), device="cuda"), 0.0, "llama", "auto", sms())
    assert dx.shape == (0, 4096) and torch.equal(dw, torch.zeros_like(w))
    dy, x, w, rstd = inputs((4, 4096), torch.bfloat16, True)
    with pytest.raises(ValueError, match="weight"):
        backward(dy, x, w[:-1], rstd, 0.0, "llama", "auto", sms())
    with pytest.raises(ValueError, match="rstd"):
        backward(dy, x, w, rstd.to(torch.bfloat16), 0.0, "llama", "auto", sms())
    with pytest.raises(ValueError, match="mode"):
        backward(dy, x, w, rstd, 0.0, "llama", "both", sms())


def test_nan_propagates_to_its_row_and_dw():
    dy, x, w, rstd = inputs((6, 4096), torch.bfloat16, True)
    dy[2, 5] = float("nan")
    for mode in ("fused", "split"):
        dx, dw = backward(dy, x, w, rstd, 0.0, "llama", mode, sms())
        ex_dx, ex_dw = reference.rms_norm_backward(dy, x, w, rstd, 0.0, "llama")
        assert torch.equal(torch.isnan(dx), torch.isnan(ex_dx))
        assert torch.equal(torch.isnan(dw), torch.isnan(ex_dw))


def test_capture_in_cuda_graph_on_side_stream():
    dy, x, w, rstd = inputs((1000, 4096), torch.bfloat16, True)
    for mode in ("fused", "split"):
        e_dx, e_dw = (t.clone() for t in backward(dy, x, w, rstd, 0.0, "llama", mode, sms()))
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            backward(dy, x, w, rstd, 0.0, "llama", mode, sms())  # warm up on the side stream
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                dx, dw = backward(dy, x, w, rstd, 0.0, "llama", mode, sms())
        torch.cuda.current_stream().wait_stream(s)
        dx.fill_(float("nan"))
        dw.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(dx, e_dx) and torch.equal(dw, e_dw)


@pytest.mark.parametrize("N", [16384, 32768])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("casting", CASTING)
def test_wide_rows_fuse_in_chunks_with_dw_in_shared_memory(N, dtype, casting):
    """Rows too wide for registers: two passes over column chunks, dW accumulated in shared
    memory. 131 rows (one per strip) and 1000 (several, with a remainder)."""
    for M, offset in ((131, 0.0), (1000, 1.0)):
        dy, x, w, rstd = inputs((M, N), dtype, True)
        poison_allocator()
        dx, dw = backward(dy, x, w, rstd, offset, casting, "fused", sms())
        check(dx, dw, dy, x, w, rstd, offset, casting, f"wide fused {M}x{N} offset={offset}")


def test_fused_strips_setting_reaches_the_kernel():
    """settings.fused_strips (RMSNORM_LAB_FUSED_STRIPS) sets the fused grid when the call names
    none: the dW partial rows are then exactly that many, and the result is still right."""
    from rmsnorm_lab import settings
    from rmsnorm_lab.cute.launch import backward as backward_runner
    dy, x, w, rstd = inputs((1000, 4096), torch.bfloat16, True)
    seen = []
    real = backward_runner.compile_dw_reduce

    def spy(N, w_dtype, arch, keep_ptx_dir=None, **options):
        kernel = real(N, w_dtype, arch, keep_ptx_dir, **options)
        return lambda part, dw: (seen.append(part.shape[0]), kernel(part, dw))
    backward_runner.clear_caches()
    try:
        backward_runner.compile_dw_reduce = spy
        with settings.override(fused_strips=7):
            dx, dw = backward(dy, x, w, rstd, 0.0, "llama", "fused", sms())
    finally:
        backward_runner.compile_dw_reduce = real
        backward_runner.clear_caches()
    assert seen == [7]
    check(dx, dw, dy, x, w, rstd, 0.0, "llama", "fused_strips=7")


@pytest.mark.parametrize("mode", ["fused", "split"])
def test_back_to_back_backwards_under_pdl(mode, capture_on_side_stream):
    """Every backward kernel, the dW reduction included, launches with PDL on Hopper, so each
    may be resident before the kernel it reads from has finished. Backwards launched back to
    back in one CUDA graph, each reading the dx of the one before as its dy, must each match
    the reference on the dy it actually read (outputs start as NaN)."""
    from rmsnorm_lab import settings
    from rmsnorm_lab.cute.launch import backward as backward_runner
    from rmsnorm_lab.cute.launch import compile
    from rmsnorm_lab.cute.plan.backward import backward_uses_pdl

    steps = 6
    dy, x, w, rstd = inputs((4096, 4096), torch.bfloat16, True)
    with settings.override(pdl=True):
        entry = backward_runner.backward_launch(dy, x, w, "llama", mode, True)
        assert all(p.pdl for p in entry.plans) == backward_uses_pdl(compile.target_arch(x.device))

        def chain():
            outs = [(dy, None)]
            for _ in range(steps):
                outs.append(backward(outs[-1][0], x, w, rstd, 0.0, "llama", mode, sms()))
            return outs

        graph, outs = capture_on_side_stream(chain)
        for dx_k, dw_k in outs[1:]:
            dx_k.fill_(float("nan"))
            dw_k.fill_(float("nan"))
        graph.replay()
    for k in range(steps):
        dx, dw = outs[k + 1]
        check(dx, dw, outs[k][0], x, w, rstd, 0.0, "llama", f"{mode} step {k + 1}")


# cluster: rows split over a cluster's CTAs; staged: rows ringed through shared memory. Plan-sized
# grids, strips of uneven lengths, strips shorter than the ring, fewer rows than strips, with and
# without a weight, every casting mode.
WIDE_CASES = {
    "cluster": [((1000, 16384), None), ((3, 32768), None), ((257, 16384), 5), ((131, 65536), 2)],
    "staged": [((1000, 4096), None), ((3, 4096), None), ((257, 8192), 5), ((131, 16384), 2),
               ((4099, 2048), None)],
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize(
    "mode,shape,strips", [(m, shape, strips) for m, cases in WIDE_CASES.items()
                          for shape, strips in cases],
    ids=[f"{m}-{'x'.join(map(str, shape))}" + (f"-{strips}strips" if strips else "")
         for m, cases in WIDE_CASES.items() for shape, strips in cases])
def test_wide_backwards_match_reference(mode, dtype, shape, strips):
    checked = 0
    for with_weight, casting in ((True, "llama"), (True, "gemma"), (True, "none"),
                                 (False, "llama")):
        dy, x, w, rstd = inputs(shape, dtype, with_weight)
        poison_allocator()
        try:
            dx, dw = backward(dy, x, w, rstd, 0.5 if with_weight else 0.0, casting, mode,
                              sms(), strips=strips)
        except NotEligible:  # e.g. no weight at 16384 bf16: the fused plan holds that row
            continue
        check(dx, dw, dy, x, w, rstd, 0.5 if with_weight else 0.0, casting,
              f"{mode} weight={with_weight} strips={strips}")
        checked += 1
    if not checked:
        pytest.skip(f"{mode} not eligible at {shape} {dtype}")
