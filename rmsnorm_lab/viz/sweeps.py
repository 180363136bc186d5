"""Figures drawn from a results DataFrame (``results.load_all``), for the notebooks and the
report (the tables they draw from: ``analysis/tables.py``). Each plot takes an ``ax`` (a new figure when omitted) and returns it; each draws the
newest measurement of every point (``results.latest``) and the copy ceiling measured in the same
kind of run, labelled as measured.

The figures follow one set of rules, so that each reads at a glance:

* at most five series per axes: where more were measured, a highlighted subset (the lab's
  default and the fastest of the rest) and the others in the tables;
* the registry's colours, line styles and markers (Okabe and Ito's palette: distinct under the
  common colour-vision deficiencies), so a series looks the same in every figure;
* y ranges that show the differences that matter (bandwidth from just under the slowest shown
  point to the ceiling, with a % of the ceiling axis; ratios centred on 1);
* legends outside the data.

When results hold several GPUs, pass ``gpu=`` (a slug such as ``"h200"``): one figure never mixes
machines. Rows of the lesson notebooks' teaching kernels (``impl`` ``teach.*``, in
``results/<gpu>/teach-*.csv``) are left out of every figure here unless named.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Dict, Optional, Sequence

try:
    import matplotlib
    import matplotlib.ticker
except ImportError:  # the tables and fits still work; the figures need matplotlib
    matplotlib = None

# Headless (CI, a GPU host over ssh): render to files. Jupyter sets MPLBACKEND for its inline
# backend, and a desktop session has a display, so neither is overridden.
if matplotlib is not None and sys.platform.startswith("linux") and not (
        os.environ.get("MPLBACKEND") or os.environ.get("DISPLAY")
        or os.environ.get("WAYLAND_DISPLAY")):
    matplotlib.use("Agg")

import pandas as pd  # noqa: E402

from ..analysis.tables import (CEILING_OF_OP, at_width, ceiling_gbps,  # noqa: E402
                               fixed_cost_fit, library_rows, one_gpu, time_ratio)
from ..registry import LAB_PREFIXES, impl, impl_order  # noqa: E402
from ..results import CEILINGS  # noqa: E402

#: series per axes, the ceiling line included
MAX_SERIES = 5
#: Okabe-Ito colours used outside the registry's series
BLUE, VERMILLION, GREEN, GREY, BLACK = "#0072B2", "#D55E00", "#009E73", "#999999", "#000000"


def _axes(ax, size=(7, 4.5)):
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt  # only when the caller wants a new figure

    return plt.subplots(figsize=size, layout="constrained")[1]


def _log2_x(ax, values) -> None:
    """Log-2 x axis ticked at the measured sizes, printed as plain integers (1024, 4096, ...)."""
    ticks = sorted(set(int(v) for v in values))
    ax.set_xscale("log", base=2)
    if ticks:
        ax.set_xticks(ticks, [str(t) for t in ticks], rotation=45 if len(ticks) > 4 else 0)
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


def legend_outside(ax, where: str = "right", offset: float = 1.02, **kw) -> None:
    """The legend beside the axes (``right``, starting at ``offset`` axes widths: more when a
    right-hand axis is in the way) or under them (``below``), never over the data."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    if where == "below":
        ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.3), ncol=kw.pop("ncol", 2),
                  fontsize="small", frameon=False, **kw)
    else:
        ax.legend(loc="upper left", bbox_to_anchor=(offset, 1.0), fontsize="small",
                  frameon=False, **kw)


def highlight(d: pd.DataFrame, x: str, limit: int = MAX_SERIES - 1,
              keep: Sequence[str] = ("cute.auto",)) -> list:
    """At most ``limit`` implementations of ``d`` (bandwidth rows) to draw: those of ``keep``
    that were measured, the fastest other lab kernel, then the fastest peers (by their mean
    median GB/s over ``x``) and, if room is left, the next fastest of any; returned in the
    registry's order."""
    names = impl_order(d["impl"])
    if len(names) <= limit:
        return names
    chosen = [k for k in keep if k in names][:limit]
    mean = d.groupby("impl")["p50"].mean().sort_values(ascending=False)
    lab = [n for n in mean.index if n.startswith(LAB_PREFIXES) and n not in chosen]
    peers = [n for n in mean.index if not n.startswith(LAB_PREFIXES)]
    for name in lab[:1] + peers + list(mean.index):
        if len(chosen) >= limit:
            break
        if name not in chosen:
            chosen.append(name)
    return impl_order(chosen)


def _percent_axis(ax, ceiling: float) -> None:
    """A right-hand axis reading the same heights as a % of ``ceiling``."""
    sec = ax.secondary_yaxis("right", functions=(lambda v: 100 * v / ceiling,
                                                 lambda p: p * ceiling / 100))
    sec.set_ylabel("% of the ceiling")


def _bandwidth_vs(df, op, x, fixed, value, path, gpu, ax, impls):
    d, gpu = one_gpu(df, gpu)
    d = d[(d["op"] == op) & (d["path"] == path) & (d["metric"] == "bandwidth")
          & (d[fixed] == value) & ~d["impl"].isin(CEILINGS)]
    if impls is None:
        d = library_rows(d)
        shown = highlight(d, x)
    else:
        shown = [i for i in impls if i in set(d["impl"])]
    measured = len(set(d["impl"]))
    ax = _axes(ax)
    lows, highs = [], []
    for name in shown:
        s = d[d["impl"] == name].sort_values(x)
        st = impl(name).style
        ax.plot(s[x], s["p50"], markersize=4, **st)
        ax.fill_between(s[x], s["p20"], s["p80"], color=st["color"], alpha=0.15)
        lows.append(s["p20"].min())
        highs.append(s["p80"].max())
    ceiling = ceiling_gbps(df, op, gpu) if path == "graph" else None
    if ceiling is not None:
        ax.axhline(ceiling, color=BLACK, linestyle="--", linewidth=1,
                   label=f"{CEILING_OF_OP[op]} (measured)")
        highs.append(ceiling)
    if lows:
        lo, hi = min(lows), max(highs)
        pad = 0.04 * (hi - lo) if hi > lo else 0.05 * hi
        ax.set_ylim(max(0.0, lo - pad), hi + pad)
        if ceiling is not None:
            _percent_axis(ax, ceiling)
    _log2_x(ax, d[x])
    ax.set_xlabel(x)
    ax.set_ylabel("GB/s (median; band p20–p80)")
    subset = f"; {len(shown)} of {measured} implementations" if len(shown) < measured else ""
    ax.set_title(f"{gpu}: {op} bandwidth vs {x}, {fixed}={value}, {path}{subset}",
                 fontsize="medium")
    ax.grid(True, alpha=0.3)
    legend_outside(ax, offset=1.18 if ceiling is not None and lows else 1.02)
    return ax


def plot_bandwidth_vs_M(df: pd.DataFrame, op: str, N: int = 4096, path: str = "graph",
                        gpu: Optional[str] = None, ax=None, impls: Optional[Sequence[str]] = None):
    """GB/s against rows M at width N, one line per implementation (at most four: ``impls``, or
    the lab's default and the fastest others), the ceiling dashed."""
    return _bandwidth_vs(df, op, "M", "N", N, path, gpu, ax, impls)


def plot_bandwidth_vs_N(df: pd.DataFrame, op: str, M: int = 16384, path: str = "graph",
                        gpu: Optional[str] = None, ax=None, impls: Optional[Sequence[str]] = None):
    """GB/s against width N at M rows, one line per implementation (as ``plot_bandwidth_vs_M``),
    the ceiling dashed."""
    return _bandwidth_vs(df, op, "N", "M", M, path, gpu, ax, impls)


def plot_eager_vs_graph(df: pd.DataFrame, op: str, impl: str, N: int = 4096,
                        gpu: Optional[str] = None, ax=None):
    """µs per call against M for one implementation, launched eagerly and replayed in a CUDA
    graph: where the lines part, the host (launch path) and not the kernel sets the time."""
    d, gpu = one_gpu(df, gpu)
    d = d[(d["op"] == op) & (d["impl"] == impl) & (d["metric"] == "time") & (d["N"] == N)]
    ax = _axes(ax)
    for path, colour, ls, marker in (("eager", VERMILLION, "--", "o"),
                                     ("graph", BLUE, "-", "s")):
        s = d[d["path"] == path].sort_values("M")
        ax.plot(s["M"], s["p50"], color=colour, linestyle=ls, marker=marker, markersize=4,
                label=path)
    _log2_x(ax, d["M"])
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("M")
    ax.set_ylabel("µs per call (median)")
    ax.set_title(f"{gpu}: {impl} {op}, eager vs graph, N={N}", fontsize="medium")
    ax.grid(True, which="both", alpha=0.3)
    legend_outside(ax)
    return ax


def ratio_bars(ax, labels: Sequence[str], series: Dict[str, pd.DataFrame],
               colours: Optional[Dict[str, str]] = None, annotate: bool = True,
               refs: Optional[Dict[str, float]] = None,
               marks: Optional[Dict[str, Sequence[float]]] = None):
    """Grouped bars of ratios, drawn from 1 (not from 0), so a bar's length is the difference
    that matters; y range centred on 1. ``series`` maps a legend label to a frame with one row
    per label (in order) holding ``ratio`` and optional ``lo``/``hi`` (whiskers); NaN leaves a
    gap. ``refs`` adds dashed reference lines (label -> ratio), ``marks`` a reference value per
    label drawn as a black tick across its group (label -> values). Returns ``ax``."""
    import numpy as np

    n = max(1, len(series))
    width = 0.8 / n
    palette = [BLUE, VERMILLION, GREEN, GREY]
    extent = 0.0
    xs = np.arange(len(labels))
    for j, (name, r) in enumerate(series.items()):
        colour = (colours or {}).get(name, palette[j % len(palette)])
        pos = xs + (j - (n - 1) / 2) * width
        vals = r["ratio"].to_numpy(dtype=float)
        err = None
        if {"lo", "hi"} <= set(r.columns):
            err = [np.clip(vals - r["lo"].to_numpy(dtype=float), 0, None),
                   np.clip(r["hi"].to_numpy(dtype=float) - vals, 0, None)]
            if np.isfinite(r[["lo", "hi"]].to_numpy(dtype=float)).any():
                extent = max(extent, float(np.nanmax(np.abs(r[["lo", "hi"]].to_numpy(dtype=float)
                                                            - 1))))
        ax.bar(pos, vals - 1, width, bottom=1, color=colour, yerr=err, capsize=2,
               label=name,
               hatch=None if j == 0 else "//", edgecolor="white", linewidth=0.5)
        if np.isfinite(vals).any():
            extent = max(extent, float(np.nanmax(np.abs(vals - 1))))
        if annotate:
            tips = r["hi"].to_numpy(dtype=float) if "hi" in r.columns else vals
            lows = r["lo"].to_numpy(dtype=float) if "lo" in r.columns else vals
            for x, v, hi, lo in zip(pos, vals, tips, lows):
                if not np.isfinite(v):
                    continue
                at = (np.nanmax([v, hi]) if v >= 1 else np.nanmin([v, lo]))
                ax.annotate(f"{v:.2f}", (x, at), textcoords="offset points",
                            xytext=(0, 3 if v >= 1 else -10), ha="center", fontsize="x-small")
    for name, v in (refs or {}).items():
        ax.axhline(v, color=GREY, linestyle="--", linewidth=1.2, label=name)
        extent = max(extent, abs(v - 1))
    for name, vals in (marks or {}).items():
        vals = np.asarray(vals, dtype=float)
        ax.plot(xs, vals, linestyle="none", marker="_", markersize=34, markeredgewidth=2.2,
                color=BLACK, label=name)
        if np.isfinite(vals).any():
            extent = max(extent, float(np.nanmax(np.abs(vals - 1))))
    extent = max(extent * 1.25, 0.02)
    ax.set_ylim(1 - extent, 1 + extent)
    ax.axhline(1.0, color=BLACK, linewidth=1)
    ax.set_xticks(list(xs), list(labels), rotation=30 if len(labels) > 4 else 0)
    ax.grid(True, axis="y", alpha=0.3)
    if len(series) > 1 or refs or marks:
        legend_outside(ax, markerscale=0.45 if marks else 1.0)
    return ax


def plot_time_ratio(df: pd.DataFrame, op: str = "bwd", path: str = "graph",
                    gpu: Optional[str] = None, ax=None, slower: str = "cute.split",
                    faster: str = "cute.fused"):
    """Bars of ``t(slower) / t(faster)`` per shape (``time_ratio``; whiskers: the p20-p80
    spread), drawn from 1: above it ``faster`` is faster. By default the split backward over
    the fused one. Shapes where either was not measured (e.g. fused not eligible for a wide
    row) are left out."""
    r = time_ratio(df, op, slower, faster, path, gpu)
    _, gpu = one_gpu(df, gpu)
    ax = _axes(ax)
    labels = [f"{m}×{n}" for m, n in r.index]
    if len(r):
        colours = [GREEN if v >= 1 else VERMILLION for v in r["ratio"]]
        ax.bar(range(len(r)), r["ratio"] - 1, 0.7, bottom=1, color=colours,
               yerr=[(r["ratio"] - r["lo"]).clip(lower=0), (r["hi"] - r["ratio"]).clip(lower=0)],
               capsize=3)
        for x, v in enumerate(r["ratio"]):
            ax.annotate(f"{v:.2f}", (x, v), textcoords="offset points",
                        xytext=(0, 4 if v >= 1 else -11), ha="center", fontsize="small")
        extent = max(float((r[["lo", "hi", "ratio"]] - 1).abs().max().max()) * 1.25, 0.02)
        ax.set_ylim(1 - extent, 1 + extent)
    ax.axhline(1.0, color=BLACK, linewidth=1)
    ax.set_xticks(list(range(len(r))), labels, rotation=30)
    ax.set_xlabel("M × N")
    ax.set_ylabel(f"t({slower}) / t({faster})")
    ax.set_title(f"{gpu}: {op}, {slower} over {faster} ({path}); > 1: {faster} faster",
                 fontsize="medium")
    ax.grid(True, axis="y", alpha=0.3)
    return ax


def plot_fixed_cost(df: pd.DataFrame, impls, op: str = "fwd", N: int = 4096,
                    path: str = "graph", gpu: Optional[str] = None, min_M: int = 0, ax=None):
    """Each implementation's median µs minus the time the ceiling (``copy`` for the forward)
    would take to move the same bytes, against M at width N: the time a launch spends beyond
    streaming at the ceiling's rate. Flat lines are a fixed cost per launch; the legend gives
    ``fixed_cost_fit``'s intercept and streaming rate."""
    d, gpu = one_gpu(df, gpu)
    ceiling = ceiling_gbps(df, op, gpu)
    if ceiling is None:
        raise ValueError(f"no {CEILING_OF_OP.get(op)} ceiling measured for {gpu}")
    fit = fixed_cost_fit(df, impls, op, N, path, gpu, min_M)
    p50 = at_width(d, impls, op, N, path, min_M)
    ax = _axes(ax)
    for name in [i for i in impls if i in p50.index.get_level_values(0)][:MAX_SERIES]:
        pts = p50.loc[name].dropna()
        floor_us = pts["bandwidth"] * pts["time"] / ceiling  # the same bytes at the ceiling
        st = impl(name).style
        label = st.pop("label")
        if name in fit.index:
            f = fit.loc[name]
            label += (f"\nfixed {f['fixed µs']:.2f} µs, streams at "
                      f"{f['streaming GB/s']:.0f} GB/s")
        ax.plot(pts.index, pts["time"] - floor_us, markersize=4, label=label, **st)
    ax.axhline(0, color=BLACK, linewidth=1)
    _log2_x(ax, p50.index.get_level_values("M"))
    ax.set_xlabel("M")
    ax.set_ylabel(f"median µs above {CEILING_OF_OP[op]} of the same bytes")
    ax.set_title(f"{gpu}: {op} at N={N} ({path}): time beyond the {ceiling:.0f} GB/s ceiling",
                 fontsize="medium")
    ax.grid(True, alpha=0.3)
    legend_outside(ax, labelspacing=1.0)
    return ax


def whisker_barh(ax, ys, mid, low, high, colors) -> None:
    """Horizontal bars of ``mid`` at ``ys``, whiskers from ``low`` to ``high``, each bar
    labelled with its value just past its whisker (the probe and host-parts figures)."""
    mid, low, high = (pd.Series(list(v), dtype=float) for v in (mid, low, high))
    ax.barh(list(ys), mid, xerr=[mid - low, high - mid], color=colors, capsize=2)
    for y, v, end in zip(ys, mid, high):
        ax.annotate(f"{v:.1f}", (max(v, end), y), xytext=(3, 0), textcoords="offset points",
                    va="center", fontsize=8)


def plot_probe(probe: pd.DataFrame, captions: dict, M: int, N: int, ax=None,
               title: str = "", highlight_impl: Optional[str] = None):
    """One probe's configurations at M x N as horizontal bars: the median µs over its
    repetitions, whiskers from the fastest to the slowest. ``captions`` maps ``impl`` names to
    labels and fixes the order (top to bottom); configurations not in it are left out. The
    lab's configurations (``row.*``) are blue, the rest grey, ``highlight_impl`` orange; the
    x range starts just under the fastest bar, so the differences show."""
    ax = _axes(ax)
    at = probe[(probe["M"] == M) & (probe["N"] == N) & probe["impl"].isin(list(captions))]
    stats = at.groupby("impl")["us"].agg(["median", "min", "max"]).reindex(list(captions))
    stats = stats.dropna()
    ys = range(len(stats))[::-1]
    colours = ["#E69F00" if i == highlight_impl else (BLUE if i.startswith("row.") else GREY)
               for i in stats.index]
    whisker_barh(ax, ys, stats["median"], stats["min"], stats["max"], colours)
    ax.set_yticks(list(ys), [captions[i] for i in stats.index])
    if len(stats):
        lo, hi = stats["min"].min(), stats["max"].max()
        ax.set_xlim(lo - 0.15 * (hi - lo) - 0.01 * lo, hi + 0.12 * (hi - lo) + 0.01 * hi)
    ax.set_xlabel("µs per call (CUDA-graph replay; median, whiskers min–max)")
    ax.set_title(title or f"{M}×{N}", fontsize="medium")
    ax.grid(True, axis="x", alpha=0.3)
    return ax


def plot_percent_of_copy(table: pd.DataFrame, impls: Sequence[str], style, ax=None,
                         x: str = "M", title: str = ""):
    """``table`` (rows impl, M, N; a ``% of copy`` column, as ``lesson.teach_table`` builds it)
    drawn as one line per implementation of ``impls`` against ``x``, at most five; 100 % is
    the copy of the same bytes at each shape. The y range runs from just under the lowest
    point to just over 100. ``style(name)`` gives each line's keywords."""
    ax = _axes(ax)
    shown = [i for i in impls if i in table.index.get_level_values("impl")][:MAX_SERIES]
    lows, highs = [100.0], [100.0]
    for name in shown:
        s = table.xs(name, level="impl").reset_index().sort_values(x)
        st = style(name)
        ax.plot(s[x], s["% of copy"], markersize=5, **st)
        lows.append(float(s["% of copy"].min()))
        highs.append(float(s["% of copy"].max()))
    ax.axhline(100, color=BLACK, linestyle=":", linewidth=1, label="copy of the same bytes")
    lo = max(0.0, math.floor((min(lows) - 4) / 10) * 10)
    ax.set_ylim(lo, max(highs) + 0.06 * (max(highs) - lo))
    _log2_x(ax, table.index.get_level_values(x))
    ax.set_xlabel(x)
    ax.set_ylabel("% of a same-shape copy (median)")
    if title:
        ax.set_title(title, fontsize="medium")
    ax.grid(True, alpha=0.3)
    legend_outside(ax)
    return ax
