"""Builds and loads the native tape node (``native_node.cpp`` and its headers beside this file).

The node is a torch C++ extension compiled on first use with the machine's C++ compiler
(``torch.utils.cpp_extension.load``; torch caches the build, so later processes only load it).
It links TVM-FFI's C library to call the compiled CuTe kernels, and NVTX's header-only C API
when its headers are found (the ``nvidia-nvtx`` wheel or the CUDA toolkit).

``load()`` returns the extension module or raises ``NativeNodeUnavailable`` saying why (no
compiler, a build error). The backward's argument codes reach the build as macros from their one
definition (cute/launch/args.py). ``rms_norm`` with ``settings.experiments.autograd_node == "native"``
falls back to the Python node with one warning when the build fails; ``"python"`` never builds it.
"""

from __future__ import annotations

import glob
import hashlib
import os
import pathlib
import threading
import warnings
from typing import List, Optional

import torch

HERE = pathlib.Path(__file__).parent
SOURCE = HERE / "native_node.cpp"
HEADERS = (HERE / "ffi.h", HERE / "call_key.h", HERE / "launch.h")

_LOCK = threading.Lock()  # one build per process, whichever thread asks first
_MODULE = None
_FAILURE: Optional[str] = None


class NativeNodeUnavailable(RuntimeError):
    """The native node could not be built or loaded here."""


def _nvtx_include_dirs() -> List[str]:
    """Directories holding ``nvtx3/nvToolsExt.h``: the nvidia-nvtx wheel, then CUDA's."""
    roots = []
    try:
        import nvidia  # namespace package of NVIDIA's CUDA wheels
        roots += [os.path.join(p, "*", "include") for p in nvidia.__path__]
    except ImportError:
        pass
    from torch.utils.cpp_extension import CUDA_HOME
    for home in (CUDA_HOME, "/usr/local/cuda"):
        if home:
            roots.append(os.path.join(home, "include"))
    for pattern in roots:
        for d in sorted(glob.glob(pattern)):
            if os.path.exists(os.path.join(d, "nvtx3", "nvToolsExt.h")):
                return [d]
    return []


def _build():
    import tvm_ffi.libinfo
    from torch.utils.cpp_extension import load

    lib = tvm_ffi.libinfo.find_libtvm_ffi()
    lib_dir = os.path.dirname(lib)
    includes = [tvm_ffi.libinfo.find_include_path()]
    from ..cute.launch.args import build_macros
    cflags = ["-O2"] + build_macros()  # the backward's argument codes, defined in Python
    nvtx = _nvtx_include_dirs()
    if nvtx:
        includes += nvtx
        cflags.append("-DRMSNORM_LAB_NVTX")
    # torch's build folder is named after the extension and shared by every checkout on the
    # machine, and torch rebuilds on a changed .cpp but not on a changed header or flag: the
    # torch version and a digest of every source and flag are in the name, so each version of
    # the sources has a build of its own and no two checkouts rebuild each other's
    tag = torch.__version__.replace(".", "_").replace("+", "_")
    digest = hashlib.sha1(b"".join(p.read_bytes() for p in (SOURCE,) + HEADERS)
                          + " ".join(cflags).encode()).hexdigest()[:12]
    _ninja_on_path()
    return load(name=f"rmsnorm_lab_native_{tag}_{digest}", sources=[str(SOURCE)],
                extra_include_paths=includes, extra_cflags=cflags,
                extra_ldflags=[f"-L{lib_dir}", f"-l:{os.path.basename(lib)}",
                               f"-Wl,-rpath,{lib_dir}"])


def _ninja_on_path() -> None:
    """torch builds with the ``ninja`` command; the ninja wheel installs it beside the Python
    that runs this, which is not on PATH in a notebook or under ``.venv/bin/python``."""
    try:
        import ninja
    except ImportError:
        return
    bin_dir = getattr(ninja, "BIN_DIR", None)
    path = os.environ.get("PATH", "")
    if bin_dir and bin_dir not in path.split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + path


def load():
    """The built extension (built on the first call of the process; cached by torch)."""
    if _MODULE is not None:
        return _MODULE
    with _LOCK:
        return _load_locked()


def _load_locked():
    global _MODULE, _FAILURE
    if _MODULE is not None:
        return _MODULE
    if _FAILURE is not None:
        raise NativeNodeUnavailable(_FAILURE)
    try:
        _MODULE = _build()
    except Exception as exc:  # compiler missing, build error, loader error: say which
        _FAILURE = (f"the native autograd node could not be built ({type(exc).__name__}: "
                    f"{str(exc).strip().splitlines()[-1] if str(exc).strip() else exc!r}); "
                    "rmsnorm_lab.native.build.load() raises with the compiler's output; "
                    "RMSNORM_LAB_AUTOGRAD_NODE=python uses the Python node without trying")
        raise NativeNodeUnavailable(_FAILURE) from exc
    return _MODULE


def load_or_warn():
    """``load()``, or None: with one warning naming the reason when the build fails (the
    Python node takes over); a failure already recorded is not announced again."""
    first_try = _FAILURE is None
    try:
        return load()
    except NativeNodeUnavailable as exc:
        if first_try:
            warnings.warn(f"{exc}; using the Python autograd node", RuntimeWarning, stacklevel=3)
        return None
