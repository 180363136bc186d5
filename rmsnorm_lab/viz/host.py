"""Figures and tables of the host-overhead study (notebooks/03_host_overhead.ipynb), drawn from
``results/<gpu>/host.csv`` (``rmsnorm_lab.bench.host``) and from nsys trace CSVs
(``rmsnorm_lab.profiling.trace``).

Impl names in host.csv carry the launch path after ``@`` and a toggle after it:
``cute.auto@tvm_ffi``, ``cute.auto@cached``, ``cute.auto@tvm_ffi+nvtx``,
``cute.auto@tvm_ffi-sm_count_cache``, ``cute.auto@tvm_ffi+settings_per_call``,
``cute.auto@tvm_ffi+python_node``; peers keep their
names (``liger.triton``, ``torch.native``...). Op ``fwd`` rows whose impl ends in ``+autograd``
built the autograd graph; op ``full`` is forward + backward. Here these become a *workload*:
``fwd``, ``fwd+autograd`` or ``full``.

Every function takes a results DataFrame (``results.load``/``load_all``) and uses the newest
measurement of each point (``results.latest``); plots take an ``ax`` and return it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional, Sequence, Tuple

import matplotlib.patches
import matplotlib.ticker
import numpy as np
import pandas as pd

from ..profiling.trace import Trace, launches, stage_order, window
from ..results import read_jsonl
from ..settings import LAUNCH_PATHS, Experiments
from .sweeps import _axes, _log2_x, _one_gpu, whisker_barh

HOST_SHAPE = (128, 4096)
CACHE_SHAPE = (16384, 4096)
WORKLOADS = ("fwd", "fwd+autograd", "full")
AUTOGRAD = "+autograd"
#: the launch path of the default experiments, and its impl name in host.csv
DEFAULT_PATH = Experiments().launch_path
DEFAULT_IMPL = f"cute.auto@{DEFAULT_PATH}"
#: what each toggle row measures, against DEFAULT_IMPL
TOGGLES = {
    "+nvtx": "NVTX ranges on (settings.nvtx)",
    "-sm_count_cache": "SM count asked of the driver per call (no SM-count cache)",
    "+settings_per_call": "RMSNORM_LAB_* environment re-read per call",
    "+python_node": "Python launch path and autograd node instead of the C++ extension "
                    "(settings.experiments.autograd_node)",
}
#: the most NVTX ranges may add to a forward call, µs: the target the notebook holds the
#: measured cost of ranges on, and of ranges off, against
NVTX_BUDGET_US = 0.5


# ============================================================================ names

def split_impl(impl: str) -> Tuple[str, Optional[str], str]:
    """``"cute.auto@tvm_ffi+nvtx"`` -> ``("cute.auto", "tvm_ffi", "+nvtx")``; a peer ->
    ``(name, None, "")``; ``"cute.auto@cached:8"`` -> ``("cute.auto", "cached", ":8")``."""
    if "@" not in impl:
        return impl, None, ""
    base, rest = impl.split("@", 1)
    for path in sorted(LAUNCH_PATHS, key=len, reverse=True):
        if rest.startswith(path):
            return base, path, rest[len(path):]
    return base, rest, ""


def _workload(op: str, impl: str) -> Tuple[Optional[str], str]:
    if op == "full":
        return "full", impl
    if op == "fwd":
        if impl.endswith(AUTOGRAD):
            return "fwd+autograd", impl[:-len(AUTOGRAD)]
        return "fwd", impl
    return None, impl


def host_rows(df: pd.DataFrame, gpu: Optional[str] = None,
              shape: Tuple[int, int] = HOST_SHAPE) -> pd.DataFrame:
    """The host µs rows at ``shape`` as ``impl`` (without ``+autograd``), ``workload``, ``p20``,
    ``p50``, ``p80``."""
    d, _ = _one_gpu(df, gpu)
    d = d[(d["metric"] == "host") & (d["path"] == "host") & (d["M"] == shape[0])
          & (d["N"] == shape[1])]
    rows = []
    for r in d.itertuples(index=False):
        w, impl = _workload(r.op, r.impl)
        if w is not None:
            rows.append({"impl": impl, "workload": w, "p20": r.p20, "p50": r.p50, "p80": r.p80})
    return pd.DataFrame(rows, columns=["impl", "workload", "p20", "p50", "p80"])


def host_order(impls: Sequence[str]) -> List[str]:
    """Launch paths of the lab in ``LAUNCH_PATHS`` order (toggles after their path), then Triton,
    then peers alphabetically."""
    def key(name):
        base, path, toggle = split_impl(name)
        if path is not None:
            p = LAUNCH_PATHS.index(path) if path in LAUNCH_PATHS else len(LAUNCH_PATHS)
            return (0, p, toggle)
        return (1 if name.startswith(("cute.", "triton.")) else 2, 0, name)
    return sorted(set(impls), key=key)


def host_table(df: pd.DataFrame, gpu: Optional[str] = None,
               shape: Tuple[int, int] = HOST_SHAPE, quantile: str = "p50") -> pd.DataFrame:
    """Host µs per call (``quantile``), one row per implementation, one column per workload."""
    h = host_rows(df, gpu, shape)
    t = h.pivot_table(index="impl", columns="workload", values=quantile, aggfunc="last")
    t = t.reindex(index=host_order(t.index), columns=[w for w in WORKLOADS if w in t.columns])
    t.columns.name = None
    return t


def is_launch_path(impl: str) -> bool:
    base, path, toggle = split_impl(impl)
    return path in LAUNCH_PATHS and toggle == ""


def is_toggle(impl: str) -> bool:
    base, path, toggle = split_impl(impl)
    return path is not None and toggle in TOGGLES


# ============================================================================ host µs bars

def plot_host(df: pd.DataFrame, gpu: Optional[str] = None, shape=HOST_SHAPE,
              toggles: bool = False, ax=None):
    """Host µs per call (median, whiskers p20-p80) per launch path and per peer, one bar per
    workload (fwd, fwd+autograd, full); toggle rows only with ``toggles``."""
    d, gpu = _one_gpu(df, gpu)
    h = host_rows(d, gpu, shape)
    if not toggles:
        h = h[[not is_toggle(i) for i in h["impl"]]]
    impls = host_order(h["impl"])
    ax = _axes(ax)
    workloads = [w for w in WORKLOADS if w in set(h["workload"])]
    height = 0.8 / max(len(workloads), 1)
    ys = np.arange(len(impls))
    for j, w in enumerate(workloads):
        s = h[h["workload"] == w].set_index("impl").reindex(impls)
        y = ys + (j - (len(workloads) - 1) / 2) * height
        ax.barh(y, s["p50"], height, label=w,
                xerr=[(s["p50"] - s["p20"]).fillna(0), (s["p80"] - s["p50"]).fillna(0)],
                capsize=2)
        for yy, v in zip(y, s["p50"]):
            if pd.notna(v):
                ax.annotate(f"{v:.1f}", (v, yy), xytext=(3, 0), textcoords="offset points",
                            va="center", fontsize=7)
    ax.set_yticks(ys, impls)
    ax.invert_yaxis()
    # log scale: the jit path (tens of ms) and the TVM-FFI path (tens of µs) on one axis
    ax.set_xscale("log")
    ax.set_xlabel("host µs per call (median; whiskers p20-p80; log scale)")
    ax.set_title(f"{gpu}: host enqueue time per call, {shape[0]}×{shape[1]} bf16")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize="small", loc="lower right")
    return ax


# ============================================================================ savings

def savings_table(df: pd.DataFrame, gpu: Optional[str] = None, shape=HOST_SHAPE,
                  baseline: str = DEFAULT_IMPL) -> pd.DataFrame:
    """One row per (toggle, workload): the baseline's and the toggled path's median host µs and
    their difference (``cost µs``: what turning the saving off, or NVTX on, adds per call), with
    ``noise µs``, the larger of the two p20-p80 spreads: a difference inside it is not resolved
    by this measurement."""
    h = host_rows(df, gpu, shape).set_index(["impl", "workload"])
    rows = []
    for toggle, what in TOGGLES.items():
        impl = baseline + toggle
        for w in WORKLOADS:
            if (impl, w) not in h.index or (baseline, w) not in h.index:
                continue
            b, t = h.loc[(baseline, w)], h.loc[(impl, w)]
            cost = t["p50"] - b["p50"]
            noise = max(b["p80"] - b["p20"], t["p80"] - t["p20"])
            rows.append({"toggle": toggle, "what": what, "workload": w,
                         "baseline µs": b["p50"], "toggled µs": t["p50"], "cost µs": cost,
                         "noise µs": noise, "resolved": abs(cost) > noise})
    return pd.DataFrame(rows, columns=["toggle", "what", "workload", "baseline µs", "toggled µs",
                                       "cost µs", "noise µs", "resolved"])


# ============================================================================ host parts

#: the layers of ``rmsnorm_lab.bench.host_parts``, outermost first, with what each adds
PART_LAYERS = {
    "lab fwd+autograd": "rms_norm(x, w): the gate, then C++",
    "native_launch.rms_norm": "gate closed: memo probed from Python",
    "fast_call": "C++: call memo + native node",
    "ext.apply": "native node: allocate, launch, tape",
    "ext.apply no grad inputs": "native node, no tape",
    "tvm_ffi kernel call": "compiled kernel from Python",
    "torch fwd+autograd": "torch F.rms_norm, requires grad",
    "torch fwd": "torch F.rms_norm, inference",
    "torch.add": "one small torch op",
    "empty_like": "one allocation",
}


def load_host_parts(path) -> pd.DataFrame:
    """The JSON lines of ``python -m rmsnorm_lab.bench.host_parts`` as a frame indexed by task."""
    return pd.DataFrame([r for r in read_jsonl(path) if "task" in r]).set_index("task")


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
        whisker_barh(a, range(len(d)), d["p50"], d["p20"], d["p80"],
                     ["tab:orange" if t.startswith("torch") else "tab:blue" for t in tasks])
        labels = [f"{t}\n({PART_LAYERS[t]})" if t in PART_LAYERS else t for t in tasks]
        a.set_yticks(range(len(d)), labels, fontsize=8)
        a.invert_yaxis()
        a.set_xlabel("host µs per call (median; whiskers p20-p80)")
        a.grid(True, axis="x", alpha=0.3)
    left.set_title(title or "forward with autograd, layer by layer")
    right.set_title("forward + backward")
    return ax


# ============================================================================ crossover

@dataclasses.dataclass(frozen=True)
class Crossover:
    """Where device time reaches a constant host time. ``M`` is the interpolated row count when
    the sweep brackets it (``bound == "="``); otherwise ``M`` is the sweep's edge and ``bound``
    says the crossover lies below it (``"<"``) or beyond it (``">"``)."""
    host_us: float
    M: float
    bound: str

    def __str__(self) -> str:
        return f"{'≈' if self.bound == '=' else self.bound} {self.M:,.0f}"


def crossover_M(Ms: Sequence[float], device_us: Sequence[float], host_us: float) -> Crossover:
    """The first M at which ``device_us(M)`` reaches ``host_us``, by linear interpolation of
    log(device time) against log(M) between the two sweep points around it."""
    pts = sorted(zip(Ms, device_us))
    if not pts:
        raise ValueError("no device-time points")
    Ms = [float(m) for m, _ in pts]
    dev = [float(t) for _, t in pts]
    if dev[0] >= host_us:
        return Crossover(host_us, Ms[0], "<")
    for (m0, d0), (m1, d1) in zip(zip(Ms, dev), zip(Ms[1:], dev[1:])):
        if d0 < host_us <= d1:
            f = (math.log(host_us) - math.log(d0)) / (math.log(d1) - math.log(d0))
            return Crossover(host_us, math.exp(math.log(m0) + f * (math.log(m1) - math.log(m0))),
                             "=")
    return Crossover(host_us, Ms[-1], ">")


def device_times(df: pd.DataFrame, gpu: Optional[str] = None, impl: str = DEFAULT_IMPL,
                 N: int = HOST_SHAPE[1]) -> pd.DataFrame:
    """The CUDA-graph device µs of ``impl``'s forward against M at width N (p20, p50, p80)."""
    d, _ = _one_gpu(df, gpu)
    d = d[(d["op"] == "fwd") & (d["impl"] == impl) & (d["path"] == "graph")
          & (d["metric"] == "time") & (d["N"] == N)]
    return d.sort_values("M")[["M", "p20", "p50", "p80"]].reset_index(drop=True)


def crossover_table(df: pd.DataFrame, gpu: Optional[str] = None, workload: str = "fwd",
                    impls: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """Per launch path (or ``impls``): its host µs for ``workload`` at HOST_SHAPE and the M at
    which the default kernel's device time reaches it."""
    dev = device_times(df, gpu)
    t = host_table(df, gpu)
    if dev.empty or workload not in t.columns:
        return pd.DataFrame(columns=["host µs", "crossover M", "bound"])
    impls = [i for i in (impls or [i for i in t.index if is_launch_path(i)])
             if i in t.index and pd.notna(t.loc[i, workload])]
    rows = {}
    for i in impls:
        c = crossover_M(dev["M"], dev["p50"], float(t.loc[i, workload]))
        rows[i] = {"host µs": c.host_us, "crossover M": c.M, "bound": c.bound,
                   "reads": str(c)}
    return pd.DataFrame.from_dict(rows, orient="index")


def plot_crossover(df: pd.DataFrame, gpu: Optional[str] = None, workload: str = "fwd",
                   impls: Optional[Sequence[str]] = None, ax=None):
    """Device µs of ``cute.auto`` against M (CUDA-graph replay) and each path's constant host
    µs (``workload``); each crossover marked and annotated. Left of a crossover, a loop of eager
    calls on that path is host-bound (the GPU waits for the CPU); right of it, device-bound."""
    d, gpu = _one_gpu(df, gpu)
    dev = device_times(d, gpu)
    table = crossover_table(d, gpu, workload, impls)
    ax = _axes(ax)
    line, = ax.plot(dev["M"], dev["p50"], "-o", color="black", markersize=4,
                    label="cute.auto device µs (graph)")
    ax.fill_between(dev["M"], dev["p20"], dev["p80"], color="black", alpha=0.12)
    colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, (impl, r) in enumerate(table.iterrows()):
        c = colors[k % len(colors)]
        ax.axhline(r["host µs"], color=c, linestyle="--", linewidth=1,
                   label=f"{impl} host {r['host µs']:.1f} µs ({workload})")
        if r["bound"] == "=":
            ax.plot([r["crossover M"]], [r["host µs"]], "o", color=c, markersize=7,
                    markerfacecolor="none")
            ax.annotate(f"M≈{r['crossover M']:,.0f}", (r["crossover M"], r["host µs"]),
                        xytext=(-4, 6 + 9 * (k % 2)), textcoords="offset points", ha="right",
                        fontsize=8, color=c)
    _log2_x(ax, dev["M"])
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel(f"M (rows), N={HOST_SHAPE[1]}")
    ax.set_ylabel("µs per call")
    ax.set_title(f"{gpu}: where device time overtakes host time ({workload})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="x-small", loc="upper left")
    return ax


# ============================================================================ cache cap

def _cap_key(label: str) -> float:
    return math.inf if label == "unbounded" else float(label)


def cache_table(df: pd.DataFrame, gpu: Optional[str] = None,
                shape: Tuple[int, int] = CACHE_SHAPE, triton: str = "triton.row") -> pd.DataFrame:
    """Peak MiB and step µs of the training-like step (op ``full``, eager) per tensor-cache cap
    of the ``cached`` path, and the same as a ratio to ``triton``'s (when measured)."""
    d, _ = _one_gpu(df, gpu)
    d = d[(d["op"] == "full") & (d["path"] == "eager") & (d["M"] == shape[0])
          & (d["N"] == shape[1]) & d["metric"].isin(["peak_mem", "time"])]
    rows: Dict[str, Dict[str, float]] = {}
    for r in d.itertuples(index=False):
        if r.impl.startswith("cute.auto@cached:"):
            label = r.impl.split(":", 1)[1]
        elif r.impl == triton:
            label = triton
        else:
            continue
        e = rows.setdefault(label, {})
        if r.metric == "peak_mem":
            e["peak MiB"] = r.p50
        else:
            e["step µs"], e["step p20"], e["step p80"] = r.p50, r.p20, r.p80
    caps = sorted((k for k in rows if k != triton), key=_cap_key)
    t = pd.DataFrame.from_dict(rows, orient="index").reindex(
        index=caps, columns=["peak MiB", "step µs", "step p20", "step p80"])
    t.index.name = "cap"
    if triton in rows:
        tr = rows[triton]
        if "peak MiB" in tr and tr["peak MiB"] > 0:
            t[f"peak / {triton}"] = t["peak MiB"] / tr["peak MiB"]
        if "step µs" in tr and tr["step µs"] > 0:
            t[f"step / {triton}"] = t["step µs"] / tr["step µs"]
    return t


def triton_step(df: pd.DataFrame, gpu: Optional[str] = None, shape=CACHE_SHAPE,
                triton: str = "triton.row") -> Dict[str, float]:
    d, _ = _one_gpu(df, gpu)
    d = d[(d["op"] == "full") & (d["path"] == "eager") & (d["impl"] == triton)
          & (d["M"] == shape[0]) & (d["N"] == shape[1])]
    return {m: float(v) for m, v in zip(d["metric"], d["p50"])}


def plot_cache_cap(df: pd.DataFrame, gpu: Optional[str] = None, shape=CACHE_SHAPE,
                   axes=None, triton: str = "triton.row"):
    """Two panels: peak memory (MiB above the step's inputs) and step time (ms) against the
    ``cached`` path's tensor-cache cap, with the lab Triton path's as a dashed line."""
    d, gpu = _one_gpu(df, gpu)
    t = cache_table(d, gpu, shape, triton)
    tr = triton_step(d, gpu, shape, triton)
    if axes is None:
        import matplotlib.pyplot as plt
        axes = plt.subplots(1, 2, figsize=(12, 4), constrained_layout=True)[1]
    ax_m, ax_t = axes
    xs = np.arange(len(t))
    ax_m.bar(xs, t["peak MiB"], color="tab:blue", label="cute.auto@cached")
    for x, v in zip(xs, t["peak MiB"]):
        if pd.notna(v):
            ax_m.annotate(f"{v:,.0f}", (x, v), xytext=(0, 2), textcoords="offset points",
                          ha="center", fontsize=8)
    if "peak_mem" in tr:
        ax_m.axhline(tr["peak_mem"], color="black", linestyle="--", linewidth=1,
                     label=f"{triton} {tr['peak_mem']:,.0f} MiB")
    ax_m.set_ylabel("peak MiB above the inputs")
    ax_m.set_title(f"{gpu}: peak memory vs tensor-cache cap")
    step_ms = t["step µs"] / 1e3
    ax_t.bar(xs, step_ms, color="tab:orange", label="cute.auto@cached",
             yerr=[((t["step µs"] - t["step p20"]) / 1e3).fillna(0),
                   ((t["step p80"] - t["step µs"]) / 1e3).fillna(0)], capsize=3)
    if "time" in tr:
        ax_t.axhline(tr["time"] / 1e3, color="black", linestyle="--", linewidth=1,
                     label=f"{triton} {tr['time'] / 1e3:,.2f} ms")
    ax_t.set_ylabel("ms per step (median; p20-p80)")
    ax_t.set_title(f"{gpu}: training-like step time vs cap")
    for ax in axes:
        ax.set_xticks(xs, list(t.index))
        ax.set_xlabel(f"tensor-cache cap (full fwd+bwd, {shape[0]}×{shape[1]})")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize="small", loc="upper left")
    return axes


# ============================================================================ timeline

def _short(name: str, width: int = 40) -> str:
    return name if len(name) <= width else name[:width - 1] + "…"


def plot_timeline(trace: Trace, first: int = 0, count: int = 3, ax=None,
                  api: bool = True, connect: bool = True):
    """NVTX ranges (one row per range name, ordered by stage) above the CUDA API calls and the
    GPU activities, on one time axis in µs from the start of iteration ``first``, for ``count``
    iterations. Thin grey lines join each launch call to the kernel it launched (correlation
    id) when both traces are there."""
    t0, t1 = window(trace, first, count)
    pad = 0.02 * (t1 - t0)
    lo, hi = t0 - pad, t1 + pad

    def clip(f):
        if f is None or f.empty:
            return None
        f = f[(f["end_ns"] >= lo) & (f["start_ns"] <= hi)]
        return f if not f.empty else None

    nv, gpu_df = clip(trace.nvtx), clip(trace.gpu)
    api_df = clip(trace.api) if api else None
    rows: List[Tuple[str, pd.DataFrame, object]] = []
    cmap = matplotlib.colormaps["tab10"]
    if nv is not None:
        for k, name in enumerate(sorted(nv["range"].unique(), key=stage_order)):
            rows.append((name, nv[nv["range"] == name], cmap(k % 10)))
    if api_df is not None:
        rows.append(("CUDA API (host)", api_df, None))
    if gpu_df is not None:
        rows.append(("GPU", gpu_df, None))
    if not rows:
        raise ValueError("nothing to draw in this window")
    ax = _axes(ax)
    kernel_colors: Dict[str, object] = {}
    pastel = matplotlib.colormaps["Set2"]
    height = 0.7
    for y, (label, f, color) in enumerate(rows):
        starts = (f["start_ns"] - t0) / 1e3
        widths = np.maximum(f["dur_ns"] / 1e3, (hi - lo) / 1e3 * 1e-3)
        if label == "GPU":
            colors = []
            for n, kind in zip(f["name"], f.get("kind", ["kernel"] * len(f))):
                if n not in kernel_colors:
                    kernel_colors[n] = pastel(len(kernel_colors) % 8)
                colors.append(kernel_colors[n])
        elif label.startswith("CUDA API"):
            colors = ["tab:red" if x else "lightgray" for x in f.get("launch", [True] * len(f))]
        else:
            colors = [color] * len(f)
        ax.broken_barh(list(zip(starts, widths)), (y - height / 2, height),
                       facecolors=colors, edgecolor="black", linewidth=0.3)
    labels = [_short(r[0]) for r in rows]
    if connect and api_df is not None and gpu_df is not None:
        joined = launches(Trace(None, gpu_df, api_df, {}))
        if joined is not None:
            y_api = next(i for i, r in enumerate(rows) if r[0].startswith("CUDA API"))
            y_gpu = len(rows) - 1
            for a, s in zip(joined["api_start_ns"], joined["start_ns"]):
                ax.plot([(a - t0) / 1e3, (s - t0) / 1e3], [y_api + height / 2, y_gpu - height / 2],
                        color="gray", linewidth=0.5, alpha=0.7)
    ax.set_yticks(range(len(rows)), labels)
    ax.set_ylim(len(rows) - 0.4, -0.6)
    ax.set_xlim((lo - t0) / 1e3, (hi - t0) / 1e3)
    ax.set_xlabel("µs from the start of the first iteration shown")
    ax.grid(True, axis="x", alpha=0.3)
    handles = [matplotlib.patches.Patch(facecolor=c, edgecolor="black", label=_short(n, 60))
               for n, c in kernel_colors.items()]
    if handles:
        ax.legend(handles=handles, fontsize="x-small", loc="upper left",
                  bbox_to_anchor=(0.0, -0.15), ncol=2, title="GPU activity",
                  title_fontsize="x-small", frameon=False)
    ax.set_title(f"NVTX ranges above GPU work, iterations {first}–{first + count - 1}")
    return ax
