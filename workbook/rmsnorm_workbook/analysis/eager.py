"""What eager torch launches for a function: one kernel an operator it dispatches, views aside,
and the bytes each reads and writes. Counted on any device (the CPU too), from the operators
themselves, so a lesson can say how many passes an unfused chain makes and what they move.
"""

from __future__ import annotations

from typing import Callable

import pandas as pd
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

#: operators that make a tensor like their input without reading it
_FACTORIES = ("zeros_like", "ones_like", "full_like", "empty_like")


def _tensors(tree) -> list:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class _Kernels(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.rows = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            name = func.overloadpacket.__name__
            reads = 0 if name in _FACTORIES else _bytes(_tensors((args, kwargs)))
            self.rows.append({"op": name, "reads": reads, "writes": _bytes(_tensors(out))})
        return out


def eager_kernels(fn: Callable, *args) -> pd.DataFrame:
    """The operators eager torch dispatches for ``fn(*args)``, views aside (one kernel each on
    a GPU): a row each, ``op``, the bytes it ``reads`` (its tensor arguments; none for a
    ``*_like`` factory) and ``writes``, and their sum, ``bytes``."""
    with _Kernels() as kernels:
        fn(*args)
    table = pd.DataFrame(kernels.rows, columns=["op", "reads", "writes"])
    table["bytes"] = table["reads"] + table["writes"]
    return table
