"""The library as the workbook sees it: what its benchmarks switch and its lessons read.

The workbook (the ``rmsnorm_workbook`` package: benchmarks, the lessons' helpers, profiling, the
report) reaches the library through three doors only: the top-level names (``rms_norm``,
``RMSNorm``, ``patch``, ``settings``, ...), ``rmsnorm_lab.reference`` (the float64 oracle) and
this module. A script that wants to measure or take apart what the library does may use it too;
code that only wants the op does not need it.

Kernels by name
    ``VARIANTS``, ``FORWARD_VARIANTS``, ``BACKWARD_MODES``: every kernel the library launches.
    ``kernel_forward``/``kernel_backward``: one backend's kernels called directly, with no
    autograd (what the benchmark times as "the kernel"). ``RMSNormFunction``: the Python tape
    node, for a backward pinned to a mode. ``validate``: the checks ``rms_norm`` makes first
    (it returns the casting mode the kernels see: an alias such as ``"torch"`` resolved).
Plans and compiled code (read on any machine, no GPU needed)
    ``plan_forward``, ``plan_backward``, ``plan_split``, ``fused_strips``, ``dw_row_groups``,
    ``with_dw_cluster``, ``compile_and_inspect``, ``ptx_facts``, ``ptxas_report``, ``arch_name``.
The host path, taken apart (the host lesson and its benchmark)
    ``routed_to_native``, ``native_node``, ``memo_call``, ``forward_entry``,
    ``clear_forward_caches``, ``NVTX_DOMAIN``, ``sm_count``.
Models
    ``TRANSFORMERS``: the transformers norm classes ``patch`` replaces.
"""

from __future__ import annotations

import importlib
from typing import Callable, Dict, Optional, Tuple

# name -> (module of the library, attribute): imported on first use, so that reading a constant
# (say NVTX_DOMAIN) does not load CuTe DSL
_NAMES: Dict[str, Tuple[str, str]] = {
    "VARIANTS": ("registry", "VARIANTS"),
    "FORWARD_VARIANTS": ("registry", "FORWARD_VARIANTS"),
    "BACKWARD_MODES": ("registry", "BACKWARD_MODES"),
    # kernel_forward(x, weight, eps, offset, casting_mode, backend, need_rstd) -> (y, rstd)
    "kernel_forward": ("dispatch", "forward"),
    # kernel_backward(dy, x, weight, rstd, offset, casting_mode, backend) -> (dx, dw)
    "kernel_backward": ("dispatch", "backward"),
    # cute_backward(dy2, x2, weight, rstd, offset, casting_mode, mode, sms): the CuTe backward on
    # 2-D rows with its mode named (no settings read)
    "cute_backward": ("cute.launch.backward", "backward"),
    "RMSNormFunction": ("autograd", "RMSNormFunction"),
    "validate": ("api", "validate"),
    "plan_forward": ("cute.plan.forward", "plan_forward"),
    "plan_backward": ("cute.plan.backward", "plan_backward"),
    "plan_split": ("cute.plan.backward", "plan_split"),
    "fused_strips": ("cute.plan.backward", "fused_strips"),
    "dw_row_groups": ("cute.plan.backward", "dw_row_groups"),
    "with_dw_cluster": ("cute.plan.backward", "with_dw_cluster"),
    "compile_and_inspect": ("cute.inspect_ptx", "compile_and_inspect"),
    "ptx_facts": ("cute.inspect_ptx", "ptx_facts"),
    "ptxas_report": ("cute.inspect_ptx", "ptxas_report"),
    "arch_name": ("cute.launch.compile", "arch_name"),
    "routed_to_native": ("dispatch", "routed_to_native"),
    "native_node": ("dispatch", "native_node"),
    # forward_entry(x2, weight, casting_mode, need_rstd, variant, pdl): the CuTe forward's launch
    # entry (its plan, its compiled kernel on first use)
    "forward_entry": ("cute.launch.forward", "entry_for"),
    "NVTX_DOMAIN": ("common.nvtx", "DOMAIN"),
    "sm_count": ("common.device", "sm_count"),
    "TRANSFORMERS": ("models.patch", "TRANSFORMERS"),
}


def __getattr__(name: str):
    try:
        module, attribute = _NAMES[name]
    except KeyError:
        raise AttributeError(f"module 'rmsnorm_lab.lab' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f"rmsnorm_lab.{module}"), attribute)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_NAMES))


def memo_call() -> Optional[Callable]:
    """The extension's call memo as ``rms_norm`` reaches it (``fn(x, weight, eps, offset,
    casting_mode)``: y, or None for a call not planned before), or None while the settings
    route calls elsewhere or the native node is not built."""
    from . import dispatch
    return dispatch.fast_call


def clear_forward_caches() -> None:
    """Forget the CuTe forward's compilations, launch entries and cached tensor handles (the
    tensor-handle cache's memory is measured from empty)."""
    from .cute.launch import forward as runner
    runner.clear_caches()


__all__ = sorted(set(_NAMES) | {"memo_call", "clear_forward_caches"})
