"""Per-event Nsight Systems reports as DataFrames: the raw material of a timeline.

``profiling/nsys.py`` reads the *summary* reports (one row per range or kernel name). This module
reads the *trace* reports, one row per event, that ``nsys stats --format csv`` writes for::

    nsys stats --report nvtx_pushpop_trace,cuda_gpu_trace,cuda_api_trace --format csv \\
        --output profile-fwd --force-export true profile-fwd.nsys-rep

which gives ``profile-fwd_nvtx_pushpop_trace.csv``, ``profile-fwd_cuda_gpu_trace.csv`` and
``profile-fwd_cuda_api_trace.csv`` (newer nsys also offer ``nvtx_trace``, read the same way).

The parsers are keyed on column-name patterns, not positions, because the reports' columns move
between nsys versions. The headers of nsys 2024-2025 are (only the starred ones are required):

* ``nvtx_pushpop_trace``: ``Start (ns)``\\*, ``End (ns)``, ``Duration (ns)``, ``DurChild (ns)``,
  ``DurNonChild (ns)``, ``Name``\\*, ``PID``, ``TID``, ``Lvl``, ``NumChild``, ``RangeId``,
  ``ParentId``, ``RangeStack``, ``NameTree``;
* ``cuda_gpu_trace``: ``Start (ns)``\\*, ``Duration (ns)``, ``CorrId``, ``GrdX`` ... ``BlkZ``,
  ``Reg/Trd``, ``StcSMem (MB)``, ``DymSMem (MB)``, ``Bytes (MB)``, ``Throughput (MBps)``,
  ``SrcMemKd``, ``DstMemKd``, ``Device``, ``Ctx``, ``GreenCtx``, ``Strm``, ``Name``\\*;
* ``cuda_api_trace``: ``Start (ns)``\\*, ``Duration (ns)``, ``Name``\\*, ``Result``, ``CorrID``,
  ``Pid``, ``Tid``, ``T-Pri``, ``Thread Name``.

Every event needs a start and either an end or a duration. Times come back in ns whatever unit
the header names (``(us)`` when exported with ``--timeunit us``). Lines before the header (status
lines nsys prints when writing to stdout) are skipped.

NVTX time is host time (push to pop); a GPU trace row is device time; the two are on the same
clock in one report, so they can be drawn on one axis. A kernel is tied to the API call that
launched it by the correlation id (``CorrId`` / ``CorrID``).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pandas as pd

from rmsnorm_lab.lab import NVTX_DOMAIN as DOMAIN
from .nsys import STAGES, base_name, column_ns, normalize_range

#: the trace reports, and the names nsys gives the NVTX one (newest first)
NVTX_REPORTS = ("nvtx_pushpop_trace", "nvtx_trace")
GPU_REPORT = "cuda_gpu_trace"
API_REPORT = "cuda_api_trace"
TRACE_REPORTS = NVTX_REPORTS + (GPU_REPORT, API_REPORT)



class TraceError(ValueError):
    """A trace CSV that cannot be read: no header with the needed columns, or a bad number."""


# ============================================================================ columns

def _base(column: str) -> str:
    """A column name without its unit and in lower case: ``"Start (ns)"`` -> ``"start"``."""
    return base_name(column).strip().lower()


#: output column -> accepted base names (lower case, unit stripped), first match wins
_PATTERNS: Dict[str, Sequence[str]] = {
    "start_ns": ("start", "start time", "orig start"),
    "end_ns": ("end", "end time", "orig end"),
    "dur_ns": ("duration", "dur"),
    "name": ("name", "range", "kernel name", "api name"),
    "pid": ("pid", "process id"),
    "tid": ("tid", "thread id"),
    "corr_id": ("corrid", "correlation id", "corr id"),
    "level": ("lvl", "level"),
    "range_id": ("rangeid", "range id"),
    "parent_id": ("parentid", "parent id"),
    "device": ("device",),
    "stream": ("strm", "stream"),
    "grid_x": ("grdx", "grid x"),
    "block_x": ("blkx", "block x"),
    "thread_name": ("thread name",),
}
_TIME_COLUMNS = ("start_ns", "end_ns", "dur_ns")
_INT_COLUMNS = ("pid", "tid", "corr_id", "level", "range_id", "parent_id", "grid_x", "block_x")


def _read_rows(path: Path) -> List[List[str]]:
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    return list(csv.reader(io.StringIO(text)))


def read_trace_csv(path) -> pd.DataFrame:
    """Any per-event nsys CSV → a DataFrame with ``start_ns``, ``end_ns``, ``dur_ns`` (floats,
    ns), ``name`` and whichever of ``pid``, ``tid``, ``corr_id``, ``level``, ``range_id``,
    ``parent_id``, ``device``, ``stream``, ``grid_x``, ``block_x``, ``thread_name`` the report
    has. Rows sorted by start. ``TraceError`` when no header has a start and a name column and
    either an end or a duration."""
    path = Path(path)
    rows = _read_rows(path)
    for i, header in enumerate(rows):
        bases = [_base(c) for c in header]
        cols: Dict[str, int] = {}
        for out, names in _PATTERNS.items():
            for name in names:
                if name in bases:
                    cols[out] = bases.index(name)
                    break
        if "start_ns" in cols and "name" in cols and ("end_ns" in cols or "dur_ns" in cols):
            return _frame(path, header, cols, rows[i + 1:], i + 2)
    raise TraceError(f"{path}: no header with a start, a name and an end or a duration column "
                     "(e.g. 'Start (ns)', 'Duration (ns)', 'Name'): is this the CSV of an nsys "
                     "trace report (nvtx_pushpop_trace, cuda_gpu_trace, cuda_api_trace)?")


def _number(path: Path, lineno: int, column: str, raw: str) -> Optional[float]:
    raw = raw.strip().replace(",", "")
    if raw == "" or raw.lower() in ("nan", "none", "null"):
        return None
    try:
        return float(raw)
    except ValueError:
        raise TraceError(f"{path}:{lineno}: column {column!r} is not a number: {raw!r}") from None


def _frame(path: Path, header: List[str], cols: Dict[str, int], data: List[List[str]],
           first_line: int) -> pd.DataFrame:
    records = []
    for n, cells in enumerate(data):
        if not any(c.strip() for c in cells):
            continue
        lineno = first_line + n
        rec: Dict[str, object] = {}
        for out, idx in cols.items():
            raw = cells[idx] if idx < len(cells) else ""
            if out in _TIME_COLUMNS:
                v = _number(path, lineno, header[idx], raw)
                rec[out] = None if v is None else v * column_ns(header[idx])
            elif out in _INT_COLUMNS:
                v = _number(path, lineno, header[idx], raw)
                rec[out] = None if v is None else int(v)
            else:
                rec[out] = raw.strip()
        if rec.get("start_ns") is None:
            raise TraceError(f"{path}:{lineno}: an event without a start time")
        end, dur = rec.get("end_ns"), rec.get("dur_ns")
        if end is None and dur is None:
            raise TraceError(f"{path}:{lineno}: an event without an end or a duration")
        if end is None:
            rec["end_ns"] = rec["start_ns"] + dur
        if dur is None:
            rec["dur_ns"] = rec["end_ns"] - rec["start_ns"]
        records.append(rec)
    columns = ["start_ns", "end_ns", "dur_ns", "name"] + [
        c for c in _PATTERNS if c in cols and c not in ("start_ns", "end_ns", "dur_ns", "name")]
    df = pd.DataFrame(records, columns=columns)
    for c in _TIME_COLUMNS:
        df[c] = df[c].astype("float64")
    for c in _INT_COLUMNS:
        if c in df.columns:
            df[c] = df[c].astype("Int64")
    return df.sort_values("start_ns", kind="stable").reset_index(drop=True)


# ============================================================================ the three reports

def parse_nvtx_trace(path, domain: str = DOMAIN, lab_only: bool = True) -> pd.DataFrame:
    """``nvtx_pushpop_trace`` / ``nvtx_trace`` CSV → one row per range instance, with
    ``range`` (the lab's name without the domain, ``"launch row 128x4096"``) and ``stage`` (its
    first word: ``iter``, ``marshal``, ``launch``...). With ``lab_only`` ranges of other domains
    are dropped; otherwise their ``range`` is the name as nsys wrote it and ``stage`` is empty."""
    df = read_trace_csv(path)
    lab = df["name"].map(lambda n: normalize_range(n, domain))
    if lab_only:
        df, lab = df[lab.notna()].copy(), lab[lab.notna()]
    df["range"] = lab.where(lab.notna(), df["name"])
    df["stage"] = [r.split(" ", 1)[0] if ok else "" for r, ok in zip(df["range"], lab.notna())]
    return df.reset_index(drop=True)


def is_kernel_name(name: str) -> bool:
    """False for the memory operations a GPU trace also lists (``[CUDA memcpy ...]``,
    ``[CUDA memset]``)."""
    return not name.strip().startswith("[")


def parse_gpu_trace(path) -> pd.DataFrame:
    """``cuda_gpu_trace`` CSV → one row per GPU activity, with ``kind`` ``kernel`` or
    ``memop``."""
    df = read_trace_csv(path)
    df["kind"] = ["kernel" if is_kernel_name(n) else "memop" for n in df["name"]]
    return df


def parse_api_trace(path) -> pd.DataFrame:
    """``cuda_api_trace`` CSV → one row per CUDA runtime/driver API call, with ``launch`` True
    for the calls that launch a kernel (``cudaLaunchKernel``, ``cuLaunchKernelEx``...)."""
    df = read_trace_csv(path)
    df["launch"] = df["name"].str.contains("LaunchKernel|GraphLaunch|cuLaunch", regex=True)
    return df


# ============================================================================ a capture's files

@dataclasses.dataclass
class Trace:
    """The trace reports of one capture; any may be None when its CSV was not exported."""
    nvtx: Optional[pd.DataFrame]
    gpu: Optional[pd.DataFrame]
    api: Optional[pd.DataFrame]
    files: Dict[str, Path]

    @property
    def empty(self) -> bool:
        return all(f is None or f.empty for f in (self.nvtx, self.gpu, self.api))


def find_trace_csvs(folder, stem: Optional[str] = None) -> Dict[str, Path]:
    """``{report: path}`` for the trace CSVs in ``folder`` (``<stem>_<report>.csv``; without a
    stem, the first such file per report in name order). The NVTX one is returned under
    ``"nvtx"``, whichever of ``NVTX_REPORTS`` it is. Missing reports are absent, not an error."""
    folder = Path(folder)
    found: Dict[str, Path] = {}
    if not folder.is_dir():
        return found
    for report in TRACE_REPORTS:
        pattern = f"{stem}_{report}.csv" if stem else f"*_{report}.csv"
        cands = sorted(folder.glob(pattern))
        if not cands and (folder / f"{report}.csv").is_file():
            cands = [folder / f"{report}.csv"]
        if not cands:
            continue
        key = "nvtx" if report in NVTX_REPORTS else report
        found.setdefault(key, cands[0])
    return found


def load_trace(folder, stem: Optional[str] = None, domain: str = DOMAIN) -> Trace:
    files = find_trace_csvs(folder, stem)
    return Trace(nvtx=parse_nvtx_trace(files["nvtx"], domain) if "nvtx" in files else None,
                 gpu=parse_gpu_trace(files[GPU_REPORT]) if GPU_REPORT in files else None,
                 api=parse_api_trace(files[API_REPORT]) if API_REPORT in files else None,
                 files=files)


# ============================================================================ analysis

def iterations(nvtx: pd.DataFrame) -> pd.DataFrame:
    """The ``iter`` ranges (one per loop iteration of ``python -m rmsnorm_lab profile``), in
    order."""
    return nvtx[nvtx["stage"] == "iter"].sort_values("start_ns").reset_index(drop=True)


def window(trace: Trace, first: int = 0, count: int = 3) -> tuple:
    """``(t0, t1)`` in ns covering iterations ``first .. first+count-1`` and the GPU work they
    launched (a kernel can run after its iteration's range closed). Without ``iter`` ranges, the
    first ``count`` kernels' span."""
    t0 = t1 = None
    if trace.nvtx is not None and not trace.nvtx.empty:
        it = iterations(trace.nvtx)
        sel = it.iloc[first:first + count] if not it.empty else trace.nvtx.iloc[:0]
        if not sel.empty:
            t0, t1 = float(sel["start_ns"].min()), float(sel["end_ns"].max())
    gpu = trace.gpu
    if gpu is not None and not gpu.empty:
        if t0 is None:
            k = gpu.iloc[first:first + count]
            return float(k["start_ns"].min()), float(k["end_ns"].max())
        launched = launches(trace)
        if launched is not None and not launched.empty:
            inside = launched[(launched["api_start_ns"] >= t0) & (launched["api_start_ns"] <= t1)]
            if not inside.empty:
                t1 = max(t1, float(inside["end_ns"].max()))
    if t0 is None:
        raise TraceError("no iter ranges and no GPU activity in this trace")
    return t0, t1


def launches(trace: Trace) -> Optional[pd.DataFrame]:
    """GPU activities joined to the API calls that launched them on the correlation id: the
    GPU row's columns plus ``api_name``, ``api_start_ns``, ``api_end_ns`` and ``queue_ns``
    (kernel start − API call start: enqueue plus waiting behind earlier work). None without both
    traces or without correlation ids."""
    gpu, api = trace.gpu, trace.api
    if gpu is None or api is None or "corr_id" not in gpu or "corr_id" not in api:
        return None
    a = api[["corr_id", "name", "start_ns", "end_ns"]].dropna(subset=["corr_id"]).rename(
        columns={"name": "api_name", "start_ns": "api_start_ns", "end_ns": "api_end_ns"})
    out = gpu.dropna(subset=["corr_id"]).merge(a, on="corr_id", how="inner")
    out["queue_ns"] = out["start_ns"] - out["api_start_ns"]
    return out.sort_values("start_ns").reset_index(drop=True)


def stage_order(name: str):
    stage = name.split(" ", 1)[0]
    return (STAGES.index(stage) if stage in STAGES else len(STAGES), name)



# ============================================================================ steady state

def kernels(trace: Trace) -> pd.DataFrame:
    """The loop's kernels (no memory operations), in start order: those that start after the
    first ``iter`` range opened. A capture taken whole, without ``--capture-range``, also holds
    the set-up, the compile and the warm-up before it."""
    if trace.gpu is None or trace.gpu.empty:
        return pd.DataFrame(columns=["start_ns", "end_ns", "dur_ns", "name"])
    k = trace.gpu[trace.gpu["kind"] == "kernel"] if "kind" in trace.gpu else trace.gpu
    if trace.nvtx is not None and not trace.nvtx.empty:
        it = iterations(trace.nvtx)
        if not it.empty:
            k = k[k["start_ns"] >= it["start_ns"].min()]
    return k.sort_values("start_ns", kind="stable").reset_index(drop=True)


def kernel_iterations(trace: Trace) -> pd.DataFrame:
    """The capture's kernels grouped into iterations by the GPU alone: an iteration starts at
    each launch of the first kernel of the capture (the forward, in a ``profile`` loop). What a
    CUDA-graph replay has instead of ``iter`` ranges. Columns: ``start_ns`` (its first kernel's
    start), ``end_ns`` (its last kernel's end), ``kernels``, ``busy_ns`` (kernel time)."""
    k = kernels(trace)
    if k.empty:
        return pd.DataFrame(columns=["start_ns", "end_ns", "kernels", "busy_ns"])
    group = (k["name"] == k["name"].iloc[0]).cumsum() - 1
    g = k.groupby(group)
    return pd.DataFrame({"start_ns": g["start_ns"].min(), "end_ns": g["end_ns"].max(),
                         "kernels": g.size(), "busy_ns": g["dur_ns"].sum()}
                        ).reset_index(drop=True)


def steady_window(trace: Trace, skip: int = 1, count: int = 3,
                  span_ns: Optional[float] = None) -> tuple:
    """``(t0, t1)`` in ns: from the start of iteration ``skip`` (the first iteration pays for
    whatever was cold and squeezes the rest when drawn) over ``count`` iterations, or over
    ``span_ns`` when given. Iterations are the ``iter`` ranges when the capture has them inside
    its kernels' span, else the kernel groups of ``kernel_iterations`` (a graph replay)."""
    its = _iteration_starts(trace)
    if its.empty:
        raise TraceError("no iterations in this trace (no iter ranges and no kernels)")
    skip = min(skip, len(its) - 1)
    t0 = float(its["start_ns"].iloc[skip])
    if span_ns is not None:
        return t0, t0 + float(span_ns)
    if "source" in its and its["source"].iloc[0] == "iter":
        return window(trace, skip, count)
    last = its.iloc[min(skip + count, len(its)) - 1]
    return t0, float(last["end_ns"])


def typical_start(trace: Trace, skip: int = 1, count: int = 3) -> int:
    """The first of ``count`` consecutive iterations, at or after ``skip``, whose start-to-start
    times are closest to the loop's median (least summed distance): a window to draw that shows
    the loop as it usually runs, not an outlier."""
    import numpy as np
    starts = _iteration_starts(trace)["start_ns"].to_numpy(dtype=float)
    periods = np.diff(starts)[skip:]
    if len(periods) < count:
        return min(skip, max(len(starts) - 1, 0))
    off = np.abs(periods - np.median(periods))
    sums = np.convolve(off, np.ones(count), mode="valid")
    return skip + int(np.argmin(sums))


def _iteration_starts(trace: Trace) -> pd.DataFrame:
    if trace.nvtx is not None and not trace.nvtx.empty:
        it = iterations(trace.nvtx)
        k = kernels(trace)
        # a graph replay's iter ranges (if any) were recorded at capture time, not around it
        if not it.empty and (k.empty or it["end_ns"].max() >= k["start_ns"].min()):
            return it.assign(source="iter")
    return kernel_iterations(trace).assign(source="kernels")


def steady_state(trace: Trace, skip: int = 1) -> Dict[str, float]:
    """What the timeline shows in numbers, iteration ``skip`` on (µs): ``iterations`` counted,
    ``kernels_per_iter``, ``kernel_us`` (median kernel time of one iteration), ``period_us``
    (median start-to-start of consecutive iterations' first kernels: one loop iteration as the
    GPU sees it), ``busy`` (the time some kernel runs over the span of the kernels: overlapping
    kernels count once), ``gap_us`` (median idle time between consecutive kernels),
    ``overlap_us`` (median time a kernel starts before the previous one ends: PDL lets the next
    grid's CTAs start while the last one drains), ``iter_host_us`` (median ``iter`` range, host
    time; NaN without iter ranges around the kernels), ``launch_api_us`` (median launch call on
    the host: ``cu*LaunchKernel*`` or ``cudaGraphLaunch``)."""
    import numpy as np
    out: Dict[str, float] = {}
    kit = kernel_iterations(trace).iloc[skip:]
    k = kernels(trace)
    if not kit.empty:
        k = k[k["start_ns"] >= kit["start_ns"].iloc[0]]
    out["iterations"] = float(len(kit))
    out["kernels_per_iter"] = float(kit["kernels"].median()) if len(kit) else math.nan
    out["kernel_us"] = float(kit["busy_ns"].median()) / 1e3 if len(kit) else math.nan
    out["period_us"] = (float(np.median(np.diff(kit["start_ns"]))) / 1e3
                        if len(kit) >= 2 else math.nan)
    if len(k) >= 2:
        k = k.sort_values("start_ns")
        start, end = k["start_ns"].to_numpy(), k["end_ns"].to_numpy()
        span = float(end.max() - start.min())
        reached = np.maximum.accumulate(end)  # the latest end of any kernel so far
        covered = np.minimum(end[1:] - start[1:], (end[1:] - reached[:-1]).clip(min=0)).sum()
        out["busy"] = float(end[0] - start[0] + covered) / span if span > 0 else math.nan
        step = start[1:] - reached[:-1]
        out["gap_us"] = float(np.median(step.clip(min=0))) / 1e3
        out["overlap_us"] = float(np.median((-step).clip(min=0))) / 1e3
    else:
        out["busy"] = out["gap_us"] = out["overlap_us"] = math.nan
    its = _iteration_starts(trace)
    if "source" in its and len(its) and its["source"].iloc[0] == "iter":
        out["iter_host_us"] = float(its["dur_ns"].iloc[skip:].median()) / 1e3
    else:
        out["iter_host_us"] = math.nan
    api = trace.api
    if api is not None and not api.empty and "launch" in api:
        launch = api[api["launch"]]
        if not kit.empty:
            launch = launch[launch["end_ns"] >= kit["start_ns"].iloc[0] - 1e6]
        out["launch_api_us"] = (float(launch["dur_ns"].median()) / 1e3 if not launch.empty
                                else math.nan)
    else:
        out["launch_api_us"] = math.nan
    return out
