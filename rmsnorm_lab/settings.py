"""Every toggle of the lab in one object.

``RMSNORM_LAB_<FIELD>`` environment variables are read once, when this module is imported; the
launch path reads the ``settings`` object (a plain attribute load), never ``os.environ``.
Notebooks change toggles for a block of code with ``settings.override(...)``::

    from rmsnorm_lab import settings
    with settings.override(forward_variant="warp"):
        y = rms_norm(x, w)
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, Callable, Dict, Iterator, List, Mapping

BACKENDS = ("cute", "triton", "torch")
FORWARD_VARIANTS = ("auto", "row", "persistent", "warp", "fallback")
BACKWARD_MODES = ("auto", "fused", "split")
LAUNCH_PATHS = ("tvm_ffi", "cached", "compiled", "jit")
AUTOGRAD_NODES = ("native", "python")

_CHOICES: Dict[str, tuple] = {
    "backend": BACKENDS,
    "forward_variant": FORWARD_VARIANTS,
    "backward": BACKWARD_MODES,
    "launch_path": LAUNCH_PATHS,
    "autograd_node": AUTOGRAD_NODES,
}
_THE_SETTINGS = None  # the lab's ``settings`` (below): its changes are announced to listeners
# integer toggles with a lower bound (tensor_cache_cap has none: negative means unbounded)
_MINIMUM: Dict[str, int] = {"fused_strips": 0}


@dataclasses.dataclass
class Settings:
    #: default backend of ``rms_norm`` when the call names none
    backend: str = "cute"
    #: CuTe forward kernel: ``auto`` picks the fastest measured eligible variant for the shape
    forward_variant: str = "auto"
    #: CuTe backward: ``fused`` (dx and the dW partials in one kernel), ``split`` (separate
    #: kernels), ``auto`` (the kernel family picks per shape). ``RMSNORM_LAB_BACKWARD=split`` is
    #: the escape hatch when the fused kernel misbehaves on a machine.
    backward: str = "auto"
    #: strips of rows (= CTAs) of the fused backward; 0 (auto) takes the plan's CTAs per SM
    #: times the SM count (backward_plan.fused_strips). Negative values are refused.
    fused_strips: int = 0
    #: programmatic dependent launch where it was measured to pay, on Hopper: the forward's row
    #: kernel (cute/plan.py ``uses_pdl``) and every backward kernel
    #: (cute/backward_plan.py ``backward_uses_pdl``); off: plain stream order
    pdl: bool = True
    #: how torch tensors reach a compiled CuTe kernel (rmsnorm_lab/cute/runner.py lists them);
    #: ``tvm_ffi`` is the fastest on the host
    launch_path: str = "tvm_ffi"
    #: how CuTe calls on the ``tvm_ffi`` path are made: ``native`` (the C++ extension,
    #: csrc/native_node.cpp, built on first use: its call memo, its launch and, for training
    #: calls, its autograd node; if it cannot be built, one warning and the Python path) or
    #: ``python`` (the Python launch path and a ``torch.autograd.Function`` node, as the other
    #: launch paths, Triton, ``in_place=True`` and torch.compile always use)
    autograd_node: str = "native"
    #: marshaled tensor handles kept by the ``cached`` path (FIFO); 0 turns the cache off,
    #: a negative cap removes the bound (only to demonstrate why the bound exists)
    tensor_cache_cap: int = 8
    #: NVTX ranges (domain ``rmsnorm_lab``) around compile, marshal, launch and reduce
    nvtx: bool = False
    #: cache each device's SM count (the persistent grids need it); off asks the driver per call
    sm_count_cache: bool = True
    #: re-read the RMSNORM_LAB_* environment on every CuTe launch, only to measure that cost
    settings_per_call: bool = False

    def __setattr__(self, name: str, value: Any) -> None:
        self._assign(name, value)
        if self is _THE_SETTINGS:  # not a scratch object (from_environ, per_call_settings_cost)
            _notify()

    def _assign(self, name: str, value: Any) -> None:
        """Validate and set one toggle, without telling the listeners."""
        if name not in _FIELD_NAMES:
            raise AttributeError(
                f"settings has no toggle {name!r}; toggles: {sorted(_FIELD_NAMES)}")
        object.__setattr__(self, name, _coerce(name, value))

    @contextlib.contextmanager
    def override(self, **changes: Any) -> Iterator["Settings"]:
        """Temporarily change toggles; restores the previous values on exit, even on error.
        Listeners hear once on entry and once on exit, however many toggles change (the
        benchmarks wrap single calls in an override)."""
        saved = {k: getattr(self, k) for k in changes if k in _FIELD_NAMES}
        try:
            for k, v in changes.items():
                self._assign(k, v)
            if self is _THE_SETTINGS:
                _notify()
            yield self
        finally:
            for k, v in saved.items():
                object.__setattr__(self, k, v)
            if self is _THE_SETTINGS:
                _notify()

    def as_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


_LISTENERS: List[Callable[[], None]] = []


def on_change(listener: Callable[[], None]) -> None:
    """Call ``listener()`` after every change of a toggle, set or restored by ``override``: for
    state derived from the settings once rather than read per call (the native call memo)."""
    _LISTENERS.append(listener)


def _notify() -> None:
    for listener in _LISTENERS:
        listener()


_FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(Settings))
_TYPES = {f.name: f.type for f in dataclasses.fields(Settings)}


def _coerce(name: str, value: Any) -> Any:
    kind = _TYPES[name]
    if kind == "bool":
        if isinstance(value, str):
            low = value.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"settings.{name} expects a boolean, got {value!r}")
        return bool(value)
    if kind == "int":
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"settings.{name} expects an integer, got {value!r}") from None
        low = _MINIMUM.get(name)
        if low is not None and number < low:
            raise ValueError(f"settings.{name} must be at least {low}, got {number}")
        return number
    value = str(value)
    choices = _CHOICES.get(name)
    if choices is not None and value not in choices:
        raise ValueError(f"settings.{name} must be one of {choices}, got {value!r}")
    return value


def from_environ(environ: Mapping[str, str]) -> Settings:
    """Build settings from ``RMSNORM_LAB_*`` variables (unknown ones are an error, not ignored)."""
    s = Settings()
    prefix = "RMSNORM_LAB_"
    for key, raw in environ.items():
        if not key.startswith(prefix):
            continue
        name = key[len(prefix):].lower()
        if name not in _FIELD_NAMES:
            raise ValueError(f"unknown environment variable {key}; known: "
                             + ", ".join(prefix + n.upper() for n in sorted(_FIELD_NAMES)))
        setattr(s, name, raw)
    return s


settings = _THE_SETTINGS = from_environ(os.environ)
