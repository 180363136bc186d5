"""RMSNorm's speed of light on each GPU: arithmetic intensity (FLOPs per byte of DRAM traffic)
against the two roofs of a GPU, its memory bandwidth and its FP32 throughput (the roofline), with
the lab's kernels placed on it as measured, modelled or reported points.

FLOPs are counted per element of the M×N input, as the formulas in ``reference.py`` spend them
(``FLOPS_PER_ELEMENT``; a convention, written down once): the forward squares and sums x (2),
scales by rstd (1) and by the weight (1); the backward forms m = dy·w (1), x̂ = x·rstd (1), sums
m·x̂ (2), forms rstd·(m − x̂·mean) (3) and sums dy·x̂ over the rows for dW (2). Bytes are
``model.bytes_moved``: the minimum traffic.

``live_rows`` measures, on the GPU the lab runs on, what notebook 04 places on the chart: the copy
ceilings and the default kernels' forward and backward by CUDA-graph replay, L2-cold, as the
benchmark does (fewer replays).
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from . import MEASURED, MODELLED, REPORTED
from .model import MODEL_GPUS, REF_N, bytes_moved, device_us
from .specs import measured_copy_bandwidth, spec
from .tables import CEILING_OF_OP

#: floating-point operations per element of the M×N input (see the module docstring)
FLOPS_PER_ELEMENT: Dict[str, int] = {"fwd": 4, "bwd": 9}
#: the shape the chart places the lab's kernels at: large enough that the fixed cost is small
SOL_SHAPE = (65536, REF_N)
OPS = ("fwd", "bwd")


def flops(op: str, M, N: int, per_element: Optional[Dict[str, int]] = None):
    """FLOPs of one call (``full``: forward and backward)."""
    per = per_element or FLOPS_PER_ELEMENT
    if op == "full":
        return flops("fwd", M, N, per) + flops("bwd", M, N, per)
    return per[op] * np.asarray(M, dtype=float) * N


def intensity(op: str, M: int = SOL_SHAPE[0], N: int = SOL_SHAPE[1], dtype: str = "bf16",
              per_element: Optional[Dict[str, int]] = None) -> float:
    """FLOPs per byte of minimum DRAM traffic of one call at (M, N)."""
    return float(flops(op, M, N, per_element) / bytes_moved(op, M, N, dtype))


def roof_tflops(gpu: str, ai, bandwidth_gbps: Optional[float] = None):
    """Attainable TFLOP/s at intensity ``ai`` on ``gpu``: min(FP32 peak, ai × bandwidth); the
    datasheet bandwidth unless ``bandwidth_gbps`` (a measured ceiling) is given."""
    s = spec(gpu)
    bw = s.bandwidth_gbps if bandwidth_gbps is None else bandwidth_gbps
    return np.minimum(s.fp32_tflops, np.asarray(ai, dtype=float) * bw / 1e3)


def sol_points(df: pd.DataFrame, reported: pd.DataFrame, cal: pd.DataFrame,
               impl: str = "cute.auto", shape: Tuple[int, int] = SOL_SHAPE,
               gpus: Sequence[str] = MODEL_GPUS,
               per_element: Optional[Dict[str, int]] = None) -> pd.DataFrame:
    """The points of the speed-of-light chart, one row each: ``gpu``, ``op``, ``impl``,
    ``kind`` (measured / modelled / reported), ``M``, ``N``, ``time_us``, ``GBps``,
    ``intensity``, ``TFLOPs``, ``source``, and for a measured point ``ceiling GBps``: its op's
    ceiling (``copy`` forward, ``copy2r1w`` backward) measured in the point's own run, what the
    report's "% of copy" tables divide it by (NaN elsewhere).

    * measured: every GPU whose results have ``impl``'s CUDA-graph time at ``shape``;
    * modelled: ``impl`` on each GPU of ``gpus`` without a measurement (``model.device_us``);
    * reported: every device/graph time in ``reported`` with a known shape and GPU, and every
      reported bandwidth at ``shape``'s width (its intensity taken at ``shape[0]`` rows, its
      time left out: the source gives none)."""
    from ..results import latest
    rows: List[dict] = []
    M, N = shape

    def add(gpu, op, name, kind, m, n, t_us=None, gbps=None, source="", ceiling=math.nan):
        b = bytes_moved(op, m, n)
        if gbps is None:
            gbps = b / t_us / 1e3
        if t_us is None:
            t_us = math.nan  # a reported bandwidth without a row count: no time to quote
        ai = intensity(op, m, n, per_element=per_element)
        rows.append({"gpu": gpu, "op": op, "impl": name, "kind": kind, "M": m, "N": n,
                     "time_us": t_us, "GBps": gbps, "intensity": ai,
                     "TFLOPs": ai * gbps / 1e3, "source": source, "ceiling GBps": ceiling})

    measured_gpus = set()
    if not df.empty:
        d = latest(df[(df["impl"] == impl) & (df["path"] == "graph") & (df["metric"] == "time")
                      & (df["M"] == M) & (df["N"] == N) & df["op"].isin(OPS)])
        for r in d.itertuples(index=False):
            own = measured_copy_bandwidth(df, r.gpu, CEILING_OF_OP[r.op], run=r.timestamp)
            add(_spec_key(r.gpu), r.op, impl, MEASURED, M, N, t_us=r.p50,
                source=f"results/{r.gpu}/{r.op}.csv", ceiling=own if own else math.nan)
            measured_gpus.add((_spec_key(r.gpu), r.op))
    for g in gpus:
        for op in OPS:
            if (g, op) in measured_gpus:
                continue
            t = device_us(cal, op, impl, g, M, N)
            if t == t:  # not NaN
                add(g, op, impl, MODELLED, M, N, t_us=float(t), source="model")
    if not reported.empty:
        r = reported[reported["op"].isin(OPS)]
        for x in r.itertuples(index=False):
            g = _spec_key(x.gpu)
            if g is None:
                continue
            if x.metric == "time" and x.path in ("graph", "device") and pd.notna(x.M) \
                    and pd.notna(x.N):
                add(g, x.op, x.impl, REPORTED, int(x.M), int(x.N), t_us=float(x.value),
                    source=x.source)
            elif x.metric == "bandwidth" and pd.notna(x.N) and int(x.N) == N:
                add(g, x.op, x.impl, REPORTED, M, int(x.N), gbps=float(x.value),
                    source=x.source)
    return pd.DataFrame(rows, columns=["gpu", "op", "impl", "kind", "M", "N", "time_us",
                                       "GBps", "intensity", "TFLOPs", "source",
                                       "ceiling GBps"])


def _spec_key(gpu: str) -> Optional[str]:
    try:
        return spec(gpu).key
    except KeyError:
        return None


def live_rows(shapes: Sequence[Tuple[int, int]] = ((8192, REF_N), SOL_SHAPE),
              replays: int = 10) -> Tuple[List[dict], List[str]]:
    """Rows measured now on this GPU (results format): the copy ceilings (``copy``,
    ``copy2r1w``: 1 GiB tensors) and ``cute.auto``'s forward and backward at ``shapes``
    (``time`` and ``bandwidth``, CUDA-graph replay over enough input sets to keep them out of
    L2, each checked against the reference first); and the failures, named."""
    import contextlib
    import functools

    import torch

    from ..bench import peers
    from ..bench.impls import lab_impls
    from ..bench.ops import BWD, DTYPE, FWD
    from ..bench.runner import bandwidth, check, make_row
    from ..bench.timing import graph_time_us, rotating, rotation_count
    from ..results import provenance
    prov = provenance.collect()
    rows: List[dict] = []
    failures: List[str] = []
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    for name in ("copy", "copy2r1w"):
        c = peers.ceiling(name, DTYPE)
        t = graph_time_us(c.fn, replays=replays)
        rows.append(make_row(prov, "fwd" if name == "copy" else "bwd", name, "graph", c.M,
                             c.N, DTYPE, "time", t))
        rows.append(make_row(prov, "fwd" if name == "copy" else "bwd", name, "graph", c.M,
                             c.N, DTYPE, "bandwidth", bandwidth(c.bytes_moved, t)))
        del c
        torch.cuda.empty_cache()
    for op in (FWD, BWD):
        impl = lab_impls(op.name)["cute.auto"]
        for M, N in shapes:
            side = torch.cuda.Stream() if op.prepare is not None else None
            try:
                with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
                    first = op.make_inputs(M, N, DTYPE)
                    status, why = check(op, impl, first, op.reference(first))
                    if status != "ok":
                        failures.append(f"cute.auto {op.name} {M}x{N}: {why}")
                        continue
                    size = sum(t.numel() * t.element_size() for t in first
                               if isinstance(t, torch.Tensor))
                    k = rotation_count(size, l2)
                    sets = [first] + [op.make_inputs(M, N, DTYPE) for _ in range(k - 1)]
                    bound = [op.bind(impl, s) for s in sets]
                    q = graph_time_us(rotating(functools.partial(op.run, impl), bound),
                                      replays=replays, calls_multiple=k, stream=side)
                    moved = op.bytes_moved(first)
            except Exception as e:  # noqa: BLE001 - a failure is reported, the rest goes on
                failures.append(f"cute.auto {op.name} {M}x{N}: {type(e).__name__}: {e}")
                continue
            finally:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            rows.append(make_row(prov, op.name, "cute.auto", "graph", M, N, DTYPE, "time", q))
            rows.append(make_row(prov, op.name, "cute.auto", "graph", M, N, DTYPE, "bandwidth",
                                 bandwidth(moved, q)))
    return rows, failures
