"""The CuTe kernels on the native tape node (``settings.autograd_node == "native"``).

Python decides what to launch, exactly as the Python node's path does: the forward entry
(runner.entry_for) and the backward entry (backward_runner.entry_for) of this configuration,
and, per call, the forward grid, the fused strip count (or split's M) and the rows of dW
partials. The node (csrc/native_node.cpp) then launches the forward, keeps what the backward
needs, and runs the whole backward in C++.

Per call shape the whole decision is memoized (``_CALLS``): the SM count, the settings and the
plans are read when a new shape, dtype, alignment or setting arrives, not on every call.
Per configuration the compiled kernels are handed to C++ once, as a ``Kernels`` object. It is
kept for the life of the process (``_KERNELS`` is never cleared, not even by the runners'
``clear_caches``): a node on some tape may still point at it.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from ..settings import settings
from . import backward_runner, runner
from .backward_plan import dw_row_groups, fused_strips
from .plan import INT32_LIMIT, check_int32_addressable

_KERNELS: Dict[Tuple, object] = {}
#: call key -> (kernels, forward grid, backward int, partial rows); see ``rms_norm``
_CALLS: Dict[Tuple, Tuple] = {}
CALLS_CAP = 1024


def ffi_handle(fn) -> int:
    """The TVM-FFI object handle of a compiled CuTe function (the C ABI's function pointer)."""
    obj = fn.__tvm_ffi_object__() if hasattr(fn, "__tvm_ffi_object__") else fn
    return obj.__chandle__()


def _kernels(native, fwd: "runner._Entry", bwd: "backward_runner._Entry",
             w_dtype: Optional[torch.dtype]):
    key = (fwd, bwd)  # the entries themselves: kept alive here, so never confused with new ones
    found = _KERNELS.get(key)
    if found is not None:
        return found[0]
    if fwd.ffi_kernel is None:
        fwd.ffi_kernel = runner.compile_forward(fwd.plan, fwd.arch)
    functions = [fwd.ffi_kernel, bwd.kernel(0)]
    dw = reduce = None
    if w_dtype is not None:
        if bwd.mode == "split":
            dw = bwd.kernel(1)
        if bwd.reduce is None:
            bwd.reduce = backward_runner.compile_dw_reduce(fwd.plan.N, w_dtype, bwd.arch)
        reduce = bwd.reduce
        functions += [f for f in (dw, reduce) if f is not None]
    handle = lambda f: ffi_handle(f) if f is not None else 0  # noqa: E731
    kernels = native.Kernels(
        forward=handle(fwd.ffi_kernel), backward=handle(bwd.kernel(0)), dw=handle(dw),
        reduce=handle(reduce), no_weight=fwd.empty_w, no_partials=bwd.no_part,
        forward_name=fwd.plan.variant, backward_name=bwd.mode,
        aligned=bwd.plans[0].vec > 1)
    _KERNELS[key] = (kernels, functions)  # the Python functions too: they own the code
    return kernels


def _plan_call(native, x: torch.Tensor, weight: Optional[torch.Tensor], casting_mode: str,
               sms: int) -> Tuple:
    """What a call of this shape launches: ``(kernels, forward grid, backward int, partial
    rows)``. Raises, like the Python node's path, on a layout the kernels cannot address."""
    from ..launch import as_rows
    x2 = as_rows(x)
    M, N = x2.shape
    if weight is not None and weight.stride(0) != 1 and N > 1:
        raise ValueError(f"weight must be contiguous, got stride {weight.stride(0)}")
    if M * x2.stride(0) >= INT32_LIMIT:
        check_int32_addressable(M, x2.stride(0), N)
    fwd = runner.entry_for(x2, weight, casting_mode, True, settings.forward_variant)
    # dy is not known yet: x stands in for its alignment, and the node copies a gradient that
    # arrives misaligned (csrc/native_node.cpp, grad_rows)
    bwd = backward_runner.entry_for(x2, x2, weight, casting_mode, settings.backward)
    kernels = _kernels(native, fwd, bwd, weight.dtype if weight is not None else None)
    if bwd.mode == "fused":
        backward_int = fused_strips(M, sms, bwd.plans[0], settings.fused_strips or None)
        partial_rows = backward_int if weight is not None else 0
    else:
        backward_int = M
        partial_rows = dw_row_groups(M, bwd.plans[1], sms) if weight is not None else 0
    return kernels, fwd.plan.grid(M, sms), backward_int, partial_rows


def rms_norm(native, x: torch.Tensor, weight: Optional[torch.Tensor], eps: float,
             offset: float, casting_mode: str) -> torch.Tensor:
    """y of ``x`` (any leading shape, validated by ``api.rms_norm``) on the native node.

    Everything a launch decides besides eps and offset follows from the key below, so it is
    decided once per key (``_plan_call``) and looked up after: two entry lookups, the strip
    count and the grid cost ~8 us of Python per call on a CPU measured here, the key ~2."""
    w_ptr = 0 if weight is None else weight.data_ptr()
    key = (x.shape, x.stride(), x.dtype, None if weight is None else weight.dtype,
           None if weight is None else weight.stride(), ((x.data_ptr() | w_ptr) & 15) == 0,
           casting_mode, x.get_device(), settings.forward_variant, settings.backward,
           settings.fused_strips)
    call = _CALLS.get(key)
    if call is None:
        from ..launch import sm_count
        call = _plan_call(native, x, weight, casting_mode, sm_count(x.get_device()))
        if len(_CALLS) >= CALLS_CAP:  # bounded under ever-changing shapes
            _CALLS.clear()
        _CALLS[key] = call
    kernels, grid, backward_int, partial_rows = call
    return native.apply(x, weight, kernels, grid, eps, offset, backward_int, partial_rows,
                        settings.nvtx)
