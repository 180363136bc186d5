"""The cross-GPU figures (notebook 04 and the report). Every point says what it is, by marker and
legend: measured (filled circle, solid line), modelled (hollow square, dashed line), reported
(star). Each function takes an ``ax`` (a new figure when omitted) and returns it."""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from . import sweeps as _sweeps  # noqa: F401 (selects a headless backend where needed)
from ..analysis import MEASURED, MODELLED, REPORTED, model
from ..analysis.specs import measured_copy_bandwidth, spec

STYLE = {
    MEASURED: dict(marker="o", linestyle="-", fillstyle="full"),
    MODELLED: dict(marker="s", linestyle="--", fillstyle="none"),
    REPORTED: dict(marker="*", linestyle="none", markersize=13),
}
GPU_COLORS = {"h200": "tab:blue", "h100_sxm": "tab:orange", "h100_pcie": "tab:brown",
              "b200": "tab:green", "h100": "tab:orange"}


def _color(gpu: str) -> str:
    return GPU_COLORS.get(gpu, "tab:gray")


def _axes(ax, size=(7.5, 4.8)):
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt
    return plt.subplots(figsize=size)[1]


def _log2_x(ax, values) -> None:
    import matplotlib.ticker
    ticks = sorted(set(int(v) for v in values))
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(t) for t in ticks], rotation=45)
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


def plot_roofline(df: pd.DataFrame, reported: pd.DataFrame, impl: str = "cute.auto",
                  op: str = "fwd", gpus: Sequence[str] = model.MODEL_GPUS, N: int = model.REF_N,
                  cal: Optional[pd.DataFrame] = None, ax=None):
    """Memory roofline of a memory-bound op: achieved GB/s against M at width N. Roofs: each
    GPU's datasheet bandwidth (dotted) and, where the lab ran, its measured copy (dash-dot).
    Measured points of every GPU with results; the model's curve for every GPU; reported device
    times converted to GB/s with the same byte count."""
    cal = model.calibrate(df) if cal is None else cal
    ax = _axes(ax)
    Ms = np.array(model.MODEL_M, dtype=float)
    meas = model.measured_points(df, op, N)
    xs = list(Ms)
    for gpu in gpus:
        s, c = spec(gpu), _color(gpu)
        ax.axhline(s.bandwidth_gbps, color=c, linestyle=":", linewidth=1,
                   label=f"{gpu} datasheet {s.memory_bandwidth_tbps:g} TB/s")
        copy = measured_copy_bandwidth(df, gpu)
        if copy:
            ax.axhline(copy, color=c, linestyle="-.", linewidth=1,
                       label=f"{gpu} copy ({MEASURED})")
        t = model.device_us(cal, op, impl, gpu, Ms, N)
        if not np.all(np.isnan(t)):
            gbps = model.bytes_moved(op, Ms, N) / t / 1e3
            ax.plot(Ms, gbps, color=c, label=f"{gpu} {impl} ({MODELLED})", **STYLE[MODELLED])
    for gpu in sorted(meas["gpu"].unique()) if not meas.empty else []:
        m = meas[(meas["gpu"] == gpu) & (meas["impl"] == impl)].sort_values("M")
        if not m.empty:
            ax.plot(m["M"], m["GBps"], color=_color(gpu), label=f"{gpu} {impl} ({MEASURED})",
                    **STYLE[MEASURED])
            xs += list(m["M"])
    if not reported.empty:
        r = reported[(reported["op"] == op) & (reported["metric"] == "time")
                     & reported["path"].isin(["graph", "device"]) & (reported["N"] == N)
                     & reported["M"].notna()]
        for x in r.itertuples():
            gbps = model.bytes_moved(op, int(x.M), N) / x.value / 1e3
            ax.plot([int(x.M)], [gbps], color=_color(x.gpu),
                    label=f"{x.gpu} {x.impl} ({REPORTED}, {x.source.rsplit('/', 1)[-1]})",
                    **STYLE[REPORTED])
    _log2_x(ax, xs)
    ax.set_ylim(0, max(spec(g).bandwidth_gbps for g in gpus) * 1.08)
    ax.set_xlabel("M (rows)")
    ax.set_ylabel("GB/s (minimum traffic / time)")
    ax.set_title(f"{op} memory roofline, N={N}, bf16: {impl}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="x-small", ncol=2, loc="lower right")
    return ax


def plot_crossover(df: pd.DataFrame, impls: Sequence[str] = ("liger.cutedsl", "liger.triton",
                                                              "cute.auto", "triton.row"),
                   op: str = "fwd", gpus: Sequence[str] = model.MODEL_GPUS, N: int = model.REF_N,
                   cal: Optional[pd.DataFrame] = None, hosts: Optional[pd.DataFrame] = None,
                   device_impl: str = "liger.triton", ax=None):
    """Device µs against M per GPU (modelled dashed; measured solid) and each implementation's
    measured host µs per call (horizontal lines, the same on every GPU by assumption). Where a
    device curve crosses a host line is that implementation's crossover M on that GPU: left of
    it the call is host-bound."""
    cal = model.calibrate(df) if cal is None else cal
    hosts = model.host_costs(df, op=op) if hosts is None else hosts
    ax = _axes(ax)
    Ms = np.array(model.MODEL_M, dtype=float)
    for gpu in gpus:
        t = model.device_us(cal, op, device_impl, gpu, Ms, N)
        if not np.all(np.isnan(t)):
            ax.plot(Ms, t, color=_color(gpu),
                    label=f"{gpu} device, {device_impl} ({MODELLED})", **STYLE[MODELLED])
    meas = model.measured_points(df, op, N)
    for gpu in sorted(meas["gpu"].unique()) if not meas.empty else []:
        m = meas[(meas["gpu"] == gpu) & (meas["impl"] == device_impl)].sort_values("M")
        if not m.empty:
            ax.plot(m["M"], m["time_us"], color=_color(gpu),
                    label=f"{gpu} device, {device_impl} ({MEASURED})", **STYLE[MEASURED])
    styles = ["-", "--", "-.", ":"]
    for i, name in enumerate(impls):
        shown, h = model.resolve_host(hosts, name)
        if not math.isfinite(h):
            continue
        ax.axhline(h, color="black", linestyle=styles[i % 4], linewidth=1.2, alpha=0.7,
                   label=f"host {shown}: {h:.0f} µs ({MEASURED} on h200's host)")
        for gpu in gpus:
            m = model.crossover_M(cal, op, model.device_impl(name), h, gpu, N)
            if math.isfinite(m) and Ms[0] <= m <= Ms[-1]:
                ax.plot([m], [h], marker="s", fillstyle="none", color=_color(gpu), markersize=9,
                        linestyle="none")
    _log2_x(ax, Ms)
    ax.set_yscale("log")
    ax.set_xlabel("M (rows)")
    ax.set_ylabel("µs per call")
    ax.set_title(f"{op}, N={N}: host enqueue vs device time; squares = crossover M (modelled)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="x-small", loc="upper left")
    return ax


def plot_reported_vs_modelled(pr: pd.DataFrame, ax=None, title_suffix: str = ""):
    """CuTe / Triton time per GPU and M: reported (star), modelled per-call (hollow square),
    modelled device-only (hollow triangle), measured eager on the H200 (filled circle).
    Below 1: CuTe faster."""
    ax = _axes(ax)
    labels, x = [], 0
    seen = set()

    def once(label):
        if label in seen:
            return None
        seen.add(label)
        return label

    for pair, g in pr.groupby("pair", sort=False):
        for _, r in g.iterrows():
            c = _color(r["gpu"])
            ax.plot([x], [r["call ratio (modelled)"]], color=c,
                    label=once(f"call ratio ({MODELLED})"),
                    **{**STYLE[MODELLED], "linestyle": "none", "markersize": 8})
            ax.plot([x], [r["device ratio"]], color=c, marker="^", fillstyle="none",
                    linestyle="none",
                    label=once(f"device-only ratio ({MODELLED})"))
            if math.isfinite(r["reported ratio"]):
                ax.plot([x], [r["reported ratio"]], color=c, label=once(f"ratio ({REPORTED})"),
                        **STYLE[REPORTED])
            if math.isfinite(r["measured eager ratio"]):
                ax.plot([x], [r["measured eager ratio"]], color=c,
                        label=once(f"eager ratio ({MEASURED})"),
                        **{**STYLE[MEASURED], "linestyle": "none"})
            labels.append(f"{r['gpu']}\nM={r['M']}\n{pair.split(' / ')[0]}")
            x += 1
    ax.axhline(1.0, color="black", linewidth=1)
    ax.axhspan(1 - model.PARITY, 1 + model.PARITY, color="gray", alpha=0.15, lw=0)
    ax.set_xticks(range(x), labels, fontsize="x-small")
    ax.set_ylabel("CuTe time / Triton time")
    ax.set_title("CuTe vs Triton per call (colour = GPU; grey band = parity ±5%)" + title_suffix)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize="x-small")
    return ax
