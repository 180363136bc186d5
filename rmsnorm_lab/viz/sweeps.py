"""Figures and tables drawn from a results DataFrame (``results.load_all``), for the notebooks and
the report. Each plot takes an ``ax`` (a new figure when omitted) and returns it; each draws the
newest measurement of every point (``results.latest``) and the copy ceiling measured in the same
kind of run, labelled as measured.

When results hold several GPUs, pass ``gpu=`` (a slug such as ``"h200"``): one figure never mixes
machines.
"""

from __future__ import annotations

import os
import sys
from typing import Optional, Tuple

import matplotlib
import matplotlib.ticker

# Headless (CI, a GPU host over ssh): render to files. Jupyter sets MPLBACKEND for its inline
# backend, and a desktop session has a display, so neither is overridden.
if sys.platform.startswith("linux") and not (os.environ.get("MPLBACKEND")
                                             or os.environ.get("DISPLAY")
                                             or os.environ.get("WAYLAND_DISPLAY")):
    matplotlib.use("Agg")

import pandas as pd  # noqa: E402

from ..registry import impl, impl_order  # noqa: E402
from ..results import CEILINGS, latest  # noqa: E402

#: the ceiling each op is drawn against: the forward reads one tensor and writes one, the
#: backward reads two (x, dy) and writes one (dx). ``full`` (forward then backward) has no single
#: access pattern and is drawn without a ceiling.
CEILING_OF_OP = {"fwd": "copy", "bwd": "copy2r1w"}


def _one_gpu(df: pd.DataFrame, gpu: Optional[str]) -> Tuple[pd.DataFrame, str]:
    gpus = sorted(df["gpu"].unique())
    if gpu is None:
        if len(gpus) != 1:
            raise ValueError(f"the results hold {len(gpus)} GPUs {gpus}; pass gpu=")
        gpu = gpus[0]
    elif gpu not in gpus:
        raise ValueError(f"no results for gpu {gpu!r}; have {gpus}")
    return latest(df[df["gpu"] == gpu]), gpu


def ceiling_gbps(df: pd.DataFrame, op: str, gpu: Optional[str] = None) -> Optional[float]:
    """Median GB/s of ``op``'s ceiling on ``gpu``, newest run; None when not measured."""
    name = CEILING_OF_OP.get(op)
    d, _ = _one_gpu(df, gpu)
    d = d[(d["impl"] == name) & (d["metric"] == "bandwidth") & (d["path"] == "graph")]
    if d.empty:
        return None
    newest = pd.to_datetime(d["timestamp"], utc=True).idxmax()
    return float(d.loc[newest, "p50"])


def _axes(ax):
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt  # only when the caller wants a new figure

    return plt.subplots(figsize=(7, 4.5))[1]


def _log2_x(ax, values) -> None:
    """Log-2 x axis ticked at the measured sizes, printed as plain integers (1024, 4096, ...)."""
    ticks = sorted(set(int(v) for v in values))
    ax.set_xscale("log", base=2)
    if ticks:
        ax.set_xticks(ticks, [str(t) for t in ticks], rotation=45 if len(ticks) > 4 else 0)
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


def _draw_ceiling(ax, df, op, gpu) -> None:
    gbps = ceiling_gbps(df, op, gpu)
    if gbps is not None:
        ax.axhline(gbps, color="black", linestyle="--", linewidth=1,
                   label=f"{CEILING_OF_OP[op]} (measured)")


def _bandwidth_vs(df, op, x, fixed, value, path, gpu, ax):
    d, gpu = _one_gpu(df, gpu)
    d = d[(d["op"] == op) & (d["path"] == path) & (d["metric"] == "bandwidth")
          & (d[fixed] == value) & ~d["impl"].isin(CEILINGS)]
    ax = _axes(ax)
    for name in impl_order(d["impl"]):
        s = d[d["impl"] == name].sort_values(x)
        style = impl(name).style
        ax.plot(s[x], s["p50"], markersize=4, **style)
        ax.fill_between(s[x], s["p20"], s["p80"], color=style["color"], alpha=0.15)
    _draw_ceiling(ax, df, op, gpu)
    _log2_x(ax, d[x])
    ax.set_xlabel(x)
    ax.set_ylabel("GB/s (median; band p20-p80)")
    ax.set_title(f"{gpu}: {op} bandwidth vs {x}, {fixed}={value}, {path}")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return ax


def plot_bandwidth_vs_M(df: pd.DataFrame, op: str, N: int = 4096, path: str = "graph",
                        gpu: Optional[str] = None, ax=None):
    """GB/s against rows M at width N, one line per implementation, the ceiling dashed."""
    return _bandwidth_vs(df, op, "M", "N", N, path, gpu, ax)


def plot_bandwidth_vs_N(df: pd.DataFrame, op: str, M: int = 16384, path: str = "graph",
                        gpu: Optional[str] = None, ax=None):
    """GB/s against width N at M rows, one line per implementation, the ceiling dashed."""
    return _bandwidth_vs(df, op, "N", "M", M, path, gpu, ax)


def plot_eager_vs_graph(df: pd.DataFrame, op: str, impl: str, N: int = 4096,
                        gpu: Optional[str] = None, ax=None):
    """µs per call against M for one implementation, launched eagerly and replayed in a CUDA
    graph: where the lines part, the host (launch path) and not the kernel sets the time."""
    d, gpu = _one_gpu(df, gpu)
    d = d[(d["op"] == op) & (d["impl"] == impl) & (d["metric"] == "time") & (d["N"] == N)]
    ax = _axes(ax)
    for path, style in (("eager", "-o"), ("graph", "-s")):
        s = d[d["path"] == path].sort_values("M")
        ax.plot(s["M"], s["p50"], style, markersize=4, label=path)
    _log2_x(ax, d["M"])
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("M")
    ax.set_ylabel("µs per call (median)")
    ax.set_title(f"{gpu}: {impl} {op}, eager vs graph, N={N}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    return ax


def bandwidth_table(df: pd.DataFrame, op: str, gpu: Optional[str] = None,
                    path: str = "graph") -> pd.DataFrame:
    """Median GB/s per shape (rows ``M``, ``N``) and implementation (columns under ``"GB/s"``),
    and the same as a percentage of the op's measured ceiling (columns under ``"% of copy"`` for
    the forward, ``"% of copy2r1w"`` for the backward; absent when none was measured)."""
    d, gpu = _one_gpu(df, gpu)
    d = d[(d["op"] == op) & (d["path"] == path) & (d["metric"] == "bandwidth")
          & ~d["impl"].isin(CEILINGS)]
    gbps = d.pivot_table(index=["M", "N"], columns="impl", values="p50", aggfunc="last")
    gbps = gbps.reindex(columns=impl_order(gbps.columns))
    gbps = gbps.sort_index(level=["N", "M"])
    gbps.columns.name = None
    parts = {"GB/s": gbps}
    ceiling = ceiling_gbps(df, op, gpu)
    if ceiling is not None:
        parts[f"% of {CEILING_OF_OP[op]}"] = 100 * gbps / ceiling
    return pd.concat(parts, axis=1)


def fwd_table(df: pd.DataFrame, gpu: Optional[str] = None) -> pd.DataFrame:
    """The forward's ``bandwidth_table`` under CUDA-graph replay."""
    return bandwidth_table(df, "fwd", gpu)


def host_table(df: pd.DataFrame, op: str, gpu: Optional[str] = None) -> pd.DataFrame:
    """Host µs per call (p20, p50, p80) per implementation and shape."""
    d, _ = _one_gpu(df, gpu)
    d = d[(d["op"] == op) & (d["metric"] == "host")]
    d = d.assign(impl=pd.Categorical(d["impl"], impl_order(d["impl"]), ordered=True))
    return d.sort_values(["impl", "M", "N"]).set_index(["impl", "M", "N"])[["p20", "p50", "p80"]]


def bwd_table(df: pd.DataFrame, gpu: Optional[str] = None) -> pd.DataFrame:
    """The backward's ``bandwidth_table`` under CUDA-graph replay (``% of copy2r1w``)."""
    return bandwidth_table(df, "bwd", gpu)


def _shape_order(index) -> list:
    """Shapes sorted as the sweep reads: by N, then M."""
    return sorted(index, key=lambda s: (s[1], s[0]))


def time_ratio(df: pd.DataFrame, op: str = "bwd", slower: str = "cute.split",
               faster: str = "cute.fused", path: str = "graph",
               gpu: Optional[str] = None) -> pd.DataFrame:
    """Per shape (rows ``M``, ``N``): the median µs of ``slower`` and ``faster`` and
    ``ratio = t(slower) / t(faster)`` (above 1: ``faster`` is faster), plus the ratio's spread
    from the quantiles (``lo`` = p20(slower)/p80(faster), ``hi`` = p80(slower)/p20(faster)).
    Only shapes where both were measured."""
    d, _ = _one_gpu(df, gpu)
    d = d[(d["op"] == op) & (d["path"] == path) & (d["metric"] == "time")
          & d["impl"].isin([slower, faster])]
    q = {k: d.pivot_table(index=["M", "N"], columns="impl", values=k, aggfunc="last")
         for k in ("p20", "p50", "p80")}
    cols = ["M", "N", slower, faster, "ratio", "lo", "hi"]
    if q["p50"].empty or not {slower, faster} <= set(q["p50"].columns):
        return pd.DataFrame(columns=cols).set_index(["M", "N"])
    out = pd.DataFrame({slower: q["p50"][slower], faster: q["p50"][faster],
                        "ratio": q["p50"][slower] / q["p50"][faster],
                        "lo": q["p20"][slower] / q["p80"][faster],
                        "hi": q["p80"][slower] / q["p20"][faster]}).dropna()
    return out.reindex(_shape_order(out.index))


def plot_time_ratio(df: pd.DataFrame, op: str = "bwd", path: str = "graph",
                    gpu: Optional[str] = None, ax=None, slower: str = "cute.split",
                    faster: str = "cute.fused"):
    """Bars of ``t(slower) / t(faster)`` per shape (``time_ratio``; whiskers: the p20-p80
    spread), a line at 1: above it ``faster`` is faster. By default the split backward over the
    fused one; the notebooks also draw ``cute.auto-pdl`` over ``cute.auto``. Shapes where either
    was not measured (e.g. fused not eligible for a wide row) are left out."""
    r = time_ratio(df, op, slower, faster, path, gpu)
    _, gpu = _one_gpu(df, gpu)
    ax = _axes(ax)
    labels = [f"{m}×{n}" for m, n in r.index]
    xs = range(len(r))
    if len(r):
        ax.bar(xs, r["ratio"], color=["tab:green" if v >= 1 else "tab:red" for v in r["ratio"]],
               yerr=[(r["ratio"] - r["lo"]).clip(lower=0), (r["hi"] - r["ratio"]).clip(lower=0)],
               capsize=3)
        for x, v in zip(xs, r["ratio"]):
            ax.annotate(f"{v:.2f}", (x, v), textcoords="offset points", xytext=(0, 4),
                        ha="center", fontsize="small")
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_xticks(list(xs), labels, rotation=30)
    ax.set_xlabel("M × N")
    ax.set_ylabel(f"t({slower}) / t({faster}), median")
    ax.set_title(f"{gpu}: {op}, {slower} vs {faster} ({path}); > 1: {faster} faster")
    ax.grid(True, axis="y", alpha=0.3)
    return ax


def _at_width(d: pd.DataFrame, impls, op: str, N: int, path: str, min_M: int) -> pd.DataFrame:
    """Median time and GB/s of ``impls`` at width N from ``min_M`` rows up: rows (impl, M)."""
    d = d[(d["op"] == op) & (d["path"] == path) & (d["N"] == N) & (d["M"] >= min_M)
          & d["impl"].isin(impls)]
    return d.pivot_table(index=["impl", "M"], columns="metric", values="p50", aggfunc="last")


def fixed_cost_fit(df: pd.DataFrame, impls, op: str = "fwd", N: int = 4096,
                   path: str = "graph", gpu: Optional[str] = None,
                   min_M: int = 0) -> pd.DataFrame:
    """Per implementation of ``impls`` measured at three or more M >= ``min_M`` at width N: a
    least-squares line through its median µs against the bytes it moved. The slope's inverse is its
    ``streaming GB/s`` (the rate once a launch is under way); the intercept, its ``fixed µs``
    (what every launch costs whatever its size: the first loads' latency, the last stores'
    drain, the gap to the next launch). Bytes come from each point's median time and GB/s."""
    import numpy as np

    d, _ = _one_gpu(df, gpu)
    p50 = _at_width(d, impls, op, N, path, min_M)
    rows = []
    measured = p50.index.get_level_values(0) if {"time", "bandwidth"} <= set(p50.columns) else []
    for impl in [i for i in impls if i in measured]:
        pts = p50.loc[impl, ["time", "bandwidth"]].dropna()
        if len(pts) < 3:
            continue
        mbytes = pts["bandwidth"] * pts["time"] / 1e3  # GB/s x µs = kB; / 1e3: MB
        slope, fixed = np.polyfit(mbytes, pts["time"], 1)  # µs per MB, µs
        rows.append({"impl": impl, "streaming GB/s": 1e3 / slope, "fixed µs": fixed,
                     "points": len(pts)})
    return pd.DataFrame(rows, columns=["impl", "streaming GB/s", "fixed µs", "points"]
                        ).set_index("impl")


def plot_fixed_cost(df: pd.DataFrame, impls, op: str = "fwd", N: int = 4096,
                    path: str = "graph", gpu: Optional[str] = None, min_M: int = 0, ax=None):
    """Each implementation's median µs minus the time the ceiling (``copy`` for the forward)
    would take to move the same bytes, against M at width N: the time a launch spends beyond
    streaming at the ceiling's rate. Flat lines are a fixed cost per launch; the legend gives
    ``fixed_cost_fit``'s intercept and streaming rate."""
    d, gpu = _one_gpu(df, gpu)
    ceiling = ceiling_gbps(df, op, gpu)
    if ceiling is None:
        raise ValueError(f"no {CEILING_OF_OP.get(op)} ceiling measured for {gpu}")
    fit = fixed_cost_fit(df, impls, op, N, path, gpu, min_M)
    p50 = _at_width(d, impls, op, N, path, min_M)
    ax = _axes(ax)
    for impl in [i for i in impls if i in p50.index.get_level_values(0)]:
        pts = p50.loc[impl].dropna()
        floor_us = pts["bandwidth"] * pts["time"] / ceiling  # the same bytes at the ceiling
        label = impl
        if impl in fit.index:
            f = fit.loc[impl]
            label += f": fixed {f['fixed µs']:.2f} µs, streams at {f['streaming GB/s']:.0f} GB/s"
        ax.plot(pts.index, pts["time"] - floor_us, marker="o", markersize=4, label=label)
    ax.axhline(0, color="black", linewidth=1)
    _log2_x(ax, p50.index.get_level_values("M"))
    ax.set_xlabel("M")
    ax.set_ylabel(f"median µs above {CEILING_OF_OP[op]} of the same bytes")
    ax.set_title(f"{gpu}: {op} at N={N} ({path}): time beyond the {ceiling:.0f} GB/s ceiling")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return ax


def op_breakdown(df: pd.DataFrame, impls=None, path: str = "graph",
                 gpu: Optional[str] = None) -> pd.DataFrame:
    """From recorded rows only (nothing measured, nothing drawn): per implementation and shape,
    median µs of ``fwd``, ``bwd`` and ``full``, ``fwd+bwd``, and ``full / (fwd+bwd)`` (below 1:
    running both in one call overlaps or saves something; above 1: the training call costs more
    than its parts, e.g. saving rstd or autograd's bookkeeping under ``eager``). Implementations
    are those in ``impls`` (default: all); a missing op leaves NaN."""
    d, _ = _one_gpu(df, gpu)
    d = d[(d["path"] == path) & (d["metric"] == "time") & ~d["impl"].isin(CEILINGS)]
    if impls is not None:
        d = d[d["impl"].isin(list(impls))]
    t = d.pivot_table(index=["impl", "M", "N"], columns="op", values="p50", aggfunc="last")
    t = t.reindex(columns=["fwd", "bwd", "full"])
    t.columns.name = None
    t["fwd+bwd"] = t["fwd"] + t["bwd"]
    t["full / (fwd+bwd)"] = t["full"] / t["fwd+bwd"]
    if t.empty:
        return t
    order = {name: i for i, name in enumerate(impl_order(t.index.get_level_values("impl")))}
    keys = sorted(t.index, key=lambda k: (order[k[0]], k[2], k[1]))
    return t.reindex(keys)


def markdown_table(table: pd.DataFrame, digits: int = 2, right_align: bool = False) -> str:
    """A pipe table for the report: a named or multi-level index becomes the leading columns;
    floats print with ``digits`` decimals, missing values as '-'."""
    named = bool(table.index.name) or isinstance(table.index, pd.MultiIndex)
    flat = table.reset_index() if named else table
    head = "| " + " | ".join(str(c) for c in flat.columns) + " |"
    rule = "|" + "|".join(("---:" if right_align else "---") for _ in flat.columns) + "|"

    def cell(v):
        if isinstance(v, float):
            return "-" if pd.isna(v) else f"{v:.{digits}f}"
        return str(v)

    body = ["| " + " | ".join(cell(v) for v in row) + " |"
            for row in flat.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def whisker_barh(ax, ys, mid, low, high, colors) -> None:
    """Horizontal bars of ``mid`` at ``ys``, whiskers from ``low`` to ``high``, each bar
    labelled with its value just past its whisker (the probe and host-parts figures)."""
    mid, low, high = (pd.Series(list(v), dtype=float) for v in (mid, low, high))
    ax.barh(list(ys), mid, xerr=[mid - low, high - mid], color=colors, capsize=2)
    for y, v, end in zip(ys, mid, high):
        ax.annotate(f"{v:.1f}", (max(v, end), y), xytext=(3, 0), textcoords="offset points",
                    va="center", fontsize=8)


def plot_probe(probe: pd.DataFrame, captions: dict, M: int, N: int, ax=None,
               title: str = ""):
    """One probe's configurations at M x N as horizontal bars: the median µs over its
    repetitions, whiskers from the fastest to the slowest. ``captions`` maps ``impl`` names to
    labels and fixes the order (top to bottom); configurations not in it are left out."""
    ax = _axes(ax)
    at = probe[(probe["M"] == M) & (probe["N"] == N) & probe["impl"].isin(list(captions))]
    stats = at.groupby("impl")["us"].agg(["median", "min", "max"]).reindex(list(captions))
    stats = stats.dropna()
    ys = range(len(stats))[::-1]
    whisker_barh(ax, ys, stats["median"], stats["min"], stats["max"],
                 ["tab:blue" if i.startswith("row.") else "tab:gray" for i in stats.index])
    ax.set_yticks(list(ys), [captions[i] for i in stats.index])
    ax.set_xlim(stats["min"].min() * 0.97, stats["max"].max() * 1.01)
    ax.set_xlabel("µs per call (CUDA-graph replay; median, whiskers min–max)")
    ax.set_title(title or f"{M}×{N}")
    ax.grid(True, axis="x", alpha=0.3)
    return ax
