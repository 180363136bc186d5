"""The host-overhead study's tables (notebooks/03_host_overhead.ipynb, the report), drawn from
``results/<gpu>/host.csv`` (``rmsnorm_workbook.bench.host``); its figures are ``rmsnorm_workbook.viz.host``,
its live measurements ``analysis.host_live``.

Impl names in host.csv carry the launch path after ``@`` and a toggle after it:
``cute.auto@tvm_ffi``, ``cute.auto@cached``, ``cute.auto@tvm_ffi+nvtx``,
``cute.auto@tvm_ffi+settings_per_call``, ``cute.auto@tvm_ffi+python_node``; peers keep their names
(``liger.triton``, ``torch.native``...). Op ``fwd`` rows whose impl ends in ``+autograd`` built the
autograd graph; op ``full`` is forward + backward. Here these become a *workload*: ``fwd``,
``fwd+autograd`` or ``full``. Rows with ``+varying_m`` timed calls whose row count changes every
call (their ``M`` is the largest drawn). Rows of a toggle outside ``TOGGLES`` are left out of every
table here.

The launch paths, the tensor-cache cap and ``settings_per_call`` are the workbook's instruments
(``bench.instruments``); the other toggles are the library's settings. Both together are "the
settings" that ``recorded_name`` maps to a host.csv row.

Every function takes a results DataFrame (``results.load``/``load_all``) and uses the newest
measurement of each point (``results.latest``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional, Sequence, Tuple

import pandas as pd

from ..results import latest
from rmsnorm_lab import settings
from rmsnorm_lab.settings import Settings
from ..bench import instruments
from ..bench.instruments import LAUNCH_PATHS
from .tables import host_benchmark_run, one_gpu

HOST_SHAPE = (128, 4096)
CACHE_SHAPE = (16384, 4096)
WORKLOADS = ("fwd", "fwd+autograd", "full")
AUTOGRAD = "+autograd"
VARYING = "+varying_m"
#: the launch path of the default instruments (the library's own), and its impl name in host.csv
DEFAULT_PATH = instruments.DEFAULTS.launch_path
DEFAULT_IMPL = f"cute.auto@{DEFAULT_PATH}"
TORCH = "torch.native"


@dataclasses.dataclass(frozen=True)
class Toggle:
    """One saving of the default path undone (or NVTX turned on), measured on its own."""
    suffix: str                 # after ``cute.auto@tvm_ffi`` in host.csv
    overrides: Dict[str, object]
    what: str


#: what each toggle row measures, against DEFAULT_IMPL (the toggles the benchmark times)
TOGGLES: Dict[str, Toggle] = {t.suffix: t for t in (
    Toggle("+nvtx", {"nvtx": True}, "NVTX ranges on"),
    Toggle("+settings_per_call", {"settings_per_call": True},
           "the RMSNORM_LAB_* environment parsed on every call"),
    Toggle("+python_node", {"autograd_node": "python"},
           "the Python launch path and autograd.Function instead of the C++ extension"),
)}


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


def is_toggle(impl: str) -> bool:
    base, path, toggle = split_impl(impl)
    return path is not None and toggle in TOGGLES


def known_impl(impl: str) -> bool:
    """False for a row of a toggle outside ``TOGGLES`` (left out everywhere here)."""
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
    ``p50``, ``p80``; rows of toggles outside ``TOGGLES`` are left out."""
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


# ============================================================================ settings -> rows

def default_toggles() -> Dict[str, object]:
    """Every toggle at the lab's defaults, flat: the library's settings (both groups, ignoring
    the environment) and the workbook's instruments (``instruments.use`` takes them all)."""
    return {**Settings().as_dict(), **instruments.DEFAULTS.as_dict()}


def changed_toggles() -> Dict[str, object]:
    """The toggles now in force (settings and instruments) that differ from the defaults."""
    defaults = default_toggles()
    now = {**settings.as_dict(), **instruments.state().as_dict()}
    return {k: v for k, v in now.items() if defaults.get(k) != v}


def recorded_name(changed: Optional[Dict[str, object]] = None) -> Optional[str]:
    """The host.csv impl name the benchmark recorded for the toggles ``changed`` from the
    defaults (settings and instruments, as ``changed_toggles`` gives them; default: those now in
    force); None when it recorded no such row.
    ``forward_variant``, ``backward``, ``pdl`` and ``fused_strips`` choose kernels, not the host
    path: the benchmark times the defaults."""
    c = dict(changed_toggles() if changed is None else changed)
    path = c.pop("launch_path", DEFAULT_PATH)
    if c.get("backend", "cute") != "cute":
        return None
    c.pop("backend", None)
    if path != "tvm_ffi":
        c.pop("autograd_node", None)  # the other paths always take the Python node
        cap = c.pop("tensor_cache_cap", instruments.DEFAULTS.tensor_cache_cap)
        if path == "cached" and cap != instruments.DEFAULTS.tensor_cache_cap:
            return None  # the host rows ran the default cap
        return f"cute.auto@{path}" if not c else None
    c.pop("tensor_cache_cap", None)  # only the cached path reads it
    for t in TOGGLES.values():
        if c == t.overrides:
            return DEFAULT_IMPL + t.suffix
    return DEFAULT_IMPL if not c else None


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
#: (``bench/launch_paths.py``: ``launch_cached``): x, the weight, y, rstd
CACHED_TENSORS = ("x", "w", "y", "rstd")
#: those of them that are activation-sized (M x N)
ACTIVATIONS = ("x", "y")


def cache_after_step(cap: int, layers: int) -> List[str]:
    """The tensors whose handles the ``cached`` path still holds after a step of ``layers``
    forwards on fresh activations, oldest first (``x3``: layer 3's x; ``w``: the shared weight):
    the policy of ``bench/launch_paths.py``'s ``cached_handle`` replayed, a FIFO of ``cap`` handles
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
