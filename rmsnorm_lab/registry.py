"""Every kernel variant the library launches, named once.

A **variant** is a kernel the library can launch: the forward's ``row``, ``persistent``, ``warp``,
``cluster``, ``staged`` and ``fallback``, the backward's ``fused``, ``split``, ``cluster`` and
``staged`` (and the ``dw_reduce`` that finishes dW).
The settings take their choices from here, the plans refuse names not listed here, the NVTX ranges
and the native node take their names and colours from here, the forward's launch finds each
variant's kernel class here, and the workbook's benchmark and sanitizer walk these lists. Adding a
forward variant is its kernel, its plan rule and one line below.

This module imports nothing of the lab: every layer may read it.
"""

from __future__ import annotations

import dataclasses
from typing import Tuple


@dataclasses.dataclass(frozen=True)
class Variant:
    """A kernel the library launches."""
    name: str         # the settings' value and the NVTX name: ``launch row 128x4096``
    op: str           # fwd | bwd | reduce
    backend: str      # the package whose kernel it is: cute | triton
    nvtx_argb: int    # colour of its NVTX ranges in Nsight Systems
    #: measured in the sweeps (not: the fallback, a safety net, and a kernel whose GPU tests
    #: have not run yet)
    benchmarked: bool = True
    #: a CuTe forward's kernel class, ``module.Class`` under rmsnorm_lab/cute/kernels/
    kernel: str = ""


VARIANTS: Tuple[Variant, ...] = (
    Variant("row", "fwd", "cute", 0xFF0072B2, kernel="forward.RMSNormForward"),
    Variant("persistent", "fwd", "cute", 0xFFCC79A7, kernel="forward.RMSNormForward"),
    Variant("warp", "fwd", "cute", 0xFF009E73, kernel="forward.RMSNormForward"),
    Variant("cluster", "fwd", "cute", 0xFF56B4E9, kernel="forward.RMSNormClusterForward"),
    Variant("staged", "fwd", "cute", 0xFF332288, kernel="forward_staged.RMSNormStagedForward"),
    Variant("fallback", "fwd", "cute", 0xFFD55E00, benchmarked=False,
            kernel="forward.RMSNormForward"),
    Variant("fused", "bwd", "cute", 0xFFE69F00),
    Variant("split", "bwd", "cute", 0xFFF0E442),
    Variant("cluster", "bwd", "cute", 0xFF000000),
    Variant("staged", "bwd", "cute", 0xFF882255),
    Variant("dw_reduce", "reduce", "cute", 0xFF999999),
    Variant("row", "fwd", "triton", 0xFF56B4E9),
    Variant("split", "bwd", "triton", 0xFF56B4E9),
)

#: what the settings and the plans accept: ``auto`` and the CuTe variants of each op
FORWARD_VARIANTS: Tuple[str, ...] = tuple(
    v.name for v in VARIANTS if v.backend == "cute" and v.op == "fwd")
BACKWARD_MODES: Tuple[str, ...] = tuple(
    v.name for v in VARIANTS if v.backend == "cute" and v.op == "bwd")
BACKENDS: Tuple[str, ...] = ("cute", "triton", "torch")


def variant(name: str, backend: str = "cute") -> Variant:
    for v in VARIANTS:
        if v.name == name and v.backend == backend:
            return v
    raise KeyError(f"no {backend} variant named {name!r}")


def nvtx_argb(name: str) -> int:
    """The NVTX colour of a range named after a variant (``triton`` for the Triton kernels);
    white for anything else."""
    for v in VARIANTS:
        if v.name == name or (name == v.backend == "triton"):
            return v.nvtx_argb
    return 0xFFFFFFFF
