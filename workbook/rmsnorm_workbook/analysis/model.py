"""A two-term model of what one RMSNorm call costs on a GPU the lab may never have run on.

*Device time* (the kernel alone, as CUDA-graph replay measures it)::

    device_us(M, N) = t0 + bytes(M, N) / (efficiency * datasheet_bandwidth)

fitted per (op, implementation) on the measured graph times of the calibration GPU (the H200):
``t0`` is what does not scale with bytes (launch latency, the ramp-up and the tail of the grid),
``efficiency`` the fraction of the datasheet bandwidth the kernel reaches. Carrying both to
another GPU assumes the kernel reaches the same fraction of that GPU's datasheet bandwidth and
the same fixed latency: a *model*, drawn as modelled, never as measured.

*Host time* (the CPU cost of enqueueing one call) is taken as measured (``path == "host"`` rows:
``host.csv`` when present, else the host rows of the forward sweep) and assumed to be the same on
every GPU: it is a property of the CPU and the launch path, not of the GPU (the other machines'
CPUs differ: an assumption).

*Per-call time* when calls are launched one after another, two ways (``CALL_MODELS``):

``pipelined``  ``max(host_us, device_us)``: back-to-back calls, the slower of the producer (the
               CPU) and the consumer (the GPU).
``do_bench``   ``device_us + max(0, host_us - flush_us)``: what ``triton.testing.do_bench`` (the
               eager timer of this lab and of the PRs) reports. It zeroes a 256 MiB buffer
               before every call to flush L2; while the GPU runs that flush, the CPU enqueues
               the call, so only the host time *beyond* the flush shows. ``flush_us`` is
               256 MiB at the copy efficiency measured on the calibration GPU: a faster GPU
               hides less host time.

Where the host term wins, a cheaper launch path wins however good the kernels are; the
*crossover* M is where ``device_us`` overtakes ``host_us`` (the definition: ``analysis.crossover``).
"""

from __future__ import annotations

import math
import re
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from ..results import CEILINGS, latest
from ..results.provenance import gpu_title
from . import MEASURED
from .crossover import (HOST_BENCHMARK, HOSTS_SHOWN, kernel_of,  # noqa: F401 (shared names)
                        crossover_table as measured_crossover_table, shown_hosts)
from .specs import SPECS, GPUSpec, has_spec, measured_copy_bandwidth, spec

SPECS_KEYS = frozenset(SPECS)

REF_N = 4096
ELEM_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
CALIBRATION_GPU = "h200"
#: the GPUs the model draws: the calibration GPU first, then the others its specs mark
MODEL_GPUS = (CALIBRATION_GPU,) + tuple(k for k, s in SPECS.items()
                                        if s.modelled and k != CALIBRATION_GPU)
MODEL_M = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
#: the PR's pair (Liger-Kernel's CuTe DSL and Triton kernels) and the lab's own pair
PAIRS = (("liger.cutedsl", "liger.triton"), ("cute.auto", "triton.row"))
#: how close to 1 a ratio must be to count as parity
PARITY = 0.05
CALL_MODELS = ("do_bench", "pipelined")
#: triton.testing.do_bench's L2 flush buffer (zeroed before every timed call)
FLUSH_BYTES = 256 * 2**20
#: copy / datasheet on the calibration GPU when its copy ceiling is not in the results: the
#: H200's measured copy over its datasheet 4800 GB/s
#: (docs/design-record.md, 'Measurement: same-shape copy ceilings')
DEFAULT_COPY_EFFICIENCY = 0.89


def copy_efficiency(df: pd.DataFrame, gpu: str = CALIBRATION_GPU) -> float:
    """Measured copy GB/s over the datasheet bandwidth on ``gpu``."""
    copy = measured_copy_bandwidth(df, gpu) if not df.empty else None
    return copy / spec(gpu).bandwidth_gbps if copy else DEFAULT_COPY_EFFICIENCY


def flush_us(gpu: str, copy_eff: float = DEFAULT_COPY_EFFICIENCY) -> float:
    """Modelled µs of do_bench's 256 MiB L2 flush on ``gpu``."""
    return FLUSH_BYTES / (copy_eff * spec(gpu).bandwidth_gbps * 1e3)


def call_us(host: float, device: float, gpu: str, how: str = "do_bench",
            copy_eff: float = DEFAULT_COPY_EFFICIENCY) -> float:
    """Per-call µs from host and device µs (see the module docstring for ``how``)."""
    if how == "pipelined":
        return max(host, device)
    if how == "do_bench":
        return device + max(0.0, host - flush_us(gpu, copy_eff))
    raise ValueError(f"how must be one of {CALL_MODELS}, got {how!r}")


def bound(host: float, device: float, gpu: str, how: str = "do_bench",
          copy_eff: float = DEFAULT_COPY_EFFICIENCY) -> str:
    """Which term of ``call_us`` is the larger, ``"host"`` or ``"device"``: the host time the
    call model lets show (``pipelined``: all of it; ``do_bench``: what lies beyond the flush)
    against the device time."""
    shown = host - (flush_us(gpu, copy_eff) if how == "do_bench" else 0.0)
    return "host" if shown > device else "device"


def bytes_moved(op: str, M: int, N: int, dtype: str = "bf16") -> float:
    """Minimum DRAM bytes of one call. fwd: read x, write y, read w (the benchmark's count);
    bwd: read x, dy, w and rstd, write dx and dw; full: both."""
    s = ELEM_BYTES[dtype]
    fwd = 2.0 * M * N * s + N * s
    bwd = 3.0 * M * N * s + 4.0 * M + 2.0 * N * s
    return {"fwd": fwd, "bwd": bwd, "full": fwd + bwd}[op]


def spec_of(gpu: str, sm_count: Optional[int] = None) -> GPUSpec:
    """The spec for a results slug; a plain ``h100`` (results recorded before the form factor
    was part of the slug) with 114 SMs is the PCIe card."""
    return spec("h100_pcie" if gpu == "h100" and sm_count == 114 else gpu)


def _spec_key(gpu: str, sm_count: Optional[int] = None) -> str:
    try:
        return spec_of(gpu, sm_count).key
    except KeyError:
        return gpu


#: the kernel behind a host-measured name: ``cute.auto@tvm_ffi`` -> ``cute.auto``
device_impl = kernel_of


# --- calibration ------------------------------------------------------------------------------

def _fit(b: np.ndarray, t: np.ndarray) -> Tuple[float, float]:
    """Least squares ``t = t0 + c * b`` with ``t0 >= 0`` and ``c > 0``; returns (t0, c)."""
    if len(b) >= 2 and np.ptp(b) > 0:
        c, t0 = np.polyfit(b, t, 1)
        if t0 >= 0 and c > 0:
            return float(t0), float(c)
    return 0.0, float(np.sum(t * b) / np.sum(b * b))


def calibrate(df: pd.DataFrame, gpu: str = CALIBRATION_GPU, N: int = REF_N) -> pd.DataFrame:
    """Per (op, impl): ``t0_us`` and ``efficiency`` (fraction of ``gpu``'s datasheet bandwidth),
    fitted on the measured CUDA-graph times at width ``N`` (all widths when fewer than two rows
    have it), with the largest relative error of the fit over every measured shape."""
    cols = ["op", "impl", "gpu", "t0_us", "efficiency", "GBps_at_large_M", "points",
            "max_rel_err"]
    if df.empty:
        return pd.DataFrame(columns=cols)
    d = latest(df[(df["gpu"] == gpu) & (df["path"] == "graph") & (df["metric"] == "time")
                  & ~df["impl"].isin(CEILINGS)])
    if d.empty:
        return pd.DataFrame(columns=cols)
    s = spec_of(gpu, int(d["sm_count"].iloc[0]))
    bw = s.bandwidth_gbps * 1e3  # bytes per µs
    rows = []
    for (op, impl), g in d.groupby(["op", "impl"], sort=True):
        b_all = np.array([bytes_moved(op, m, n, dt) for m, n, dt in
                          zip(g["M"], g["N"], g["dtype"])])
        t_all = g["p50"].to_numpy(dtype=float)
        use = (g["N"] == N).to_numpy()
        if use.sum() < 2:
            use = np.ones(len(g), dtype=bool)
        t0, c = _fit(b_all[use], t_all[use])
        pred = t0 + c * b_all
        rows.append({"op": op, "impl": impl, "gpu": gpu, "t0_us": t0,
                     "efficiency": 1.0 / (c * bw), "GBps_at_large_M": 1e-3 / c,
                     "points": int(use.sum()),
                     "max_rel_err": float(np.max(np.abs(pred / t_all - 1)))})
    return pd.DataFrame(rows, columns=cols)


def _cal_row(cal: pd.DataFrame, op: str, impl: str) -> Optional[pd.Series]:
    r = cal[(cal["op"] == op) & (cal["impl"] == impl)]
    return None if r.empty else r.iloc[0]


def device_us(cal: pd.DataFrame, op: str, impl: str, gpu: str, M, N: int = REF_N,
              dtype: str = "bf16"):
    """Modelled device µs of ``impl``'s ``op`` on ``gpu`` (NaN when ``impl`` was not calibrated).
    ``M`` may be an array."""
    r = _cal_row(cal, op, impl)
    if r is None:
        return np.full(np.shape(M), np.nan) if np.ndim(M) else math.nan
    bw = spec(gpu).bandwidth_gbps * 1e3
    b = bytes_moved(op, np.asarray(M, dtype=float), N, dtype)
    return r["t0_us"] + b / (r["efficiency"] * bw)


# --- host -------------------------------------------------------------------------------------

_PLAIN = re.compile(r"^[\w.]+(@[\w]+)?$")  # cute.auto@tvm_ffi, triton.row; not the ablations


def host_costs(df: pd.DataFrame, gpu: str = CALIBRATION_GPU, op: str = "fwd") -> pd.DataFrame:
    """Measured host µs per call of each implementation and launch path: the ``path == "host"``
    rows of ``gpu`` (host.csv's ``cute.auto@<path>`` rows and the forward sweep's plain names),
    ablation rows (``+nvtx``, ``+python_node``, ``+autograd``, ``+varying_m``...) and the fused
    residual adds' (``cute.auto+add``) left out.

    Each cost is the median of the newest host benchmark run that timed it (``bench --op
    host``: every implementation interleaved on one host, so they compare), else of its newest
    run; ``p20``/``p80``: the smallest and largest median of every recorded run (host costs
    drift between runs and hosts far more than device times), ``runs`` their count; ``source``:
    ``host benchmark`` or ``sweep`` (a sweep's own host rows, timed apart and, for a pinned lab
    variant, inside ``settings.override``: they do not compare with the host benchmark's).
    Columns: impl, device_impl, M, N, host_us, p20, p80, runs, source."""
    cols = ["impl", "device_impl", "M", "N", "host_us", "p20", "p80", "runs", "source"]
    if df.empty:
        return pd.DataFrame(columns=cols)
    d = df[(df["gpu"] == gpu) & (df["path"] == "host") & (df["metric"] == "host")
           & (df["op"] == op)]
    d = d[d["impl"].map(lambda s: bool(_PLAIN.match(s)))]
    if d.empty:
        return pd.DataFrame(columns=cols)
    # one number per implementation: the smallest measured shape (host cost barely moves with M)
    d = d[d["M"] == d.groupby("impl")["M"].transform("min")]
    d = d.assign(_t=pd.to_datetime(d["timestamp"], utc=True)).sort_values("_t")
    # the host benchmark's runs are the ones that time launch paths (``cute.auto@tvm_ffi``)
    bench_runs = d.loc[d["impl"].str.contains("@", regex=False), "_t"]
    g = d.groupby("impl")
    chosen, when = g["p50"].last(), g["_t"].last()
    if len(bench_runs):
        newest = d[d["_t"] == bench_runs.max()].set_index("impl")
        chosen.update(newest["p50"])
        when.update(newest["_t"])
    out = pd.DataFrame({"impl": list(g.groups), "M": g["M"].first().values,
                        "N": g["N"].first().values, "host_us": chosen.values,
                        "p20": g["p50"].min().values, "p80": g["p50"].max().values,
                        "runs": g["p50"].size().values,
                        "source": np.where(when.isin(set(bench_runs)), HOST_BENCHMARK,
                                           "sweep")})
    out["device_impl"] = out["impl"].map(device_impl)
    return out.sort_values("impl").reset_index(drop=True)[cols]


def with_host(hosts: pd.DataFrame, impl: str, host_us: float) -> pd.DataFrame:
    """``hosts`` with ``impl``'s host cost replaced (or added): a what-if, e.g. the host cost a
    PR reported for an older launch path. Whatever uses it is a scenario, not a measurement."""
    out = hosts[hosts["impl"] != impl]
    row = pd.DataFrame([{"impl": impl, "device_impl": device_impl(impl), "M": 0, "N": 0,
                         "host_us": float(host_us), "p20": float(host_us),
                         "p80": float(host_us), "source": "scenario"}])
    return pd.concat([out, row], ignore_index=True)


def resolve_host(hosts: pd.DataFrame, impl: str) -> Tuple[Optional[str], float]:
    """(host-measured name, host µs) for ``impl``: a plain kernel name prefers its TVM-FFI
    launch path (the lab's default, measured in host.csv) over the plain name (the forward
    sweep's host rows); then its kernel's plain name (a fused add's kernel is the fused add,
    ``kernel_of``: never the plain norm's). (None, NaN) when none was measured."""
    names = ([f"{impl}@tvm_ffi", impl] if "@" not in impl else [impl]) + [device_impl(impl)]
    for name in names:
        r = hosts[hosts["impl"] == name]
        if not r.empty:
            return name, float(r["host_us"].iloc[0])
    return None, math.nan


def host_us_of(hosts: pd.DataFrame, impl: str) -> float:
    """Host µs of ``impl`` (see ``resolve_host``); NaN when none was measured."""
    return resolve_host(hosts, impl)[1]


def measured_points(df: pd.DataFrame, op: str = "fwd", N: int = REF_N,
                    path: str = "graph") -> pd.DataFrame:
    """Every GPU's measured median µs and GB/s (``path``) at width ``N``, ``kind == measured``:
    results committed for an H100 or a B200 show up here by themselves."""
    if df.empty:
        return pd.DataFrame(columns=["gpu", "impl", "M", "N", "time_us", "GBps", "kind"])
    d = latest(df[(df["op"] == op) & (df["path"] == path) & (df["N"] == N)
                  & ~df["impl"].isin(CEILINGS)])
    t = d[d["metric"] == "time"].set_index(["gpu", "impl", "M", "N"])["p50"]
    bw = d[d["metric"] == "bandwidth"].set_index(["gpu", "impl", "M", "N"])["p50"]
    out = pd.concat({"time_us": t, "GBps": bw}, axis=1).reset_index()
    return out.assign(kind=MEASURED)


def crossover_M(cal: pd.DataFrame, op: str, impl: str, host_us: float, gpu: str,
                N: int = REF_N, dtype: str = "bf16") -> float:
    """The M at which ``impl``'s modelled device time on ``gpu`` reaches ``host_us``: below it
    the call is host-bound. 0 when the device is slower at every M; NaN when not calibrated."""
    r = _cal_row(cal, op, impl)
    if r is None or not math.isfinite(host_us):
        return math.nan
    if host_us <= r["t0_us"]:
        return 0.0
    per_row = bytes_moved(op, 2, N, dtype) - bytes_moved(op, 1, N, dtype)
    bw = spec(gpu).bandwidth_gbps * 1e3
    return (host_us - r["t0_us"]) * r["efficiency"] * bw / per_row


def crossover_table(df: pd.DataFrame, gpus: Sequence[str] = MODEL_GPUS, op: str = "fwd",
                    N: int = REF_N, cal: Optional[pd.DataFrame] = None,
                    hosts: Optional[pd.DataFrame] = None) -> pd.DataFrame:
    """Crossover M per host-measured implementation (rows) and GPU (columns): modelled (the
    implementation's kernel, modelled on that GPU, against its host cost in ``hosts``), and on
    each GPU with measurements, ``crossover.crossover_table``'s (its kernel's measured graph
    times against its measured host time; NaN where the measurements do not bracket it)."""
    cal = calibrate(df) if cal is None else cal
    hosts = host_costs(df, op=op) if hosts is None else hosts
    rows = []
    for h in hosts.itertuples():
        row = {"impl": h.impl, "host_us": h.host_us}
        for gpu in gpus:
            row[f"{gpu} (modelled)"] = crossover_M(cal, op, h.device_impl, h.host_us, gpu, N)
        rows.append(row)
    if not rows:
        return pd.DataFrame()
    out = pd.DataFrame(rows).set_index("impl")
    for gpu in (sorted(df["gpu"].unique()) if not df.empty else []):
        t = measured_crossover_table(df, list(out.index), gpu, N=N)
        measured = t["crossover M"].where(t["bound"] == "=").reindex(out.index)
        if measured.notna().any():  # a GPU whose results hold no host-timed forward sweep: none
            out[f"{gpu} (measured)"] = measured
    return out


# --- checks against measurement and against the reported figures -----------------------------

def pr_comparison(df: pd.DataFrame, reported: pd.DataFrame, op: str = "fwd",
                  Ms: Sequence[int] = (4096, 8192), gpus: Sequence[str] = ("h100_sxm", "b200"),
                  N: int = REF_N, cal: Optional[pd.DataFrame] = None,
                  hosts: Optional[pd.DataFrame] = None, how: str = "do_bench") -> pd.DataFrame:
    """CuTe time / Triton time, modelled per pair, GPU and M, next to the reported ratio and the
    ratios measured on a GPU the lab ran on (the calibration GPU): ``measured device ratio`` by
    CUDA-graph replay, ``measured eager ratio`` by ``do_bench``. ``device ratio (modelled)`` is
    the kernels alone; ``call ratio`` adds the host term by the ``how`` call model
    (``do_bench``: what the PRs and this lab's eager timer measure); ``bound (cute, triton)``
    says which term of that call model is the larger on each side (``bound``); ``flush_us`` is
    the L2 flush under which the ``do_bench`` model hides host time."""
    cal = calibrate(df) if cal is None else cal
    hosts = host_costs(df, op=op) if hosts is None else hosts
    ce = copy_efficiency(df)
    rows = []

    def timed(path):  # results slugs (h100) to spec keys (h100_sxm, h100_pcie by SM count)
        if df.empty:
            return df
        d = latest(df[(df["path"] == path) & (df["metric"] == "time") & (df["op"] == op)
                      & (df["N"] == N)])
        return d.assign(gpu=[_spec_key(g, n) for g, n in zip(d["gpu"], d["sm_count"])])

    measured = {"measured device ratio": timed("graph"), "measured eager ratio": timed("eager")}

    def ratio(d, gpu, M, a, b):
        t = {} if d.empty else d[(d["gpu"] == gpu) & (d["M"] == M)].set_index("impl")["p50"]
        return t[a] / t[b] if a in t and b in t else math.nan

    ran = sorted({g for d in measured.values() if not d.empty for g in d["gpu"]})
    for cute, tri in PAIRS:
        hc, ht = host_us_of(hosts, cute), host_us_of(hosts, tri)
        for gpu in dict.fromkeys([CALIBRATION_GPU, *gpus, *[g for g in ran if g in SPECS_KEYS]]):
            flush = flush_us(gpu, ce)
            for M in Ms:
                dc, dt = (device_us(cal, op, device_impl(i), gpu, M, N) for i in (cute, tri))
                cc, ct = (call_us(hc, dc, gpu, how, ce), call_us(ht, dt, gpu, how, ce))
                rep = reported[(reported["gpu"] == gpu) & (reported["op"] == op)
                               & (reported["metric"] == "ratio") & (reported["M"] == M)
                               & (reported["impl"] == cute)] if not reported.empty else reported
                rows.append({"pair": f"{cute} / {tri}", "gpu": gpu, "M": M,
                             "device cute_us": dc, "device triton_us": dt,
                             "host cute_us": hc, "host triton_us": ht,
                             "device ratio (modelled)": dc / dt, "call ratio (modelled)": cc / ct,
                             "bound (cute, triton)": f"{bound(hc, dc, gpu, how, ce)}, "
                                                      f"{bound(ht, dt, gpu, how, ce)}",
                             "call model": how, "flush_us": flush,
                             "reported ratio": float(next(iter(rep["value"]), math.nan)),
                             **{k: ratio(d, gpu, M, cute, tri) for k, d in measured.items()}})
    return pd.DataFrame(rows)


def finding(pr: pd.DataFrame, M: int = 8192) -> Dict[str, str]:
    """Does the model reproduce the PR's finding at ``M`` rows, for the PR's own pair? Computed
    from ``pr_comparison``'s rows, and worded as the data says, direction and magnitude apart:

    * B200, the *direction*: CuTe faster per call (modelled ratio below 1 − PARITY/2) while the
      kernels alone are not, so that the host term decides; the *magnitude*: the modelled ratio
      within PARITY of the reported one. ``"direction reproduced, magnitude not: ..."``;
    * H100, *parity*: the modelled ratio within PARITY of 1 (and its magnitude as above).

    Returns a verdict per GPU and an ``overall`` line."""
    pair = f"{PAIRS[0][0]} / {PAIRS[0][1]}"
    out = {}
    for gpu, want in (("b200", "win"), ("h100_sxm", "parity")):
        r = pr[(pr["pair"] == pair) & (pr["gpu"] == gpu) & (pr["M"] == M)]
        if r.empty or not math.isfinite(r["call ratio (modelled)"].iloc[0]):
            out[gpu] = "not computable (no calibration or host data for the PR's pair)"
            continue
        r = r.iloc[0]
        ratio, rep = r["call ratio (modelled)"], r["reported ratio"]
        if want == "win":
            # CuTe faster although the kernels alone are not: the host term decides
            ok = ratio < 1 - PARITY / 2 and r["device ratio (modelled)"] > ratio + PARITY / 2
            claim = "direction"
        else:
            ok = abs(ratio - 1) <= PARITY
            claim = "parity"
        close = math.isfinite(rep) and abs(ratio - rep) <= PARITY
        verdict = (f"{claim} and magnitude reproduced" if ok and close else
                   f"{claim} reproduced, magnitude not" if ok else
                   f"{claim} not reproduced")
        sides = [_side(who, b.strip(), r[f"host {k}_us"], r[f"device {k}_us"], r)
                 for who, k, b in zip(("CuTe", "Triton"), ("cute", "triton"),
                                      r["bound (cute, triton)"].split(","))]
        out[gpu] = (f"{verdict}: modelled {ratio:.2f} against reported {rep:.2f} (kernels alone "
                    f"{r['device ratio (modelled)']:.2f}; {'; '.join(sides)})")
    out["overall"] = "; ".join(f"{gpu_title(g)}: {v.split(':')[0]}" for g, v in out.items())
    return out


def _side(who: str, bound_: str, host: float, device: float, r: pd.Series) -> str:
    """One side of ``finding``'s bracket: which term bounds ``who``'s call under the row's call
    model, with the numbers that decide it."""
    head, flush = f"{who}'s call {bound_}-bound", r.get("flush_us", 0.0)
    if r.get("call model", "do_bench") != "do_bench":
        return f"{head}, {host:.0f} µs host against a {device:.0f} µs kernel"
    if host <= flush:
        return f"{head}, its {host:.0f} µs host hidden under the {flush:.0f} µs L2 flush"
    return (f"{head}, {host - flush:.0f} µs of its {host:.0f} µs host beyond the {flush:.0f} µs "
            f"flush against a {device:.0f} µs kernel")


def calibration_check(pr: pd.DataFrame) -> pd.DataFrame:
    """The check under ``finding``'s verdicts: ``pr_comparison``'s rows of the PR's pair on the
    calibration GPU where its eager ratio was measured, the model's call ratio over that
    measured one (``off by``). Far from 1, the host costs put into the model do not reproduce
    that GPU's own eager calls, and the other GPUs' verdicts hold only under those costs."""
    pair = f"{PAIRS[0][0]} / {PAIRS[0][1]}"
    r = pr[(pr["pair"] == pair) & (pr["gpu"] == CALIBRATION_GPU)
           & pr["measured eager ratio"].notna()]
    r = r[["M", "call ratio (modelled)", "measured eager ratio"]].reset_index(drop=True)
    return r.assign(**{"off by": r["call ratio (modelled)"] / r["measured eager ratio"]})


def reported_vs_modelled(reported: pd.DataFrame, cal: pd.DataFrame) -> pd.DataFrame:
    """Each reported device time (graph or device path, known M and N) next to the model's
    device time for the same implementation, op, shape and GPU."""
    if reported.empty:
        return pd.DataFrame()
    r = reported[(reported["metric"] == "time") & reported["path"].isin(["graph", "device"])
                 & reported["M"].notna() & reported["N"].notna()]
    rows = []
    for x in r.itertuples():
        if not has_spec(x.gpu):  # no datasheet: no model
            continue
        m = device_us(cal, x.op, device_impl(x.impl), x.gpu, int(x.M), int(x.N))
        rows.append({"gpu": x.gpu, "op": x.op, "impl": x.impl, "M": int(x.M), "N": int(x.N),
                     "reported_us": x.value, "modelled_us": m, "modelled/reported":
                     m / x.value if math.isfinite(m) else math.nan, "source": x.source})
    return pd.DataFrame(rows)


# --- NVFP4 on Blackwell, modelled ----------------------------------------------------------------

def nvfp4_bytes(M, N: int = REF_N, dtype: str = "bf16"):
    """Minimum DRAM bytes of one NVFP4 forward: read x and w, write half a byte a value and one
    e4m3 scale a block of 16 (the swizzled padding aside)."""
    s = ELEM_BYTES[dtype]
    M = np.asarray(M, dtype=float)
    return M * N * (s + 0.5) + M * N / 16 + N * s


def nvfp4_table(df: pd.DataFrame, gpu: str = "b200", Ms: Sequence[int] = MODEL_M,
                N: int = REF_N, impl: str = "cute.auto") -> pd.DataFrame:
    """The NVFP4 forward on ``gpu``, **modelled** (the lab has no Blackwell): its bytes, and the
    time of a kernel that reaches the bf16 forward's fixed cost and bandwidth efficiency as
    calibrated on the H200 (``calibrate``), beside the bf16 forward modelled the same way. The
    NVFP4 kernel is the forward's tile with another epilogue, so the same efficiency is the
    assumption; 'modelled' is in the column names."""
    cal = calibrate(df)
    r = _cal_row(cal, "fwd", impl)
    bw = spec(gpu).bandwidth_gbps * 1e3
    Ms = np.asarray(Ms, dtype=float)
    b = nvfp4_bytes(Ms, N)
    t = (r["t0_us"] + b / (r["efficiency"] * bw)) if r is not None else np.full(len(Ms), np.nan)
    bf16 = device_us(cal, "fwd", impl, gpu, Ms, N)
    return pd.DataFrame({"M": Ms.astype(int), "N": N, "nvfp4_MB": b / 1e6,
                         "bf16_MB": bytes_moved("fwd", Ms, N) / 1e6,
                         f"nvfp4_us ({gpu}, modelled)": t,
                         f"bf16_us ({gpu}, modelled)": bf16})
