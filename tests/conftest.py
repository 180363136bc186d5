import os

import pytest

# CuTe compiles for this target when no GPU is present (tests/test_cute_compile.py names its own).
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
