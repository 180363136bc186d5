"""Compiling CuTe kernels: the target architecture, the typed stand-ins a kernel is compiled
against, and the one place every compilation goes through.

CuTe DSL builds each kernel in an MLIR context that is global to the process, so two threads
compiling at once corrupt each other's state (a Python exception in one, or an abort of the whole
process from inside MLIR). Every compilation of the lab therefore holds ``COMPILE_LOCK``; a
thread that finds the compilation it waited for already made by another uses that one.
Launching compiled kernels takes no lock.
"""

from __future__ import annotations

import os
import threading
from typing import Callable, Dict, Optional

import cutlass
import cutlass.cute as cute
import torch
from cutlass.cute.runtime import make_fake_tensor

from ...common import nvtx

#: held by every CuTe compilation of the lab (re-entrant: a build may compile a helper kernel)
COMPILE_LOCK = threading.RLock()
_ARCH: Dict[int, str] = {}


def arch_name(major: int, minor: int) -> str:
    """The compile target of compute capability ``major.minor``: the architecture-specific
    ``a`` target where the chip has one (from Hopper on: sm_90a, sm_100a, sm_103a, sm_120a, ...),
    whose instructions (PDL, clusters, TMA) the kernels may use; the plain one before (sm_80,
    sm_86, sm_89)."""
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def target_arch(device: Optional[torch.device] = None) -> str:
    """The compile target of ``device`` (``sm_90a`` on an H100 or H200, ``sm_100a`` on a B200);
    without a GPU, ``CUTE_DSL_ARCH`` (default ``sm_100a``)."""
    if device is not None and device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        arch = _ARCH.get(idx)
        if arch is None:
            arch = _ARCH[idx] = arch_name(*torch.cuda.get_device_capability(idx))
        return arch
    return os.environ.get("CUTE_DSL_ARCH", "sm_100a")


def compile_locked(kernel, *args, options: str, label: str):
    """``cute.compile(kernel, *args, options=options)`` under ``COMPILE_LOCK``, inside an NVTX
    ``compile`` range."""
    with COMPILE_LOCK, nvtx.range("compile", label):
        return cute.compile(kernel, *args, options=options)


def compile_tvm_ffi(cache: Dict, key, arch: str, label: str, build: Callable[[], tuple],
                    keep_ptx_dir: Optional[str] = None):
    """``cache[key]``, compiled on a miss (or always, to keep the PTX in ``keep_ptx_dir``) with
    TVM-FFI for ``arch``: ``build()`` returns the kernel object and its typed stand-in arguments."""
    fn = cache.get(key)
    if fn is not None and keep_ptx_dir is None:
        return fn
    with COMPILE_LOCK:
        fn = cache.get(key)
        if fn is None or keep_ptx_dir is not None:
            options = f"--gpu-arch {arch} --enable-tvm-ffi"
            if keep_ptx_dir is not None:
                options += f" --keep-ptx --dump-dir {keep_ptx_dir}"
            kernel, args = build()
            fn = compile_locked(kernel, *args, options=options, label=label)
            cache[key] = fn
    return fn


def assumed_align(vec: int, dtype: torch.dtype) -> int:
    """The byte alignment a kernel may assume for a tensor of ``dtype``: 16 on the vector path
    (``vec`` > 1: the plans checked it), else one element of ``dtype``."""
    return 16 if vec > 1 else dtype.itemsize


def fake_rows(dtype, rows: str, ld: str, align: int, n=None):
    """A stand-in for (rows, N):(ld, 1) rows whose row count and row stride are symbolic, so one
    compilation serves every M and stride; N is symbolic too unless ``n`` is given."""
    width = n if n is not None else cute.sym_int64(symbol="N")
    return make_fake_tensor(dtype, (cute.sym_int64(symbol=rows), width),
                            stride=(cute.sym_int64(symbol=ld), 1), assumed_align=align)


def fake_vector(dtype, size: str, align: int):
    """A stand-in for a (size,) vector of unit stride: a weight, rstd, dW."""
    return make_fake_tensor(dtype, (cute.sym_int64(symbol=size),), stride=(1,),
                            assumed_align=align)


def fake_rstd():
    return fake_vector(cutlass.Float32, "Mr", 4)
