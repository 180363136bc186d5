"""The host-overhead lesson's figures (notebooks/03_host_overhead.ipynb, the report): host µs per
launch path and per peer, the crossover, the tensor-cache cap and the nsys timelines of an eager loop and of the same work replayed from a CUDA graph. Drawn from
``results/<gpu>/host.csv`` (tables: ``rmsnorm_workbook.analysis.host``, re-exported here) and from nsys
trace CSVs (``rmsnorm_workbook.profiling.trace``).

Every figure follows the lab's rules: at most five series per axes, Okabe and Ito's palette with
markers and line styles, log axes where values span decades (ratios centred on 1), legends beside
the data. Plots take an ``ax`` (a new figure when omitted) and return it.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Sequence

import matplotlib
import matplotlib.ticker
import numpy as np
import pandas as pd

from ..analysis.crossover import (crossover_M, crossover_table, kernel_of,  # noqa: F401
                                  kernel_times)
from ..analysis.host import (CACHE_SHAPE, DEFAULT_IMPL, HOST_SHAPE, TORCH,  # noqa: F401
                             WORKLOADS, cache_table, host_order, host_rows, host_table, is_toggle,
                             known_impl, recorded_name, split_impl, step_of, triton_step)
from ..analysis.tables import one_gpu
from ..results.provenance import gpu_title

# Okabe and Ito's palette (distinct under the common colour-vision deficiencies)
BLUE, VERMILLION, GREEN, PURPLE = "#0072B2", "#D55E00", "#009E73", "#CC79A7"
ORANGE, BLACK, GREY = "#E69F00", "#000000", "#999999"
#: how each workload is drawn: colour, marker
WORKLOAD_STYLE = {"fwd": (BLUE, "o"), "fwd+autograd": (ORANGE, "s"), "full": (GREEN, "D")}
#: the key under the per-path figure's legend: what each launch path and workload is
PATH_KEY = {"@tvm_ffi": "the library's call (default)",
            "@cached": "handles kept in a FIFO",
            "@compiled": "handles made every call",
            "@jit": "cute.jit resolved every call",
            "+python_node": "launched from Python"}
WORKLOAD_KEY = {"fwd": "inference", "fwd+autograd": "inputs need grad",
                "full": "forward and backward"}
#: the crossover figure's names for its host lines
HOST_LINE_LABELS = {DEFAULT_IMPL: "cute.auto, the library's call",
                    "cute.auto@tvm_ffi+python_node": "cute.auto, launched from Python"}


# ============================================================================ figures: helpers

def _axes(ax, size=(7.5, 4.5)):
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt
    return plt.subplots(figsize=size, constrained_layout=True)[1]


def _plain_log(axis) -> None:
    axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def _log2_x(ax, values) -> None:
    ticks = sorted(set(int(v) for v in values))
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


def _legend_right(ax, handles=None, **kw) -> None:
    if handles is None:
        handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                  fontsize="small", frameon=False, **kw)


def _dots(ax, ys, mid, low, high, color, marker, label=None, size=6):
    """Medians as markers with p20-p80 whiskers, on horizontal rows ``ys``."""
    mid, low, high = (np.asarray(a, dtype=float) for a in (mid, low, high))
    ok = ~np.isnan(mid)
    ax.errorbar(mid[ok], np.asarray(ys, dtype=float)[ok],
                xerr=[(mid - low)[ok], (high - mid)[ok]], fmt=marker, color=color,
                markersize=size, capsize=2, elinewidth=1, label=label, linestyle="none")


# ============================================================================ against torch

def plot_host(df: pd.DataFrame, gpu: Optional[str] = None, shape=HOST_SHAPE,
              toggles: bool = False, ax=None):
    """Host µs per call (log scale; median, whiskers p20-p80) per launch path and per peer, one
    marker per workload; toggle rows only with ``toggles``."""
    _, gpu = one_gpu(df, gpu)
    h = host_rows(df, gpu, shape)  # all rows: the newest per key could be a sweep's, not the run's
    if not toggles:
        h = h[[not is_toggle(i) for i in h["impl"]]]
    impls = host_order(h["impl"])
    ax = _axes(ax, (9, 0.4 * len(impls) + 1.5))
    workloads = [w for w in WORKLOADS if w in set(h["workload"])]
    far = off_scale(h)
    top = float(h[~h["impl"].isin(far)][["p50", "p80"]].max().max()) * 1.6 if far else None
    ys = np.arange(len(impls))
    for j, w in enumerate(workloads):
        s = h[h["workload"] == w].set_index("impl").reindex(impls)
        color, marker = WORKLOAD_STYLE[w]
        off = (j - (len(workloads) - 1) / 2) * 0.22
        near = ~s.index.isin(far)
        _dots(ax, (ys + off)[near], s["p50"][near], s["p20"][near], s["p80"][near], color,
              marker, label=w, size=5)
        if far:  # at the right edge, hollow: the value is in the note beside them
            ax.plot(np.full(len(far), top / 1.12), [ys[impls.index(i)] + off for i in far],
                    marker, color=color, markersize=5, fillstyle="none", linestyle="none")
    for i in far:
        _off_scale_note(ax, h[h["impl"] == i], workloads, ys[impls.index(i)], top / 1.3)
    ax.set_yticks(ys, impls)
    ax.set_ylim(len(impls) - 0.5, -0.5)
    ax.set_xscale("log")
    _plain_log(ax.xaxis)
    if far:
        ax.set_xlim(None, top)
    ax.set_xlabel("host µs per call (median; whiskers p20-p80; log scale)"
                  + ("\nhollow markers at the right edge: off this scale, value beside them"
                     if far else ""))
    ax.set_title(f"{gpu_title(gpu)}: host time per call, {shape[0]}×{shape[1]} bf16",
                 fontsize="medium")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    _legend_right(ax)
    _path_key(ax, impls, workloads)
    return ax


def _path_key(ax, impls: Sequence[str], workloads: Sequence[str]) -> None:
    """What the rows' launch paths and the markers' workloads are, below the legend."""
    paths = [p for p in PATH_KEY if any(p in i for i in impls)]
    lines = ["launch paths of cute.auto:"] + [f"{p}: {PATH_KEY[p]}" for p in paths]
    lines += ["", "workloads:"] + [f"{w}: {WORKLOAD_KEY[w]}" for w in workloads]
    ax.text(1.02, 0.0, "\n".join(lines), transform=ax.transAxes, ha="left", va="bottom",
            fontsize="x-small", color="#333333")


#: a row whose slowest point is this many times the next slowest row's is drawn off the scale
OFF_SCALE = 10.0


def off_scale(h: pd.DataFrame) -> list:
    """The implementations of ``h`` (``host_rows``) so much slower than all the rest that one
    log axis spanning them would squeeze every other row: each row's highest p80 (or p50) more
    than ``OFF_SCALE`` times that of the next slower row, from the top down."""
    worst = h.assign(v=h["p80"].fillna(h["p50"])).groupby("impl")["v"].max()
    worst = worst.dropna().sort_values(ascending=False)
    far = []
    while len(worst) > len(far) + 1 and worst.iloc[len(far)] > OFF_SCALE * worst.iloc[len(far) + 1]:
        far.append(worst.index[len(far)])
    return far


def _off_scale_note(ax, rows: pd.DataFrame, workloads, y: float, x: float) -> None:
    """Each workload's median of an off-scale row, written at ``x`` (right-aligned)."""
    med = rows.set_index("workload")["p50"]
    parts = [f"{w} {med[w] / 1e3:,.1f} ms" for w in workloads if w in med.index]
    ax.annotate("off this scale: " + ", ".join(parts) + " →", (x, y), ha="right", va="center",
                fontsize=8, color="#333333")


# ============================================================================ crossover

#: host lines of the crossover figure: the default, torch and the Python node
CROSSOVER_IMPLS = (DEFAULT_IMPL, TORCH, "cute.auto@tvm_ffi+python_node")
_HOST_LINE_STYLE = (("--", BLUE), (":", GREY), ("-.", PURPLE), ((0, (5, 2, 1, 2)), VERMILLION))
#: how each kernel's time is drawn: colour, marker (the lab's, then torch's, then others)
_KERNEL_STYLE = {"cute.auto": (BLACK, "o"), TORCH: (GREY, "s")}


def _kernel_label(kernel: str, impls: Sequence[str]) -> str:
    shared = sum(kernel_of(i) == kernel for i in impls) > 1
    return f"device µs, {kernel}'s kernel" + (" (the lab's paths)" if shared else "")


#: how each run of the kernels' sweeps is drawn, the run with the most points first: line
#: style and marker fill (a kernel's colour stays its own)
_RUN_STYLE = (("-", "full"), ("--", "none"), (":", "none"))


def _runs(dev: Sequence[pd.DataFrame]) -> list:
    """(run, (line style, fill)) for each run (``timestamp``) the kernels' points come from,
    the one with most points first."""
    every = pd.concat(list(dev)) if len(dev) else pd.DataFrame({"timestamp": []})
    runs = every["timestamp"].value_counts(sort=True).index
    return [(r, _RUN_STYLE[i % len(_RUN_STYLE)]) for i, r in enumerate(runs)]


def plot_crossover(df: pd.DataFrame, gpu: Optional[str] = None, workload: str = "fwd",
                   impls: Optional[Sequence[str]] = CROSSOVER_IMPLS, ax=None,
                   labels: Optional[Dict[str, str]] = HOST_LINE_LABELS):
    """The crossovers of ``analysis.crossover``, drawn: each implementation's host µs per call
    (``workload``) as a horizontal line, its own kernel's device µs against M as a curve
    (CUDA-graph replay, inputs from DRAM; band p20-p80; the lab's launch paths share
    ``cute.auto``'s), and a ring where a host line meets its kernel's curve. Left of a ring, a
    loop of eager calls on that path is host-bound; right of it, device-bound. Points from
    different runs of the sweeps are different series (``_RUN_STYLE``), never joined; a ring
    between two runs' points is interpolated across them, as ``analysis.crossover`` does."""
    _, gpu = one_gpu(df, gpu)
    table = crossover_table(df, impls, gpu, workload)  # all rows, as plot_host
    ax = _axes(ax, (8.5, 4.5))
    kernels = list(dict.fromkeys(table["kernel"]))
    top = float(table["host µs"].max()) if len(table) else math.inf
    curves = {}
    for kernel in kernels:
        dev = kernel_times(df, kernel, gpu, "full" if workload == "full" else "fwd")
        past = dev.index[dev["p50"] >= top]  # one measured point past the highest host line
        curves[kernel] = dev.iloc[:past[0] + 1] if len(past) else dev
    runs = _runs(curves.values())
    xs = []
    for kernel, dev in curves.items():
        colour, marker = _KERNEL_STYLE.get(kernel, (GREEN, "D"))
        ax.plot([], [], "-", marker=marker, color=colour, markersize=4,
                label=_kernel_label(kernel, list(table.index)))
        for run, (ls, fill) in runs:
            d = dev[dev["timestamp"] == run]
            ax.plot(d["M"], d["p50"], linestyle=ls, marker=marker, color=colour, markersize=5,
                    fillstyle=fill, markeredgewidth=1.2)
            ax.fill_between(d["M"], d["p20"], d["p80"], color=colour, alpha=0.15, linewidth=0)
        xs += list(dev["M"])
    if len(runs) > 1:  # which points each run measured, in the legend
        for run, (ls, fill) in runs:
            Ms = sorted({int(m) for d in curves.values() for m in d.loc[d["timestamp"] == run,
                                                                        "M"]})
            ax.plot([], [], linestyle=ls, marker="o", color=GREY, fillstyle=fill,
                    label=f"run {str(run)[5:16].replace('T', ' ')}: M = "
                          f"{', '.join(f'{m:,}' for m in Ms)}")
    for k, (impl, r) in enumerate(table.head(len(_HOST_LINE_STYLE)).iterrows()):
        ls, c = _HOST_LINE_STYLE[k]
        ax.axhline(r["host µs"], color=c, linestyle=ls, linewidth=1.5,
                   label=f"host µs, {(labels or {}).get(impl, impl)} ({r['host µs']:.1f})")
        if r["bound"] == "=":
            ax.plot([r["crossover M"]], [r["host µs"]], "o", color=c, markersize=9,
                    markerfacecolor="none", markeredgewidth=1.8, zorder=4)
    if xs:
        _log2_x(ax, xs)
    ax.set_yscale("log")
    # 3 too: a decade's 1-2-5 can leave the few-rows end of the curves without a label
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 3.0, 5.0)))
    _plain_log(ax.yaxis)
    ax.set_xlabel(f"M (rows), N={HOST_SHAPE[1]} bf16")
    ax.set_ylabel(f"µs per call ({workload}; log scale)")
    ax.set_title(f"{gpu_title(gpu)}: host time per call (lines) against kernel time (curves), "
                 f"{workload}\nrings: the crossover; left of a ring the call is host-bound",
                 fontsize="medium")
    ax.grid(True, which="major", alpha=0.3)
    _legend_right(ax)
    return ax


# ============================================================================ cache cap

def plot_cache_steps(df: pd.DataFrame, gpu: Optional[str] = None, shape=CACHE_SHAPE, ax=None,
                     references: Sequence[str] = (DEFAULT_IMPL, "triton.row")):
    """Step time (ms; median, whiskers p20-p80) of the training-like step per tensor-cache cap
    of the ``cached`` path, with the default path's and Triton's steps as horizontal lines."""
    d, gpu = one_gpu(df, gpu)
    t = cache_table(d, gpu, shape)
    ax = _axes(ax, (7.5, 4))
    xs = np.arange(len(t))
    ms = t["step µs"] / 1e3
    ax.errorbar(xs, ms, yerr=[(ms - t["step p20"] / 1e3).fillna(0),
                              (t["step p80"] / 1e3 - ms).fillna(0)],
                fmt="o", color=VERMILLION, markersize=7, capsize=3,
                label="cached path (median, p20–p80)")
    lines = []
    for ref in references:
        s = step_of(d, ref, gpu, shape)
        if "time" in s:
            ls, c = _reference_style(ref)
            name = f"{ref} (the default)" if ref == DEFAULT_IMPL else ref
            ax.axhline(s["time"] / 1e3, color=c, linestyle=ls, linewidth=1.5,
                       label=f"{name}: {s['time'] / 1e3:.1f} ms")
            lines.append(s["time"] / 1e3)
    ax.set_xticks(xs, list(t.index))
    ax.set_xlim(-0.5, len(t) - 0.5)
    ax.set_ylim(0, None)  # from zero: the ratios between caps read as lengths
    _value_labels(ax, xs, ms, lines)
    ax.set_xlabel("tensor_cache_cap of the cached path (handles kept)")
    ax.set_ylabel(f"ms per step ({shape[0]}×{shape[1]}, fwd+bwd)")
    ax.set_title(f"{gpu_title(gpu)}: step time per tensor_cache_cap", fontsize="medium")
    ax.grid(True, axis="y", alpha=0.3)
    _legend_right(ax)
    return ax


def _reference_style(name: str):
    """(line style, colour) of a reference line in the cache-cap panels: one per name, so that
    a line looks the same in both panels."""
    return ("--", BLUE) if name == DEFAULT_IMPL else (":", GREEN)


def _value_labels(ax, xs, values, lines: Sequence[float]) -> None:
    """Each value written right of its marker, level with it unless a horizontal line at
    ``lines`` would run through the text (centre within 5 points): then level, 9 points above
    or below, whichever keeps it furthest from every line."""
    lo, hi = ax.get_ylim()
    box = ax.get_position()
    per_pt = (hi - lo) / max(box.height * ax.figure.get_figheight() * 72, 1.0)  # data per point
    for x, v in zip(xs, values):
        if pd.isna(v):
            continue

        def room(dy):  # points between the text's centre and the nearest line
            return min((abs(v + dy * per_pt - ln) / per_pt for ln in lines), default=1e9)

        dy = 0 if room(0) >= 5 else max((0, 9, -9), key=room)
        ax.annotate(f"{v:.1f}", (x, v), xytext=(8, dy), textcoords="offset points",
                    va="center", fontsize=8)


def plot_cache_cap(df: pd.DataFrame, gpu: Optional[str] = None, shape=CACHE_SHAPE,
                   axes=None, triton: str = "triton.row", layers: Optional[int] = None):
    """Two panels against the ``cached`` path's tensor-cache cap, Triton's step as a line in
    both. Left, a bar per cap: the peak memory of the step (MiB above the memory allocated
    when it began) with, stacked on it and hatched, the storage the cache's handles held at
    that start (``analysis.host.cache_memory_table``: pinned tensors of ``layers`` layers,
    default the host benchmark's, times one activation), so that each bar is what the step
    needs beside everything else. Right: step time (``plot_cache_steps``)."""
    from ..analysis.host import cache_memory_table

    if layers is None:
        from ..bench.host import LAYERS as layers
    d, gpu = one_gpu(df, gpu)
    t = cache_table(d, gpu, shape, triton)
    mem = cache_memory_table(d, layers, gpu, shape)
    tr = triton_step(d, gpu, shape, triton)
    if axes is None:
        import matplotlib.pyplot as plt
        axes = plt.subplots(1, 2, figsize=(13, 4), constrained_layout=True)[1]
    ax_m, ax_t = axes
    xs = np.arange(len(t))
    peak, pinned = t["peak MiB"].to_numpy(float), mem["pinned at start (MiB)"].to_numpy(float)
    act = shape[0] * shape[1] * 2 / 2**20
    ax_m.bar(xs, peak, width=0.6, color=VERMILLION, label="the step's peak,\nfrom its start")
    ax_m.bar(xs, pinned, width=0.6, bottom=peak, color="white", edgecolor=VERMILLION,
             hatch="///", linewidth=0.8,
             label=f"pinned by the cache\nat the start ({act:.0f} MiB\nper tensor held)")
    for x, total in zip(xs, peak + pinned):
        if np.isfinite(total):
            ax_m.annotate(f"{total:,.0f}", (x, total), xytext=(0, 2), textcoords="offset points",
                          ha="center", va="bottom", fontsize=8)
    if "peak_mem" in tr:
        ls, c = _reference_style(triton)
        ax_m.axhline(tr["peak_mem"], color=c, linestyle=ls, linewidth=1.5,
                     label=f"{triton} ({tr['peak_mem']:,.0f} MiB)")
    ax_m.set_xticks(xs, list(t.index))
    ax_m.set_xlim(-0.5, len(t) - 0.5)
    top = np.nanmax(np.append(peak + pinned, tr.get("peak_mem", 0.0)))
    ax_m.set_ylim(0, 1.15 * top)  # from zero, as the step-time panel; room for the totals
    ax_m.set_xlabel("tensor_cache_cap of the cached path (handles kept)")
    ax_m.set_ylabel("MiB: the step's peak + what the cache pins")
    ax_m.set_title(f"{gpu_title(gpu)}: memory per tensor_cache_cap", fontsize="medium")
    ax_m.grid(True, axis="y", alpha=0.3)
    _legend_right(ax_m)
    plot_cache_steps(d, gpu, shape, ax=ax_t, references=(DEFAULT_IMPL, triton))
    return axes


# the timelines live in their own module; imported last (it takes this module's helpers)
from .timeline import (api_call_name, plot_timeline, plot_timelines,  # noqa: E402,F401
                       short_kernel_name, trace_gpu)
