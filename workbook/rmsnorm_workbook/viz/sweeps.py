"""Figures drawn from a results DataFrame (``results.load_all``), for the notebooks and the
report (the tables they draw from: ``analysis/tables.py``). Each plot takes an ``ax`` (a new
figure when omitted) and returns it; each draws the
newest measurement of every point (``results.latest``) and the copy ceiling measured in the same
kind of run, labelled as measured.

The figures follow one set of rules, so that each reads at a glance:

* at most five series per axes: where more were measured, a highlighted subset (the lab's
  default and the fastest of the rest) and the others in the tables;
* the registry's colours, line styles and markers (Okabe and Ito's palette: distinct under the
  common colour-vision deficiencies), so a series looks the same in every figure;
* y ranges that show the differences that matter (bandwidth from just under the slowest shown
  point to the ceiling, with a % of the ceiling axis; ratios drawn from 1, the range fitted to
  them);
* legends outside the data.

When results hold several GPUs, pass ``gpu=`` (a slug such as ``"h200"``): one figure never mixes
machines. Rows of the lesson notebooks' teaching kernels (``impl`` ``teach.*``, in
``results/<gpu>/teach-*.csv``) are left out of every figure here unless named.
"""

from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

try:
    import matplotlib
    import matplotlib.ticker
except ImportError:  # the tables still work; the figures need matplotlib
    matplotlib = None

# Headless (CI, a GPU host over ssh): render to files. Jupyter sets MPLBACKEND for its inline
# backend, and a desktop session has a display, so neither is overridden.
if matplotlib is not None and sys.platform.startswith("linux") and not (
        os.environ.get("MPLBACKEND") or os.environ.get("DISPLAY")
        or os.environ.get("WAYLAND_DISPLAY")):
    matplotlib.use("Agg")

import pandas as pd  # noqa: E402

from ..analysis.tables import (CEILING_OF_OP, ceiling_gbps, library_rows,  # noqa: E402
                               one_gpu, time_ratio)
from ..legend import LAB_PREFIXES, impl, impl_order  # noqa: E402
from ..results import CEILINGS  # noqa: E402
from ..results.provenance import gpu_title  # noqa: E402

#: series per axes, the ceiling line included
MAX_SERIES = 5
#: registry colours too light to read on white, and the darker shade drawn instead
ON_WHITE = {"#F0E442": "#B8A200"}
#: Okabe-Ito colours used outside the registry's series
BLUE, VERMILLION, GREEN, BLACK = "#0072B2", "#D55E00", "#009E73", "#000000"


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


def style_of(name: str) -> dict:
    """The registry's line style of an implementation, with a colour that reads on white."""
    st = dict(impl(name).style)
    st["color"] = ON_WHITE.get(st["color"].upper(), st["color"])
    return st


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
    that were measured, the fastest other lab kernel, then the peers, each ranked by the ``x``
    values at which it is the fastest of its kind (those winning most first: one best at one
    width must not hide behind a better mean, nor one measured at a single width win on its
    mean), then by their mean median GB/s over ``x``, and, if room is left, the next fastest of
    any; returned in the registry's order."""
    names = impl_order(d["impl"])
    if len(names) <= limit:
        return names
    chosen = [k for k in keep if k in names][:limit]
    mean = d.groupby("impl")["p50"].mean().sort_values(ascending=False)
    is_lab = d["impl"].astype(str).str.startswith(LAB_PREFIXES)
    lab = _by_wins(d[is_lab & ~d["impl"].isin(chosen)], x, mean)
    peers = _by_wins(d[~is_lab], x, mean)
    for name in lab[:1] + peers + list(mean.index):
        if len(chosen) >= limit:
            break
        if name not in chosen:
            chosen.append(name)
    return impl_order(chosen)


def _by_wins(rows: pd.DataFrame, x: str, mean: pd.Series) -> list:
    """The implementations of ``rows``, those fastest at the most ``x`` values first, then by
    ``mean``; the ones never fastest after them."""
    if rows.empty:
        return []
    wins = rows.loc[rows.groupby(x)["p50"].idxmax(), "impl"].value_counts()
    names = rows["impl"].unique()
    return sorted(names, key=lambda n: (-wins.get(n, 0), -mean[n]))


def _percent_axis(ax, ceiling: float) -> None:
    """A right-hand axis reading the same heights as a % of ``ceiling``."""
    sec = ax.secondary_yaxis("right", functions=(lambda v: 100 * v / ceiling,
                                                 lambda p: p * ceiling / 100))
    sec.set_ylabel("% of the ceiling")


#: the note on an axis that does not start at zero
NOT_FROM_ZERO = "(axis starts near the data, not at 0)"

#: two series whose medians differ by less than this everywhere are drawn as coinciding
COINCIDE = 0.01


def coincides_with(name: str, d: pd.DataFrame, x: str, shown: Sequence[str]) -> Optional[str]:
    """The series drawn before ``name`` (in ``shown``) whose medians at every ``x`` of both lie
    within ``COINCIDE`` of ``name``'s, or None: its line would hide ``name``'s."""
    mine = d[d["impl"] == name].set_index(x)["p50"]
    for other in shown[:shown.index(name)]:
        theirs = d[d["impl"] == other].set_index(x)["p50"]
        both = mine.index.intersection(theirs.index)
        if len(both) and float((mine[both] / theirs[both] - 1).abs().max()) < COINCIDE:
            return other
    return None


def _coinciding(name: str, d: pd.DataFrame, x: str, shown: Sequence[str]) -> dict:
    """Line keywords that keep ``name`` visible over a series it coincides with: dashed, hollow
    markers, and the legend saying so."""
    other = coincides_with(name, d, x, shown)
    if other is None:
        return {}
    return dict(linestyle=(0, (4, 3)), fillstyle="none", markersize=7, linewidth=1.6,
                label=f"{style_of(name)['label']} (within {COINCIDE:.0%} of {other})")


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
        st = dict(style_of(name), markersize=4)
        st.update(_coinciding(name, d, x, shown))
        ax.plot(s[x], s["p50"], **st)
        ax.fill_between(s[x], s["p20"], s["p80"], color=st["color"], alpha=0.15)
        lows.append(s["p20"].min())
        highs.append(s["p80"].max())
    ceiling = ceiling_gbps(df, op, gpu) if path == "graph" else None
    if ceiling is not None:
        # dotted, as the lessons' copy line: torch.compile's series is black and dashed
        ax.axhline(ceiling, color=BLACK, linestyle=":", linewidth=1.2,
                   label=f"{impl(CEILING_OF_OP[op]).style['label']}, measured")
        highs.append(ceiling)
    if lows:
        lo, hi = min(lows), max(highs)
        pad = 0.04 * (hi - lo) if hi > lo else 0.05 * hi
        ax.set_ylim(max(0.0, lo - pad), hi + pad)
        if ceiling is not None:
            _percent_axis(ax, ceiling)
    _log2_x(ax, d[x])
    ax.set_xlabel(x)
    ax.set_ylabel("GB/s (median; band p20–p80)" + (f"\n{NOT_FROM_ZERO}"
                                                    if ax.get_ylim()[0] > 0 else ""))
    # the subset on a line of its own: one long line overflows the axes and is cut at the edge
    subset = (f"\n{len(shown)} of {measured} kernels: the default, the best other lab, best peers"
              if len(shown) < measured else "")
    ax.set_title(f"{gpu_title(gpu)}: {op} bandwidth vs {x}, {fixed}={value}, {path}{subset}",
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
    graph: where the lines part, the host (launch path) and not the kernel sets the time. The y
    range spans every implementation's times of ``op`` at width N, so that panels drawn for
    several implementations share one scale."""
    d, gpu = one_gpu(df, gpu)
    every = library_rows(d[(d["op"] == op) & (d["metric"] == "time") & (d["N"] == N)
                           & d["path"].isin(["eager", "graph"]) & ~d["impl"].isin(CEILINGS)])
    d = every[every["impl"] == impl]
    # the shared range: implementations measured both ways only (one timed eagerly alone, at
    # one size, would stretch every panel past the data)
    both = every.groupby("impl")["path"].transform(lambda p: p.nunique() == 2)
    every = every[both.astype(bool)] if both.any() else every
    ax = _axes(ax)
    for path, colour, ls, marker in (("eager", VERMILLION, "--", "o"),
                                     ("graph", BLUE, "-", "s")):
        s = d[d["path"] == path].sort_values("M")
        ax.plot(s["M"], s["p50"], color=colour, linestyle=ls, marker=marker, markersize=4,
                label=path)
    _log2_x(ax, d["M"])
    ax.set_yscale("log")
    if len(every):
        ax.set_ylim(every["p50"].min() / 1.3, every["p50"].max() * 1.3)
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("M")
    ax.set_ylabel("µs per call (median)")
    ax.set_title(f"{gpu_title(gpu)}: {impl} {op}, eager vs graph, N={N}", fontsize="medium")
    ax.grid(True, which="major", alpha=0.3)
    legend_outside(ax)
    return ax


def _fit_ratio_range(ax, values) -> None:
    """y range of a ratio figure: from just under the smallest of ``values`` and 1 to just over
    the largest, so the bars (drawn from 1) fill it."""
    import numpy as np

    v = np.asarray([x for x in values if np.isfinite(x)] + [1.0], dtype=float)
    lo, hi = float(v.min()), float(v.max())
    pad = max(0.08 * (hi - lo), 0.02)
    ax.set_ylim(lo - pad, hi + pad)


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
        _fit_ratio_range(ax, r[["lo", "hi", "ratio"]].to_numpy(dtype=float).ravel())
    ax.axhline(1.0, color=BLACK, linewidth=1)
    ax.set_xticks(list(range(len(r))), labels, rotation=30)
    ax.set_xlabel("M × N")
    ax.set_ylabel(f"t({slower}) / t({faster})")
    ax.set_title(f"{gpu_title(gpu)}: {op}, {slower} over {faster} ({path}); > 1: {faster} faster",
                 fontsize="medium")
    ax.grid(True, axis="y", alpha=0.3)
    return ax
