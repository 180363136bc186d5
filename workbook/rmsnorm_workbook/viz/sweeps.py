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

import math
import os
import sys
from typing import Dict, Optional, Sequence

try:
    import matplotlib
    import matplotlib.lines
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
from ..legend import LAB_PREFIXES, impl, impl_order  # noqa: E402
from ..results import CEILINGS  # noqa: E402
from ..results.provenance import gpu_title  # noqa: E402

#: series per axes, the ceiling line included
MAX_SERIES = 5
#: registry colours too light to read on white, and the darker shade drawn instead
ON_WHITE = {"#F0E442": "#B8A200"}
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
    that were measured, the fastest other lab kernel, then the peers that are the fastest peer
    at some ``x`` (those winning most first: a peer best at one width must not hide behind a
    better mean), then the fastest peers by their mean median GB/s over ``x`` and, if room is
    left, the next fastest of any; returned in the registry's order."""
    names = impl_order(d["impl"])
    if len(names) <= limit:
        return names
    chosen = [k for k in keep if k in names][:limit]
    mean = d.groupby("impl")["p50"].mean().sort_values(ascending=False)
    lab = [n for n in mean.index if n.startswith(LAB_PREFIXES) and n not in chosen]
    peer_rows = d[~d["impl"].astype(str).str.startswith(LAB_PREFIXES)]
    wins = (peer_rows.loc[peer_rows.groupby(x)["p50"].idxmax(), "impl"].value_counts()
            if len(peer_rows) else pd.Series(dtype=int))
    winners = sorted(wins.index, key=lambda n: (-wins[n], -mean[n]))
    peers = winners + [n for n in mean.index if not n.startswith(LAB_PREFIXES)]
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
    ax.set_ylabel("GB/s (median; band p20–p80)" + (f"\n{NOT_FROM_ZERO}"
                                                    if ax.get_ylim()[0] > 0 else ""))
    # the subset on a line of its own: one long line overflows the axes and is cut at the edge
    subset = f"\n{len(shown)} of {measured} implementations shown" if len(shown) < measured else ""
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


def _write_values(ax, notes, ticks) -> None:
    """Each bar's value at its end (above a bar past 1, below one short of it), moved past a
    mark of its group that the text would sit on."""
    lo, hi = ax.get_ylim()
    box = ax.get_position()
    per_pt = (hi - lo) / max(box.height * ax.figure.get_figheight() * 72, 1.0)  # data per point
    for x, v, at, group in notes:
        up = v >= 1
        for t in ticks:  # the text spans 3 to 13 points past ``at``; a tick is ~2 points thick
            m = t[group]
            if up and at - 2 * per_pt <= m <= at + 14 * per_pt:
                at = m + 2 * per_pt
            elif not up and at - 14 * per_pt <= m <= at + 2 * per_pt:
                at = m - 2 * per_pt
        ax.annotate(f"{v:.2f}", (x, at), textcoords="offset points",
                    xytext=(0, 3 if up else -10), ha="center", fontsize="x-small")


def ratio_bars(ax, labels: Sequence[str], series: Dict[str, pd.DataFrame],
               colours: Optional[Dict[str, str]] = None, annotate: bool = True,
               refs: Optional[Dict[str, float]] = None,
               marks: Optional[Dict[str, Sequence[float]]] = None):
    """Grouped bars of ratios, drawn from 1 (not from 0), so a bar's length is the difference
    that matters; the y range fits what is drawn (and 1). ``series`` maps a legend label to a
    frame with one row per label (in order) holding ``ratio`` and optional ``lo``/``hi``
    (whiskers); NaN leaves a gap. ``refs`` adds dashed reference lines (label -> ratio),
    ``marks`` a reference value per
    label drawn as a black tick across its group (label -> values). Returns ``ax``."""
    import numpy as np

    n = max(1, len(series))
    width = 0.8 / n
    palette = [BLUE, VERMILLION, GREEN, GREY]
    seen = []  # every value drawn: the y range fits them
    xs = np.arange(len(labels))
    notes = []  # (x, value, where the text starts, group): written once the y range is set
    for j, (name, r) in enumerate(series.items()):
        colour = (colours or {}).get(name, palette[j % len(palette)])
        pos = xs + (j - (n - 1) / 2) * width
        vals = r["ratio"].to_numpy(dtype=float)
        err = None
        if {"lo", "hi"} <= set(r.columns):
            err = [np.clip(vals - r["lo"].to_numpy(dtype=float), 0, None),
                   np.clip(r["hi"].to_numpy(dtype=float) - vals, 0, None)]
            seen += list(r[["lo", "hi"]].to_numpy(dtype=float).ravel())
        ax.bar(pos, vals - 1, width, bottom=1, color=colour, yerr=err, capsize=2,
               label=name,
               hatch=None if j == 0 else "//", edgecolor="white", linewidth=0.5)
        seen += list(vals)
        if annotate:
            tips = r["hi"].to_numpy(dtype=float) if "hi" in r.columns else vals
            lows = r["lo"].to_numpy(dtype=float) if "lo" in r.columns else vals
            for i, (x, v, hi, lo) in enumerate(zip(pos, vals, tips, lows)):
                if np.isfinite(v):
                    notes.append((x, v, np.nanmax([v, hi]) if v >= 1 else np.nanmin([v, lo]), i))
    for name, v in (refs or {}).items():
        ax.axhline(v, color=GREY, linestyle="--", linewidth=1.2, label=name)
        seen.append(v)
    for name, vals in (marks or {}).items():
        vals = np.asarray(vals, dtype=float)
        ax.plot(xs, vals, linestyle="none", marker="_", markersize=34, markeredgewidth=2.2,
                color=BLACK, label=name)
        seen += list(vals)
    _fit_ratio_range(ax, seen)
    _write_values(ax, notes, [np.asarray(v, dtype=float) for v in (marks or {}).values()])
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
        _fit_ratio_range(ax, r[["lo", "hi", "ratio"]].to_numpy(dtype=float).ravel())
    ax.axhline(1.0, color=BLACK, linewidth=1)
    ax.set_xticks(list(range(len(r))), labels, rotation=30)
    ax.set_xlabel("M × N")
    ax.set_ylabel(f"t({slower}) / t({faster})")
    ax.set_title(f"{gpu_title(gpu)}: {op}, {slower} over {faster} ({path}); > 1: {faster} faster",
                 fontsize="medium")
    ax.grid(True, axis="y", alpha=0.3)
    return ax


def plot_fixed_cost(df: pd.DataFrame, impls, op: str = "fwd", N: int = 4096,
                    path: str = "graph", gpu: Optional[str] = None, min_M: int = 0, ax=None):
    """Each implementation's median µs minus the time the ceiling (``copy`` for the forward)
    would take to move the same bytes, against the MB moved (a linear axis from 0) at width N:
    the time a launch spends beyond streaming at the ceiling's rate. Markers are the measured
    points; the thin line of the same colour is ``fixed_cost_fit``'s line through them, which
    meets 0 MB at the fit's fixed cost (the legend gives it and the streaming rate)."""
    import numpy as np

    d, gpu = one_gpu(df, gpu)
    ceiling = ceiling_gbps(df, op, gpu)
    if ceiling is None:
        raise ValueError(f"no {CEILING_OF_OP.get(op)} ceiling measured for {gpu}")
    fit = fixed_cost_fit(df, impls, op, N, path, gpu, min_M)
    p50 = at_width(d, impls, op, N, path, min_M)
    ax = _axes(ax)
    top, handles = 0.0, []
    for name in [i for i in impls if i in p50.index.get_level_values(0)][:MAX_SERIES]:
        pts = p50.loc[name].dropna()
        mb = pts["bandwidth"] * pts["time"] / 1e3  # GB/s x µs = kB; / 1e3: MB
        st = style_of(name)
        label, ls = st.pop("label"), st.pop("linestyle")
        st["fillstyle"] = "full" if ls == "-" else "none"  # two series of one colour apart
        if name in fit.index:
            f = fit.loc[name]
            label += f": fixed {f['fixed µs']:.2f} µs, {f['streaming GB/s']:.0f} GB/s"
            xs = np.array([0.0, float(mb.max())])
            ax.plot(xs, f["fixed µs"] + xs * 1e3 * (1 / f["streaming GB/s"] - 1 / ceiling),
                    color=st["color"], linestyle=ls, linewidth=1.2)
        ax.plot(mb.to_numpy(), (pts["time"] - mb * 1e3 / ceiling).to_numpy(), linestyle="none",
                markersize=7, markeredgewidth=1.5, label=label, **st)
        handles.append(matplotlib.lines.Line2D([], [], linestyle=ls, label=label, **st))
        top = max(top, float(mb.max()))
    ax.axhline(0, color=BLACK, linewidth=1)
    ax.set_xlim(0, top * 1.05 if top else None)
    ax.set_xlabel(f"MB moved per call (N = {N}; one point per M measured)")
    ax.set_ylabel(f"median µs beyond the bytes at {ceiling:.0f} GB/s\n({CEILING_OF_OP[op]}, "
                  "1 GiB)")
    ax.set_title(f"{gpu_title(gpu)}: {op} ({path}): time beyond the {ceiling:.0f} GB/s ceiling; "
                 "lines: the fit", fontsize="medium")
    ax.grid(True, alpha=0.3)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, -0.18), fontsize="small",
              frameon=False)
    return ax


def plot_probe(probe: pd.DataFrame, captions: dict, M: int, N: int, ax=None,
                title: str = "", highlight_impl: Optional[str] = None):
    """One probe's configurations at M x N as dots: the median µs over its repetitions,
    whiskers from the fastest to the slowest, each labelled with its median. ``captions`` maps
    ``impl`` names to labels and fixes the order (top to bottom); configurations not in it are
    left out. The lab's configurations (``row.*``) are blue, the rest grey, ``highlight_impl``
    orange. Dots, not bars: the x range starts just under the fastest configuration, so the
    differences show, and no bar length suggests a zero that is not on the axis."""
    ax = _axes(ax)
    at = probe[(probe["M"] == M) & (probe["N"] == N) & probe["impl"].isin(list(captions))]
    stats = at.groupby("impl")["us"].agg(["median", "min", "max"]).reindex(list(captions))
    stats = stats.dropna()
    ys = list(range(len(stats)))[::-1]
    for y, (name, r) in zip(ys, stats.iterrows()):
        colour = "#E69F00" if name == highlight_impl else (BLUE if name.startswith("row.")
                                                           else GREY)
        ax.errorbar([r["median"]], [y], xerr=[[r["median"] - r["min"]], [r["max"] - r["median"]]],
                    fmt="o", color=colour, markersize=8, capsize=3)
        ax.annotate(f"{r['median']:.1f}", (r["max"], y), xytext=(6, 0),
                    textcoords="offset points", va="center", fontsize=8)
    ax.set_yticks(ys, [captions[i] for i in stats.index])
    if len(stats):
        lo, hi = stats["min"].min(), stats["max"].max()
        ax.set_xlim(lo - 0.08 * (hi - lo), hi + 0.14 * (hi - lo))
    ax.set_ylim(-0.6, len(stats) - 0.4)
    ax.set_xlabel("µs per call (CUDA-graph replay; median, whiskers min–max)\n"
                  "the axis starts near the fastest configuration, not at 0")
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
        ax.plot(s[x], s["% of copy"], markersize=6, **st)
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
