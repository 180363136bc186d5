"""The CuTe kernels through the native extension (``settings.autograd_node == "native"``).

Python decides what to launch, exactly as the Python paths do: the forward entry
(runner.entry_for) and, for a training call, the backward entry (backward_runner.entry_for) of
this configuration, the forward grid, the fused strip count (or split's M) and the rows of dW
partials. The extension (csrc/native_node.cpp) then launches the forward; for a training call it
keeps what the backward needs on its tape node and runs the whole backward in C++.

That decision is memoized per call in the extension's ``CallMemo`` (C++): shape, strides,
dtypes, devices, alignment, casting mode, eps, offset and a code of the settings a plan reads
(``settings_code``). The SM count, the settings and the plans are read when a new call arrives,
not on every call, and a call of a known shape can run without entering this module at all
(``autograd.fast_call``). A node holds its own reference to its Launch, and a Launch to its
kernels; the compiled Python functions behind them (the code itself) are pinned in
``_FUNCTIONS`` for the life of the process, not dropped by the runners' ``clear_caches``.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from ..settings import on_change, settings
from . import backward_runner, runner
from .backward_plan import dw_row_groups, fused_strips
from .plan import INT32_LIMIT, check_int32_addressable

#: (forward entry, backward entry) -> the compiled functions; never cleared (see above)
_FUNCTIONS: Dict[Tuple, Tuple] = {}
#: the extension's CallMemo (call -> Launch), made with the first native call; see ``rms_norm``
_memo = None
LAUNCHES_CAP = 1024  # bounded under ever-changing shapes: a full memo starts over


def ffi_handle(fn) -> int:
    """The TVM-FFI object handle of a compiled CuTe function (the C ABI's function pointer)."""
    obj = fn.__tvm_ffi_object__() if hasattr(fn, "__tvm_ffi_object__") else fn
    return obj.__chandle__()


def _functions(fwd: "runner._Entry", bwd: Optional["backward_runner._Entry"],
               w_dtype: Optional[torch.dtype]) -> Tuple:
    """(forward, backward, dw, reduce), each None where not needed: this configuration's
    compilations (an inference launch has no ``bwd``), compiled on first use and pinned in
    ``_FUNCTIONS`` for the life of the process."""
    key = (fwd, bwd)  # the entries themselves: kept alive here, so never confused with new ones
    found = _FUNCTIONS.get(key)
    if found is None:
        backward = dw = reduce = None
        if bwd is not None:
            backward = bwd.kernel(0)
            if w_dtype is not None:
                dw = bwd.kernel(1) if bwd.mode == "split" else None
                reduce = bwd.dw_reduce(w_dtype)
        found = _FUNCTIONS[key] = (fwd.ffi(), backward, dw, reduce)
    return found


def _plan_launch(native, x: torch.Tensor, weight: Optional[torch.Tensor], eps: float,
                 offset: float, casting_mode: str, sms: int, training: bool):
    """The native ``Launch`` of a call: a training launch (the forward that stores rstd, and the
    backward), or an inference one (the forward that does not; no backward is compiled).
    Raises, like the Python paths, on a layout the kernels cannot address."""
    from ..launch import as_rows, check_weight
    x2 = as_rows(x)
    M, N = x2.shape
    check_weight(weight, N)
    if M * x2.stride(0) >= INT32_LIMIT:
        check_int32_addressable(M, x2.stride(0), N)
    fwd = runner.entry_for(x2, weight, casting_mode, training, settings.forward_variant)
    bwd = None
    backward_name, aligned, backward_int, partial_rows = "", True, 0, 0
    if training:
        # dy is not known yet: x stands in for its alignment, and the node copies a gradient
        # that arrives misaligned (csrc/native_node.cpp, grad_rows)
        bwd = backward_runner.entry_for(x2, x2, weight, casting_mode, settings.backward)
        backward_name, aligned = bwd.mode, bwd.plans[0].vec > 1
        if bwd.mode == "fused":
            backward_int = fused_strips(M, sms, bwd.plans[0], settings.fused_strips or None)
            partial_rows = backward_int if weight is not None else 0
        else:
            backward_int = M
            partial_rows = dw_row_groups(M, bwd.plans[1], sms) if weight is not None else 0
    forward, backward, dw, reduce = _functions(fwd, bwd, None if weight is None else weight.dtype)
    handle = lambda f: ffi_handle(f) if f is not None else 0  # noqa: E731
    no_partials = bwd.no_part if bwd is not None else fwd.empty_rstd
    return native.Launch(
        handle(forward), handle(backward), handle(dw), handle(reduce), fwd.empty_w, no_partials,
        fwd.empty_rstd, fwd.plan.variant, backward_name, aligned, weight is not None, M,
        x2.stride(0), fwd.plan.grid(M, sms), backward_int, partial_rows, eps, offset,
        settings.nvtx)


def settings_code() -> int:
    """The settings every plan of this module reads, as one integer of the memo's keys."""
    return hash((settings.forward_variant, settings.backward, settings.fused_strips,
                 settings.nvtx, settings.pdl))


def memo(native):
    """The extension's call memo (made on first use; its settings code follows every change)."""
    global _memo
    if _memo is None:
        _memo = native.CallMemo(LAUNCHES_CAP)
        _memo.settings = settings_code()

        def follow_settings():
            _memo.settings = settings_code()
        on_change(follow_settings)
    return _memo


def rms_norm(native, x: torch.Tensor, weight: Optional[torch.Tensor], eps: float,
             offset: float, casting_mode: str) -> torch.Tensor:
    """y of ``x`` (any leading shape, validated by ``api.rms_norm``) through the native
    extension: on the tape when grad mode is on and x or the weight requires grad.

    Everything a launch decides follows from the call's key (see the module's docstring), so it
    is decided once per key (``_plan_launch``: the two entry lookups, the strip count and the
    grid cost ~8 us of Python per call on a CPU measured here) and found in the memo after."""
    calls = memo(native)
    launch = calls.find(x, weight, eps, offset, casting_mode)
    if launch is None:
        from ..launch import sm_count
        training = torch.is_grad_enabled() and (
            x.requires_grad or (weight is not None and weight.requires_grad))
        launch = _plan_launch(native, x, weight, eps, offset, casting_mode,
                              sm_count(x.get_device()), training)
        calls.insert(x, weight, eps, offset, casting_mode, launch)
    return native.apply(x, weight, launch)
