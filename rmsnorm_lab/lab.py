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
    ``routed_to_native``, ``native_node``, ``memo_call``, ``forward_launch``,
    ``clear_forward_caches``, ``NVTX_DOMAIN``, ``sm_count``, ``snapshot``.
    ``forward_launcher(fn)``: the hook through which the host lesson's launch paths take the
    CuTe forward's last step (``fn(launch, x2, w, y, rstd, grid, eps, offset)`` in place of the
    TVM-FFI call; calls leave the native node while it is installed), with what they build on:
    ``forward_kernel_object`` (a plan's kernel class instance), ``compile_locked``,
    ``COMPILE_LOCK``, ``nvtx_range``.
Models
    ``TRANSFORMERS``: the transformers norm classes ``patch`` replaces.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Callable, Dict, Iterator, Optional, Tuple

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
    # 2-D rows with its mode named (the other settings: those in force)
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
    # forward_launch(x2, weight, casting_mode, need_rstd, snap, sms): the CuTe forward's launch
    # (its plan, its grid rule, its compiled kernel on first use)
    "forward_launch": ("cute.launch.forward", "forward_launch"),
    "forward_kernel_object": ("cute.launch.forward", "kernel_object"),
    "compile_locked": ("cute.launch.compile", "compile_locked"),
    "COMPILE_LOCK": ("cute.launch.compile", "COMPILE_LOCK"),
    "snapshot": ("settings", "snapshot"),
    "NVTX_DOMAIN": ("common.nvtx", "DOMAIN"),
    # nvtx_range(stage, impl, shape=None, on=None): a range of the lab's domain (on: None
    # follows settings.nvtx)
    "nvtx_range": ("common.nvtx", "range"),
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


def cute_backward(dy2, x2, weight, rstd, offset: float, casting_mode: str, mode: str, sms: int,
                  **kwargs):
    """The CuTe backward on 2-D rows with its mode named, under the other settings in force
    (``cute.launch.backward.backward``'s keywords: strips, need_dx, need_dw, dh2)."""
    from .cute.launch import backward
    from .settings import snapshot
    return backward.backward(dy2, x2, weight, rstd, offset, casting_mode, mode, sms, snapshot(),
                             **kwargs)


def clear_forward_caches() -> None:
    """Forget the CuTe forward's compilations and launches."""
    from .cute.launch import forward
    forward.clear_caches()


@contextlib.contextmanager
def forward_launcher(launcher: Callable) -> Iterator[None]:
    """For the block, the CuTe forward's planned kernel is launched by ``launcher(launch, x2, w,
    y, rstd, grid, eps, offset)`` (``launch``: a ``cute.launch.forward.ForwardLaunch``) instead
    of its TVM-FFI call, and calls take the Python path (the native node launches through
    TVM-FFI only). The host lesson's launch paths plug in here; process-wide, like the
    settings."""
    from . import dispatch
    previous = dispatch.set_forward_launcher(launcher)
    try:
        yield
    finally:
        dispatch.set_forward_launcher(previous)


__all__ = sorted(set(_NAMES) | {"memo_call", "clear_forward_caches", "cute_backward",
                                "forward_launcher"})
