"""The host-overhead lesson's figures (notebooks/03_host_overhead.ipynb, the report): the launch
path step by step, against torch and the peers, the crossover, the tensor-cache cap and the nsys
timelines of an eager loop and of the same work replayed from a CUDA graph. Drawn from
``results/<gpu>/host.csv`` (tables: ``rmsnorm_lab.analysis.host``, re-exported here) and from nsys
trace CSVs (``rmsnorm_lab.profiling.trace``).

Every figure follows the lab's rules: at most five series per axes, Okabe and Ito's palette with
markers and line styles, log axes where values span decades (ratios centred on 1), legends beside
the data. Plots take an ``ax`` (a new figure when omitted) and return it.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import matplotlib
import matplotlib.patches
import matplotlib.ticker
import numpy as np
import pandas as pd

from ..analysis.host import (AUTOGRAD, CACHE_SHAPE, DEFAULT_IMPL, DEFAULT_PATH,  # noqa: F401
                             HOST_SHAPE, PART_LAYERS, STEPS, TOGGLES, TORCH, VARYING, WORKLOADS,
                             Crossover, Step, Toggle, cache_table, crossover_M,
                             crossover_table, device_times, host_order, host_rows, host_table,
                             is_launch_path, is_toggle, known_impl, load_host_parts,
                             recorded_name, savings_table, split_impl, step_of, triton_step,
                             varying_table)
from ..analysis.tables import one_gpu
from ..profiling.trace import (Trace, kernels, launches, stage_order, steady_state,
                               steady_window)
from ..registry import impl as registry_impl

# Okabe and Ito's palette (distinct under the common colour-vision deficiencies)
BLUE, VERMILLION, GREEN, PURPLE = "#0072B2", "#D55E00", "#009E73", "#CC79A7"
ORANGE, SKY, YELLOW, BLACK, GREY = "#E69F00", "#56B4E9", "#F0E442", "#000000", "#999999"
#: how each workload is drawn: colour, marker
WORKLOAD_STYLE = {"fwd": (BLUE, "o"), "fwd+autograd": (ORANGE, "s"), "full": (GREEN, "D")}


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


# ============================================================================ the ladder

def ladder_frame(runs: Dict[str, pd.DataFrame], workloads: Sequence[str] = WORKLOADS
                 ) -> pd.DataFrame:
    """``HostRuns.runs`` as one row per (step label, workload): p20, p50, p80 of ``now``, and
    torch's median of the same measurement."""
    rows = []
    for label, f in runs.items():
        for w in workloads:
            if ("now", w) not in f.index:
                continue
            r = f.loc[("now", w)]
            t = f.loc[("torch", w), "p50"] if ("torch", w) in f.index else math.nan
            rows.append({"step": label, "workload": w, "p20": r["p20"], "p50": r["p50"],
                         "p80": r["p80"], "torch": t})
    return pd.DataFrame(rows, columns=["step", "workload", "p20", "p50", "p80", "torch"])


def plot_ladder(runs: Dict[str, pd.DataFrame], steps: Sequence[str],
                workloads: Sequence[str] = WORKLOADS, axes=None, title: str = ""):
    """One panel per workload: host µs per call (log scale; median, whiskers p20-p80) of each
    step of the launch path, top to bottom in ``steps`` order, with torch's ``F.rms_norm``
    (the median over the steps' measurements) as a dashed line."""
    f = ladder_frame({k: runs[k] for k in steps if k in runs}, workloads)
    ws = [w for w in workloads if w in set(f["workload"])]
    if axes is None:
        import matplotlib.pyplot as plt
        axes = plt.subplots(1, len(ws), figsize=(4.2 * len(ws) + 2.2, 0.55 * len(steps) + 1.8),
                            sharey=True, constrained_layout=True, squeeze=False)[1][0]
    labels = [s for s in steps if s in set(f["step"])]
    ys = np.arange(len(labels))
    for ax, w in zip(axes, ws):
        d = f[f["workload"] == w].set_index("step").reindex(labels)
        color, marker = WORKLOAD_STYLE[w]
        _dots(ax, ys, d["p50"], d["p20"], d["p80"], color, marker)
        torch_us = float(np.nanmedian(d["torch"])) if d["torch"].notna().any() else math.nan
        if math.isfinite(torch_us):
            ax.axvline(torch_us, color=GREY, linestyle="--", linewidth=1.2)
            shown = f"{torch_us:.1f}" if torch_us < 100 else f"{torch_us:.0f}"
            ax.annotate(f"torch {shown} µs", (torch_us, -0.5), xytext=(3, 0),
                        textcoords="offset points", fontsize=8, color="#555555",
                        va="bottom", ha="left")
        for y, v in zip(ys, d["p50"]):
            if pd.notna(v):
                ax.annotate(f"{v:.1f}" if v < 100 else f"{v:.0f}", (v, y), xytext=(0, 7),
                            textcoords="offset points", ha="center", fontsize=8)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        _plain_log(ax.xaxis)
        lo = np.nanmin([d["p20"].min(), torch_us]) if math.isfinite(torch_us) else d["p20"].min()
        hi = np.nanmax([d["p80"].max(), torch_us]) if math.isfinite(torch_us) else d["p80"].max()
        ax.set_xlim(lo / 1.6, hi * 1.6)
        ax.set_title(w, fontsize="medium")
        ax.set_xlabel("host µs per call (log)")
        ax.grid(True, axis="x", which="both", alpha=0.3)
    axes[0].set_yticks(ys, labels)
    axes[0].set_ylim(len(labels) - 0.5, -0.9)
    if title:
        axes[0].figure.suptitle(title, fontsize="medium")
    return axes


# ============================================================================ against torch

def plot_vs_torch(table: pd.DataFrame, impls: Sequence[str], torch_name: str = TORCH,
                  ax=None, labels: Optional[Dict[str, str]] = None):
    """Host µs per call over torch's ``F.rms_norm`` (``table``: ``host_table``), one row per
    implementation, one marker per workload, on a log axis centred on 1 (left of the line:
    cheaper than torch)."""
    ax = _axes(ax, (8, 0.5 * len(impls) + 1.6))
    impls = [i for i in impls if i in table.index]
    ys = np.arange(len(impls))
    ratios = table.loc[impls] / table.loc[torch_name]
    k = len(table.columns)
    for j, w in enumerate(table.columns):
        color, marker = WORKLOAD_STYLE.get(w, (GREY, "o"))
        off = (j - (k - 1) / 2) * 0.18
        ax.plot(ratios[w], ys + off, marker, color=color, linestyle="none", markersize=7,
                label=w)
    finite = ratios.to_numpy(dtype=float)
    finite = finite[np.isfinite(finite)]
    span = max(2.0, float(np.max(np.abs(np.log2(finite)))) + 0.4) if finite.size else 2.0
    ax.set_xscale("log", base=2)
    ax.set_xlim(2 ** -span, 2 ** span)
    ticks = [2.0 ** e for e in range(-int(span), int(span) + 1)]
    ax.set_xticks(ticks, [f"{t:g}×" for t in ticks])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.axvline(1.0, color=BLACK, linewidth=1)
    ax.set_yticks(ys, [(labels or {}).get(i, i) for i in impls])
    ax.set_ylim(len(impls) - 0.5, -0.5)
    ax.set_xlabel(f"host time per call / {(labels or {}).get(torch_name, torch_name)}'s "
                  "(log scale; < 1: cheaper)")
    ax.grid(True, axis="x", alpha=0.3)
    _legend_right(ax, title="workload", title_fontsize="small")
    return ax


def plot_host(df: pd.DataFrame, gpu: Optional[str] = None, shape=HOST_SHAPE,
              toggles: bool = False, ax=None):
    """Host µs per call (log scale; median, whiskers p20-p80) per launch path and per peer, one
    marker per workload; toggle rows only with ``toggles``."""
    d, gpu = one_gpu(df, gpu)
    h = host_rows(d, gpu, shape)
    if not toggles:
        h = h[[not is_toggle(i) for i in h["impl"]]]
    impls = host_order(h["impl"])
    ax = _axes(ax, (9, 0.4 * len(impls) + 1.5))
    workloads = [w for w in WORKLOADS if w in set(h["workload"])]
    ys = np.arange(len(impls))
    for j, w in enumerate(workloads):
        s = h[h["workload"] == w].set_index("impl").reindex(impls)
        color, marker = WORKLOAD_STYLE[w]
        off = (j - (len(workloads) - 1) / 2) * 0.22
        _dots(ax, ys + off, s["p50"], s["p20"], s["p80"], color, marker, label=w, size=5)
    ax.set_yticks(ys, impls)
    ax.set_ylim(len(impls) - 0.5, -0.5)
    ax.set_xscale("log")
    _plain_log(ax.xaxis)
    ax.set_xlabel("host µs per call (median; whiskers p20-p80; log scale)")
    ax.set_title(f"{gpu}: host time per call, {shape[0]}×{shape[1]} bf16", fontsize="medium")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    _legend_right(ax)
    return ax


# ============================================================================ crossover

#: host lines of the crossover figure, at most four: the default, torch, and two slower paths
CROSSOVER_IMPLS = (DEFAULT_IMPL, TORCH, "cute.auto@tvm_ffi+python_node", "cute.auto@cached")
_HOST_LINE_STYLE = (("--", BLUE), (":", GREY), ("-.", PURPLE), ((0, (5, 2, 1, 2)), VERMILLION))


def plot_crossover(df: pd.DataFrame, gpu: Optional[str] = None, workload: str = "fwd",
                   impls: Optional[Sequence[str]] = CROSSOVER_IMPLS, ax=None,
                   labels: Optional[Dict[str, str]] = None):
    """Device µs of the default kernel against M (CUDA-graph replay, p20-p80 band) and the host
    µs of up to four implementations (``workload``) as horizontal lines, each crossover marked
    and its M written on the M axis. Left of a crossover, a loop of eager calls on that path is
    host-bound (the GPU waits for the CPU); right of it, device-bound."""
    d, gpu = one_gpu(df, gpu)
    dev = device_times(d, gpu)
    table = crossover_table(d, gpu, workload, impls)
    ax = _axes(ax, (8.5, 4.5))
    ax.plot(dev["M"], dev["p50"], "-o", color=BLACK, markersize=4,
            label="device µs, default kernel (graph replay)")
    ax.fill_between(dev["M"], dev["p20"], dev["p80"], color=BLACK, alpha=0.12, linewidth=0)
    for k, (impl, r) in enumerate(table.head(4).iterrows()):
        ls, c = _HOST_LINE_STYLE[k]
        ax.axhline(r["host µs"], color=c, linestyle=ls, linewidth=1.5,
                   label=f"host µs, {(labels or {}).get(impl, impl)} ({r['host µs']:.1f})")
        if r["bound"] == "=":
            ax.plot([r["crossover M"]], [r["host µs"]], "o", color=c, markersize=8,
                    markerfacecolor="white", markeredgewidth=1.5)
            ax.axvline(r["crossover M"], color=c, linestyle=ls, linewidth=0.8, alpha=0.6)
    _log2_x(ax, dev["M"])
    ax.tick_params(axis="x", labelrotation=45)
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    _plain_log(ax.yaxis)
    ax.set_xlabel(f"M (rows), N={HOST_SHAPE[1]} bf16")
    ax.set_ylabel(f"µs per call ({workload})")
    ax.grid(True, which="both", alpha=0.3)
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
                label="cached path, per cap")
    for x, v in zip(xs, ms):
        if pd.notna(v):
            ax.annotate(f"{v:.1f}", (x, v), xytext=(8, 0), textcoords="offset points",
                        va="center", fontsize=8)
    for ref, (ls, c) in zip(references, (("--", BLUE), (":", GREEN))):
        s = step_of(d, ref, gpu, shape)
        if "time" in s:
            name = f"{ref} (the default)" if ref == DEFAULT_IMPL else ref
            ax.axhline(s["time"] / 1e3, color=c, linestyle=ls, linewidth=1.5,
                       label=f"{name}: {s['time'] / 1e3:.1f} ms")
    ax.set_xticks(xs, list(t.index))
    ax.set_xlim(-0.5, len(t) - 0.5)
    ax.set_ylim(0, None)  # from zero: the ratios between caps read as lengths
    ax.set_xlabel("tensor_cache_cap of the cached path (handles kept)")
    ax.set_ylabel(f"ms per step ({shape[0]}×{shape[1]}, fwd+bwd)")
    ax.grid(True, axis="y", alpha=0.3)
    _legend_right(ax)
    return ax


def plot_cache_cap(df: pd.DataFrame, gpu: Optional[str] = None, shape=CACHE_SHAPE,
                   axes=None, triton: str = "triton.row"):
    """Two panels: peak memory (MiB above what was allocated when the step began) and step
    time against the ``cached`` path's tensor-cache cap, with Triton's as a dashed line."""
    d, gpu = one_gpu(df, gpu)
    t = cache_table(d, gpu, shape, triton)
    tr = triton_step(d, gpu, shape, triton)
    if axes is None:
        import matplotlib.pyplot as plt
        axes = plt.subplots(1, 2, figsize=(13, 4), constrained_layout=True)[1]
    ax_m, ax_t = axes
    xs = np.arange(len(t))
    ax_m.plot(xs, t["peak MiB"], "o", color=VERMILLION, markersize=7, label="cached path")
    if "peak_mem" in tr:
        ax_m.axhline(tr["peak_mem"], color=GREEN, linestyle=":", linewidth=1.5,
                     label=f"{triton} ({tr['peak_mem']:,.0f} MiB)")
    ax_m.set_xticks(xs, list(t.index))
    ax_m.set_xlabel("tensor_cache_cap")
    ax_m.set_ylabel("peak MiB above the step's start")
    ax_m.grid(True, axis="y", alpha=0.3)
    _legend_right(ax_m)
    plot_cache_steps(d, gpu, shape, ax=ax_t, references=(triton,))
    return axes


# ============================================================================ timeline

#: kernel-name fragments -> the short name a timeline shows
KERNEL_NAMES = (("RMSNormFusedAddForward", "forward + add"), ("RMSNormForward", "forward"),
                ("DwReduce", "dW reduce"), ("RMSNormBackward", "backward"),
                ("Dx", "dx"), ("Dw", "dW partials"))
_KERNEL_COLORS = (BLUE, ORANGE, GREEN, PURPLE, SKY, YELLOW)
#: NVTX ranges by stage (launch calls are vermillion, kernels take _KERNEL_COLORS)
RANGE_COLORS = {"iter": "#CCCCCC", "replay": "#CCCCCC", "warmup": "#CCCCCC", "launch": SKY,
                "reduce": PURPLE, "marshal": YELLOW, "compile": GREEN}


def short_kernel_name(name: str) -> str:
    """A mangled CuTe kernel name as a reader knows it (``forward``, ``backward``, ``dW
    reduce``); any other kernel keeps its first 30 characters."""
    for part, short in KERNEL_NAMES:
        if part in name:
            return short
    return name if len(name) <= 30 else name[:29] + "…"


def _short(name: str, width: int = 40) -> str:
    return name if len(name) <= width else name[:width - 1] + "…"


def plot_timeline(trace: Trace, first: int = 1, count: int = 3, ax=None,
                  api: bool = True, connect: bool = True, span_us: Optional[float] = None,
                  kernel_colors: Optional[Dict[str, str]] = None, legend: bool = True):
    """NVTX ranges (one row per range name, ordered by stage) above the CUDA API calls and the
    kernels, on one time axis in µs from the start of iteration ``first`` (default 1: the first
    iteration pays for what was cold and would squeeze the rest), over ``count`` iterations or
    ``span_us``. Iterations are the ``iter`` ranges, or for a graph replay the kernel groups.
    Thin grey lines join each launch call to the kernel it launched (correlation id)."""
    t0, t1 = steady_window(trace, first, count, None if span_us is None else span_us * 1e3)
    pad = 0.02 * (t1 - t0)
    lo, hi = t0 - pad, t1 + pad

    def clip(f):
        if f is None or f.empty:
            return None
        f = f[(f["end_ns"] >= lo) & (f["start_ns"] <= hi)]
        return f if not f.empty else None

    nv = clip(trace.nvtx)
    gpu_df = clip(kernels(trace)) if trace.gpu is not None else None
    api_df = clip(trace.api) if api else None
    rows: List[Tuple[str, pd.DataFrame, object]] = []
    if nv is not None:
        for name in sorted(nv["range"].unique(), key=stage_order):
            rows.append((name, nv[nv["range"] == name],
                         RANGE_COLORS.get(name.split(" ", 1)[0], GREY)))
    if api_df is not None or (api and trace.api is not None):
        # kept when empty: a span without launch calls is what a graph replay looks like
        rows.append(("CUDA API (host)", api_df if api_df is not None else trace.api.iloc[:0],
                     None))
    if gpu_df is not None:
        rows.append(("GPU kernels", gpu_df, None))
    if not rows:
        raise ValueError("nothing to draw in this window")
    ax = _axes(ax, (12, 3.5))
    colors_of = dict(kernel_colors or {})
    height = 0.7
    for y, (label, f, color) in enumerate(rows):
        starts = (f["start_ns"] - t0) / 1e3
        widths = np.maximum(f["dur_ns"] / 1e3, (hi - lo) / 1e3 * 2e-3)
        if label == "GPU kernels":
            colors = []
            for n in f["name"]:
                s = short_kernel_name(n)
                if s not in colors_of:
                    colors_of[s] = _KERNEL_COLORS[len(colors_of) % len(_KERNEL_COLORS)]
                colors.append(colors_of[s])
        elif label.startswith("CUDA API"):
            colors = [VERMILLION if x else "#DDDDDD" for x in f.get("launch", [True] * len(f))]
        else:
            colors = [color] * len(f)
        ax.broken_barh(list(zip(starts, widths)), (y - height / 2, height),
                       facecolors=colors, edgecolor=BLACK, linewidth=0.3)
    labels = [_short(r[0]) for r in rows]
    for y, (label, f, _) in enumerate(rows):
        if label.startswith("CUDA API") and f.empty:
            ax.text(0.5, y, "no CUDA API calls in this span", transform=ax.get_yaxis_transform(),
                    ha="center", va="center", fontsize=9, color="#555555")
    if connect and api_df is not None and gpu_df is not None:
        joined = launches(Trace(None, gpu_df, api_df, {}))
        if joined is not None:
            y_api = next(i for i, r in enumerate(rows) if r[0].startswith("CUDA API"))
            y_gpu = len(rows) - 1
            for a, s in zip(joined["api_start_ns"], joined["start_ns"]):
                ax.plot([(a - t0) / 1e3, (s - t0) / 1e3], [y_api + height / 2, y_gpu - height / 2],
                        color=GREY, linewidth=0.6, alpha=0.8)
    ax.set_yticks(range(len(rows)), labels)
    ax.set_ylim(len(rows) - 0.4, -0.6)
    ax.set_xlim((lo - t0) / 1e3, (hi - t0) / 1e3)
    ax.set_xlabel("µs from the start of the first iteration shown")
    ax.grid(True, axis="x", alpha=0.3)
    if legend:
        used = sorted({short_kernel_name(n) for n in gpu_df["name"]}) if gpu_df is not None else []
        handles = [matplotlib.patches.Patch(facecolor=colors_of[s], edgecolor=BLACK, label=s)
                   for s in used]
        if api_df is not None:
            handles.append(matplotlib.patches.Patch(facecolor=VERMILLION, edgecolor=BLACK,
                                                    label="launch call"))
        _legend_right(ax, handles)
    return ax


def plot_timelines(eager: Trace, graph: Optional[Trace], first: int = 1, count: int = 3,
                   axes=None, stats_from: Optional[int] = None):
    """The eager loop (``count`` iterations from ``first``) above the same work replayed from a
    CUDA graph, on the same time span, so that their paces compare at a glance; each panel's
    title gives its pace from the trace (``steady_state`` from iteration ``stats_from``, default
    ``first``). Without ``graph`` the eager loop alone. Returns the axes."""
    stats_from = first if stats_from is None else stats_from
    n = 2 if graph is not None else 1
    if axes is None:
        import matplotlib.pyplot as plt
        ranges = eager.nvtx["range"].nunique() if eager.nvtx is not None else 0
        heights = [ranges + 2, 2][:n]
        axes = plt.subplots(n, 1, figsize=(12, 0.55 * sum(heights) + 1.2 * n),
                            constrained_layout=True, squeeze=False,
                            gridspec_kw={"height_ratios": heights})[1][:, 0]
    t0, t1 = steady_window(eager, first, count)
    span_us = (t1 - t0) / 1e3
    colors: Dict[str, str] = {}
    for t in (eager, graph):
        for k in (kernels(t)["name"] if t is not None else []):
            colors.setdefault(short_kernel_name(k),
                              _KERNEL_COLORS[len(colors) % len(_KERNEL_COLORS)])
    s = steady_state(eager, stats_from)
    plot_timeline(eager, first, count, ax=axes[0], kernel_colors=colors)
    axes[0].set_title(f"eager loop: one iteration every {s['period_us']:.1f} µs, "
                      f"{s['kernel_us']:.1f} µs of it on the GPU ({s['busy']:.0%} busy)",
                      fontsize="medium", loc="left")
    if graph is not None:
        g = steady_state(graph, stats_from)
        plot_timeline(graph, first, span_us=span_us, ax=axes[1], kernel_colors=colors)
        axes[1].set_title(f"the same work replayed from one CUDA graph: one iteration every "
                          f"{g['period_us']:.1f} µs ({g['busy']:.0%} busy)",
                          fontsize="medium", loc="left")
        axes[0].set_xlabel("")
    return axes


# ============================================================================ host parts

def plot_host_parts(parts: pd.DataFrame, title: str = "", ax=None):
    """Forward-with-autograd layers against torch (left) and forward + backward (right)."""
    if ax is None:
        import matplotlib.pyplot as plt
        _, ax = plt.subplots(1, 2, figsize=(13, 4), constrained_layout=True,
                             gridspec_kw={"width_ratios": [3, 1]})
    left, right = ax
    for a, tasks in ((left, [t for t in PART_LAYERS if t in parts.index]),
                     (right, [t for t in ("torch full", "lab full") if t in parts.index])):
        d = parts.loc[tasks]
        colors = [GREY if t.startswith("torch") else BLUE for t in tasks]
        a.barh(range(len(d)), d["p50"], color=colors,
               xerr=[d["p50"] - d["p20"], d["p80"] - d["p50"]], capsize=2)
        labels = [f"{t}\n({PART_LAYERS[t]})" if t in PART_LAYERS else t for t in tasks]
        a.set_yticks(range(len(d)), labels, fontsize=8)
        a.invert_yaxis()
        a.set_xlabel("host µs per call (median; whiskers p20-p80)")
        a.grid(True, axis="x", alpha=0.3)
    left.set_title(title or "forward with autograd, layer by layer")
    right.set_title("forward + backward")
    return ax


def impl_label(name: str) -> str:
    """The registry's legend text of an implementation (``cute.auto (the default)``...)."""
    return registry_impl(name).style["label"]
