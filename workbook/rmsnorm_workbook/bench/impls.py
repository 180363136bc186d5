"""The lab's implementations as the benchmarks call them: ``fn(x, w) -> y``, one per kernel
variant the registry lists, pinned with ``settings.override`` for the duration of a call."""

from __future__ import annotations

from typing import Callable, Dict

import torch

from rmsnorm_lab import rms_norm, settings
from rmsnorm_lab.lab import VARIANTS, native_node, routed_to_native

#: the configuration every lab implementation is measured in: eps and Llama's rounding (the
#: peers' too: bench/peers.py), named here rather than left to rms_norm's defaults (torch's)
EPS = 1e-6
MODE = "llama"


def lab_impls(op: str) -> Dict[str, Callable]:
    """The lab's implementations of ``op``, named as in the results.

    ``fwd``: ``cute.<variant>`` for every benchmarked forward variant, ``cute.auto``,
    ``cute.auto-pdl`` (auto with ``settings.pdl`` off, to show what programmatic dependent launch
    buys in the same run) and ``triton.row``. ``bwd`` and ``full``: the differentiable
    ``rms_norm`` (the benchmark takes the gradient) with each backward pinned (``cute.fused``,
    ``cute.split``, ``cute.auto``), ``cute.auto-pdl`` and ``triton.split``. ``fwd-add`` and
    ``bwd-add``: ``fn(x, r, w) -> (y, h)``, ``cute.auto+add`` and ``triton.row+add``, and for
    ``bwd-add`` each benchmarked backward mode pinned (``cute.fused+add``...). ``fwd-fp8`` and
    ``fwd-fp8-static``: the fp8 output's kernels and unfused chain (bench/fp8.py)."""
    if op == "fwd":
        def cute_variant(variant: str, **toggles) -> Callable:
            if variant == settings.forward_variant and not toggles:  # as a user calls it
                return lambda x, w: rms_norm(x, w, EPS, casting_mode=MODE, backend="cute")

            def run(x, w):  # the override's own cost is in eager and host times
                with settings.override(forward_variant=variant, **toggles):
                    return rms_norm(x, w, EPS, casting_mode=MODE, backend="cute")
            return run

        names = [v.name for v in VARIANTS
                 if v.backend == "cute" and v.op == "fwd" and v.benchmarked] + ["auto"]
        impls = {f"cute.{v}": cute_variant(v) for v in names}
        impls["cute.auto-pdl"] = cute_variant("auto", pdl=False)
        impls["triton.row"] = lambda x, w: rms_norm(x, w, EPS, casting_mode=MODE,
                                                     backend="triton")
        return impls
    if op in ("bwd", "full"):
        names = [v.name for v in VARIANTS
                 if v.backend == "cute" and v.op == "bwd" and v.benchmarked] + ["auto"]
        impls = {f"cute.{mode}": pinned_backward(mode) for mode in names}
        impls["cute.auto-pdl"] = pinned_backward("auto", pdl=False)
        impls["triton.split"] = lambda x, w: rms_norm(x, w, EPS, casting_mode=MODE,
                                                       backend="triton")
        return impls
    if op in ("fwd-add", "bwd-add"):  # the fused residual add: fn(x, r, w) -> (y, h)
        impls = {f"{impl}+add": (lambda backend: lambda x, r, w: rms_norm(
                     x, w, EPS, residual=r, casting_mode=MODE, backend=backend))(backend)
                 for impl, backend in (("cute.auto", "cute"), ("triton.row", "triton"))}
        if op == "bwd-add":  # each backward mode beside auto's choice
            impls.update({f"cute.{v.name}+add": pinned_add_backward(v.name) for v in VARIANTS
                          if v.backend == "cute" and v.op == "bwd" and v.benchmarked})
        return impls
    if op in ("fwd-fp8", "fwd-fp8-static"):  # the fp8 output: fn(x, w[, scale])
        from .fp8 import lab_impls as fp8_impls
        return fp8_impls(static=op == "fwd-fp8-static")
    if op in ("fwd-qk-rope", "bwd-qk-rope"):  # q/k norms + RoPE: fn(q, k, wq, wk, cos, sin)
        from .qk_rope import lab_impls as qk_impls
        return qk_impls()
    raise ValueError(f"no lab implementations for op {op!r}; ops: fwd, bwd, full, fwd-add, "
                     "bwd-add, fwd-fp8, fwd-fp8-static, fwd-qk-rope, bwd-qk-rope")


def pinned_backward(mode: str, backend: str = "cute", **toggles) -> Callable:
    """``fn(x, w) -> y``: ``rms_norm(x, w, backend=backend)`` whose backward runs with
    ``settings.backward == mode``, on the tape node the library itself would use. The call is
    made under ``settings.override``, and either node keeps the settings of its forward for its
    backward. ``toggles`` (other settings, e.g. ``pdl=False``) hold for the forward and the
    backward alike."""
    def run(x, w, eps: float = EPS):
        with settings.override(backward=mode, **toggles):
            return rms_norm(x, w, eps, casting_mode=MODE, backend=backend)
    return run


def pinned_add_backward(mode: str) -> Callable:
    """``fn(x, r, w) -> (y, h)``: the fused add whose backward runs with ``settings.backward ==
    mode``. The native node fixes its backward at the forward, so the forward runs under the
    override; without the native node the pin would not hold, and the call says so (the
    benchmark then skips it, as a shape a mode cannot take)."""
    def run(x, r, w):
        if not (routed_to_native("cute") and native_node() is not None):
            raise ValueError(f"cute.{mode}+add is pinned on the native autograd node, which "
                             "is not built here")
        with settings.override(backward=mode):
            return rms_norm(x, w, EPS, residual=r, casting_mode=MODE, backend="cute")
    return run
