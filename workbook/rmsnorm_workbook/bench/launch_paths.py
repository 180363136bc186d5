"""The host lesson's launch paths: ways of reaching the CuTe forward's compiled kernel other than
the library's TVM-FFI call (notebooks/03_host_overhead.ipynb, steps 0 to 2; host.csv's
``cute.auto@jit``, ``@compiled`` and ``@cached`` rows).

Each is a launcher for ``rmsnorm_lab.lab.forward_launcher``, installed by
``instruments.use(launch_path=...)``: it gets the call's ``ForwardLaunch`` (its plan, its target
architecture), the rows ``x2``, the weight ``w`` (or the launch's zero-length stand-in), the
outputs ``y`` and ``rstd`` (or its stand-in), the grid, eps and offset, and launches the planned
kernel on torch's current stream with CuTe tensor handles made by ``from_dlpack``:

``jit``       ``launch_jit``: a new kernel object per call, called as the ``@cute.jit`` function
              it is; CuTe DSL works out the compilation from that object and the argument
              types on every call (the lesson's step 0 times what that costs).
``compiled``  ``launch_compiled``: compiled once per launch against handles; every tensor
              marshaled on every call.
``cached``    ``launch_cached``: as ``compiled``, each handle kept in a bounded FIFO keyed on
              (data_ptr, dtype, shape, stride).

NVTX ranges ``marshal`` and ``launch`` (settings.nvtx) bracket the handles and the launch.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Dict, Sequence

import cuda.bindings.driver as cuda
import cutlass
import torch
from cutlass.cute.runtime import from_dlpack

from rmsnorm_lab.lab import COMPILE_LOCK, compile_locked, forward_kernel_object, nvtx_range

#: the cached path's handles, oldest first
_HANDLES: "OrderedDict[tuple, object]" = OrderedDict()
#: the compiled and cached paths' compilation of each launch (a ForwardLaunch -> its kernel)
_COMPILED: Dict[object, object] = {}


def clear_caches() -> None:
    """Forget every compilation and tensor handle of these paths."""
    _HANDLES.clear()
    _COMPILED.clear()


def marshal(t: torch.Tensor, align: int):
    """A CuTe tensor handle for ``t`` with a dynamic layout (what from_dlpack costs per call)."""
    # detach: DLPack refuses tensors that require grad (the autograd path hands those over)
    return from_dlpack(t.detach(), assumed_align=align).mark_layout_dynamic(
        leading_dim=t.dim() - 1)


def cached_handle(t: torch.Tensor, align: int, cap: int):
    """``marshal`` through the bounded FIFO cache. A handle keeps its tensor's storage alive,
    so an unbounded cache keeps every tensor it ever saw: the cap bounds that memory."""
    key = (t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()))
    h = _HANDLES.get(key)
    if h is None:
        h = marshal(t, align)
        if cap != 0:  # negative: unbounded (the failure mode the cap exists to prevent)
            if 0 < cap <= len(_HANDLES):
                _HANDLES.popitem(last=False)
            _HANDLES[key] = h
    return h


def alignments(launch, w: torch.Tensor) -> Sequence[int]:
    """The byte alignment the kernel assumes for x, w, y and rstd: 16 on the vector path (the
    plan checked it), else one element."""
    vector = launch.plan.vec > 1
    x = 16 if vector else launch.plan.x_dtype.itemsize
    return x, (16 if vector else w.dtype.itemsize), x, 4


def stream_of(t: torch.Tensor):
    """torch's current stream on ``t``'s device, as the CUDA driver's handle."""
    return cuda.CUstream(torch.cuda.current_stream(t.device).cuda_stream)


def launch_jit(launch, x2, w, y, rstd, grid: int, eps: float, offset: float) -> None:
    """The ``jit`` path: handles made on every call, handed to a new kernel object."""
    stream = stream_of(x2)
    with nvtx_range("marshal", launch.plan.variant, x2.shape):
        args = [marshal(t, a) for t, a in zip((x2, w, y, rstd), alignments(launch, w))]
    # a new kernel object: CuTe DSL's own cache finds (or makes) its compilation, under the lock
    with COMPILE_LOCK, nvtx_range("launch", launch.plan.variant, x2.shape):
        forward_kernel_object(launch.plan)(*args, grid, eps, offset, stream)


def launch_compiled(launch, x2, w, y, rstd, grid: int, eps: float, offset: float) -> None:
    """The ``compiled`` path: every tensor marshaled on every call."""
    stream = stream_of(x2)
    with nvtx_range("marshal", launch.plan.variant, x2.shape):
        args = [marshal(t, a) for t, a in zip((x2, w, y, rstd), alignments(launch, w))]
    _call_compiled(launch, args, grid, eps, offset, stream, x2.shape)


def launch_cached(launch, x2, w, y, rstd, grid: int, eps: float, offset: float,
                  cap: int = 8) -> None:
    """The ``cached`` path: handles through the FIFO of ``cap`` entries (``cached_handle``)."""
    stream = stream_of(x2)
    with nvtx_range("marshal", launch.plan.variant, x2.shape):
        args = [cached_handle(t, a, cap) for t, a in zip((x2, w, y, rstd),
                                                          alignments(launch, w))]
    _call_compiled(launch, args, grid, eps, offset, stream, x2.shape)


def _call_compiled(launch, args, grid: int, eps: float, offset: float, stream, shape) -> None:
    """The launch's kernel compiled once against handles (``cute.compile``), then called with
    them through the compiled function's generic call."""
    kernel = _COMPILED.get(launch)
    if kernel is None:
        kernel = _COMPILED[launch] = compile_locked(
            forward_kernel_object(launch.plan), *args, cutlass.Int32(grid),
            cutlass.Float32(eps), cutlass.Float32(offset), stream,
            options=f"--gpu-arch {launch.arch}", label=launch.plan.variant)
    with nvtx_range("launch", launch.plan.variant, shape):
        kernel(*args, grid, eps, offset, stream)
