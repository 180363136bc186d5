"""The fused ops against their fastest peer, shape by shape: the report's figure of its fusion
tables (``analysis.tables.fusion_table``), one panel an op, a bar a shape."""

from __future__ import annotations

from typing import Dict, List

import pandas as pd

from . import sweeps as _sweeps  # noqa: F401 (selects a headless backend where needed)
from .gpus import BLUE, GREY, VERMILLION
from .recorded import fmt_shape
from ..results.provenance import gpu_title

RATIO = "lab / best peer"
LEVEL = 0.005  # a ratio this close to 1 is drawn as level: it prints as 1.00


def colour(ratio: float) -> str:
    return GREY if abs(ratio - 1) < LEVEL else BLUE if ratio < 1 else VERMILLION


def plot_fusions_vs_peer(fusions: Dict[str, pd.DataFrame], gpu: str, fig) -> List:
    """One panel per fused op with a ``lab / best peer`` column: the lab's fused kernel's time
    over the fastest other implementation's at each shape, the bar blue where the lab is faster,
    vermillion where it is slower, grey where the two are within ``LEVEL``; its value written
    beside it. Returns the axes."""
    names = [n for n, t in fusions.items() if RATIO in t.columns and t[RATIO].notna().any()]
    axes = fig.subplots(1, len(names), squeeze=False)[0] if names else []
    for ax, name in zip(axes, names):
        r = fusions[name][RATIO].dropna()
        ys = range(len(r))
        ax.barh(ys, r.values, color=[colour(v) for v in r.values])
        ax.set_yticks(list(ys), [fmt_shape(M, N) for M, N in r.index], fontsize=8)
        ax.invert_yaxis()  # the table's order, top down
        ax.axvline(1.0, color="black", linewidth=0.8)
        for y, v in zip(ys, r.values):
            ax.text(v, y, f" {v:.2f}", va="center", fontsize=7)
        ax.set_xlim(0, max(1.2, 1.25 * float(r.max())))
        run = fusions[name].attrs.get("run")  # which code was measured, and when
        ax.set_title(f"{name}\n{run[0][:7]}, {run[1]}" if run else name, fontsize=9)
        ax.set_xlabel("time / fastest peer's", fontsize=8)
    if names:
        fig.suptitle(f"{gpu_title(gpu)}: each fused op's time over its fastest peer's "
                     "(below 1: the lab is faster)", fontsize=10)
    return list(axes)
