"""What the native node launches, decided in Python.

Python decides what to launch from the same planning entries the Python paths launch from: the
forward's ``cute.launch.forward.forward_launch`` and, for a training call, the backward's
``cute.launch.backward.backward_launch`` and its ``steps`` (dx and dW, dx alone, dW alone), with
the grids, strip counts and rows of dW partials as rules of the row count. The decision is
handed to the extension as one ``LaunchSpec`` of plain values; the extension (native_node.cpp)
launches the forward and, for a training call, keeps what the backward needs on its tape node and
runs the steps of the backward the inputs' gradients ask for, in C++. The fused residual add
(``call`` with a residual) goes the same way with its own forward, dx kernels that add h's gradient, and
its own memo.

The decision is memoized in the extension's ``CallMemo``, keyed on what a plan reads: the row
width and layout, dtypes, devices, alignment, casting mode, eps, offset, which side of ``auto``'s
few-rows threshold the row count is on, and the code of the settings snapshot the plan read; not
on the row count itself, so calls whose leading shape changes every call share one Launch. A call
of a known key runs without entering this module (``dispatch.fast_call``); on a miss the memo
computes the key once, asks ``plan`` for the launch and files it under that key and the code of
the snapshot it was planned under. A node holds its own reference to its Launch, and a Launch to
its kernels; the compiled Python functions behind them are pinned in ``_FUNCTIONS`` for the life
of the process, not dropped by the launch modules' ``clear_caches``.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Dict, Optional, Tuple

import torch

from ..common.device import sm_count
from ..common.rows import as_rows, check_weight
from ..cute.launch.backward import backward_launch
from ..cute.launch.forward import forward_launch
from ..cute.plan.auto import AUTO_FEW_ROWS_MAX, AUTO_FEWEST_ROWS_MAX
from ..cute.plan.forward import INT32_LIMIT, RowsRule, check_int32_addressable
from ..registry import nvtx_argb
from ..settings import Snapshot, on_change, snapshot

#: entries -> their compiled functions; never cleared (see above)
_FUNCTIONS: Dict[Tuple, Tuple] = {}
#: the extension's CallMemos (call -> Launch) of rms_norm (False) and of the fused add (True),
#: each made with its first native call
_memos: Dict[bool, object] = {}
_memo_lock = threading.Lock()
LAUNCHES_CAP = 1024  # bounded under ever-changing shapes: a full memo starts over


def ffi_handle(fn) -> int:
    """The TVM-FFI object handle of a compiled CuTe function (the C ABI's function pointer)."""
    obj = fn.__tvm_ffi_object__() if hasattr(fn, "__tvm_ffi_object__") else fn
    return obj.__chandle__()


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """One backward kernel call as the extension sees it (``cute.launch.backward.Step`` with the
    kernel as a TVM-FFI handle and the NVTX colour resolved)."""
    kernel: int
    args: Tuple[int, ...]
    count: Optional[RowsRule]  # the rule of the COUNT argument (None: the step passes none)
    stage: str
    name: str
    argb: int
    on_partials: bool


@dataclasses.dataclass(frozen=True)
class BackwardSpec:
    """The steps of one backward and the rule of the rows of dW partials they write."""
    steps: Tuple[StepSpec, ...]
    partial_rows: Optional[RowsRule]  # None: no dW


@dataclasses.dataclass(frozen=True)
class LaunchSpec:
    """Everything the extension's ``Launch`` is built from (its constructor reads these
    attributes). Nothing in it depends on the row count M: the grid, strip counts and partial
    rows are rules of M, evaluated per call. A training launch has backwards and its forward
    stores rstd; an inference launch has none and runs the forward that does not."""
    forward: int               # TVM-FFI handle: (x, w, y, rstd, grid, eps, offset); with
    #                            a residual (x, r, w, y, h, rstd, grid, eps, offset)
    forward_name: str          # NVTX: "row", "persistent", ...
    forward_argb: int
    forward_grid: RowsRule
    row_stride: int            # x's row stride as rows, for layouts the memo keys exactly
    weighted: bool
    eps: float
    offset: float
    nvtx: bool
    no_weight: torch.Tensor    # zero-length stand-in for an absent weight
    no_rstd: torch.Tensor      # zero-length stand-in for the rstd an inference forward skips
    no_partials: torch.Tensor  # stand-in for partials a kernel does not write
    aligned: bool              # the backward kernels assume 16-byte aligned rows of dy
    #: (dx and dW, dx alone, dW alone): the node runs the one its inputs' gradients ask for
    backward: Tuple[BackwardSpec, ...] = ()
    #: the fused residual add: the forward writes h too, the dx kernels add h's gradient
    residual: bool = False


def _backward_spec(bwd, sms: int, w_dtype: Optional[torch.dtype], fused_strips: int,
                   need_dx: bool, need_dw: bool) -> BackwardSpec:
    steps, partial_rows = bwd.steps(sms, w_dtype, fused_strips, 0, need_dx, need_dw)
    _FUNCTIONS.setdefault((bwd, w_dtype, need_dx, need_dw), tuple(s.kernel for s in steps))
    return BackwardSpec(tuple(StepSpec(ffi_handle(s.kernel), tuple(map(int, s.args)), s.count,
                                       s.stage, s.name, nvtx_argb(s.name), s.on_partials)
                              for s in steps), partial_rows)


def plan_launch(x: torch.Tensor, weight: Optional[torch.Tensor], eps: float, offset: float,
                casting_mode: str, sms: int, training: bool, snap: Snapshot,
                residual: Optional[torch.Tensor] = None) -> LaunchSpec:
    """The launch of a call under the settings ``snap``: a training launch (the forward that
    stores rstd, and the backwards), or an inference one; with ``residual`` (laid out as x),
    the fused residual add's. Raises, like the Python paths, on a layout the kernels cannot
    address."""
    x2 = as_rows(x)
    M, N = x2.shape
    check_weight(weight, N)
    if M * x2.stride(0) >= INT32_LIMIT:
        check_int32_addressable(M, x2.stride(0), N)
    r2 = as_rows(residual, "residual") if residual is not None else None
    fwd = forward_launch(x2, weight, casting_mode, training, snap, sms, residual=r2)
    forward = fwd.compiled()
    _FUNCTIONS.setdefault(fwd, (forward,))
    w_dtype = weight.dtype if weight is not None else None
    backward, aligned, no_partials = (), False, fwd.no_rstd
    if training:
        # dy is not known yet: x stands in for its alignment, and the node copies a gradient
        # that arrives in another layout (common.rows.kernel_grad_rows)
        bwd = backward_launch(x2, x2, weight, casting_mode, snap.backward, snap.pdl,
                              dh=residual is not None)
        backward = tuple(_backward_spec(bwd, sms, w_dtype, snap.fused_strips, dx, dw)
                         for dx, dw in ((True, True), (True, False), (False, True)))
        aligned, no_partials = bwd.aligned, bwd.no_partials
    return LaunchSpec(
        forward=ffi_handle(forward), forward_name=fwd.plan.variant,
        forward_argb=nvtx_argb(fwd.plan.variant), forward_grid=fwd.grid,
        row_stride=x2.stride(0), weighted=weight is not None, eps=eps, offset=offset,
        nvtx=snap.nvtx, no_weight=fwd.no_weight, no_rstd=fwd.no_rstd, no_partials=no_partials,
        aligned=aligned, backward=backward, residual=residual is not None)


def memo(native, residual: bool = False):
    """The extension's call memo of rms_norm, or with ``residual`` the fused add's (each made
    on first use; its settings code follows every change)."""
    found = _memos.get(residual)
    if found is not None:
        return found
    with _memo_lock:
        if residual not in _memos:
            # the one use of M a plan makes: ``auto``'s row class (cute/plan/auto.py row_class)
            memo = native.CallMemo(LAUNCHES_CAP, AUTO_FEW_ROWS_MAX, AUTO_FEWEST_ROWS_MAX)
            memo.settings = snapshot().code

            def follow_settings():
                memo.settings = snapshot().code
            on_change(follow_settings)
            _memos[residual] = memo
    return _memos[residual]


def call(native, x: torch.Tensor, residual: Optional[torch.Tensor],
         weight: Optional[torch.Tensor], eps: float, offset: float, casting_mode: str,
         snap: Snapshot):
    """y of ``x`` (any leading shape, validated by ``api.rms_norm``) through the native
    extension, or with ``residual`` (laid out as x: ``common.rows.same_layout``) ``(y, h)`` of
    the fused add; on the tape when grad mode is on and an input requires grad. The memo runs a
    known call; a new one is planned under ``snap`` (``plan_launch``) and filed."""
    def plan():
        training = torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (x, residual, weight))
        spec = plan_launch(x, weight, eps, offset, casting_mode, sm_count(x.get_device()),
                           training, snap, residual=residual)
        return native.Launch(spec), snap.code
    if residual is None:
        return memo(native).call(x, weight, eps, offset, casting_mode, plan)
    return memo(native, residual=True).call_add(x, residual, weight, eps, offset, casting_mode,
                                                plan)
