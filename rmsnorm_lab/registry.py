"""Every kernel variant and every measured implementation, named once.

A **variant** is a kernel the library can launch: the forward's ``row``, ``persistent``, ``warp``
and ``fallback``, the backward's ``fused`` and ``split`` (and the ``dw_reduce`` that finishes dW).
The settings take their choices from here, the plans refuse names not listed here, the NVTX ranges
and the native node take their names and colours from here, and the benchmark and the sanitizer
walk these lists. Adding a variant is its kernel, its plan rule and one line below.

An **implementation** is a row label of the results (the ``impl`` column): the lab's own
(``cute.<variant>``, ``triton.<variant>``), the peers measured beside them and the copy ceilings.
Each has one legend colour, line style and marker, so a series looks the same in every figure.
The palette is Okabe and Ito's, which stays distinct under the common colour-vision deficiencies;
the line style and marker carry the family where colours repeat.

This module imports nothing of the lab: every layer may read it.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable, Dict, Optional, Tuple


@dataclasses.dataclass(frozen=True)
class Variant:
    """A kernel the library launches."""
    name: str         # the settings' value and the NVTX name: ``launch row 128x4096``
    op: str           # fwd | bwd | reduce
    backend: str      # the package whose kernel it is: cute | triton
    nvtx_argb: int    # colour of its NVTX ranges in Nsight Systems
    #: its eligibility rule, ``module:function``, which raises NotEligible saying why a shape is
    #: refused; empty where the kernel serves every row
    plan: str = ""
    #: measured in the sweeps (not: the fallback, a safety net, and a kernel whose GPU tests
    #: have not run yet)
    benchmarked: bool = True

    def planner(self) -> Optional[Callable]:
        """The plan function (imported on demand: it lives in a backend package), or None."""
        if not self.plan:
            return None
        module, function = self.plan.split(":")
        return getattr(importlib.import_module(module), function)


VARIANTS: Tuple[Variant, ...] = (
    Variant("row", "fwd", "cute", 0xFF0072B2, "rmsnorm_lab.cute.plan:plan_forward"),
    Variant("persistent", "fwd", "cute", 0xFFCC79A7, "rmsnorm_lab.cute.plan:plan_forward"),
    Variant("warp", "fwd", "cute", 0xFF009E73, "rmsnorm_lab.cute.plan:plan_forward"),
    Variant("cluster", "fwd", "cute", 0xFF56B4E9, "rmsnorm_lab.cute.plan:plan_forward"),
    Variant("staged", "fwd", "cute", 0xFF332288, "rmsnorm_lab.cute.plan:plan_forward"),
    Variant("fallback", "fwd", "cute", 0xFFD55E00, "rmsnorm_lab.cute.plan:plan_forward",
            benchmarked=False),
    Variant("fused", "bwd", "cute", 0xFFE69F00, "rmsnorm_lab.cute.backward_plan:plan_backward"),
    Variant("split", "bwd", "cute", 0xFFF0E442, "rmsnorm_lab.cute.backward_plan:plan_split"),
    Variant("cluster", "bwd", "cute", 0xFF000000,
            "rmsnorm_lab.cute.backward_plan:plan_cluster_backward"),
    Variant("staged", "bwd", "cute", 0xFF882255,
            "rmsnorm_lab.cute.backward_plan:plan_staged_backward"),
    Variant("dw_reduce", "reduce", "cute", 0xFF999999),
    Variant("row", "fwd", "triton", 0xFF56B4E9),
    Variant("split", "bwd", "triton", 0xFF56B4E9),
)

#: what the settings and the plans accept: ``auto`` and the CuTe variants of each op
FORWARD_VARIANTS: Tuple[str, ...] = tuple(
    v.name for v in VARIANTS if v.backend == "cute" and v.op == "fwd")
BACKWARD_MODES: Tuple[str, ...] = tuple(
    v.name for v in VARIANTS if v.backend == "cute" and v.op == "bwd")
BACKENDS: Tuple[str, ...] = ("cute", "triton", "torch")


def variant(name: str, backend: str = "cute") -> Variant:
    for v in VARIANTS:
        if v.name == name and v.backend == backend:
            return v
    raise KeyError(f"no {backend} variant named {name!r}")


def nvtx_argb(name: str) -> int:
    """The NVTX colour of a range named after a variant (``triton`` for the Triton kernels);
    white for anything else."""
    for v in VARIANTS:
        if v.name == name or (name == v.backend == "triton"):
            return v.nvtx_argb
    return 0xFFFFFFFF


@dataclasses.dataclass(frozen=True)
class Impl:
    """How one implementation is drawn and what it is."""
    name: str
    kind: str         # lab | peer | ceiling
    colour: str
    linestyle: str = "-"
    marker: str = "o"
    label: str = ""   # legend text, when it differs from the name

    @property
    def style(self) -> Dict[str, str]:
        """matplotlib keyword arguments for a line of this implementation."""
        return dict(color=self.colour, linestyle=self.linestyle, marker=self.marker,
                    label=self.label or self.name)


# Okabe-Ito: blue, vermillion, bluish green, reddish purple, orange, sky blue, yellow, black
_BLUE, _VERMILLION, _GREEN, _PURPLE = "#0072B2", "#D55E00", "#009E73", "#CC79A7"
_ORANGE, _SKY, _YELLOW, _BLACK, _GREY = "#E69F00", "#56B4E9", "#F0E442", "#000000", "#999999"
_BROWN = "#8C564B"  # beyond Okabe-Ito's eight: the one more peer

IMPLS: Tuple[Impl, ...] = (
    # the lab: solid lines, filled markers
    Impl("cute.auto", "lab", _BLUE, "-", "o", "cute.auto (the default)"),
    Impl("cute.auto-pdl", "lab", _BLUE, ":", "o", "cute.auto without PDL"),
    Impl("cute.row", "lab", _SKY, "-", "s"),
    Impl("cute.persistent", "lab", _PURPLE, "-", "^"),
    Impl("cute.warp", "lab", _GREEN, "-", "v"),
    Impl("cute.cluster", "lab", _BLACK, "-", "8"),
    Impl("cute.staged", "lab", _ORANGE, "-", "D"),
    Impl("cute.fused", "lab", _SKY, "-", "s"),
    Impl("cute.split", "lab", _PURPLE, "-", "^"),
    Impl("triton.row", "lab", _GREEN, "-.", "D"),
    Impl("triton.split", "lab", _GREEN, "-.", "D"),
    # peers: dashed lines, open markers
    Impl("liger.triton", "peer", _ORANGE, "--", "P"),
    Impl("liger.cutedsl", "peer", _VERMILLION, "--", "X"),
    Impl("quack", "peer", _YELLOW, "--", "*"),
    Impl("flashinfer", "peer", _BROWN, "--", "p"),
    Impl("torch.compile", "peer", _BLACK, "--", "d"),
    Impl("torch.native", "peer", _GREY, "--", "h"),
    # ceilings: thin dotted, no marker
    Impl("copy", "ceiling", _BLACK, ":", "", "copy ceiling (read 1, write 1)"),
    Impl("copy2r1w", "ceiling", _BLACK, ":", "", "copy ceiling (read 2, write 1)"),
    Impl("copy.shape", "ceiling", _GREY, ":", "x", "copy of the same shape"),
    Impl("copy2r1w.shape", "ceiling", _GREY, ":", "x", "copy of the same shape (2 reads)"),
    Impl("copy2r2w.shape", "ceiling", _GREY, ":", "x", "copy of the same shape (2 in, 2 out)"),
    Impl("copy3r1w.shape", "ceiling", _GREY, ":", "x", "copy of the same shape (3 reads)"),
)
_IMPL_BY_NAME = {i.name: i for i in IMPLS}
#: prefixes of the lab's own implementation names
LAB_PREFIXES: Tuple[str, ...] = ("cute.", "triton.")
CEILINGS: Tuple[str, ...] = tuple(i.name for i in IMPLS if i.kind == "ceiling")


def impl(name: str) -> Impl:
    """The implementation named ``name``; one not listed (a new peer, a probe's label) is drawn
    in grey with its family's line style."""
    found = _IMPL_BY_NAME.get(name)
    if found is not None:
        return found
    base = name.split("@")[0].split("+add")[0]
    if base in _IMPL_BY_NAME:  # ``cute.auto@cached``, ``cute.auto+add``: a launch path, the
        # fused residual add
        return dataclasses.replace(_IMPL_BY_NAME[base], name=name, label="")
    lab = name.startswith(LAB_PREFIXES)
    return Impl(name, "lab" if lab else "peer", _GREY, "-" if lab else "--", ".")


def impl_order(names) -> list:
    """``names`` in the registry's order (lab, then peers, then ceilings), unknown ones last."""
    rank = {i.name: k for k, i in enumerate(IMPLS)}
    return sorted(dict.fromkeys(names), key=lambda n: (rank.get(n, len(rank)), n))
