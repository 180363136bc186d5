"""The host-overhead lesson's live measurements (notebooks/03_host_overhead.ipynb on a CUDA
GPU): the same quantities ``rmsnorm_workbook.bench.host`` records, with fewer rounds, so that the
notebook shows what it just measured. Without a GPU the notebook reads the recorded rows instead
(``HostRuns`` looks them up by the settings and instruments in force, ``bench.instruments.use``:
``analysis.host.recorded_name``).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import pandas as pd

from rmsnorm_lab import rms_norm
from .host import (AUTOGRAD, DEFAULT_IMPL, HOST_SHAPE, TORCH, WORKLOADS, changed_toggles,
                   default_toggles, host_rows, recorded_name)

EPS = 1e-6


def _lab_call(x, w):  # rms_norm bound at import: no import statement inside a timed call
    return rms_norm(x, w, EPS, casting_mode="llama", backend="cute")


def _torch_call(x, w):
    import torch
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, EPS)


class HostRuns:
    """Host µs per call of the lab's call under the settings and instruments in force
    (``instruments.use``: the library's settings, the launch path...), next to the defaults and
    torch's ``F.rms_norm``: measured now when ``live`` (interleaved rounds, collector off, as
    ``bench.host`` does, with fewer rounds), otherwise the rows ``recorded`` in host.csv for
    those settings. Each ``measure`` is kept under its label."""

    def __init__(self, recorded: Optional[pd.DataFrame], live: bool, gpu: str = "h200",
                 calls: int = 100, repeats: int = 5):
        self.recorded, self.live, self.gpu = recorded, live, gpu
        self.calls, self.repeats = calls, repeats
        self.runs: Dict[str, pd.DataFrame] = {}
        self.names: Dict[str, Optional[str]] = {}  # label -> the host.csv name of its settings
        self.failures: List[str] = []

    # what one measurement returns: index (who, workload), columns p20, p50, p80
    def measure(self, label: str, workloads: Sequence[str] = WORKLOADS
                ) -> Optional[pd.DataFrame]:
        """The host µs of ``workloads`` for: ``now`` (the settings in force), ``default`` (the
        lab's defaults) and ``torch``. None (with a line saying why) when these settings were
        not recorded and cannot be measured here."""
        changed = changed_toggles()
        if self.live:
            frame = self._measure_live(changed, workloads)
        else:
            frame = self._lookup(changed, workloads)
        if frame is not None:
            self.runs[label] = frame
            self.names[label] = recorded_name(changed)
        return frame

    def as_rows(self, prov: dict, skip: Sequence[str] = (DEFAULT_IMPL,)) -> List[dict]:
        """The ``now`` measurements as host.csv rows (``prov``: the provenance), named as the
        benchmark names the settings they ran under; labels whose settings the benchmark does
        not name, and the names in ``skip``, are left out."""
        import torch

        from ..bench.runner import make_row
        from ..bench.timing import Quantiles
        rows = []
        for label, frame in self.runs.items():
            name = self.names.get(label)
            if name is None or name in skip:
                continue
            for (who, w), r in frame.iterrows():
                if who != "now":
                    continue
                op = "full" if w == "full" else "fwd"
                impl = name + (AUTOGRAD if w == "fwd+autograd" else "")
                rows.append(make_row(prov, op, impl, "host", HOST_SHAPE[0], HOST_SHAPE[1],
                                     torch.bfloat16, "host",
                                     Quantiles(r["p20"], r["p50"], r["p80"])))
        return rows

    def _lookup(self, changed, workloads) -> Optional[pd.DataFrame]:
        name = recorded_name(changed)
        if self.recorded is None or name is None:
            print("not recorded: the benchmark has no row for these settings "
                  f"({', '.join(f'{k}={v!r}' for k, v in changed.items()) or 'defaults'}); "
                  "a CUDA GPU measures them here")
            return None
        h = host_rows(self.recorded, self.gpu).set_index(["impl", "workload"])
        rows = []
        for who, impl in (("now", name), ("default", DEFAULT_IMPL), ("torch", TORCH)):
            for w in workloads:
                if (impl, w) in h.index:
                    r = h.loc[(impl, w)]
                    rows.append({"who": who, "workload": w, "p20": r["p20"], "p50": r["p50"],
                                 "p80": r["p80"]})
        if not any(r["who"] == "now" for r in rows):
            print(f"not recorded: no {name} rows in the recorded host results")
            return None
        return pd.DataFrame(rows).set_index(["who", "workload"])

    def _measure_live(self, changed, workloads) -> Optional[pd.DataFrame]:
        from ..bench.host import host_tasks
        from ..bench.timing import interleaved_host_time_us
        impls = {"now": (_lab_call, dict(changed)), "torch": (_torch_call, {})}
        if changed:
            impls["default"] = (_lab_call, default_toggles())
        tasks, failures = host_tasks(impls, calls=self.calls)
        self.failures += failures
        for f in failures:
            print(f"failed: {f}")
        keep = {k: t for k, t in tasks.items() if _task_workload(*k) in workloads}
        if not keep:
            return None
        timed = interleaved_host_time_us(keep, repeats=self.repeats, warmup=5)
        rows = [{"who": _task_who(impl), "workload": _task_workload(op, impl), "p20": q.p20,
                 "p50": q.p50, "p80": q.p80} for (op, impl), q in timed.items()]
        frame = pd.DataFrame(rows).set_index(["who", "workload"])
        if not changed:  # the defaults are "now"
            frame = pd.concat([frame, frame.loc[["now"]].rename(index={"now": "default"})])
        return frame

    def summary(self, label: str) -> pd.DataFrame:
        """One row per workload: µs now, at the defaults and torch's, and now / torch."""
        return summarize(self.runs[label])


def _task_workload(op: str, impl: str) -> str:
    return "fwd+autograd" if impl.endswith(AUTOGRAD) else op


def _task_who(impl: str) -> str:
    return impl[:-len(AUTOGRAD)] if impl.endswith(AUTOGRAD) else impl


def summarize(frame: pd.DataFrame) -> pd.DataFrame:
    """A ``HostRuns.measure`` frame as one row per workload: ``µs`` (now), ``default µs``,
    ``torch µs``, ``/ torch``, ``spread µs`` (the larger p20-p80 of now and default)."""
    p50 = frame["p50"].unstack("who")
    spread = (frame["p80"] - frame["p20"]).unstack("who")
    out = pd.DataFrame(index=[w for w in WORKLOADS if w in p50.index])
    out["µs"] = p50["now"]
    if "default" in p50:
        out["default µs"] = p50["default"]
    if "torch" in p50:
        out["torch µs"] = p50["torch"]
        out["/ torch"] = p50["now"] / p50["torch"]
    out["spread µs"] = spread[[c for c in ("now", "default") if c in spread]].max(axis=1)
    out.index.name = "workload"
    return out


#: row counts of the kernels' L2-cold times measured live (the crossover's device side)
KERNEL_M = (1024, 2048, 4096, 8192, 16384, 32768, 65536)


def _cold_graph_us(call, M: int, N: int, replays: int):
    """CUDA-graph µs per ``call(x, w)`` at M x N, its input sets rotated past the L2 (as the
    sweeps time the kernels), so every call reads them from DRAM."""
    import torch

    from ..bench.timing import graph_time_us, rotating, rotation_count
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    k = rotation_count(2 * M * N * 2, l2)
    sets = [(torch.randn(M, N, device="cuda", dtype=torch.bfloat16),
             torch.randn(N, device="cuda", dtype=torch.bfloat16)) for _ in range(k)]
    return graph_time_us(rotating(lambda s: call(*s), sets), replays=replays, calls_multiple=k)


def live_rows(kind: str, prov: Optional[dict] = None, **kw) -> List[dict]:
    """Results rows measured now on the GPU (``results.write``'s format; ``prov``: the
    provenance of the run they belong to, this machine's now if None: rows meant to read as one
    run share one), as ``bench.host`` records them with fewer rounds. ``kind``:

    * ``crossover``: the default path's forward by graph replay of one input against M (kw
      ``Ms``), and the lab's and torch's kernels on inputs rotated past the L2 (kw
      ``kernel_Ms``): the device side of ``analysis.crossover``;
    * ``peers``: the three workloads of the default path, the lab's Triton path and every
      installed peer but those in kw ``skip`` (default ``torch.compile``: it compiles for longer
      than a lesson runs)."""
    import torch

    from ..bench import host as hb
    from ..bench.runner import make_row
    from ..bench.timing import graph_time_us, interleaved_host_time_us
    from ..results import provenance
    prov = provenance.collect() if prov is None else prov
    M0, N0 = HOST_SHAPE
    rows: List[dict] = []
    if kind == "crossover":
        for M in kw.get("Ms", hb.CROSSOVER_M):  # one input set: in L2 where it fits
            x = torch.randn(M, N0, device="cuda", dtype=hb.DTYPE)
            w = torch.randn(N0, device="cuda", dtype=hb.DTYPE)
            q = graph_time_us(lambda: _lab_call(x, w), replays=kw.get("replays", 10))
            rows.append(make_row(prov, "fwd", DEFAULT_IMPL, "graph", M, N0, hb.DTYPE, "time", q))
        for M in kw.get("kernel_Ms", KERNEL_M):  # each kernel on inputs read from DRAM
            for name, call in (("cute.auto", _lab_call), (TORCH, _torch_call)):
                rows.append(make_row(prov, "fwd", name, "graph", M, N0, hb.DTYPE, "time",
                                     _cold_graph_us(call, M, N0, kw.get("replays", 10))))
        return rows
    if kind == "peers":
        from ..bench import peers
        impls = {DEFAULT_IMPL: _lab_call, "triton.row": hb.lab_call("triton")}
        impls.update({n: f for n, f in peers.forward_peers(EPS).items()
                      if n not in kw.get("skip", ("torch.compile",))})
        # aliases: the benchmark adds its varying-M workloads to some names, not wanted here
        alias = {f"impl{k}": name for k, name in enumerate(impls)}
        no_backward = peers.forward_only()
        forward_only = frozenset(a for a, n in alias.items() if n in no_backward)
        tasks, failures = hb.host_tasks({a: (impls[n], default_toggles())
                                         for a, n in alias.items()}, calls=kw.get("calls", 50),
                                        forward_only=forward_only)
        for f in failures:
            print(f"failed: {f}")
        timed = interleaved_host_time_us(tasks, repeats=kw.get("repeats", 3), warmup=5)
        for (op, a), q in timed.items():
            base, suffix = (a[:-len(AUTOGRAD)], AUTOGRAD) if a.endswith(AUTOGRAD) else (a, "")
            rows.append(make_row(prov, op, alias[base] + suffix, "host", M0, N0, hb.DTYPE,
                                 "host", q))
        return rows
    raise ValueError(f"kind must be crossover or peers, got {kind!r}")
