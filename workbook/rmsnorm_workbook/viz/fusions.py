"""The fused ops against their fastest peer, shape by shape: the report's figure of its fusion
tables (``analysis.tables.fusion_table``), one panel an op, a bar a shape."""

from __future__ import annotations

from typing import Dict, List

import pandas as pd
from matplotlib.patches import Patch

from . import sweeps as _sweeps  # noqa: F401 (selects a headless backend where needed)
from .gpus import BLUE, GREY, VERMILLION
from .recorded import fmt_shape
from ..results.provenance import gpu_title

RATIO = "lab / best peer"
LEVEL = 0.005  # a ratio this close to 1 is drawn as level: it prints as 1.00
XMAX = 1.6  # the panels' range at most: past it a bar is cut, its value written


def colour(ratio: float) -> str:
    return GREY if abs(ratio - 1) < LEVEL else BLUE if ratio < 1 else VERMILLION


def plot_fusions_vs_peer(fusions: Dict[str, pd.DataFrame], gpu: str, fig) -> List:
    """One panel per fused op with a ``lab / best peer`` column: the lab's fused kernel's time
    over the fastest other implementation's at each shape, the bar blue where the lab is faster,
    vermillion where it is slower, grey where the two are within ``LEVEL`` (a key below the
    panels); its value written in a column right of the panel; each panel titled with its run
    and the peers it counts. Returns the axes."""
    names = [n for n, t in fusions.items() if RATIO in t.columns and t[RATIO].notna().any()]
    axes = fig.subplots(1, len(names), squeeze=False)[0] if names else []
    # one range for every panel, up to XMAX: a bar past it is cut there and its value says so
    top = min(XMAX, max(1.2, 1.1 * max(float(fusions[n][RATIO].max()) for n in names))) \
        if names else XMAX
    for ax, name in zip(axes, names):
        r = fusions[name][RATIO].dropna()
        ys = range(len(r))
        ax.barh(ys, r.clip(upper=top).values, color=[colour(v) for v in r.values])
        ax.set_yticks(list(ys), [fmt_shape(M, N) for M, N in r.index], fontsize=8)
        ax.invert_yaxis()  # the table's order, top down
        ax.axvline(1.0, color="black", linewidth=0.8, zorder=1)
        # the values in a column right of the panel: clear of the bars and of the line at 1
        where = ax.get_yaxis_transform()
        for y, v in zip(ys, r.values):
            ax.text(1.02, y, f"{v:.2f}" + (" ›" if v > top else ""), transform=where,
                    va="center", ha="left", fontsize=7)
        ax.set_xlim(0, top)
        run = fusions[name].attrs.get("run")  # which code was measured, and when
        peers = sorted({p.split("+")[0] for p in fusions[name].attrs.get("peers", [])})
        title = f"{name}\n{run[0][:7]}, {run[1]}" if run else name
        ax.set_title(title + (f"\nagainst {', '.join(peers)}" if peers else ""), fontsize=9)
        ax.set_xlabel("time / fastest peer's", fontsize=8)
    if names:
        key = [Patch(color=c, label=t) for c, t in ((BLUE, "the lab faster"), (GREY, (
            f"within {LEVEL:.1%}")), (VERMILLION, "a peer faster"))]
        fig.legend(handles=key, loc="outside lower center", ncols=3, fontsize=8, frameon=False)
        fig.suptitle(f"{gpu_title(gpu)}: each fused op's time over its fastest peer's "
                     "(below 1: the lab is faster)", fontsize=10)
    return list(axes)
