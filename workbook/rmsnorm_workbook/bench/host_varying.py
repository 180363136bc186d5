"""Where the forward + backward's host microseconds go when the row count changes every call: the
varying-M workload of ``bench --op host`` taken apart, the lab's default path next to torch's
``F.rms_norm``, all timed interleaved (``interleaved_host_time_us``), N=4096 bf16 on one GPU.

    python -m rmsnorm_workbook.bench.host_varying --out DIR

Tasks per implementation: ``full`` (forward + backward, M drawn per call from 1..8192, each call's
rows a leaf of its own: the benchmark's workload), ``fwd leaf`` (the same forward, its graph
built and dropped: the backward's share is the difference), and both at a fixed M of 4096, the
drawn counts' mean, which separates "M changes" from "M is large". Writes ``host-varying.jsonl``
(provenance, then one line per task: p20, p50, p80 µs per call) and ``host-varying-ops.txt``:
torch.profiler's per-operator host time over the same calls, for each ``full``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path
from typing import Callable, Dict

import torch

from .host import VARYING_M_MAX, lab_call, varying_m_sequence
from .timing import HostTask, interleaved_host_time_us

N = 4096
FIXED_M = VARYING_M_MAX // 2
DTYPE = torch.bfloat16
EPS = 1e-6


def workloads(fn: Callable, name: str) -> Dict[str, Callable[[], object]]:
    """The four workloads of one implementation (see the module's docstring)."""
    Ms = varying_m_sequence()
    x = torch.randn(VARYING_M_MAX, N, device="cuda", dtype=DTYPE)
    w = torch.randn(N, device="cuda", dtype=DTYPE, requires_grad=True)
    dy = torch.randn_like(x)
    at = [0]

    def varying() -> int:
        at[0] = (at[0] + 1) % len(Ms)
        return Ms[at[0]]

    def full(m: int) -> None:
        fn(x[:m].detach().requires_grad_(), w).backward(dy[:m])

    def fwd_leaf(m: int) -> None:
        fn(x[:m].detach().requires_grad_(), w)

    tasks = {f"{name} full": lambda: full(varying()),
             f"{name} fwd leaf": lambda: fwd_leaf(varying()),
             f"{name} full M={FIXED_M}": lambda: full(FIXED_M),
             f"{name} fwd leaf M={FIXED_M}": lambda: fwd_leaf(FIXED_M)}
    for m in Ms:  # every row count once before timing, as the benchmark does
        full(m)
    return tasks


def operator_table(call: Callable[[], object], calls: int = 300) -> str:
    """torch.profiler's per-operator host time over ``calls`` calls, the costliest first."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)


def main(argv=None) -> int:
    from ..results import provenance

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    tasks: Dict[str, Callable[[], object]] = {}
    tasks.update(workloads(lab_call("cute"), "lab"))
    tasks.update(workloads(lambda a, b: torch.nn.functional.rms_norm(a, (N,), b, EPS), "torch"))
    timed = interleaved_host_time_us(
        {name: HostTask(fn, 200, contextlib.nullcontext) for name, fn in tasks.items()},
        repeats=15)
    with open(args.out / "host-varying.jsonl", "w") as f:
        f.write(json.dumps({"provenance": provenance.collect()}, default=str) + "\n")
        for name, q in timed.items():
            f.write(json.dumps({"task": name, "p20": round(q.p20, 2), "p50": round(q.p50, 2),
                                "p80": round(q.p80, 2)}) + "\n")
            print(f"{name:28s} {q.p50:8.1f} µs  ({q.p20:.1f}-{q.p80:.1f})")
    with open(args.out / "host-varying-ops.txt", "w") as f:
        for name in ("lab full", "torch full", f"lab full M={FIXED_M}",
                     f"torch full M={FIXED_M}"):
            f.write(f"== {name}\n{operator_table(tasks[name])}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
