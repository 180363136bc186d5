"""Forward kernels on a GPU vs the float64-checked reference (run with: pytest -m gpu)."""

import json
import os

import pytest
import torch

from rmsnorm_lab import reference, rms_norm, settings
from rmsnorm_lab.cute.plan.forward import NotEligible

pytestmark = pytest.mark.gpu

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
MODES = ["llama", "gemma", "none"]
SHAPES = [(1, 1), (1, 4096), (3, 1023), (127, 4096), (133, 8192), (4096, 4096),
          (16384, 16384), (64, 65536), (2, 7, 1024)]
CUTE_VARIANTS = ["row", "persistent", "warp", "fallback", "cluster", "auto"]

# Tolerance of y against the reference evaluated on the same inputs: the kernels round at the
# same points, so differences come from fp32 summation order and rsqrt.approx (a few fp32 ulps).
# After rounding to bf16/fp16 that flips at most one output ulp in rare ties.
MAX_REL = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}

# Where to append each case's relative error (JSON lines), for the notes of a GPU run.
ERROR_LOG = os.environ.get("LAB_TEST_ERROR_LOG")


def fresh(shape, dtype):
    return torch.randn(shape, device="cuda", dtype=torch.float32).to(dtype)


def run(impl, x, w, mode, offset):
    backend, _, variant = impl.partition(".")
    if backend == "triton":
        return rms_norm(x, w, 1e-6, offset=offset, casting_mode=mode, backend="triton")
    with settings.override(forward_variant=variant):
        return rms_norm(x, w, 1e-6, offset=offset, casting_mode=mode, backend="cute")


def poison_allocator():
    """Fill the caching allocator's free blocks with NaN so an unwritten output shows up."""
    big = torch.empty(64 << 20, dtype=torch.float32, device="cuda").fill_(float("nan"))
    del big


@pytest.mark.parametrize("impl", [f"cute.{v}" for v in CUTE_VARIANTS] + ["triton.row"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_forward_matches_reference(impl, dtype, mode, shape):
    N = shape[-1]
    for with_weight, offset in ((True, 0.0), (True, 1.0), (False, 0.0)):
        x = fresh(shape, dtype)
        w = fresh((N,), dtype) if with_weight else None
        poison_allocator()
        try:
            y = run(impl, x, w, mode, offset)
        except NotEligible:
            if impl == "cute.fallback" or impl == "cute.auto":
                raise
            pytest.skip(f"{impl} not eligible for N={N} {dtype}")
        torch.cuda.synchronize()
        expect = reference.rms_norm(x, w, 1e-6, offset, mode)
        assert y.shape == x.shape and y.dtype == x.dtype
        assert not torch.isnan(y).any(), "unwritten (NaN-poisoned) or NaN outputs"
        err = (y.double() - expect.double()).norm()
        rel = (err / expect.double().norm().clamp_min(1e-30)).item()
        if ERROR_LOG:
            with open(ERROR_LOG, "a") as f:
                f.write(json.dumps([impl, str(dtype), mode, list(shape), with_weight, rel]) + "\n")
        assert rel <= MAX_REL[dtype], f"rel err {rel:.3g} (weight={with_weight}, offset={offset})"


# Rows narrower than a warp's copies share a warp (per-head norms): 16, 8 and 1 lanes per row,
# a row count that leaves the last CTA partly empty, and 12 copies on 16 lanes.
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(1000, 128), (37, 96), (4099, 64), (300, 8)],
                         ids=lambda s: "x".join(map(str, s)))
def test_rows_narrower_than_a_warp(shape, dtype):
    test_forward_matches_reference("cute.warp", dtype, "llama", shape)
    x, w = fresh(shape, dtype), fresh((shape[-1],), dtype)
    from rmsnorm_lab.dispatch import forward
    with settings.override(forward_variant="warp"):
        _, rstd = forward(x, w, 1e-6, 0.0, "llama", "cute", need_rstd=True)
    torch.testing.assert_close(rstd, reference.rstd_of(x, 1e-6), rtol=1e-5, atol=0)


def test_short_rows_with_a_row_stride():
    """Per-head rows read from a wider buffer (a slice of a fused QKV projection): a CTA's
    tiles of rows step by the row stride. A CTA owns two tiles of 8 rows: at 1000 and 8 rows
    the last CTA's second tile lies wholly past M, at 1001 it holds one row."""
    from rmsnorm_lab.dispatch import forward
    for M in (1000, 1001, 8):
        base = fresh((M, 3 * 128), torch.bfloat16)
        x = base[:, 128:256]
        w = fresh((128,), torch.bfloat16)
        poison_allocator()
        with settings.override(forward_variant="warp"):
            y, rstd = forward(x, w, 1e-6, 0.0, "llama", "cute", need_rstd=True)
        torch.testing.assert_close(y, reference.rms_norm(x, w, 1e-6, 0.0, "llama"), rtol=0,
                                   atol=0.02)
        torch.testing.assert_close(rstd, reference.rstd_of(x, 1e-6), rtol=1e-5, atol=0)


@pytest.mark.parametrize("variant", ["row", "persistent", "warp", "fallback"])
def test_rstd_is_stored_in_fp32(variant):
    from rmsnorm_lab.dispatch import forward
    x = fresh((300, 2048), torch.bfloat16)
    w = fresh((2048,), torch.bfloat16)
    with settings.override(forward_variant=variant):
        y, rstd = forward(x, w, 1e-6, 0.0, "llama", "cute", need_rstd=True)
    expect = reference.rstd_of(x, 1e-6)
    assert rstd.dtype == torch.float32
    torch.testing.assert_close(rstd, expect, rtol=1e-5, atol=0)


def test_row_strided_input_and_unaligned_input():
    base = fresh((64, 4096 + 8), torch.bfloat16)
    x = base[:, :4096]                      # row stride 4104: still 16-byte aligned rows
    w = fresh((4096,), torch.bfloat16)
    torch.testing.assert_close(rms_norm(x, w, backend="cute"), reference.rms_norm(x, w),
                               rtol=0, atol=0.02)
    flat = fresh((64 * 4096 + 1,), torch.bfloat16)
    xu = flat[1:].view(64, 4096)             # base pointer off by 2 bytes: auto must fall back
    torch.testing.assert_close(rms_norm(xu, w, backend="cute"), reference.rms_norm(xu, w),
                               rtol=0, atol=0.02)
    with settings.override(forward_variant="row"), pytest.raises(NotEligible, match="aligned"):
        rms_norm(xu, w, backend="cute")


def test_mixed_weight_dtype():
    x = fresh((257, 4096), torch.bfloat16)
    w = fresh((4096,), torch.float32)
    for variant in ("row", "warp", "persistent"):
        with settings.override(forward_variant=variant):
            y = rms_norm(x, w, backend="cute")
        rel = (y.double() - reference.rms_norm(x, w).double()).norm() / y.double().norm()
        assert rel < MAX_REL[torch.bfloat16]


def test_nan_inf_propagate_like_reference():
    x = fresh((4, 4096), torch.bfloat16)
    x[1, 3] = float("nan")
    x[2, 7] = float("inf")
    y = rms_norm(x, None, backend="cute")
    expect = reference.rms_norm(x, None)
    assert torch.equal(torch.isnan(y), torch.isnan(expect))
    assert torch.isfinite(y[0]).all() and torch.isfinite(y[3]).all()


def test_empty_input_and_bad_input_errors():
    x = torch.empty((0, 4096), device="cuda", dtype=torch.bfloat16)
    assert rms_norm(x, None, backend="cute").shape == (0, 4096)
    with pytest.raises(ValueError, match="weight"):
        rms_norm(fresh((4, 4096), torch.bfloat16), fresh((4095,), torch.bfloat16), backend="cute")
    transposed = fresh((4096, 8), torch.bfloat16).t()  # a copy where the kernels need one
    y = rms_norm(transposed, None, backend="cute")
    torch.testing.assert_close(y.float(), reference.rms_norm(transposed, None).float(),
                               rtol=1e-2, atol=1e-2)


def test_capture_in_cuda_graph_on_side_stream(side_stream_graph_replay):
    x = fresh((1000, 4096), torch.bfloat16)
    w = fresh((4096,), torch.bfloat16)
    side_stream_graph_replay(lambda: rms_norm(x, w, backend="cute"))


@pytest.mark.parametrize("variant,M,N", [("row", 16384, 4096), ("row", 16384, 8192),
                                         ("warp", 16384, 1024), ("auto", 1024, 2048),
                                         ("auto", 300, 1024), ("auto", 7, 4096)])
@pytest.mark.parametrize("in_graph", [False, True], ids=["eager", "graph"])
def test_chained_launches_read_complete_outputs(variant, M, N, in_graph,
                                                capture_on_side_stream):
    """With programmatic dependent launch a kernel's CTAs may be resident before the kernel it
    reads from has finished. A chain of forwards, each reading the output of the one before,
    launched back to back: every step must match the reference on the input it actually read
    (outputs start as NaN, so a read that came early shows up). ``auto`` at few rows: CTAs of
    64, 64 and 256 threads, every one launched with PDL."""
    from rmsnorm_lab.cute.launch import forward as runner
    from rmsnorm_lab.cute.launch.compile import target_arch
    from rmsnorm_lab.cute.plan.forward import PDL_ARCHS

    steps = 8
    x = fresh((M, N), torch.bfloat16)
    w = (1 + 0.1 * fresh((N,), torch.float32)).to(torch.bfloat16)
    with settings.override(forward_variant=variant, pdl=True):
        if target_arch(x.device) in PDL_ARCHS and variant in ("row", "auto"):
            assert runner.forward_launch(x, w, "llama", False, settings.snapshot(),
                                         132).plan.pdl

        def chain():
            ys = [x]
            for _ in range(steps):
                ys.append(rms_norm(ys[-1], w, backend="cute"))
            return ys

        if in_graph:
            graph, ys = capture_on_side_stream(chain)
            for y in ys[1:]:
                y.fill_(float("nan"))
            graph.replay()
        else:
            poison_allocator()
            ys = chain()
    torch.cuda.synchronize()
    for k in range(steps):
        expect = reference.rms_norm(ys[k], w, 1e-6)
        assert not torch.isnan(ys[k + 1]).any(), f"step {k + 1}: NaN read from an unfinished step"
        rel = ((ys[k + 1].double() - expect.double()).norm() / expect.double().norm()).item()
        assert rel <= MAX_REL[torch.bfloat16], f"step {k + 1}: rel err {rel:.3g}"


# Rows too wide for one CTA's registers. cluster: 2, 4 and 8 CTAs per row on a persistent grid
# (1000 rows are strips of 15 or 16 rows per cluster, each row's sums in one of two slot sets
# taken in turn); staged: the row whole in shared memory (64 KB at 32768 bf16, 128 KB at 65536);
# row: column chunks (on Hopper one copy a thread a chunk, 4 to 16 chunks, x loaded with L2
# priorities). A single row, an odd row count, leading dims, every dtype, with and without a
# weight.
@pytest.mark.parametrize("with_weight", [True, False], ids=["w", "no-w"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 32768), (3, 32768), (1000, 32768), (2, 5, 65536),
                                   (17, 131072)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("variant", ["cluster", "staged", "row"])
def test_wide_rows_and_rstd_match_reference(variant, shape, dtype, with_weight):
    from rmsnorm_lab import dispatch
    N = shape[-1]
    x, w = fresh(shape, dtype), (fresh((N,), dtype) if with_weight else None)
    poison_allocator()
    with settings.override(forward_variant=variant):
        try:
            y, rstd = dispatch.forward(x, w, 1e-6, 0.0, "llama", "cute", need_rstd=True)
        except NotEligible:
            pytest.skip(f"{variant} not eligible for N={N} {dtype}")
    torch.cuda.synchronize()
    assert not torch.isnan(y).any() and not torch.isnan(rstd).any()
    expect = reference.rms_norm(x, w, 1e-6, 0.0, "llama")
    rel = ((y.double() - expect.double()).norm() / expect.double().norm()).item()
    assert rel <= MAX_REL[dtype]
    torch.testing.assert_close(rstd, reference.rstd_of(x, 1e-6).view(rstd.shape), rtol=1e-4,
                               atol=0)
