"""Every launch path of the host lesson (bench/launch_paths.py, installed by
``instruments.use``) gives the reference's answer, on the current stream (run with -m gpu)."""

import pytest
import torch

from rmsnorm_lab import lab, reference, rms_norm
from rmsnorm_workbook.bench import instruments, launch_paths

pytestmark = pytest.mark.gpu

PATHS = list(instruments.LAUNCH_PATHS)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("variant", ["row", "warp", "fallback"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("with_weight", [True, False])
def test_path_matches_reference(path, variant, dtype, with_weight):
    for M, N in ((1, 1024), (133, 1024), (257, 2048)):
        x = torch.randn(M, N, device="cuda").to(dtype)
        w = torch.randn(N, device="cuda").to(dtype) if with_weight else None
        with instruments.use(launch_path=path, forward_variant=variant):
            y = rms_norm(x, w, backend="cute")
        torch.cuda.synchronize()
        expect = reference.rms_norm(x, w)
        rel = ((y.double() - expect.double()).norm() / expect.double().norm()).item()
        assert rel < (1e-5 if dtype == torch.float32 else 8e-3), (path, M, N, rel)


@pytest.mark.parametrize("path", PATHS)
def test_path_runs_on_the_current_stream_and_in_a_graph(path, side_stream_graph_replay):
    x = torch.randn(1000, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    with instruments.use(launch_path=path):
        side_stream_graph_replay(lambda: rms_norm(x, w, backend="cute"))


@pytest.mark.parametrize("path", ["cached", "compiled", "jit"])
def test_path_launches_through_its_launcher_and_the_python_node(path, monkeypatch):
    """A launch path takes the forward's last step: its launcher runs, and the call's tape node
    is the Python one (the native node launches through TVM-FFI only)."""
    seen = []
    launcher = getattr(launch_paths, f"launch_{path}")
    monkeypatch.setattr(launch_paths, f"launch_{path}",
                        lambda *a, **k: (seen.append(path), launcher(*a, **k)))
    x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with instruments.use(launch_path=path):
        assert not lab.routed_to_native("cute")
        y = rms_norm(x, None, backend="cute")
    assert seen == [path] and "RMSNormFunction" in y.grad_fn.name()
    assert lab.routed_to_native("cute")  # the launcher gone: back to the native node


@pytest.mark.parametrize("cap", [0, 2, 8])
def test_tensor_cache_is_bounded_by_its_cap(cap):
    instruments.clear_caches()
    w = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    with instruments.use(launch_path="cached", tensor_cache_cap=cap):
        for _ in range(6):
            x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
            rms_norm(x, w, backend="cute")
    assert len(launch_paths._HANDLES) <= cap
