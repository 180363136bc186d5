"""The crossover: the row count at which a loop of eager calls stops being host-bound.

One definition, used by every reader (notebooks 03 and 04, the report's figures):

    The crossover M of an implementation is the row count, at width N, at which the device time
    per call of **its own kernel** reaches **its own host time per call**.

* *its own kernel*: the kernel behind the host-measured name (``kernel_of``): every launch path
  of the lab (``cute.auto@tvm_ffi``, ``cute.auto@cached``, ``...+python_node``) runs
  ``cute.auto``'s kernel, a peer runs its own (``torch.native``, ``liger.triton``...);
* *device time*: that kernel's median µs by CUDA-graph replay in the sweeps (``path == "graph"``
  rows named by the kernel, e.g. ``results/<gpu>/fwd.csv``), whose inputs rotate past the L2, so
  every call reads them from DRAM;
* *host time*: the median host µs per call at ``HOST_SHAPE`` for the workload asked (``fwd``,
  ``fwd+autograd``: compared with the forward kernel; ``full``: with forward and backward), from
  the newest run of the host benchmark (``host_times``);
* between the two measured M around it, log(device time) is interpolated linearly in log(M).

Below the crossover the GPU waits for the CPU (host-bound), above it the CPU waits for the GPU.
The modelled crossovers of other GPUs (``model.crossover_M``) apply the same definition to a
modelled device time.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import pandas as pd

from .host import HOST_SHAPE, host_table
from .tables import one_gpu

COLUMNS = ["kernel", "host µs", "crossover M", "bound", "reads"]
#: the host-measured names the cross-GPU tables (notebook 04, the report) show: the lab's default
#: launch path and the peers, each as the host benchmark timed it (``shown_hosts``)
HOSTS_SHOWN = ("cute.auto@tvm_ffi", "triton.row", "liger.cutedsl", "liger.triton", "quack",
               "torch.native")
#: ``model.host_costs``'s ``source`` of a cost from the host benchmark (``bench --op host``)
HOST_BENCHMARK = "host benchmark"


def shown_hosts(hosts: pd.DataFrame, names: Sequence[str] = HOSTS_SHOWN) -> pd.DataFrame:
    """The rows of ``hosts`` (``model.host_costs``) that the cross-GPU tables compare: those of
    ``names`` whose cost the host benchmark timed (``source``), in that order. A sweep's own host
    row is left out: timed apart from the others, and for a pinned lab variant inside
    ``settings.override``, it does not compare with them."""
    h = hosts[hosts["impl"].isin(list(names)) & (hosts["source"] == HOST_BENCHMARK)]
    return h.set_index("impl").reindex([n for n in names if n in set(h["impl"])]).reset_index()


@dataclasses.dataclass(frozen=True)
class Crossover:
    """Where device time reaches a constant host time. ``M`` is the interpolated row count when
    the measurements bracket it (``bound == "="``); otherwise ``M`` is the edge of what was
    measured and ``bound`` says the crossover lies below it (``"<"``) or beyond it (``">"``)."""
    host_us: float
    M: float
    bound: str

    def __str__(self) -> str:
        return f"{'≈' if self.bound == '=' else self.bound} {self.M:,.0f}"


def crossover_M(Ms: Sequence[float], device_us: Sequence[float], host_us: float) -> Crossover:
    """The first M at which ``device_us(M)`` reaches ``host_us``, by linear interpolation of
    log(device time) against log(M) between the two measured points around it."""
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


def kernel_of(impl: str) -> str:
    """The kernel behind a host-measured name: ``cute.auto@tvm_ffi+python_node`` ->
    ``cute.auto``; a peer is its own kernel, and so is a fused residual add (``cute.auto+add``:
    ``+add`` names the op, where ``+nvtx``, ``+python_node``... name ablations)."""
    parts = impl.split("@")[0].split("+")
    return "+".join(parts[:2]) if parts[1:2] == ["add"] else parts[0]


def op_of(workload: str) -> str:
    """The sweep op whose kernel time a host workload is compared with."""
    return "full" if workload == "full" else "fwd"


def kernel_times(df: pd.DataFrame, kernel: str, gpu: Optional[str] = None, op: str = "fwd",
                 N: int = HOST_SHAPE[1]) -> pd.DataFrame:
    """``kernel``'s CUDA-graph µs per call against M at width N (columns M, p20, p50, p80, and
    ``timestamp``: the run each comes from), the newest measurement of each M; empty when the
    sweeps did not time it."""
    d, _ = one_gpu(df, gpu)
    d = d[(d["op"] == op) & (d["impl"] == kernel) & (d["path"] == "graph")
          & (d["metric"] == "time") & (d["N"] == N)]
    return d.sort_values("M")[["M", "p20", "p50", "p80", "timestamp"]].reset_index(drop=True)


def host_times(df: pd.DataFrame, gpu: Optional[str] = None, workload: str = "fwd",
               shape=HOST_SHAPE) -> pd.Series:
    """Median host µs per call at ``shape`` of every implementation for ``workload``: from the
    newest run of the host benchmark (``bench --op host``, whose rows name launch paths with
    ``@``; it times every implementation in the same interleaved rounds, so they compare), and
    for an implementation that run did not time, its newest measurement."""
    _, gpu = one_gpu(df, gpu)
    d = df[df["gpu"] == gpu]
    newest_all = host_table(d, gpu, shape)
    bench = d[(d["path"] == "host") & d["impl"].str.contains("@", regex=False)]
    if bench.empty or workload not in newest_all.columns:
        return newest_all.get(workload, pd.Series(dtype=float))
    run = host_table(d[d["timestamp"] == bench["timestamp"].max()], gpu, shape)
    out = newest_all[workload].copy()
    if workload in run.columns:
        out.update(run[workload])
    return out


def crossover_table(df: pd.DataFrame, impls: Sequence[str], gpu: Optional[str] = None,
                    workload: str = "fwd", N: int = HOST_SHAPE[1]) -> pd.DataFrame:
    """One row per implementation of ``impls`` that has both a host time and its kernel's
    device times: ``kernel`` (whose time it was compared with), ``host µs``, ``crossover M``,
    ``bound`` (``=``, ``<``, ``>``: see ``Crossover``) and ``reads`` (``≈ 2,479``)."""
    hosts = host_times(df, gpu, workload)
    rows = {}
    for impl in impls:
        if impl not in hosts.index or pd.isna(hosts[impl]):
            continue
        dev = kernel_times(df, kernel_of(impl), gpu, op_of(workload), N)
        if dev.empty:
            continue
        c = crossover_M(dev["M"], dev["p50"], float(hosts[impl]))
        rows[impl] = {"kernel": kernel_of(impl), "host µs": c.host_us, "crossover M": c.M,
                      "bound": c.bound, "reads": str(c)}
    return pd.DataFrame.from_dict(rows, orient="index", columns=COLUMNS)
