"""Every toggle of the lab, in two groups.

``settings`` holds what a user chooses: the backend, the forward and backward kernels, programmatic
dependent launch and NVTX ranges. ``settings.experiments`` holds what the notebooks and the
benchmarks switch to *measure* something (the Python autograd node, a forced strip count); the
defaults are the fast path and a user has no reason to touch them.

Both are read once, when this module is imported, from ``RMSNORM_LAB_<TOGGLE>`` environment
variables: an unknown ``RMSNORM_LAB_*`` name is ignored with a warning (``UnknownVariableWarning``)
that lists the valid ones; a known one with a value it cannot take is a ``SettingsError`` (a
``ValueError``) naming the variable and the values it takes, which the lab's own command lines
print as one line before exiting with status 2. A call never reads ``os.environ``: re-reading the
environment per call costs more than the rest of the call
(docs/design-record.md, 'Host: settings read once'). ``settings.override(...)`` changes any toggle of either group for a block of code and
restores it on exit::

    from rmsnorm_lab import settings
    with settings.override(forward_variant="warp", nvtx=True):
        y = rms_norm(x, w)

Settings are process-wide (like ``torch.backends`` flags): an override in one thread is seen by
calls in every thread while it lasts. A call takes them once, as a ``Snapshot`` (``snapshot()``,
rebuilt on every change, so taking it is one global read), and passes that down: its plan, its
launch and the call memo's key all see the same values.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import warnings
from typing import Any, Callable, Dict, Iterator, List, Mapping, NamedTuple

from .registry import BACKENDS, BACKWARD_MODES, FORWARD_VARIANTS

AUTOGRAD_NODES = ("native", "python")
UNDER_COMPILE = ("decompose", "kernel")
FORWARD_CHOICES = ("auto",) + FORWARD_VARIANTS
BACKWARD_CHOICES = ("auto",) + BACKWARD_MODES
PREFIX = "RMSNORM_LAB_"

_CHOICES: Dict[str, tuple] = {
    "backend": BACKENDS,
    "forward_variant": FORWARD_CHOICES,
    "backward": BACKWARD_CHOICES,
    "autograd_node": AUTOGRAD_NODES,
    "under_compile": UNDER_COMPILE,
}
_MINIMUM: Dict[str, int] = {"fused_strips": 0}


class _Toggles:
    """Validation and change notification shared by both groups."""

    def __setattr__(self, name: str, value: Any) -> None:
        self._assign(name, value)
        if any(self is live for live in _LIVE):  # not a scratch copy (from_environ's)
            _notify()

    def _assign(self, name: str, value: Any) -> None:
        fields = {f.name: f.type for f in dataclasses.fields(self)}
        if name not in fields:
            raise AttributeError(f"{type(self).__name__} has no toggle {name!r}; toggles: "
                                 f"{sorted(fields)}")
        object.__setattr__(self, name, _coerce(name, fields[name], value))

    def as_dict(self) -> Dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclasses.dataclass
class Experiments(_Toggles):
    """Toggles the lab's notebooks and benchmarks switch to measure a part of the host path."""
    #: CuTe calls: ``native`` (the C++ extension: call memo, launch and autograd node) or
    #: ``python`` (a ``torch.autograd.Function``, as Triton, ``in_place=True``, torch.compile
    #: and a forward launcher of the host lesson's, ``lab.forward_launcher``, use)
    autograd_node: str = "native"
    #: strips (CTAs) of the fused backward; 0: the plan's resident CTAs per SM times the SMs
    fused_strips: int = 0


@dataclasses.dataclass
class Settings(_Toggles):
    """What a user chooses. ``experiments`` holds the measuring toggles."""
    #: default backend of ``rms_norm`` when the call names none
    backend: str = "cute"
    #: CuTe forward kernel; ``auto`` picks the fastest measured eligible one for the shape
    forward_variant: str = "auto"
    #: CuTe backward: ``fused`` (dx and dW partials in one kernel), ``split`` (a dx kernel and a dW
    #: kernel), ``auto`` (per shape). ``RMSNORM_LAB_BACKWARD=split`` is the escape hatch.
    backward: str = "auto"
    #: programmatic dependent launch on Hopper where it was measured to pay (cute/plan/forward.py
    #: ``uses_pdl``, cute/plan/backward.py ``backward_uses_pdl``); off: plain stream order
    pdl: bool = True
    #: NVTX ranges (domain ``rmsnorm_lab``) around compile, marshal, launch and reduce
    nvtx: bool = False
    #: under torch.compile: ``decompose`` (the ops' math as torch ops, which Inductor fuses with
    #: the model's other ops) or ``kernel`` (the lab's kernels, one opaque graph node each)
    under_compile: str = "decompose"
    experiments: Experiments = dataclasses.field(default_factory=Experiments)

    def _assign(self, name: str, value: Any) -> None:
        if name == "experiments" and isinstance(value, Experiments):
            object.__setattr__(self, name, value)
            return
        if name in EXPERIMENT_TOGGLES:
            raise AttributeError(f"{name} is an experiment toggle: settings.experiments.{name}")
        super()._assign(name, value)

    @contextlib.contextmanager
    def override(self, **changes: Any) -> Iterator["Settings"]:
        """Temporarily change toggles of either group; restores them on exit, even on error.
        Listeners hear once on entry and once on exit, however many toggles change."""
        targets = {k: (self.experiments if k in EXPERIMENT_TOGGLES else self) for k in changes}
        unknown = sorted(set(changes) - set(USER_TOGGLES) - set(EXPERIMENT_TOGGLES))
        if unknown:
            raise AttributeError(f"settings have no toggle {unknown[0]!r}; toggles: "
                                 f"{sorted(USER_TOGGLES + EXPERIMENT_TOGGLES)}")
        saved = {k: getattr(t, k) for k, t in targets.items()}
        try:
            for k, v in changes.items():
                _Toggles._assign(targets[k], k, v)
            _notify()
            yield self
        finally:
            for k, v in saved.items():
                object.__setattr__(targets[k], k, v)
            _notify()

    def snapshot(self) -> "Snapshot":
        """The toggles a call reads, as one ``Snapshot`` (module function ``snapshot``)."""
        return _SNAPSHOT[0]

    def as_dict(self) -> Dict[str, Any]:
        """Every toggle of both groups, flat."""
        d = {k: v for k, v in super().as_dict().items() if k != "experiments"}
        return {**d, **self.experiments.as_dict()}


USER_TOGGLES = tuple(f.name for f in dataclasses.fields(Settings) if f.name != "experiments")
EXPERIMENT_TOGGLES = tuple(f.name for f in dataclasses.fields(Experiments))

class Snapshot(NamedTuple):
    """The settings a call reads, taken once (``snapshot()``) and passed down: the plans, the
    launches and the call memo's key see these values, whatever another thread changes."""
    forward_variant: str
    backward: str
    pdl: bool
    nvtx: bool
    fused_strips: int
    autograd_node: str

    @property
    def code(self) -> int:
        """The snapshot as one integer of the call memo's keys."""
        return hash(tuple(self))


_LISTENERS: List[Callable[[], None]] = []
_LIVE: List[_Toggles] = []  # the module's own objects: their changes are announced
_SNAPSHOT: List[Snapshot] = []  # the snapshot of the settings in force (one element)


def snapshot() -> Snapshot:
    """The settings in force as a ``Snapshot`` (rebuilt on every change, not per call)."""
    return _SNAPSHOT[0]


def _take_snapshot() -> Snapshot:
    return Snapshot(settings.forward_variant, settings.backward, settings.pdl, settings.nvtx,
                    settings.experiments.fused_strips, settings.experiments.autograd_node)


def on_change(listener: Callable[[], None]) -> None:
    """Call ``listener()`` after every change of a toggle (set, or entered or restored by
    ``override``): for state derived from the settings once rather than read per call."""
    _LISTENERS.append(listener)


def _notify() -> None:
    _SNAPSHOT[0] = _take_snapshot()
    for listener in _LISTENERS:
        listener()


def _coerce(name: str, kind: str, value: Any) -> Any:
    if kind == "bool":
        if isinstance(value, str):
            low = value.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"settings.{name} expects a boolean (1, true, yes, on or 0, false, "
                             f"no, off), got {value!r}")
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


class SettingsError(ValueError):
    """An ``RMSNORM_LAB_*`` environment variable set to a value its toggle cannot take."""


class UnknownVariableWarning(UserWarning):
    """An ``RMSNORM_LAB_*`` environment variable the lab does not read."""


def environment_names() -> List[str]:
    """Every ``RMSNORM_LAB_*`` variable the lab reads."""
    return [PREFIX + n.upper() for n in USER_TOGGLES + EXPERIMENT_TOGGLES]


def from_environ(environ: Mapping[str, str]) -> Settings:
    """Settings built from ``RMSNORM_LAB_*`` variables. An unknown one gets a one-line warning
    naming the valid ones (a misspelt escape hatch must not be silently ignored, nor stop an
    import); a known one with a value it cannot take is an error naming the variable."""
    s = Settings()
    for key, raw in environ.items():
        if not key.startswith(PREFIX):
            continue
        name = key[len(PREFIX):].lower()
        target = s if name in USER_TOGGLES else s.experiments if name in EXPERIMENT_TOGGLES \
            else None
        if target is not None:
            try:
                _Toggles._assign(target, name, raw)
            except ValueError as e:  # name the variable the user set, not the attribute
                raise SettingsError(f"environment variable {key}={raw!r}: {e}") from None
        else:
            warnings.warn(f"unknown environment variable {key} (ignored); the lab reads: "
                          + ", ".join(environment_names()), UnknownVariableWarning, stacklevel=2)
    return s


#: the lab's command lines: ``python -m`` of a module of these packages, and the workbook's
#: console script. Python imports a package before it runs the package's ``__main__``, so these
#: import this module before any code of their own runs and cannot catch a bad variable themselves
COMMAND_PACKAGES = ("rmsnorm_lab", "rmsnorm_workbook")
COMMAND_SCRIPTS = ("rmsnorm-lab",)


def _started_as() -> str:
    """What this interpreter was started to run: the module of ``python -m MODULE``, the file
    name of a script, ``-c``, or "" (interactive)."""
    args = list(getattr(sys, "orig_argv", sys.argv))[1:]
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "-m":
            return args[i + 1] if i + 1 < len(args) else ""
        if arg.startswith("-m"):
            return arg[2:]
        if arg in ("-c", "-") or not arg.startswith("-"):
            return arg if arg.startswith("-") else os.path.basename(arg)
        i += 2 if arg in ("-X", "-W") else 1
    return ""


def is_lab_command_line() -> bool:
    """Whether this process is one of the lab's command lines (``COMMAND_PACKAGES``,
    ``COMMAND_SCRIPTS``), not a program that uses the library."""
    run = _started_as()
    return run.split(".")[0] in COMMAND_PACKAGES or run in COMMAND_SCRIPTS


def _from_environ_at_import() -> Settings:
    """``from_environ(os.environ)``. A bad value raises ``SettingsError`` in a program that
    imports the library; in the lab's own command lines it is one line on stderr and exit
    status 2 (what their other usage errors do), not a traceback through the import machinery."""
    try:
        return from_environ(os.environ)
    except SettingsError as e:
        if not is_lab_command_line():
            raise
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


settings = _from_environ_at_import()
_LIVE += [settings, settings.experiments]
_SNAPSHOT.append(_take_snapshot())
