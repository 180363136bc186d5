"""The host lesson's instruments: what the host benchmark (``bench.host``) switches to take the
library's host path apart, beside the library's own settings; notebooks/03_host_overhead.ipynb
switches the launch paths.

``launch_path``        how the CuTe forward reaches its compiled kernel: ``tvm_ffi`` (the
                       library's own TVM-FFI call) or one of ``bench.launch_paths``' launchers,
                       ``cached``, ``compiled``, ``jit``, installed through the library's hook
                       ``rmsnorm_lab.lab.forward_launcher`` (calls then take the Python node)
``tensor_cache_cap``   the ``cached`` path's FIFO of tensor handles: at most this many (0: none
                       kept; negative: unbounded, the memory the cap exists to bound)
``settings_per_call``  the ``RMSNORM_LAB_*`` environment parsed before every call
                       (``per_call``), to price reading the settings once at import

``use(...)`` sets them for a block, handing every other key to ``rmsnorm_lab.settings.override``;
``state()`` is what is in force, ``DEFAULTS`` the library's own path. The names are those of
``results/<gpu>/host.csv``: ``cute.auto@<launch_path>``, ``cute.auto@cached:<cap>``,
``cute.auto@tvm_ffi+settings_per_call``. Process-wide, like the settings.

This module imports no CuTe DSL: the analysis and the command line read the names and defaults,
and ``bench.launch_paths`` (which loads it) is imported on the first ``use`` of a launcher.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from typing import Any, Callable, Dict, Iterator, List, Optional

from rmsnorm_lab import settings
from rmsnorm_lab.settings import from_environ

#: every launch path, the library's own first
LAUNCH_PATHS = ("tvm_ffi", "cached", "compiled", "jit")


@dataclasses.dataclass(frozen=True)
class Instruments:
    """One setting of the instruments (the defaults: the library's path, untouched)."""
    launch_path: str = "tvm_ffi"
    tensor_cache_cap: int = 8
    settings_per_call: bool = False

    def __post_init__(self) -> None:
        if self.launch_path not in LAUNCH_PATHS:
            raise ValueError(f"launch_path must be one of {LAUNCH_PATHS}, "
                             f"got {self.launch_path!r}")
        if isinstance(self.tensor_cache_cap, bool) or not isinstance(self.tensor_cache_cap, int):
            raise ValueError(f"tensor_cache_cap must be an integer, got "
                             f"{self.tensor_cache_cap!r}")
        if not isinstance(self.settings_per_call, bool):
            raise ValueError(f"settings_per_call must be a bool, got {self.settings_per_call!r}")

    def as_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


#: the instruments' names, as ``use`` and host.csv's config keys spell them
NAMES = tuple(f.name for f in dataclasses.fields(Instruments))
DEFAULTS = Instruments()
_STATE: List[Instruments] = [DEFAULTS]


def state() -> Instruments:
    """The instruments in force."""
    return _STATE[0]


@contextlib.contextmanager
def use(**changes: Any) -> Iterator[Instruments]:
    """For the block: the instruments named in ``changes`` and, for every other key, the
    library's settings (``rmsnorm_lab.settings.override``); both restored on exit, even on error.
    A launch path other than ``tvm_ffi`` is installed as the library's forward launcher::

        with use(launch_path="cached", tensor_cache_cap=0, nvtx=True):
            y = rms_norm(x, w)       # the CuTe forward launched by launch_paths.launch_cached

    ``settings_per_call`` changes no call by itself: the benchmark's tasks wrap their call in
    ``per_call`` while it is on (``timed_call``)."""
    mine = {k: changes.pop(k) for k in NAMES if k in changes}
    new = dataclasses.replace(_STATE[0], **mine)  # checked before anything changes
    with contextlib.ExitStack() as stack:
        stack.enter_context(settings.override(**changes))
        if "launch_path" in mine or "tensor_cache_cap" in mine:
            from rmsnorm_lab.lab import forward_launcher
            stack.enter_context(forward_launcher(launcher(new)))
        previous, _STATE[0] = _STATE[0], new
        try:
            yield new
        finally:
            _STATE[0] = previous


def launcher(instruments: Instruments) -> Optional[Callable]:
    """The forward launcher of ``instruments``' launch path (None: the library's TVM-FFI
    call)."""
    if instruments.launch_path == "tvm_ffi":
        return None
    from . import launch_paths
    if instruments.launch_path == "cached":
        return functools.partial(launch_paths.launch_cached, cap=instruments.tensor_cache_cap)
    return {"compiled": launch_paths.launch_compiled,
            "jit": launch_paths.launch_jit}[instruments.launch_path]


def per_call(fn: Callable) -> Callable:
    """``fn`` with the ``RMSNORM_LAB_*`` environment parsed and validated before every call (not
    applied: the settings in force stay): what a library reading its settings per call would
    pay on top of ``fn``."""
    def call(*args, **kwargs):
        from_environ(os.environ)
        return fn(*args, **kwargs)
    return call


def timed_call(fn: Callable, overrides: Dict[str, Any]) -> Callable:
    """``fn`` as a benchmark times it under ``overrides`` (keys of ``use``): wrapped in
    ``per_call`` when they turn ``settings_per_call`` on, else ``fn`` itself."""
    return per_call(fn) if overrides.get("settings_per_call") else fn


def clear_caches() -> None:
    """Forget the library's forward compilations and launches and the launch paths' own
    (compilations, tensor handles): a measurement from a cold start."""
    from rmsnorm_lab.lab import clear_forward_caches

    from . import launch_paths
    clear_forward_caches()
    launch_paths.clear_caches()
