"""The nsys timelines of the host-overhead lesson (notebooks/03_host_overhead.ipynb, the report):
an eager loop and the same work replayed from a CUDA graph, NVTX ranges above the CUDA API calls
and the kernels on one time axis (traces: ``rmsnorm_workbook.profiling.trace``)."""

from __future__ import annotations

import re
from typing import Dict, Iterable, List, Optional, Tuple

import matplotlib
import matplotlib.patches
import numpy as np
import pandas as pd

from ..profiling.trace import (Trace, kernels, launches, stage_order, steady_state,
                               steady_window)
from ..results.provenance import gpu_title

# Okabe and Ito's palette (the yellow left out: it does not read on white)
BLUE, VERMILLION, GREEN, PURPLE = "#0072B2", "#D55E00", "#009E73", "#CC79A7"
ORANGE, SKY, BLACK, GREY = "#E69F00", "#56B4E9", "#000000", "#999999"
OTHER_API = "#DDDDDD"  # CUDA API calls that launch no kernel (a sync, a name lookup)
#: the legend entry of those calls; the names of the ones in view follow it
OTHER_CALLS = "CUDA API: another call"


def _axes(ax, size=(12, 3.5)):
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt
    return plt.subplots(figsize=size, constrained_layout=True)[1]


def _legend_right(ax, handles) -> None:
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                  fontsize="small", frameon=False)

# ============================================================================ timeline

#: kernel-name fragments -> the short name a timeline shows
KERNEL_NAMES = (("RMSNormFusedAddForward", "forward + add"), ("RMSNormForward", "forward"),
                ("DwReduce", "dW reduce"), ("RMSNormBackward", "backward"),
                ("Dx", "dx"), ("Dw", "dW partials"))
_KERNEL_COLORS = (BLUE, ORANGE, GREEN, PURPLE, SKY, VERMILLION)  # not black: the launches
#: NVTX ranges, one colour whatever the stage (each row's label names its range), so the colours
#: left to tell apart are the kernels' (_KERNEL_COLORS) and the CUDA calls' (launches black)
RANGE_COLOR = "#FFFFFF"
LAUNCH_COLOR = BLACK


def short_kernel_name(name: str) -> str:
    """A mangled CuTe kernel name as a reader knows it (``forward``, ``backward``, ``dW
    reduce``); any other kernel keeps its first 30 characters."""
    for part, short in KERNEL_NAMES:
        if part in name:
            return short
    return name if len(name) <= 30 else name[:29] + "…"


def _short(name: str, width: int = 40) -> str:
    return name if len(name) <= width else name[:width - 1] + "…"


def api_call_name(name: str) -> str:
    """A CUDA API call as its documentation names it: the trace's version suffix dropped
    (``cudaGraphLaunch_v10000`` -> ``cudaGraphLaunch``)."""
    return re.sub(r"_v\d+$", "", str(name))


def _name_wide_calls(ax, f: pd.DataFrame, y: float, t0: float, lo: float, hi: float) -> None:
    """Write each CUDA API call's name (``api_call_name``) on its bar where the part in view is
    wide enough to hold it: white on a launch, black on another call."""
    width_pt = ax.get_position().width * ax.figure.get_figwidth() * 72
    pt_per_ns = width_pt / max(hi - lo, 1.0)
    launch = f.get("launch", pd.Series(True, index=f.index)).astype(bool)
    for start, end, name, is_launch in zip(f["start_ns"], f["end_ns"], f["name"], launch):
        a, b = max(start, lo), min(end, hi)
        text = api_call_name(name)
        if (b - a) * pt_per_ns >= 1.3 * (0.6 * 7 * len(text) + 6):  # 7-point text, a margin
            ax.text(((a + b) / 2 - t0) / 1e3, y, text, ha="center", va="center", fontsize=7,
                    color="white" if is_launch else BLACK, clip_on=True)


def _other_calls(seen: Dict[str, str], names: Iterable[str]) -> None:
    """The legend entry of the non-launch calls (``OTHER_CALLS``), naming those in view; the
    names of an earlier panel's entry in ``seen`` are kept with these."""
    names = set(names)
    for key in [k for k in seen if k.startswith(OTHER_CALLS)]:
        names |= set(key.split("\n(", 1)[1].rstrip(")").split(", ")) if "\n(" in key else set()
        del seen[key]
    seen[f"{OTHER_CALLS}\n({', '.join(sorted(names))})"] = OTHER_API


def plot_timeline(trace: Trace, first: int = 1, count: int = 3, ax=None,
                  api: bool = True, connect: bool = True, span_us: Optional[float] = None,
                  kernel_colors: Optional[Dict[str, str]] = None, legend: bool = True,
                  drawn: Optional[Dict[str, str]] = None, title: Optional[str] = None):
    """NVTX ranges (one row per range name, ordered by stage) above the CUDA API calls and the
    kernels, on one time axis in µs from the start of iteration ``first`` (default 1: the first
    iteration pays for what was cold and would squeeze the rest), over ``count`` iterations or
    ``span_us``. Iterations are the ``iter`` ranges, or for a graph replay the kernel groups.
    Thin grey lines join each launch call to the kernel it launched (correlation id). ``drawn``
    (label -> colour) is filled with what the legend lists: the kernels and the kinds of CUDA
    API call in view. ``title``: the axes' title; by default what is shown (and the GPU, from
    the trace's folder), none for a ``span_us`` window (a panel of ``plot_timelines``)."""
    t0, t1 = steady_window(trace, first, count, None if span_us is None else span_us * 1e3)
    pad = 0.02 * (t1 - t0)
    lo, hi = t0 - pad, t1 + pad

    def clip(f):
        # a window of whole iterations shows what lies wholly in it (not the neighbours' ends);
        # a span shows whatever overlaps it
        if f is None or f.empty:
            return None
        f = (f[(f["start_ns"] >= lo) & (f["end_ns"] <= hi)] if span_us is None else
             f[(f["end_ns"] >= lo) & (f["start_ns"] <= hi)])
        return f if not f.empty else None

    nv = clip(trace.nvtx)
    gpu_df = clip(kernels(trace)) if trace.gpu is not None else None
    api_df = clip(trace.api) if api else None
    rows: List[Tuple[str, pd.DataFrame, object]] = []
    if nv is not None:
        for name in sorted(nv["range"].unique(), key=stage_order):
            rows.append((name, nv[nv["range"] == name], RANGE_COLOR))
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
            colors = [LAUNCH_COLOR if x else OTHER_API for x in f.get("launch", [True] * len(f))]
        else:
            colors = [color] * len(f)
        ax.broken_barh(list(zip(starts, widths)), (y - height / 2, height),
                       facecolors=colors, edgecolor=BLACK, linewidth=0.3)
    labels = [_short(r[0]) for r in rows]
    for y, (label, f, _) in enumerate(rows):
        if label.startswith("CUDA API") and f.empty:
            ax.text(0.5, y, "no CUDA API calls in this span", transform=ax.get_yaxis_transform(),
                    ha="center", va="center", fontsize=9, color="#555555")
        elif label.startswith("CUDA API"):
            _name_wide_calls(ax, f, y, t0, lo, hi)
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
    seen = {} if drawn is None else drawn  # every colour drawn is in the legend
    if nv is not None and not nv.empty:
        seen.setdefault("NVTX range (its row names it)", RANGE_COLOR)
    if gpu_df is not None:
        for n in sorted({short_kernel_name(n) for n in gpu_df["name"]}):
            seen[f"kernel: {n}"] = colors_of[n]
    if api_df is not None:
        launch = api_df.get("launch", pd.Series(True, index=api_df.index)).astype(bool)
        if launch.any():
            seen["CUDA API: a kernel launch"] = LAUNCH_COLOR
        if (~launch).any():
            _other_calls(seen, map(api_call_name, api_df.loc[~launch, "name"]))
    if legend:
        _legend_right(ax, _handles(seen))
    if title is None:
        gpu = trace_gpu(trace)
        last = first + count - 1
        title = (f"{gpu_title(gpu) + ': ' if gpu else ''}nsys timeline of iterations "
                 f"{first}–{last}: "
                 "host ranges and calls above the kernels they launched"
                 if span_us is None else "")
    if title:
        ax.set_title(title, fontsize="medium")
    return ax


def trace_gpu(trace: Trace) -> str:
    """The GPU a trace was taken on, when its files lie in a folder named after one
    (``profiles/<gpu>/``, as ``profile`` writes them); else ''."""
    from ..analysis.specs import SPECS

    folders = {p.parent.name for p in trace.files.values()}
    return folders.pop() if len(folders) == 1 and next(iter(folders)) in SPECS else ""


def _handles(drawn: Dict[str, str]):
    return [matplotlib.patches.Patch(facecolor=c, edgecolor=BLACK, label=label)
            for label, c in drawn.items()]


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
    drawn: Dict[str, str] = {}  # one legend for both panels, beside the first
    plot_timeline(eager, first, count, ax=axes[0], kernel_colors=colors, legend=False,
                  drawn=drawn, title="")
    gpu = trace_gpu(eager)
    axes[0].set_title(f"{gpu_title(gpu) + ': ' if gpu else ''}eager loop: one iteration every "
                      f"{s['period_us']:.1f} µs, "
                      f"{s['kernel_us']:.1f} µs of it on the GPU ({s['busy']:.0%} busy)",
                      fontsize="medium", loc="left")
    if graph is not None:
        g = steady_state(graph, stats_from)
        plot_timeline(graph, first, span_us=span_us, ax=axes[1], kernel_colors=colors,
                      legend=False, drawn=drawn, title="")
        axes[1].set_title(f"the same work replayed from one CUDA graph: one iteration every "
                          f"{g['period_us']:.1f} µs ({g['busy']:.0%} busy)",
                          fontsize="medium", loc="left")
        axes[0].set_xlabel("")
    _legend_right(axes[0], _handles(drawn))
    return axes


