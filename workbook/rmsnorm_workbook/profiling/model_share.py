"""The norm kernels' share of a model step, from the SQLite export of an Nsight Systems capture of
``python -m rmsnorm_workbook.bench.model --capture <arch>.<choice>:<workload>``::

    nsys profile -t cuda,nvtx --cuda-graph-trace=node --capture-range=cudaProfilerApi \\
        --capture-range-end=stop --export sqlite -o model-llama.lab-train \\
        python -m rmsnorm_workbook.bench.model --capture llama.lab:train
    python -m rmsnorm_workbook.profiling.model_share model-llama.lab-train.sqlite

(``nsys export --type sqlite`` makes the same file from a ``.nsys-rep``.) Three tables of the
export are read: ``NVTX_EVENTS`` (``start``, ``end``, and the range's name in ``text``, or in
``StringIds`` through ``textId``), ``CUPTI_ACTIVITY_KIND_KERNEL`` (``start``, ``end``, and the
kernel's ``demangledName`` and ``shortName`` as ``StringIds`` ids) and ``StringIds`` (``id``,
``value``). Times are ns on the capture's one timeline.

A step is one NVTX range named ``step``. The capture synchronizes before closing each, so every
kernel of a step starts inside its range; kernels are given to steps by their start. Kernel time
is the sum of the kernels' durations (on several streams they may overlap: work, not elapsed
time). A kernel is a norm's when its demangled name (else its short name) holds one of
``NORM_PATTERNS``, in any case:

* ``rmsnorm``: the lab's CuTe kernels. CuTe DSL names a kernel after its class's module path
  without the dots, then the class:
  ``kernel_cutlass_kernel_rmsnorm_labcuteforwardRMSNormForward_...``,
  ``..._rmsnorm_labcutebackwardRMSNormBackward_...``, ``..._rmsnorm_labcutedw_reduceDwReduce_...``
  (profiles/h200/), the fused add's ``RMSNormFusedAddForward``; any other ``RMSNorm`` class too;
* ``rms_norm``: the lab's Triton kernels (``_rms_norm_fwd_fused``, ``_rms_norm_fwd_looped``,
  ``_rms_norm_bwd``) and Liger's (``_rms_norm_forward_kernel``, ``_rms_norm_backward_kernel``);
* ``layer_norm``, ``RowwiseMoments``, ``GammaBeta``: torch's fused RMSNorm (``torch.nn.RMSNorm``
  on CUDA) runs ATen's layer-norm kernels with an RMS template flag
  (``vectorized_layer_norm_kernel``, ``RowwiseMomentsCUDAKernel``, ``layer_norm_grad_input_kernel``,
  ``GammaBetaBackwardCUDAKernelTemplate``...); the models hold no LayerNorm, so there these are
  all RMSNorm.

Not attributable by name, so read as 0: transformers' own Python RMSNorm (``shipped``: a power,
a mean, an rsqrt and multiplies, each a generic elementwise or reduction kernel) and a norm that
Inductor fused into its neighbours (``compile.torch``: ``triton_..._rsqrt_...`` kernels that do
more than the norm).
"""

from __future__ import annotations

import argparse
import bisect
import csv
import dataclasses
import re
import sqlite3
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

#: what marks a norm kernel's name (see the module docstring)
NORM_PATTERNS: Tuple[str, ...] = ("rmsnorm", "rms_norm", "layer_norm", "RowwiseMoments",
                                  "GammaBeta")
_NORM_RE = re.compile("|".join(re.escape(p) for p in NORM_PATTERNS), re.IGNORECASE)
TABLES = ("NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_KERNEL", "StringIds")


class ExportError(ValueError):
    """The file is not an nsys SQLite export of a capture with ``step`` ranges and kernels."""


def is_norm_kernel(name: str) -> bool:
    return _NORM_RE.search(name) is not None


@dataclasses.dataclass(frozen=True)
class StepShare:
    """One step: its NVTX range (host time, ns) and the kernels that started inside it."""
    step: int
    start_ns: int
    end_ns: int
    kernels: int
    kernel_ns: int
    norm_kernels: int
    norm_ns: int
    norm_names: Tuple[str, ...]  # the distinct norm kernels, by name

    @property
    def share(self) -> float:
        """The norm kernels' fraction of the step's kernel time."""
        return self.norm_ns / self.kernel_ns if self.kernel_ns else 0.0

    @property
    def wall_ns(self) -> int:
        return self.end_ns - self.start_ns


def _connect(path: Path) -> sqlite3.Connection:
    if not path.is_file():
        raise ExportError(f"{path}: no such file")
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        tables = {name for (name,) in con.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as e:
        raise ExportError(f"{path}: not an SQLite file ({e})") from None
    missing = [t for t in TABLES if t not in tables]
    if missing:
        con.close()
        raise ExportError(f"{path}: no table {', '.join(missing)}; is this the SQLite export of "
                          "an nsys capture with -t cuda,nvtx that ran kernels?")
    return con


def _ranges(con: sqlite3.Connection, name: str) -> List[Tuple[int, int]]:
    columns = {row[1] for row in con.execute("PRAGMA table_info(NVTX_EVENTS)")}
    if "textId" in columns:  # names nsys interned (registered strings) are in StringIds
        sql = ("SELECT e.start, e.end FROM NVTX_EVENTS e LEFT JOIN StringIds s "
               "ON e.textId = s.id WHERE COALESCE(e.text, s.value) = ?")
    else:
        sql = "SELECT e.start, e.end FROM NVTX_EVENTS e WHERE e.text = ?"
    return sorted((int(s), int(e)) for s, e in con.execute(
        sql + " AND e.end IS NOT NULL AND e.end > e.start", (name,)))


def _kernels(con: sqlite3.Connection) -> List[Tuple[int, int, str]]:
    sql = ("SELECT k.start, k.end, COALESCE(d.value, s.value, '') "
           "FROM CUPTI_ACTIVITY_KIND_KERNEL k "
           "LEFT JOIN StringIds d ON k.demangledName = d.id "
           "LEFT JOIN StringIds s ON k.shortName = s.id ORDER BY k.start")
    return [(int(s), int(e), str(n)) for s, e, n in con.execute(sql)]


def _kernels_in_steps(path, range_name: str):
    """The ``range_name`` ranges of the export at ``path`` and every kernel inside one of them,
    as (step, start ns, end ns, name); ``ExportError`` when there is no such export or range."""
    path = Path(path)
    con = _connect(path)
    try:
        ranges, kernels = _ranges(con, range_name), _kernels(con)
    finally:
        con.close()
    if not ranges:
        raise ExportError(f"{path}: no NVTX range named {range_name!r}; was it captured from "
                          "python -m rmsnorm_workbook.bench.model --capture with -t cuda,nvtx?")
    starts = [s for s, _ in ranges]
    inside = []
    for k_start, k_end, name in kernels:
        i = bisect.bisect_right(starts, k_start) - 1
        if 0 <= i and k_start < ranges[i][1]:  # else outside every step (warm-up, the edges)
            inside.append((i, k_start, k_end, name))
    return ranges, inside


def step_kernels(path, range_name: str = "step") -> List[Tuple[int, float, float, str, bool]]:
    """Every kernel inside a ``range_name`` range of the export at ``path``, in time order:
    (step, start µs, end µs from the step's start, name, is a norm kernel). Small enough to
    keep beside the results where the export itself is not (a timeline of a few steps)."""
    ranges, inside = _kernels_in_steps(path, range_name)
    return [(i, (s - ranges[i][0]) / 1e3, (e - ranges[i][0]) / 1e3, n, is_norm_kernel(n))
            for i, s, e, n in inside]


def step_shares(path, range_name: str = "step") -> List[StepShare]:
    """Per ``range_name`` range of the export at ``path``, in time order: its kernels' total
    time, the norm kernels' time and their share. ``ExportError`` when the file is not such an
    export or holds no such range."""
    ranges, inside = _kernels_in_steps(path, range_name)
    acc = [[0, 0, 0, 0, {}] for _ in ranges]  # kernels, kernel ns, norm kernels, norm ns, names
    for i, k_start, k_end, name in inside:
        a, ns = acc[i], k_end - k_start
        a[0] += 1
        a[1] += ns
        if is_norm_kernel(name):
            a[2] += 1
            a[3] += ns
            a[4][name] = None
    return [StepShare(i, s, e, a[0], a[1], a[2], a[3], tuple(a[4]))
            for i, ((s, e), a) in enumerate(zip(ranges, acc))]


def format_shares(shares: List[StepShare]) -> str:
    """A table in µs, a mean line, and the norm kernels seen (to check what was counted)."""
    lines = [f"{'step':>4}  {'wall µs':>11}  {'kernels':>7}  {'kernel µs':>11}  "
             f"{'norm kern':>9}  {'norm µs':>10}  {'share':>6}"]
    for s in shares:
        lines.append(f"{s.step:>4}  {s.wall_ns / 1e3:>11,.1f}  {s.kernels:>7}  "
                     f"{s.kernel_ns / 1e3:>11,.1f}  {s.norm_kernels:>9}  "
                     f"{s.norm_ns / 1e3:>10,.1f}  {100 * s.share:>5.1f}%")
    kernel = sum(s.kernel_ns for s in shares)
    norm = sum(s.norm_ns for s in shares)
    lines.append(f"all {len(shares)} steps: norms {norm / 1e3:,.1f} of {kernel / 1e3:,.1f} kernel "
                 f"µs = {100 * norm / kernel if kernel else 0.0:.1f}%")
    names: Dict[str, None] = {}
    for s in shares:
        names.update(dict.fromkeys(s.norm_names))
    lines.append("norm kernels: " + (", ".join(n[:100] for n in names) if names else
                                     "none recognised (NORM_PATTERNS)"))
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rmsnorm_workbook.profiling.model_share",
        description="Per NVTX range 'step' of an nsys SQLite export (python -m "
                    "rmsnorm_workbook.bench.model --capture): kernel time, the norm kernels' time "
                    "and their share.")
    parser.add_argument("export", type=Path, metavar="EXPORT.sqlite")
    parser.add_argument("--range", default="step", help="the NVTX range of one step")
    parser.add_argument("--kernels-csv", type=Path, metavar="OUT.csv",
                        help="also write each step's kernels (step, start_us, end_us, name, "
                             "norm) to OUT.csv")
    args = parser.parse_args(argv)
    try:
        print(format_shares(step_shares(args.export, args.range)))
        if args.kernels_csv:
            with open(args.kernels_csv, "w", newline="") as f:
                w = csv.writer(f, lineterminator="\n")
                w.writerow(("step", "start_us", "end_us", "name", "norm"))
                w.writerows((i, f"{a:.3f}", f"{b:.3f}", n, int(m))
                            for i, a, b, n, m in step_kernels(args.export, args.range))
    except ExportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
