"""Figures of notebook 05: each norm's model step against torch's norm in the same model. Each
function takes an ``ax`` (a new figure when omitted) and returns it."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pandas as pd

from . import sweeps as _sweeps  # noqa: F401 (selects a headless backend where needed)
from .gpus import BLUE, GREEN, GREY, ORANGE, PURPLE, VERMILLION, _axes
from ..results.provenance import gpu_title

NORM_COLORS = {"lab": BLUE, "lab+carry": GREEN, "lab+qk": VERMILLION, "liger": ORANGE,
               "shipped": PURPLE, "torch": GREY}
#: the choices the figures draw (each where the run has it), in their order
NORMS = ("shipped", "lab", "lab+carry", "lab+qk", "liger")
#: each choice as the legend names it
NORM_LABELS = {"shipped": "shipped (transformers' own)", "lab": "lab (rmsnorm_lab.patch)",
               "lab+carry": "lab + residual add fused", "lab+qk": "lab + q/k norms, RoPE as one op",
               "liger": "Liger-Kernel"}


def plot_vs_torch(ratios: pd.DataFrame, arch: str, columns: Sequence[str],
                  norms: Sequence[str] = NORMS, ax=None,
                  xlim: Optional[tuple] = None, gpu: Optional[str] = None,
                  spread: Optional[tuple] = None):
    """Horizontal bars: each norm's time over torch's norm's in the same model, per workload
    column, centred on 1 (left of the line: faster than torch's), each bar labelled with its
    ratio; a bar too short to see gets a diamond at its tip, and a bar past the range ends at its
    edge with a chevron and its ratio written inside (the range is kept to the differences that
    matter). ``xlim``: the same range for panels that are compared (widened on the left by the
    same room for the labels in every panel);
    ``gpu``: the GPU the steps ran on, for the title; ``spread``: ``(lo, hi)`` ratio frames
    (``analysis.model_step.versus_spread``), drawn as whiskers at the bars' tips."""
    ax = _axes(ax, (7.0, 0.55 * len(columns) * 1.6 + 1.0))
    rows = ratios.loc[arch]
    norms = [n for n in norms if n in rows.index]
    height = 0.8 / max(len(norms), 1)
    y = np.arange(len(columns))
    drawn = rows.loc[norms, list(columns)].to_numpy(dtype=float)
    lo, hi = xlim if xlim is not None else _fit(drawn)
    floor = lo  # bars end here at the least; the labels' room lies left of it
    lo = _label_room(ax, lo, hi)
    drew = set()  # which marks were drawn, for the x label
    for i, norm in enumerate(norms):
        vals = rows.loc[norm, list(columns)].to_numpy(dtype=float)
        ys = y + (i - (len(norms) - 1) / 2) * height
        colour = NORM_COLORS.get(norm, GREY)
        shown = np.clip(vals, floor, hi)
        ax.barh(ys, shown - 1.0, height=height, left=1.0, color=colour,
                label=NORM_LABELS.get(norm, norm))
        for yy, v, s in zip(ys, vals, shown):
            if np.isfinite(v) and v != s:  # past the range: a chevron, the ratio inside
                drew.add("chevrons: past the range")
                ax.plot([s], [yy], ">" if v > s else "<", color="black", markersize=5)
                ax.annotate(f"{v:.3f}", (s, yy), xytext=(-8 if v > s else 8, 0),
                            textcoords="offset points", va="center", fontsize=7,
                            ha="right" if v > s else "left", color="white", fontweight="bold")
        vals = np.where(vals == shown, vals, np.nan)  # the rest labels bars inside the range
        short = np.isfinite(vals) & (np.abs(vals - 1.0) < 0.012 * (hi - lo))
        drew |= {"diamonds: too short to see"} if short.any() else set()
        ax.plot(vals[short], ys[short], "D", color=colour, markersize=5,
                markeredgecolor="black", markeredgewidth=0.5)
        low, high = vals, vals  # where the label goes: past the whisker, if one is drawn
        if spread is not None and (arch, norm) in spread[0].index:
            # a bar past the range has none (nan above): its label sits inside the bar
            raw_low = spread[0].loc[(arch, norm), list(columns)].to_numpy(float)
            raw_high = spread[1].loc[(arch, norm), list(columns)].to_numpy(float)
            low, high = np.clip(raw_low, floor, hi), np.clip(raw_high, floor, hi)
            ok = np.isfinite(vals) & np.isfinite(low) & np.isfinite(high)
            ax.errorbar(vals[ok], ys[ok], xerr=[(vals - low)[ok], (high - vals)[ok]],
                        fmt="none", ecolor="black", elinewidth=0.8, capsize=2)
            # a whisker cut at the range's edge: an open chevron where it leaves the axes
            for cut, edge, mark in ((ok & (raw_high > hi), hi, ">"),
                                    (ok & (raw_low < floor), floor, "<")):
                if cut.any():
                    drew.add("open chevron: a whisker past the range")
                    ax.plot(np.full(cut.sum(), edge), ys[cut], mark, color="black",
                            markersize=5, fillstyle="none")
            low, high = np.fmin(low, vals), np.fmax(high, vals)
        for yy, v, a, b in zip(ys, vals, low, high):
            if np.isfinite(v):
                _ratio_label(ax, v, yy, a, b, lo, hi)
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xlim(lo, hi)
    ax.set_yticks(y, columns)
    ax.invert_yaxis()
    marks = [m for m in ("diamonds: too short to see", "chevrons: past the range",
                         "open chevron: a whisker past the range") if m in drew]
    ax.set_xlabel("time / time with torch.nn.RMSNorm (same model, same run)\n"
                  + "; ".join(["bars from 1"] + (["whiskers: p20-p80 of both"]
                                                 if spread is not None else []))
                  + ("\n" + "; ".join(marks) if marks else ""))
    ax.set_title(f"{gpu_title(gpu) + ': ' if gpu else ''}{arch}, each norm's step time over "
                 "torch's norm's",
                 fontsize="medium")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    return ax


def _ratio_label(ax, v: float, y: float, low: float, high: float, lo: float, hi: float):
    """The ratio ``v`` written beside its bar and whisker (``low``..``high``): past the end away
    from 1, or, where the axes end before the label would, on the other side of the line at 1,
    clear of the bar and the whisker alike."""
    per_pt = (hi - lo) / max(ax.get_position().width * ax.figure.get_figwidth() * 72, 1.0)
    room = LABEL_PT * per_pt  # the label with its offset, in data units
    if v >= 1:  # beyond the whisker's end where the axes reach, else left of the line at 1
        right = high + room <= hi
        x = high if right else min(low, 1.0)
    else:  # before the whisker's start where the axes reach, else right of the line at 1
        right = low - room < lo - 1e-9 * (hi - lo)
        x = max(high, 1.0) if right else low
    ax.annotate(f"{v:.3f}", (x, y), xytext=(5 if right else -5, 0), textcoords="offset points",
                va="center", fontsize=7, ha="left" if right else "right")


def fitted_range(ratios: pd.DataFrame, columns: Sequence[str],
                 norms: Sequence[str] = NORMS,
                 spread: Optional[tuple] = None, room: float = 0.14) -> tuple:
    """One x range for compared panels of ``plot_vs_torch`` that holds every ratio of
    ``columns`` of the ``norms`` drawn and, with ``spread``, every whisker: nothing is drawn past
    it. ``room``: the share of the width kept right of the highest for its label (the left's
    is ``plot_vs_torch``'s)."""
    frames = [ratios] + ([*spread] if spread is not None else [])
    shown = np.concatenate([f[f.index.get_level_values(-1).isin(norms)][list(columns)]
                            .to_numpy(dtype=float).ravel() for f in frames] + [[1.0]])
    lo, hi = float(np.nanmin(shown)), float(np.nanmax(shown))
    lo -= 0.01 * (hi - lo)
    return lo, hi + room / (1 - room) * (hi - lo)


def plot_step_ratios(ratios: pd.DataFrame, archs: Sequence[str],
                     groups: Sequence[Sequence[str]], notes: Sequence[str] = (),
                     gpu: Optional[str] = None, spread: Optional[tuple] = None, fig=None):
    """``plot_vs_torch`` for each of ``archs`` (columns of panels) and each group of workload
    columns (rows of panels), every row on an x range of its own fitted to what it draws
    (``fitted_range``): a group whose ratios or whiskers reach far (eager decode, paced by the
    host) does not squeeze the others' differences into the line at 1, and no bar or whisker is
    cut. ``notes``: a title for each row after the first. Returns the axes, rows by columns."""
    if fig is None:
        import matplotlib.pyplot as plt
        fig = plt.figure(figsize=(13, 1.6 + 0.75 * sum(len(g) + 1 for g in groups)),
                         layout="constrained")
    axes = fig.subplots(len(groups), len(archs), squeeze=False,
                        height_ratios=[len(g) + 0.8 for g in groups])
    for row, cols in enumerate(groups):
        span = fitted_range(ratios, cols, spread=spread)
        for col, arch in enumerate(archs):
            ax = plot_vs_torch(ratios, arch, cols, ax=axes[row][col], xlim=span, gpu=gpu,
                               spread=spread)
            if row:
                ax.set_title(f"{arch}: {notes[row - 1]}" if row - 1 < len(notes) else arch,
                             fontsize="medium")
            if row or col < len(archs) - 1:
                ax.get_legend().remove()
    return axes


def _fit(values: np.ndarray) -> tuple:
    """An x range holding 1 and every finite value, with room at the right for a label."""
    v = np.append(values[np.isfinite(values)], 1.0)
    return float(v.min()) - 0.02, float(v.max()) + 0.12 * max(float(v.max() - v.min()), 0.1)


#: points a ratio label takes left of its bar ("0.871" at 7 points, its offset and a gap)
LABEL_PT = 30


def _label_room(ax, lo: float, hi: float) -> float:
    """The left limit moved left so that a label ending at ``lo`` stays inside the axes (not on
    the tick labels); from ``lo``, ``hi`` and the axes' width alone, so panels given one range
    keep one range."""
    width_pt = ax.get_position().width * ax.figure.get_figwidth() * 72
    frac = min(0.4, LABEL_PT / max(width_pt, 1.0))
    return lo - frac * (hi - lo) / (1 - frac)
