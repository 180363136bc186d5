"""Figures of the probes the lessons read (tables: ``rmsnorm_workbook.analysis.probes``)."""

from __future__ import annotations

import math

import pandas as pd

from .sweeps import BLACK, BLUE, GREY, VERMILLION


def strips_panels(table: pd.DataFrame, N: int = 4096) -> list:
    """The shapes of a ``strips_table``, in drawing order: width N by M first, then the other
    widths by N and M. Every shape once."""
    return sorted(set(zip(table["M"], table["N"])), key=lambda s: (s[1] != N, s[1], s[0]))


def plot_strips(table: pd.DataFrame, N: int = 4096, axes=None, per_row: int = 4):
    """Small multiples, one panel per shape of ``table`` (``analysis.probes.strips_table``):
    GB/s as a % of the best strips count against strips (CTAs) per SM, the plan's choice a
    star. One y range for every panel. Returns the axes drawn (one per shape)."""
    import matplotlib.ticker

    shapes = strips_panels(table, N)
    if axes is None:
        import matplotlib.pyplot as plt
        rows = math.ceil(len(shapes) / per_row)
        axes = plt.subplots(rows, per_row, figsize=(3.0 * per_row, 2.6 * rows + 0.4),
                            sharey=True, layout="constrained", squeeze=False)[1].ravel()
    lo = max(0.0, float(table["% of best"].min()) - 5)
    for ax, (M, n) in zip(axes, shapes):
        g = table[(table["M"] == M) & (table["N"] == n)].sort_values("per SM")
        ax.plot(g["per SM"], g["% of best"], "-o", color=BLUE, markersize=4)
        pick = g[g["per SM"] == g["plan"]]
        ax.plot(pick["per SM"], pick["% of best"], "*", color=VERMILLION, markersize=15,
                markeredgecolor=BLACK, markeredgewidth=0.5, zorder=3)
        ax.set_xscale("log", base=2)
        ticks = sorted(g["per SM"].unique())
        ax.set_xticks(ticks, [str(k) for k in ticks])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_ylim(lo, 103)
        ax.set_title(f"{M}×{n}", fontsize="medium")
        ax.grid(True, alpha=0.3)
    for ax in list(axes)[len(shapes):]:
        ax.set_visible(False)
    shown = list(axes)[:len(shapes)]
    for ax in shown[::per_row]:
        ax.set_ylabel("% of the best count")
    for ax in shown[-per_row:]:
        ax.set_xlabel("fused strips per SM")
    shown[0].figure.suptitle("fused backward, GB/s against strips per SM (one panel per "
                             "shape); star: the plan's choice", fontsize="medium")
    return shown


def plot_small_m_parts(table: pd.DataFrame, ax=None):
    """The fused backward at few rows in parts (``analysis.probes.small_m_parts``), one bar per
    shape in units of the same-shape ``copy2r1w`` time: the dx kernel alone, then what walking
    the rows in strips adds, then what dW adds; a line at the copy (in the legend). Returns the
    axes."""
    if ax is None:
        import matplotlib.pyplot as plt
        ax = plt.subplots(figsize=(7.5, 0.7 * len(table) + 1.6), layout="constrained")[1]
    copy = table["copy2r1w"]
    labels = [f"{M}×{N}" for M, N in table.index]
    left = pd.Series(0.0, index=table.index)
    for part, colour, name in (("dx kernel alone", BLUE, "dx kernel alone (a CTA a row)"),
                               ("strips", GREY, "+ fused without dW, over the dx kernel (strips)"),
                               ("dW", VERMILLION, "+ dW: partial rows, the grid's end, the sum")):
        width = table[part] / copy
        ax.barh(labels, width, left=left, color=colour, label=name, height=0.6)
        left = left + width
    for y, total in enumerate(left):
        ax.text(total + 0.02, y, f"{total:.2f}×", va="center", fontsize="small")
    ax.axvline(1.0, color=BLACK, linewidth=1.2, label="the same-shape copy2r1w (1×)")
    ax.set_xlim(0, float(left.max()) * 1.15)
    ax.invert_yaxis()
    ax.set_xlabel("time / the same-shape copy2r1w's (graph replay, L2-cold)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=1, fontsize="small",
              frameon=False)
    return ax
