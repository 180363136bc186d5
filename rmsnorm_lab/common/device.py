"""Facts about a CUDA device that the launch decisions need, asked of the driver once."""

from __future__ import annotations

from typing import Dict

import torch

_SM_COUNT: Dict[int, int] = {}


def sm_count(index: int) -> int:
    """Multiprocessor count of CUDA device ``index`` (the persistent grids are sized from it)."""
    n = _SM_COUNT.get(index)
    if n is None:
        n = _SM_COUNT[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return n
