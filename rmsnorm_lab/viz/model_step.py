"""Figures of notebook 05: each norm's model step against torch's norm in the same model, and one
decode step's kernels on a timeline with the norms picked out. Each function takes an ``ax`` (a
new figure when omitted) and returns it."""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np
import pandas as pd

from . import sweeps as _sweeps  # noqa: F401 (selects a headless backend where needed)
from .gpus import BLUE, GREEN, GREY, ORANGE, PURPLE, VERMILLION, _axes

NORM_COLORS = {"lab": BLUE, "lab+carry": GREEN, "liger": ORANGE, "shipped": PURPLE,
               "torch": GREY}


def plot_vs_torch(ratios: pd.DataFrame, arch: str, columns: Sequence[str],
                  norms: Sequence[str] = ("shipped", "lab", "lab+carry", "liger"), ax=None,
                  xlim: Optional[tuple] = None):
    """Horizontal bars: each norm's time over torch's norm's in the same model, per workload
    column, centred on 1 (left of the line: faster than torch's), each bar labelled with its
    ratio. ``xlim``: the same range for panels that are compared."""
    ax = _axes(ax, (7.0, 0.55 * len(columns) * 1.6 + 1.0))
    rows = ratios.loc[arch]
    norms = [n for n in norms if n in rows.index]
    height = 0.8 / max(len(norms), 1)
    y = np.arange(len(columns))
    for i, norm in enumerate(norms):
        vals = rows.loc[norm, list(columns)].to_numpy(dtype=float)
        ys = y + (i - (len(norms) - 1) / 2) * height
        ax.barh(ys, vals - 1.0, height=height, left=1.0, color=NORM_COLORS.get(norm, GREY),
                label=norm)
        for yy, v in zip(ys, vals):
            if np.isfinite(v):
                ax.annotate(f"{v:.3f}", (v, yy), xytext=(3 if v >= 1 else -3, 0),
                            textcoords="offset points", va="center", fontsize=7,
                            ha="left" if v >= 1 else "right")
    ax.axvline(1.0, color="black", lw=1)
    if xlim is not None:
        ax.set_xlim(*xlim)
    ax.set_yticks(y, columns)
    ax.invert_yaxis()
    ax.set_xlabel("time / time with torch.nn.RMSNorm (same model, same run)")
    ax.set_title(f"{arch}: each norm against torch's")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    return ax


def plot_decode_timeline(kernels: Dict[str, pd.DataFrame], step: int = 1, ax=None,
                         packed: bool = False, norm_color: str = VERMILLION):
    """One decode step per row (``kernels``: name -> ``profiling.model_share.step_kernels``'s
    frame): every kernel a bar at its start and length on the GPU, the norm kernels in colour.
    Time runs from the step's first kernel. ``packed``: the kernels end to end, the GPU's idle
    gaps taken out (what the step's kernels alone take, as a graph replay approaches)."""
    ax = _axes(ax, (11.0, 0.9 * len(kernels) + 1.2))
    for row, (name, k) in enumerate(kernels.items()):
        k = k[k["step"] == step].sort_values("start_us")
        length = k["end_us"] - k["start_us"]
        start = (length.cumsum() - length) if packed else k["start_us"] - k["start_us"].min()
        for norm, color in ((False, GREY), (True, norm_color)):
            sel = k["norm"].astype(bool) == norm
            ax.broken_barh(list(zip(start[sel], length[sel])), (row - 0.35, 0.7),
                           facecolors=color, linewidth=0)
        # a norm kernel is far narrower than a pixel at this scale: a line marks each one
        norms = k["norm"].astype(bool)
        ax.vlines(start[norms] + length[norms] / 2, row - 0.45, row + 0.45, colors=norm_color,
                  linewidth=1.0)
    ax.set_yticks(range(len(kernels)), list(kernels))
    ax.invert_yaxis()
    ax.set_xlabel("µs of kernel time, end to end" if packed
                  else "µs from the step's first kernel (GPU time)")
    import matplotlib.patches as mpatches
    ax.legend(handles=[mpatches.Patch(color=norm_color, label="RMSNorm kernels"),
                       mpatches.Patch(color=GREY, label="every other kernel")],
              loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=2, frameon=False)
    return ax
