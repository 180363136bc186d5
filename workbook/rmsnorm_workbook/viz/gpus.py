"""The cross-GPU figures (notebook 04 and the report). Every point says what it is, by marker and
legend: measured (filled marker, solid line), modelled (hollow marker, dashed line), reported
(star). Colours follow the GPU (Okabe and Ito's palette); at most five series per axes, small
multiples (one panel per GPU) where there would be more; legends beside the data. Each function
takes an ``ax`` (or ``axes``; a new figure when omitted) and returns it."""

from __future__ import annotations

import math
from typing import Dict, Optional, Sequence

import matplotlib.lines
import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.transforms import ScaledTranslation, blended_transform_factory

from . import sweeps as _sweeps  # noqa: F401 (selects a headless backend where needed)
from ..analysis import MEASURED, MODELLED, REPORTED, model, speed
from ..analysis.crossover import crossover_table
from ..analysis.specs import has_spec, measured_copy_bandwidth, spec
from ..results.provenance import gpu_title

BLUE, VERMILLION, GREEN, PURPLE = "#0072B2", "#D55E00", "#009E73", "#CC79A7"
ORANGE, BLACK, GREY = "#E69F00", "#000000", "#999999"
OP_MARKERS = {"fwd": "o", "bwd": "^"}
OP_COLORS = {"fwd": BLUE, "bwd": VERMILLION}
STYLE = {
    MEASURED: dict(marker="o", linestyle="-", fillstyle="full"),
    MODELLED: dict(marker="s", linestyle="--", fillstyle="none"),
    REPORTED: dict(marker="*", linestyle="none", markersize=13),
}


def _color(gpu: str) -> str:
    return spec(gpu).colour if has_spec(gpu) else GREY


def _axes(ax, size=(7.5, 4.8)):
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt
    return plt.subplots(figsize=size, constrained_layout=True)[1]


def _panels(n: int, width: float = 4.6, height: float = 4.2, sharey: bool = True):
    import matplotlib.pyplot as plt
    return plt.subplots(1, n, figsize=(width * n + 2.4, height), sharey=sharey,
                        constrained_layout=True, squeeze=False)[1][0]


def _log2_x(ax, values) -> None:
    ticks = sorted(set(int(v) for v in values))
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [f"{t:,}" if t < 1024 else f"{t // 1024}K" for t in ticks])
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


def _plain(axis) -> None:
    axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def _legend_right(ax, handles=None) -> None:
    if handles is None:
        handles, _ = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.03, 1.0),
                  fontsize="small", frameon=False)


def _handle(label, **kw):
    kw.setdefault("linestyle", "none")
    return matplotlib.lines.Line2D([], [], label=label, **kw)


# ============================================================================ speed of light

def _roofline_limits(points: pd.DataFrame, gpus: Sequence[str]):
    """(x range, y range) of the roofline panels: from just left of the leftmost point to just
    right of the highest ridge; from under the lowest point to over the highest peak."""
    ridges = [spec(g).ridge_flop_per_byte for g in gpus]
    peaks = [spec(g).fp32_tflops for g in gpus]
    ai = points["intensity"].to_numpy(dtype=float) if not points.empty else np.array([1.0])
    tf = points["TFLOPs"].to_numpy(dtype=float) if not points.empty else np.array([1.0])
    tf = tf[np.isfinite(tf) & (tf > 0)]
    return ((np.nanmin(ai) / 2.5, max(ridges) * 3.5),
            (float(np.min(tf)) / 2.5 if tf.size else 0.5, max(peaks) * 1.6))


#: points right of its op's intensity at which a GPU's reported stars of that op are drawn, on
#: one line from the lowest to the highest: beside the lab's point, not behind it (their data
#: stay at their intensity; right of it the roof is higher, so no star seems to pass it)
STAR_NUDGE_PT = 9.0


def _shape(r) -> str:
    """``M×N`` of a point; ``N=…, M not given`` for a reported bandwidth without a row count."""
    return f"{r.M}×{r.N}" if pd.notna(r.time_us) else f"N={r.N}, M not given"


def _shapes(rows: pd.DataFrame) -> str:
    """The shapes of ``rows`` (``_shape``), one a line, each with how many points it has where
    more than one shape is listed."""
    counts = pd.Series([_shape(r) for r in rows.itertuples(index=False)]).value_counts()
    if len(counts) == 1:
        return counts.index[0]
    return "\n".join(f"{k} ({n})" for k, n in counts.items())


def plot_speed_of_light(points: pd.DataFrame, gpus: Sequence[str] = model.MODEL_GPUS,
                        df: Optional[pd.DataFrame] = None, axes=None):
    """The roofline, one panel per GPU: attainable TFLOP/s against arithmetic intensity
    (FLOP/byte, log-log), over the range the points and the ridge points span. The roof is
    min(FP32 peak, intensity × datasheet bandwidth), its corner the ridge point; where the lab
    measured a copy on that GPU, the bandwidth it reached is a second, dashed roof. ``points``
    (``analysis.speed.sol_points``): RMSNorm's forward (circle) and backward (triangle), filled
    where measured, hollow where modelled, each at its own intensity; stars where reported, one
    op's on one line beside the lab's point (``STAR_NUDGE_PT``). The legend names the lab's
    shape, each panel the shapes of its stars."""
    axes = _panels(len(gpus)) if axes is None else axes
    (x0, x1), (y0, y1) = _roofline_limits(points[points["gpu"].isin(gpus)], gpus)
    ai = np.geomspace(x0, x1, 200)
    for ax, g in zip(axes, gpus):
        s, c = spec(g), _color(g)
        ax.plot(ai, speed.roof_tflops(g, ai), color=BLACK, linewidth=1.6)
        copy = measured_copy_bandwidth(df, g) if df is not None and not df.empty else None
        if copy:
            ax.plot(ai, speed.roof_tflops(g, ai, copy), color=BLACK, linestyle="--",
                    linewidth=1)
        ax.axvline(s.ridge_flop_per_byte, color=GREY, linestyle=":", linewidth=1)
        # left of the ridge, above the roof: the slope is lower there, and the text stays
        # inside the panel however close the ridge is to its right edge
        ax.annotate(f"ridge {s.ridge_flop_per_byte:.0f} FLOP/B", (s.ridge_flop_per_byte,
                                                                 s.fp32_tflops),
                    xytext=(-4, 4), textcoords="offset points", fontsize=8, color="#444444",
                    ha="right", va="bottom")
        here = points[points["gpu"] == g]
        for r in here[here["kind"] != REPORTED].itertuples(index=False):
            ax.plot([r.intensity], [r.TFLOPs], marker=OP_MARKERS.get(r.op, "o"),
                    color=OP_COLORS.get(r.op, GREY), markersize=9, linestyle="none",
                    zorder=3, fillstyle="full" if r.kind == MEASURED else "none",
                    markeredgewidth=1.8)
        stars = here[here["kind"] == REPORTED]
        nudge = ax.transData + ScaledTranslation(STAR_NUDGE_PT / 72, 0,
                                                 ax.figure.dpi_scale_trans)
        for op, g_stars in stars.groupby("op", sort=False):
            oc = OP_COLORS.get(op, GREY)
            x, y = g_stars["intensity"].to_numpy(float), g_stars["TFLOPs"].to_numpy(float)
            ax.plot([x.mean()] * 2, [y.min(), y.max()], color=oc, linewidth=1.2,
                    transform=nudge, zorder=2)
            for xi, yi in zip(x, y):
                ax.plot([xi], [yi], marker="*", color=oc, markersize=9, markeredgecolor=BLACK,
                        markeredgewidth=0.5, linestyle="none", zorder=2, transform=nudge)
        if not stars.empty:  # under the roof's right end, where no point is drawn
            ax.text(0.97, 0.04, f"stars: {REPORTED} at\n{_shapes(stars)}",
                    transform=ax.transAxes, ha="right", va="bottom", fontsize=7.5,
                    color="#444444")
        ax.set_xscale("log")
        ax.set_yscale("log")
        _plain(ax.xaxis)
        _plain(ax.yaxis)
        ax.set_xlim(x0, x1)
        ax.set_ylim(y0, y1)
        ax.set_title(f"{gpu_title(g)}: {s.memory_bandwidth_tbps:g} TB/s, {s.fp32_tflops:g} "
                     "FP32 TFLOP/s", fontsize="medium", color=c)
        ax.set_xlabel("arithmetic intensity (FLOP / byte of DRAM traffic)")
        ax.grid(True, which="major", alpha=0.3)
    axes[0].set_ylabel("attainable TFLOP/s")
    lab = points[points["gpu"].isin(gpus) & (points["kind"] != REPORTED)]
    impl = ", ".join(sorted(set(lab["impl"]))) or "the lab"
    at = f" at {_shapes(lab)}" if not lab.empty else ""
    handles = [_handle("roof: datasheet bandwidth × intensity, FP32 peak", color=BLACK,
                       linestyle="-"),
               _handle("roof at the bandwidth a copy reached (measured)", color=BLACK,
                       linestyle="--"),
               _handle(f"forward, {impl}{at}\n(filled: measured; hollow: modelled)",
                       marker="o", color=BLUE, markersize=8),
               _handle(f"backward, {impl}{at}\n(filled: measured; hollow: modelled)",
                       marker="^", color=VERMILLION, markersize=8, fillstyle="none",
                       markeredgewidth=1.5),
               _handle("reported elsewhere, at the shapes each panel names\n(colour: forward "
                       "/ backward; one op's on one line,\ndrawn just right of its intensity)",
                       marker="*", color=GREY, markersize=11, markeredgecolor=BLACK,
                       markeredgewidth=0.5, linestyle="-")]
    _legend_right(axes[-1], handles)
    where = sorted(set(points[points["kind"] == MEASURED]["gpu"]) & set(gpus))
    axes[0].figure.suptitle(
        f"Roofline per GPU: RMSNorm's forward and backward ({impl}{at})"
        + (f", measured on the {', '.join(gpu_title(g) for g in where)}, modelled and "
           "reported elsewhere" if where else ", modelled and reported"), fontsize="medium")
    return axes


def plot_bandwidth_vs_M(df: pd.DataFrame, reported: pd.DataFrame, impl: str = "cute.auto",
                        op: str = "fwd", gpus: Sequence[str] = model.MODEL_GPUS,
                        N: int = model.REF_N, cal: Optional[pd.DataFrame] = None, ax=None):
    """How close to its datasheet bandwidth each GPU's kernel gets as M grows: achieved GB/s as a
    % of the datasheet figure, modelled (dashed, hollow) for every GPU, measured (solid, filled)
    where the lab ran, reported device times (stars, labelled with the implementation they
    report, which need not be ``impl``) converted with the same byte count."""
    cal = model.calibrate(df) if cal is None else cal
    ax = _axes(ax, (8.5, 4.6))
    Ms = np.array(model.MODEL_M, dtype=float)
    for g in gpus:
        t = model.device_us(cal, op, impl, g, Ms, N)
        if not np.all(np.isnan(t)):
            pct = 100 * model.bytes_moved(op, Ms, N) / t / 1e3 / spec(g).bandwidth_gbps
            ax.plot(Ms, pct, color=_color(g), label=f"{gpu_title(g)} ({MODELLED})",
                    **STYLE[MODELLED])
    meas = model.measured_points(df, op, N)
    for g in sorted(meas["gpu"].unique()) if not meas.empty else []:
        m = meas[(meas["gpu"] == g) & (meas["impl"] == impl)].sort_values("M")
        if not m.empty:
            ax.plot(m["M"], 100 * m["GBps"] / model.spec_of(g).bandwidth_gbps, color=_color(g),
                    label=f"{gpu_title(g)} ({MEASURED})", **STYLE[MEASURED])
    if not reported.empty:
        r = reported[(reported["op"] == op) & (reported["metric"] == "time")
                     & reported["path"].isin(["graph", "device"]) & (reported["N"] == N)
                     & reported["M"].notna()]
        stars = [(int(x.M), 100 * model.bytes_moved(op, int(x.M), N) / x.value / 1e3
                  / spec(x.gpu).bandwidth_gbps, x.gpu, x.impl)
                 for x in r.sort_values("value").itertuples()]
        for i, (m, pct, g, _) in enumerate(stars):
            ax.plot([m], [pct], color=_color(g),
                    label=None if i else f"{REPORTED} device times (colour: the GPU; label: the kernels)",
                    markeredgecolor=BLACK, markeredgewidth=0.5, **STYLE[REPORTED])
        # a source reports its own kernels, often at one point: one label per group of stars
        # that coincide, under the curves (they rise with M), an arrow to its stars; a star in
        # the right half has its label end at the axes' right edge, so it stays inside them
        at_m: dict = {}
        span = np.log2(Ms.max() / Ms.min())
        for m, pct, g, names in _star_groups(stars):
            k = at_m[m] = at_m.get(m, -1) + 1  # groups at one M: stacked further down
            dy = -34 - 30 * k
            if np.log2(m / Ms.min()) / span <= 0.5:
                where, xytext, ha = "offset points", (14, dy), "left"
            else:
                where = (blended_transform_factory(ax.transAxes, ax.transData)
                         + ScaledTranslation(0, dy / 72, ax.figure.dpi_scale_trans))
                xytext, ha = (0.98, pct), "right"
            ax.annotate(_star_label(names, g), (m, pct), xytext=xytext, textcoords=where,
                        fontsize=7, color="#444444", va="top", ha=ha,
                        arrowprops=dict(arrowstyle="-", color=GREY, linewidth=0.8,
                                        shrinkA=0, shrinkB=6))
    _log2_x(ax, Ms)
    ax.set_ylim(0, 100)
    ax.set_xlabel(f"M (rows), N={N} bf16")
    ax.set_ylabel("% of the datasheet bandwidth")
    kernel = "the lab's default kernel" if impl == "cute.auto" else impl
    ax.set_title(f"{op}: share of each GPU's datasheet bandwidth (lines: {kernel})",
                 fontsize="medium")
    ax.grid(True, alpha=0.3)
    _legend_right(ax)
    return ax


#: reported stars closer than this (percentage points of the datasheet bandwidth, same M and
#: GPU) share one label
COINCIDE_PCT = 1.5


def _star_groups(stars):
    """``(M, %, gpu, impl)`` stars grouped where they coincide (same M and GPU, within
    ``COINCIDE_PCT`` of the next lower one): ``(M, mean %, gpu, [impl, ...])`` per group, by M
    and GPU."""
    groups = []
    for m, pct, g, name in sorted(stars, key=lambda s: (s[0], s[2], s[1])):
        last = groups[-1] if groups else None
        if last and last[0] == m and last[2] == g and abs(pct - last[1][-1]) <= COINCIDE_PCT:
            last[1].append(pct)
            last[3].append(name)
        else:
            groups.append((m, [pct], g, [name]))
    return [(m, float(np.mean(p)), g, names) for m, p, g, names in groups]


#: how a star's label names a project and its kernels
_PROJECTS = {"liger": "Liger-Kernel"}
_KERNELS = {"cutedsl": "CuTe DSL", "triton": "Triton", "cutile": "cuTile"}


def _star_label(names, gpu: str) -> str:
    """One label for coinciding stars: ``liger.triton (H100 SXM)``, or for several of one
    source ``3 Liger-Kernel kernels (H100 SXM): CuTe DSL, Triton, cuTile``."""
    gpu = gpu_title(gpu)
    if len(names) == 1:
        return f"{names[0]} ({gpu})"
    heads = {n.split(".", 1)[0] for n in names}
    if len(heads) == 1 and all("." in n for n in names):
        head = heads.pop()
        return (f"{len(names)} {_PROJECTS.get(head, head)} kernels ({gpu}):\n"
                + ", ".join(_KERNELS.get(t, t) for t in (n.split(".", 1)[1] for n in names)))
    return f"{len(names)} kernels ({gpu}):\n" + ", ".join(names)


# ============================================================================ crossover

CROSSOVER_IMPLS = ("liger.cutedsl", "liger.triton", "cute.auto")
_HOST_STYLES = (("--", VERMILLION), (":", PURPLE), ("-.", BLUE), ((0, (5, 2, 1, 2)), GREEN))
#: each implementation's marker on its kernel curve (filled where measured, hollow where modelled)
_IMPL_MARKERS = ("o", "s", "^", "D")


def _measured_crossovers(df: pd.DataFrame, names: Sequence[str], gpu: str) -> Dict[str, float]:
    """``analysis.crossover``'s crossover M of each host-measured name on ``gpu`` (bracketed
    ones only)."""
    t = crossover_table(df, names, gpu)
    return {i: r["crossover M"] for i, r in t.iterrows() if r["bound"] == "="}


def plot_crossover(df: pd.DataFrame, impls: Sequence[str] = CROSSOVER_IMPLS, op: str = "fwd",
                   gpus: Sequence[str] = model.MODEL_GPUS, N: int = model.REF_N,
                   cal: Optional[pd.DataFrame] = None, hosts: Optional[pd.DataFrame] = None,
                   axes=None, ax=None):
    """One panel per GPU; for each of ``impls``, in one colour: its measured host µs per call
    (the same on every GPU, by assumption) as a horizontal line and its own kernel's device
    µs against M as a curve, measured (solid, filled) on a GPU the lab ran on, modelled
    (dashed, hollow) elsewhere; a ring where the two meet, the crossover (``analysis.crossover``
    where measured, ``model.crossover_M`` where modelled). Left of a ring the call is
    host-bound."""
    cal = model.calibrate(df) if cal is None else cal
    hosts = model.host_costs(df, op=op) if hosts is None else hosts
    if axes is None:
        axes = [ax] if ax is not None else _panels(len(gpus), 4.2, 4.0)
        gpus = gpus[:len(axes)]
    Ms = np.array(model.MODEL_M, dtype=float)
    meas = model.measured_points(df, op, N)
    shown = {name: model.resolve_host(hosts, name) for name in impls}
    shown = {k: v for k, v in shown.items() if v[0] is not None and math.isfinite(v[1])}
    for a, g in zip(axes, gpus):
        here = meas[meas["gpu"] == g] if not meas.empty else meas
        crossed = _measured_crossovers(df, [v[0] for v in shown.values()], g) \
            if not here.empty else {}
        curves: Dict[str, pd.Series] = {}
        for i, (name, (host_name, h)) in enumerate(shown.items()):
            ls, c = _HOST_STYLES[i % len(_HOST_STYLES)]
            kernel = model.device_impl(name)
            a.axhline(h, color=c, linestyle=ls, linewidth=1.4)
            m = here[here["impl"] == kernel].sort_values("M") if not here.empty else here
            mark = _IMPL_MARKERS[i % len(_IMPL_MARKERS)]
            if not m.empty:
                # one marker per implementation, each smaller than the one before: curves that
                # lie on top of each other still show every marker
                a.plot(m["M"], m["time_us"], color=c, linewidth=1.2,
                       **dict(STYLE[MEASURED], marker=mark, markersize=max(3.0, 7.0 - 1.5 * i)))
                x = crossed.get(host_name, math.nan)
                curves[name] = m.set_index("M")["time_us"]
            else:
                a.plot(Ms, model.device_us(cal, op, kernel, g, Ms, N), color=c, markersize=4,
                       linewidth=1.2, **dict(STYLE[MODELLED], marker=mark))
                x = model.crossover_M(cal, op, kernel, h, g, N)
            if math.isfinite(x) and Ms[0] <= x <= Ms[-1]:
                a.plot([x], [h], "o", color=c, markersize=10, markerfacecolor="none",
                       markeredgewidth=1.8, zorder=4)
        _log2_x(a, Ms[::2])
        a.set_xlim(Ms[0] / 1.3, Ms[-1] * 1.3)
        a.set_yscale("log")
        a.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        _plain(a.yaxis)
        if curves:
            _unmeasured_span(a, Ms, min(float(c.index.min()) for c in curves.values()))
            _coincide_note(a, curves)
        a.set_title(gpu_title(g) + (f" ({MEASURED})" if curves else f" ({MODELLED})"),
                    fontsize="medium", color=_color(g))
        a.set_xlabel(f"M (rows), N={N}")
        a.grid(True, which="major", alpha=0.3)
    axes[0].set_ylabel("µs per call (log scale)")
    handles = [_handle(f"{host_name}: host {h:.0f} µs (line), its kernel (curve)", color=c,
                       linestyle=ls, marker=_IMPL_MARKERS[i % len(_IMPL_MARKERS)])
               for i, ((host_name, h), (ls, c)) in enumerate(zip(shown.values(), _HOST_STYLES))]
    handles += [_handle(f"kernel µs, {MEASURED} (filled, solid)", color=GREY,
                        **STYLE[MEASURED]),
                _handle(f"kernel µs, {MODELLED} (hollow, dashed)", color=GREY,
                        **dict(STYLE[MODELLED], marker="o"))]
    _legend_right(axes[-1], handles[:5])
    axes[0].figure.suptitle(f"{op}, N={N}: host time per call (lines) against kernel time "
                            "(curves) per GPU; rings: the crossover, left of it the call is "
                            "host-bound", fontsize="medium")
    return axes


def _unmeasured_span(ax, Ms, first: float) -> None:
    """Grey out the sizes left of the first M with a kernel time on inputs read from DRAM (the
    curves' data), so the empty stretch reads as not measured that way rather than as missing
    data."""
    if first <= Ms[0]:
        return
    edge = first / math.sqrt(2)  # halfway (in log) to the size below it
    ax.axvspan(Ms[0] / 1.3, edge, color=GREY, alpha=0.15, linewidth=0)
    ax.text(math.sqrt(Ms[0] / 1.3 * edge), 0.03,
            f"no kernel time\nfrom DRAM\nbelow M={first:,.0f}",
            transform=ax.get_xaxis_transform(), ha="center", va="bottom", fontsize=7,
            color="#444444")


def _coincide_note(ax, curves: Dict[str, pd.Series]) -> None:
    """Where several measured curves were drawn, how far apart they lie (max/min - 1 at the
    smallest and largest M they share), written in the panel: on a log axis a few % apart
    looks like one line."""
    both = pd.concat(curves, axis=1).dropna()
    if len(curves) < 2 or both.empty:
        return
    spread = both.max(axis=1) / both.min(axis=1) - 1
    lo, hi = both.index.min(), both.index.max()
    ax.text(0.03, 0.97, f"measured kernels within\n{spread[lo]:.0%} of each other at "
            f"M={lo:,.0f},\n{spread[hi]:.0%} at M={hi:,.0f}", transform=ax.transAxes,
            ha="left", va="top", fontsize=7, color="#444444")


# ================================================ Liger-Kernel PR #1336's ratios, CuTe / Triton

def plot_reported_vs_modelled(pr: pd.DataFrame, scenario: Optional[pd.DataFrame] = None,
                              scenario_label: str = "", ax=None, title_suffix: str = ""):
    """CuTe time / Triton time per GPU and M (the PR's pair), on a log axis centred on 1 with
    the parity band: reported (star), modelled per call (hollow square), modelled kernels alone
    (hollow triangle), ``scenario``'s modelled per-call ratio (hollow diamond) and the ratio
    measured eagerly on the H200 (filled circle), side by side within each (GPU, M); the y range
    spans the data and the parity band. Below 1: CuTe faster."""
    ax = _axes(ax, (9, 4.6))
    keys = list(pr[["gpu", "M"]].itertuples(index=False, name=None))
    xs = np.arange(len(keys))
    series = [("call ratio (modelled)", f"per call ({MODELLED})",
               dict(marker="s", fillstyle="none", color=BLUE, markersize=9)),
              ("device ratio (modelled)", f"kernels alone ({MODELLED})",
               dict(marker="^", fillstyle="none", color=GREY, markersize=9)),
              ("reported ratio", f"{REPORTED}", dict(marker="*", color=VERMILLION,
                                                     markersize=14)),
              ("measured eager ratio",
               f"eager ({MEASURED}, {gpu_title(model.CALIBRATION_GPU)})",
               dict(marker="o", color=BLACK, markersize=7))]
    scen = None
    if scenario is not None and not scenario.empty:
        scen = scenario.set_index(["gpu", "M"]).reindex(keys)["call ratio (modelled)"]
    drawn = [(label, pr[col].to_numpy(dtype=float), kw) for col, label, kw in series]
    if scen is not None:
        drawn.append((scenario_label or "scenario", scen.to_numpy(dtype=float),
                      dict(marker="D", fillstyle="none", color=GREEN, markersize=8)))
    drawn = [(label, v, kw) for label, v, kw in drawn if np.isfinite(v).any()]
    width = 0.15  # series side by side within each (GPU, M) group, so none hides another,
    # the outermost well inside the group's separators
    for x in xs[1:]:
        ax.axvline(x - 0.5, color=GREY, linewidth=0.6, alpha=0.5)
    for j, (label, v, kw) in enumerate(drawn):
        ax.plot(xs + (j - (len(drawn) - 1) / 2) * width, v, linestyle="none", label=label, **kw)
    allv = np.concatenate([v for _, v, _ in drawn] + [np.array([1 - model.PARITY,
                                                                1 + model.PARITY])])
    allv = allv[np.isfinite(allv) & (allv > 0)]
    lo, hi = float(allv.min()) / 1.15, float(allv.max()) * 1.15  # the data, the parity band
    ax.set_yscale("log")
    ax.set_ylim(lo, hi)
    candidates = (0.1, 0.2, 0.25, 0.33, 0.5, 0.67, 0.8, 1.0, 1.25, 1.5, 2, 3, 5, 10)
    ticks = [t for t in candidates if lo <= t <= hi]
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    ax.axhline(1.0, color=BLACK, linewidth=1)
    ax.axhspan(1 - model.PARITY, 1 + model.PARITY, color=GREY, alpha=0.2, lw=0)
    ax.set_xticks(xs, [f"{gpu_title(g)}\nM={m}" for g, m in keys], fontsize="small")
    ax.set_xlim(-0.5, len(keys) - 0.5)
    ax.set_ylabel("CuTe time / Triton time (log)")
    ax.set_title("Liger-Kernel's CuTe DSL vs Triton forward, N=4096 (grey band: parity ±5%)"
                 + title_suffix, fontsize="medium")
    ax.grid(True, axis="y", alpha=0.3)
    _legend_right(ax)
    return ax

