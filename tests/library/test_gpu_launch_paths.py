"""Every launch path gives the reference's answer, on the current stream (run with -m gpu)."""

import pytest
import torch

from rmsnorm_lab import reference, rms_norm, settings
from rmsnorm_lab.cute.launch import forward as runner

pytestmark = pytest.mark.gpu

PATHS = ["tvm_ffi", "cached", "compiled", "jit"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("variant", ["row", "warp", "fallback"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("with_weight", [True, False])
def test_path_matches_reference(path, variant, dtype, with_weight):
    for M, N in ((1, 1024), (133, 1024), (257, 2048)):
        x = torch.randn(M, N, device="cuda").to(dtype)
        w = torch.randn(N, device="cuda").to(dtype) if with_weight else None
        with settings.override(launch_path=path, forward_variant=variant):
            y = rms_norm(x, w, backend="cute")
        torch.cuda.synchronize()
        expect = reference.rms_norm(x, w)
        rel = ((y.double() - expect.double()).norm() / expect.double().norm()).item()
        assert rel < (1e-5 if dtype == torch.float32 else 8e-3), (path, M, N, rel)


@pytest.mark.parametrize("path", PATHS)
def test_path_runs_on_the_current_stream_and_in_a_graph(path, side_stream_graph_replay):
    x = torch.randn(1000, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    with settings.override(launch_path=path):
        side_stream_graph_replay(lambda: rms_norm(x, w, backend="cute"))


@pytest.mark.parametrize("cap", [0, 2, 8])
def test_tensor_cache_is_bounded_by_its_cap(cap):
    runner.clear_caches()
    w = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    with settings.override(launch_path="cached", tensor_cache_cap=cap):
        for _ in range(6):
            x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
            rms_norm(x, w, backend="cute")
    assert len(runner._HANDLES) <= cap
