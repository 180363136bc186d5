"""Every measured implementation, named once: a row label of the results (the ``impl`` column).

The lab's own (``cute.<variant>``, ``triton.<variant>``), the peers measured beside them and the
copy ceilings. Each has one legend colour, line style and marker, so a series looks the same in
every figure. The palette is Okabe and Ito's, which stays distinct under the common colour-vision
deficiencies; the line style and marker carry the family where colours repeat.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Dict, Tuple


@dataclasses.dataclass(frozen=True)
class Impl:
    """How one implementation is drawn and what it is."""
    name: str
    kind: str         # lab | peer | ceiling
    colour: str
    linestyle: str = "-"
    marker: str = "o"
    label: str = ""   # legend text, when it differs from the name
    about: str = ""   # what it is, for the report's list of names

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
    Impl("cute.auto", "lab", _BLUE, "-", "o", "cute.auto (the default)",
         "the library's call: the kernels its plans pick for the shape, PDL on"),
    Impl("cute.auto-pdl", "lab", _BLUE, ":", "o", "cute.auto without PDL",
         "cute.auto with programmatic dependent launch taken away"),
    Impl("cute.row", "lab", _SKY, "-", "s", about="forward: one CTA a row, the row in registers"),
    Impl("cute.persistent", "lab", _PURPLE, "-", "^",
         about="forward: the row tile on a grid sized from the SM count, looping over rows"),
    Impl("cute.warp", "lab", _GREEN, "-", "v",
         about="forward: one warp a row, several rows a CTA, reduced by shuffles alone"),
    Impl("cute.cluster", "lab", _BLACK, "-", "8",
         about="a row too wide for one CTA over a thread-block cluster's CTAs"),
    Impl("cute.staged", "lab", _ORANGE, "-", "D",
         about="rows ringed through shared memory by cp.async, a persistent grid"),
    Impl("cute.fused", "lab", _SKY, "-", "s",
         about="backward: one kernel writes dX and dW's partial rows, a second sums them"),
    Impl("cute.split", "lab", _PURPLE, "-", "^",
         about="backward: dX and dW's partial rows by kernels of their own, a third sums them"),
    Impl("triton.row", "lab", _GREEN, "-.", "D",
         about="the lab's Triton forward, one program a row (in host tables of `full`, the "
               "Triton backend's whole call, its backward too)"),
    Impl("triton.split", "lab", _GREEN, "-.", "D",
         about="the lab's Triton backward: dX and dW's partial rows, a program an SM"),
    # peers: dashed lines, open markers
    Impl("liger.triton", "peer", _ORANGE, "--", "P", about="Liger-Kernel's Triton RMSNorm"),
    Impl("liger.cutedsl", "peer", _VERMILLION, "--", "X",
         about="Liger-Kernel's CuTe DSL RMSNorm"),
    Impl("quack", "peer", _YELLOW, "--", "*", about="quack's CuTe DSL RMSNorm"),
    Impl("flashinfer", "peer", _BROWN, "--", "p",
         about="FlashInfer's CUDA RMSNorm (forward only)"),
    Impl("torch.compile", "peer", _BLACK, "--", "d",
         about="Inductor's kernel for the reference's arithmetic, compiled per shape"),
    Impl("torch.native", "peer", _GREY, "--", "h", about="torch.nn.functional.rms_norm, eager"),
    # ceilings: thin dotted, no marker
    Impl("copy", "ceiling", _BLACK, ":", "", "copy ceiling (read 1, write 1)",
         "the forward's ceiling: read a 1 GiB tensor, write one (torch.neg)"),
    Impl("copy2r1w", "ceiling", _BLACK, ":", "", "copy ceiling (read 2, write 1)",
         "the backward's ceiling: read two 1 GiB tensors, write one (torch.add)"),
    Impl("copy.shape", "ceiling", _GREY, ":", "x", "copy of the same shape",
         "copy at the op's own shape, timed in the same run"),
    Impl("copy2r1w.shape", "ceiling", _GREY, ":", "x", "copy of the same shape (2 reads)",
         "copy2r1w at the op's own shape"),
    Impl("copy2r2w.shape", "ceiling", _GREY, ":", "x", "copy of the same shape (2 in, 2 out)",
         "the fused add's copy: read two tensors, write two, at the op's shape"),
    Impl("copy3r1w.shape", "ceiling", _GREY, ":", "x", "copy of the same shape (3 reads)",
         "the fused add's backward copy: read three tensors, write one"),
    Impl("copy.narrow.shape", "ceiling", _GREY, ":", "x", "copy of the same bytes (2 in, 1 out)",
         "the fp8 ops' ceiling: read 2 bytes an element, write 1, no arithmetic"),
    Impl("copy.fp8.shape", "ceiling", _GREY, "-.", "x",
         "torch's cast into fp8, the same bytes (not a ceiling)",
         "torch's converting copy into fp8: the fp8 ops' bytes, a point of comparison"),
)
_IMPL_BY_NAME = {i.name: i for i in IMPLS}

#: the parts of a compound name (``cute.auto@cached+autograd``, ``cute.auto+fp8.unfused``): as
#: the report lists it, the pattern that finds it in a name, what it adds
NAME_PARTS: Tuple[Tuple[str, str, str], ...] = (
    ("@tvm_ffi", r"@tvm_ffi", "the library's call (the default): the kernel compiled for "
     "TVM-FFI takes torch's tensors as they are"),
    ("@compiled", r"@compiled", "a kernel compiled once, its tensors marshalled every call"),
    ("@cached", r"@cached(?!:)", "as @compiled, each tensor's handle kept in a bounded FIFO"),
    ("@cached:<cap>", r"@cached:", "the handle FIFO capped at <cap> (unbounded: no cap)"),
    ("@jit", r"@jit", "the cute.jit function called, its compilation looked up every call"),
    ("+python_node", r"\+python_node", "launched, and its autograd node kept, in Python "
     "rather than by the library's C++ extension"),
    ("+nvtx", r"\+nvtx", "with NVTX ranges on"),
    ("+settings_per_call", r"\+settings_per_call", "the settings read before every call"),
    ("+varying_m", r"\+varying_m", "every call another row count"),
    ("+autograd", r"\+autograd", "inputs that require grad: the autograd graph built"),
    ("+add", r"\+add", "the residual add fused: h = x + residual, normalized"),
    ("+fp8", r"\+fp8(?!\.static)", "y quantized to fp8 (e4m3), a scale a row"),
    ("+fp8.static", r"\+fp8\.static", "y quantized to fp8 (e4m3) with one static scale"),
    (".unfused", r"\.unfused(?!\.)", "the bf16 norm, then the quantization in eager ops"),
    (".unfused.inductor", r"\.unfused\.inductor", "the bf16 norm, then an Inductor kernel"),
    ("+scaled_mm", r"\+scaled_mm", "then torch._scaled_mm with row-wise scales"),
    ("+bf16+mm", r"\+bf16\+mm", "the bf16 norm, then a bf16 GEMM"),
    ("cute.qk", r"^cute\.qk\+", "the lab's q/k norms and RoPE as one op (qk_norm_rope), CuTe"),
    ("triton.qk", r"^triton\.qk\+", "the same op on the lab's Triton kernels"),
    ("+rope", r"\+rope", "the workload: q/k norms, then the rotary embedding (attention's "
     "prologue)"),
    ("+rope.eager", r"\+rope\.eager", "the rotary embedding as transformers' eager ops"),
    ("torch.eager", r"^torch\.eager", "transformers' Qwen3RMSNorm arithmetic in eager ops"),
    ("liger.rope", r"^liger\.rope", "the lab's norms, then Liger-Kernel's Triton RoPE: a peer "
     "in its RoPE alone"),
)
#: prefixes of the lab's own implementation names
LAB_PREFIXES: Tuple[str, ...] = ("cute.", "triton.")
CEILINGS: Tuple[str, ...] = tuple(i.name for i in IMPLS if i.kind == "ceiling")


def impl(name: str) -> Impl:
    """The implementation named ``name``; one not listed (a new peer, a probe's label) is drawn
    in grey with its family's line style."""
    found = _IMPL_BY_NAME.get(name)
    if found is not None:
        return found
    base = name.split("@")[0].split("+add")[0].split("+fp8")[0]
    if base in _IMPL_BY_NAME:  # ``cute.auto@cached``, ``cute.auto+add``, ``cute.auto+fp8``: a
        # launch path, the fused residual add, the fp8 output
        return dataclasses.replace(_IMPL_BY_NAME[base], name=name, label="")
    lab = name.startswith(LAB_PREFIXES)
    return Impl(name, "lab" if lab else "peer", _GREY, "-" if lab else "--", ".")


def impl_order(names) -> list:
    """``names`` in the registry's order (lab, then peers, then ceilings), unknown ones last."""
    rank = {i.name: k for k, i in enumerate(IMPLS)}
    return sorted(dict.fromkeys(names), key=lambda n: (rank.get(n, len(rank)), n))


def glossary(names) -> list:
    """``(name, what it is)`` for the implementations and name parts that ``names`` use, in the
    registry's order: each listed implementation that is a name or a name's base, then each part
    of ``NAME_PARTS`` found in a name."""
    names = set(names)
    bases = names | {re.split(r"[@+]", n)[0] for n in names}
    rows = [(i.name, i.about) for i in IMPLS if i.about and i.name in bases]
    return rows + [(shown, about) for shown, pattern, about in NAME_PARTS
                   if any(re.search(pattern, n) for n in names)]
