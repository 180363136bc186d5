import os
from pathlib import Path

import pytest

# CuTe compiles for this target when no GPU is present (tests/library/test_cute_compile.py names its own).
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")


def pytest_collection_modifyitems(config, items):
    """GPU tests run only where CUDA is available; elsewhere they are skipped with the reason."""
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def kernels_under_compile():
    """The lab's ops as their own graph nodes under torch.compile (``settings.under_compile =
    "kernel"``; the default steps aside for their math as torch ops), Dynamo's caches reset on
    either side."""
    import torch

    from rmsnorm_lab import settings
    torch._dynamo.reset()
    with settings.override(under_compile="kernel"):
        yield
    torch._dynamo.reset()


def capture(call):
    """``(graph, outputs)``: ``call()`` warmed up (compiled) and then captured in a CUDA graph, both
    on a side stream, as capture requires; ``outputs`` are what the captured call returned."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()  # compile and allocate outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            outputs = call()
    torch.cuda.current_stream().wait_stream(side)
    return graph, outputs


@pytest.fixture
def capture_on_side_stream():
    """``capture`` (above) as a fixture, for GPU tests that replay their own graphs."""
    return capture


@pytest.fixture
def side_stream_graph_replay():
    """``check(call)``: ``call()`` eagerly, then warmed up and captured in a CUDA graph on a side
    stream; the graph's output is NaN-poisoned, replayed, and must equal the eager result."""
    import torch

    def check(call):
        expect = call().clone()
        g, y = capture(call)
        y.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, expect)
    return check


# The committed results, read once per module by the analysis, report and figure tests.
RESULTS = Path(__file__).resolve().parent.parent / "results"


@pytest.fixture(scope="module")
def df():
    from rmsnorm_workbook import results
    return results.load_all(RESULTS)


@pytest.fixture(scope="module")
def rep():
    from rmsnorm_workbook.analysis import reported
    return reported.load_reported(RESULTS)


@pytest.fixture(scope="module")
def cal(df):
    from rmsnorm_workbook.analysis import model
    return model.calibrate(df)
