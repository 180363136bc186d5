"""The host-overhead study's tables (notebooks/03_host_overhead.ipynb, the report), drawn from
``results/<gpu>/host.csv`` (``rmsnorm_workbook.bench.host``); its figures are ``rmsnorm_workbook.viz.host``,
its live measurements ``analysis.host_live``.

Impl names in host.csv carry the launch path after ``@`` and a toggle after it:
``cute.auto@tvm_ffi``, ``cute.auto@cached``, ``cute.auto@tvm_ffi+nvtx``,
``cute.auto@tvm_ffi+settings_per_call``, ``cute.auto@tvm_ffi+python_node``; peers keep their names
(``liger.triton``, ``torch.native``...). Op ``fwd`` rows whose impl ends in ``+autograd`` built the
autograd graph; op ``full`` is forward + backward. Here these become a *workload*: ``fwd``,
``fwd+autograd`` or ``full``. Rows with ``+varying_m`` timed calls whose row count changes every
call (their ``M`` is the largest drawn). A toggle the settings no longer have is left out of every
table here.

Every function takes a results DataFrame (``results.load``/``load_all``) and uses the newest
measurement of each point (``results.latest``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional, Sequence, Tuple

import pandas as pd

from ..results import latest, read_jsonl
from rmsnorm_lab import settings
from rmsnorm_lab.settings import LAUNCH_PATHS, Experiments, Settings
from .tables import host_benchmark_run, one_gpu

HOST_SHAPE = (128, 4096)
CACHE_SHAPE = (16384, 4096)
WORKLOADS = ("fwd", "fwd+autograd", "full")
AUTOGRAD = "+autograd"
VARYING = "+varying_m"
#: the launch path of the default experiments, and its impl name in host.csv
DEFAULT_PATH = Experiments().launch_path
DEFAULT_IMPL = f"cute.auto@{DEFAULT_PATH}"
TORCH = "torch.native"


@dataclasses.dataclass(frozen=True)
class Toggle:
    """One saving of the default path undone (or NVTX turned on), measured on its own."""
    suffix: str                 # after ``cute.auto@tvm_ffi`` in host.csv
    overrides: Dict[str, object]
    what: str


#: what each toggle row measures, against DEFAULT_IMPL (only toggles the settings have)
TOGGLES: Dict[str, Toggle] = {t.suffix: t for t in (
    Toggle("+nvtx", {"nvtx": True}, "NVTX ranges on"),
    Toggle("+settings_per_call", {"settings_per_call": True},
           "the RMSNORM_LAB_* environment parsed on every call"),
    Toggle("+python_node", {"autograd_node": "python"},
           "the Python launch path and autograd.Function instead of the C++ extension"),
)}


@dataclasses.dataclass(frozen=True)
class Step:
    """One rung of the launch path, as the settings that select it."""
    name: str                   # the impl name in host.csv
    label: str                  # short, for figures
    overrides: Dict[str, object]
    what: str


#: the launch path, from the slowest way to reach a compiled kernel to the default
STEPS: Tuple[Step, ...] = (
    Step("cute.auto@jit", "@cute.jit called", {"launch_path": "jit"},
         "the @cute.jit function called directly: CuTe DSL rebuilds the argument types and looks "
         "its compilation up on every call"),
    Step("cute.auto@compiled", "from_dlpack per call", {"launch_path": "compiled"},
         "compiled once; every tensor turned into a CuTe handle (from_dlpack) on every call"),
    Step("cute.auto@cached", "cached handles", {"launch_path": "cached"},
         "compiled once; each tensor's handle kept in a bounded FIFO keyed on (data_ptr, dtype, "
         "shape, stride)"),
    Step("cute.auto@tvm_ffi+python_node", "TVM-FFI, Python node",
         {"launch_path": "tvm_ffi", "autograd_node": "python"},
         "compiled with --enable-tvm-ffi: torch tensors passed as they are, through a Python "
         "torch.autograd.Function"),
    Step(DEFAULT_IMPL, "TVM-FFI, C++ node", {"launch_path": "tvm_ffi", "autograd_node": "native"},
         "the same kernel called from C++: the call memo finds the launch, the tape node is C++"),
)


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


def is_launch_path(impl: str) -> bool:
    base, path, toggle = split_impl(impl)
    return path in LAUNCH_PATHS and toggle == ""


def is_toggle(impl: str) -> bool:
    base, path, toggle = split_impl(impl)
    return path is not None and toggle in TOGGLES


def known_impl(impl: str) -> bool:
    """False for a row of a toggle the settings no longer have (left out everywhere here)."""
    base, path, toggle = split_impl(impl)
    return path is None or toggle == "" or toggle in TOGGLES or toggle.startswith(":")


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
    """The host µs rows at ``shape`` of the newest host benchmark run
    (``tables.host_benchmark_run``) as ``impl`` (without ``+autograd``), ``workload``, ``p20``,
    ``p50``, ``p80``; rows of toggles the settings no longer have are left out."""
    _, gpu = one_gpu(df, gpu)
    d = df[(df["gpu"] == gpu) & (df["metric"] == "host") & (df["path"] == "host")
           & (df["M"] == shape[0]) & (df["N"] == shape[1])]
    d = latest(host_benchmark_run(d))
    rows = []
    for r in d.itertuples(index=False):
        w, impl = _workload(r.op, r.impl)
        if w is not None and known_impl(impl) and not impl.endswith(VARYING):
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
    """Host µs per call (``quantile``), one row per implementation, one column per workload (a
    forward-only peer's inference only: ``tables.host_benchmark_run``)."""
    h = host_rows(df, gpu, shape)
    t = h.pivot_table(index="impl", columns="workload", values=quantile, aggfunc="last")
    t = t.reindex(index=host_order(t.index), columns=[w for w in WORKLOADS if w in t.columns])
    t.columns.name = None
    return t


def varying_table(df: pd.DataFrame, gpu: Optional[str] = None, N: int = HOST_SHAPE[1]
                  ) -> pd.DataFrame:
    """Host µs per call when the row count changes every call (``+varying_m`` rows), next to
    the same implementation at the fixed HOST_SHAPE: one row per (implementation, workload),
    columns ``varying µs``, ``p20``, ``p80``, ``fixed µs``, ``M drawn from``. Empty when the
    results have no such rows."""
    d, gpu = one_gpu(df, gpu)
    v = d[(d["metric"] == "host") & (d["path"] == "host") & (d["N"] == N)
          & d["impl"].str.endswith(VARYING)]
    cols = ["impl", "workload", "varying µs", "p20", "p80", "fixed µs", "M drawn from"]
    if v.empty:
        return pd.DataFrame(columns=cols).set_index(["impl", "workload"])
    fixed = host_table(df, gpu)
    rows = []
    for r in v.itertuples(index=False):
        name = r.impl[:-len(VARYING)]
        w = "full" if r.op == "full" else "fwd"
        f = fixed.loc[name, w] if name in fixed.index and w in fixed.columns else math.nan
        rows.append({"impl": name, "workload": w, "varying µs": r.p50, "p20": r.p20,
                     "p80": r.p80, "fixed µs": f, "M drawn from": f"1..{int(r.M)}"})
    t = pd.DataFrame(rows, columns=cols)
    t["order"] = [host_order(t["impl"]).index(i) for i in t["impl"]]
    t["w"] = [WORKLOADS.index(w) for w in t["workload"]]
    return t.sort_values(["w", "order"]).drop(columns=["order", "w"]).set_index(
        ["impl", "workload"])


def varying_device_us(df: pd.DataFrame, impl: str, op: str, Ms: Sequence[int],
                      gpu: Optional[str] = None, N: int = HOST_SHAPE[1]) -> float:
    """The mean device time per call (µs) of ``impl``'s ``op`` over the row counts ``Ms``, from
    its CUDA-graph times at width N in the sweeps (``fwd.csv``, ``full.csv``), linear in M between
    the measured rows and flat below the smallest (where a launch's fixed cost dominates). A
    loop of calls cannot run faster than this whatever its host path costs; NaN without data."""
    import numpy as np
    d, _ = one_gpu(df, gpu)
    t = d[(d["impl"] == impl) & (d["op"] == op) & (d["path"] == "graph")
          & (d["metric"] == "time") & (d["N"] == N)].sort_values("M")
    if t.empty:
        return math.nan
    return float(np.mean(np.interp(np.asarray(Ms, dtype=float), t["M"].to_numpy(float),
                                   t["p50"].to_numpy(float))))


# ============================================================================ settings -> rows

def default_toggles() -> Dict[str, object]:
    """Every toggle (both groups, flat) at the lab's defaults, ignoring the environment."""
    return Settings().as_dict()


def changed_toggles() -> Dict[str, object]:
    """The toggles now in force that differ from the defaults."""
    defaults = default_toggles()
    return {k: v for k, v in settings.as_dict().items() if defaults.get(k) != v}


def recorded_name(changed: Optional[Dict[str, object]] = None) -> Optional[str]:
    """The host.csv impl name the benchmark recorded for the settings ``changed`` from the
    defaults (default: the settings now in force); None when it recorded no such row.
    ``forward_variant``, ``backward``, ``pdl`` and ``fused_strips`` choose kernels, not the host
    path: the benchmark times the defaults."""
    c = dict(changed_toggles() if changed is None else changed)
    path = c.pop("launch_path", DEFAULT_PATH)
    if c.get("backend", "cute") != "cute":
        return None
    c.pop("backend", None)
    if path != "tvm_ffi":
        c.pop("autograd_node", None)  # the other paths always take the Python node
        cap = c.pop("tensor_cache_cap", Experiments().tensor_cache_cap)
        if path == "cached" and cap != Experiments().tensor_cache_cap:
            return None  # the host rows ran the default cap
        return f"cute.auto@{path}" if not c else None
    c.pop("tensor_cache_cap", None)  # only the cached path reads it
    for t in TOGGLES.values():
        if c == t.overrides:
            return DEFAULT_IMPL + t.suffix
    return DEFAULT_IMPL if not c else None


# ============================================================================ savings

def savings_table(df: pd.DataFrame, gpu: Optional[str] = None, shape=HOST_SHAPE,
                  baseline: str = DEFAULT_IMPL) -> pd.DataFrame:
    """One row per (toggle, workload): the baseline's and the toggled path's median host µs and
    their difference (``cost µs``: what turning the saving off, or NVTX on, adds per call), with
    ``noise µs``, the larger of the two p20-p80 spreads: a difference inside it is not resolved
    by this measurement."""
    h = host_rows(df, gpu, shape).set_index(["impl", "workload"])
    rows = []
    for suffix, t in TOGGLES.items():
        impl = baseline + suffix
        for w in WORKLOADS:
            if (impl, w) not in h.index or (baseline, w) not in h.index:
                continue
            b, x = h.loc[(baseline, w)], h.loc[(impl, w)]
            cost = x["p50"] - b["p50"]
            noise = max(b["p80"] - b["p20"], x["p80"] - x["p20"])
            rows.append({"toggle": suffix, "what": t.what, "workload": w,
                         "baseline µs": b["p50"], "toggled µs": x["p50"], "cost µs": cost,
                         "noise µs": noise, "resolved": abs(cost) > noise})
    return pd.DataFrame(rows, columns=["toggle", "what", "workload", "baseline µs", "toggled µs",
                                       "cost µs", "noise µs", "resolved"])


# ============================================================================ device times

def device_times(df: pd.DataFrame, gpu: Optional[str] = None, impl: str = DEFAULT_IMPL,
                 N: int = HOST_SHAPE[1]) -> pd.DataFrame:
    """The host benchmark's own device µs of ``impl``'s forward against M at width N (p20,
    p50, p80): CUDA-graph replay of one input set, so the input stays in L2 where it fits, as
    in a loop over the same tensor. (The crossover, ``analysis.crossover``, compares with the
    sweeps' L2-cold times instead.)"""
    d, _ = one_gpu(df, gpu)
    d = d[(d["op"] == "fwd") & (d["impl"] == impl) & (d["path"] == "graph")
          & (d["metric"] == "time") & (d["N"] == N)]
    return d.sort_values("M")[["M", "p20", "p50", "p80"]].reset_index(drop=True)


# ============================================================================ cache cap

def _cap_key(label: str) -> float:
    return math.inf if label == "unbounded" else float(label)


def cache_table(df: pd.DataFrame, gpu: Optional[str] = None,
                shape: Tuple[int, int] = CACHE_SHAPE, triton: str = "triton.row") -> pd.DataFrame:
    """Peak MiB and step µs of the training-like step (op ``full``, eager) per tensor-cache cap
    of the ``cached`` path, and the same as a ratio to ``triton``'s (when measured)."""
    d, _ = one_gpu(df, gpu)
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


#: the tensors one forward on the ``cached`` path hands to the handle cache, in order
#: (``rmsnorm_lab/cute/runner.py``: ``_launch_marshaled``): x, the weight, y, rstd
CACHED_TENSORS = ("x", "w", "y", "rstd")
#: those of them that are activation-sized (M x N)
ACTIVATIONS = ("x", "y")


def cache_after_step(cap: int, layers: int) -> List[str]:
    """The tensors whose handles the ``cached`` path still holds after a step of ``layers``
    forwards on fresh activations, oldest first (``x3``: layer 3's x; ``w``: the shared weight):
    the policy of ``cute/runner.py``'s ``_cached_handle`` replayed, a FIFO of ``cap`` handles
    in which a hit keeps its place, ``cap == 0`` keeps nothing and a negative cap never evicts.
    A kept handle keeps its tensor's storage allocated."""
    kept: List[str] = []
    for layer in range(layers):
        for name in CACHED_TENSORS:
            key = name if name == "w" else f"{name}{layer}"
            if key in kept or cap == 0:
                continue
            if 0 < cap <= len(kept):
                kept.pop(0)
            kept.append(key)
    return kept


def pinned_activations(cap: int, layers: int) -> int:
    """How many activation-sized tensors (``ACTIVATIONS``) ``cache_after_step`` leaves held."""
    return sum(k.rstrip("0123456789") in ACTIVATIONS for k in cache_after_step(cap, layers))


def cache_memory_table(df: pd.DataFrame, layers: int, gpu: Optional[str] = None,
                       shape: Tuple[int, int] = CACHE_SHAPE, elem_bytes: int = 2
                       ) -> pd.DataFrame:
    """Per cap: the measured peak (MiB above the step's start), how far it lies below the
    cache-off peak (cap ``0``), and what the handles left by the step before would account for:
    ``pinned tensors`` (``pinned_activations``) times one activation's MiB, the storage held
    when the step starts (``pinned at start (MiB)``). A bounded FIFO frees it during the step
    (``freed in the step (MiB)``), so it lowers a peak counted from the start; an unbounded
    cache evicts nothing. ``peak with pinned (MiB)``: the peak counted from before that storage,
    what the step needs beside what the cache holds."""
    t = cache_table(df, gpu, shape)
    act_mib = shape[0] * shape[1] * elem_bytes / 2**20
    out = pd.DataFrame(index=t.index)
    out["peak MiB"] = t["peak MiB"]
    out["below cap 0 (MiB)"] = t.loc["0", "peak MiB"] - t["peak MiB"] if "0" in t.index \
        else math.nan
    out["pinned tensors"] = [pinned_activations(-1 if c == "unbounded" else int(c), layers)
                             for c in t.index]
    out["pinned at start (MiB)"] = out["pinned tensors"] * act_mib
    freed = [n if c != "unbounded" else 0 for c, n in zip(t.index, out["pinned tensors"])]
    out["freed in the step (MiB)"] = [n * act_mib for n in freed]
    out["peak with pinned (MiB)"] = out["peak MiB"] + out["pinned at start (MiB)"]
    return out


def cache_runs(df: pd.DataFrame, gpu: Optional[str] = None, shape=CACHE_SHAPE,
               default: str = DEFAULT_IMPL) -> pd.DataFrame:
    """The step time (median µs) of every recorded run of the cache-cap benchmark: one row per
    cap (and ``default``, the default path), one column per run, oldest first. ``df`` holds
    every run (``results.load_all``), not only the newest (``latest``)."""
    d = df[(df["gpu"] == (gpu or df["gpu"].iloc[0])) & (df["op"] == "full")
           & (df["path"] == "eager") & (df["metric"] == "time") & (df["M"] == shape[0])
           & (df["N"] == shape[1])]
    d = d[d["impl"].str.startswith("cute.auto@cached:") | (d["impl"] == default)]
    if d.empty:
        return pd.DataFrame()
    d = d.assign(cap=[i.split(":", 1)[1] if ":" in i else "default" for i in d["impl"]],
                 run=pd.to_datetime(d["timestamp"], utc=True))
    t = d.pivot_table(index="cap", columns="run", values="p50", aggfunc="last")
    caps = sorted((c for c in t.index if c != "default"), key=_cap_key)
    t = t.reindex(caps + (["default"] if "default" in t.index else []))
    t.columns = [f"run {i}" for i in range(1, len(t.columns) + 1)]
    return t


def cache_runs_summary(runs: pd.DataFrame) -> pd.DataFrame:
    """Per row of ``cache_runs``: the lowest and highest run median (µs) and, for the bounded
    caps, in how many runs it was the slowest bounded cap."""
    bounded = [c for c in runs.index if c not in ("unbounded", "default")]
    slowest = runs.loc[bounded].idxmax() if bounded else pd.Series(dtype=str)
    out = pd.DataFrame({"lowest run µs": runs.min(axis=1), "highest run µs": runs.max(axis=1),
                        "runs": runs.notna().sum(axis=1)})
    out["slowest bounded cap in (runs)"] = [int((slowest == c).sum()) if c in bounded else pd.NA
                                     for c in runs.index]
    return out


def step_of(df: pd.DataFrame, impl: str, gpu: Optional[str] = None, shape=CACHE_SHAPE
            ) -> Dict[str, float]:
    """``{"time": µs, "peak_mem": MiB, "p20": .., "p80": ..}`` of ``impl``'s training-like step
    (the keys that were measured)."""
    d, _ = one_gpu(df, gpu)
    d = d[(d["op"] == "full") & (d["path"] == "eager") & (d["impl"] == impl)
          & (d["M"] == shape[0]) & (d["N"] == shape[1])]
    out = {m: float(v) for m, v in zip(d["metric"], d["p50"])}
    t = d[d["metric"] == "time"]
    if not t.empty:
        out["p20"], out["p80"] = float(t["p20"].iloc[0]), float(t["p80"].iloc[0])
    return out


def triton_step(df: pd.DataFrame, gpu: Optional[str] = None, shape=CACHE_SHAPE,
                triton: str = "triton.row") -> Dict[str, float]:
    return {k: v for k, v in step_of(df, triton, gpu, shape).items() if k in ("time",
                                                                              "peak_mem")}



# ============================================================================ host parts

#: the layers of ``rmsnorm_workbook.bench.host_parts``, outermost first, with what each adds
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
    """The JSON lines of ``python -m rmsnorm_workbook.bench.host_parts`` as a frame indexed by task."""
    return pd.DataFrame([r for r in read_jsonl(path) if "task" in r]).set_index("task")
