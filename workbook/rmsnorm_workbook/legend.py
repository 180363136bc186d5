"""Every measured implementation, named once: a row label of the results (the ``impl`` column).

The lab's own (``cute.<variant>``, ``triton.<variant>``), the peers measured beside them and the
copy ceilings. Each has one legend colour, line style and marker, so a series looks the same in
every figure. The palette is Okabe and Ito's, which stays distinct under the common colour-vision
deficiencies; the line style and marker carry the family where colours repeat.
"""

from __future__ import annotations

import dataclasses
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
    Impl("copy.narrow.shape", "ceiling", _GREY, ":", "x", "copy of the same bytes (2 in, 1 out)"),
    Impl("copy.fp8.shape", "ceiling", _GREY, "-.", "x",
         "torch's cast into fp8, the same bytes (not a ceiling)"),
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
