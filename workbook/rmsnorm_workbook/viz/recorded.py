"""The lessons' recorded measurements: the teaching kernels' times
(``results/<gpu>/teach-<op>.csv``), their Nsight Compute metrics
(``profiles/<gpu>/ncu/ncu-teach.csv``) and SASS excerpts (``sass-teach.txt`` beside it), read
where no GPU can measure them."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd

from .. import results as results_io

#: where results are read and written: the repository's results/
RESULTS_ROOT: Path = results_io.results_dir()
#: where profiler records live, beside results/ and not in it (their columns are the profiler's,
#: not the results schema's): the repository's profiles/
PROFILES_ROOT: Path = RESULTS_ROOT.parent / "profiles"
#: the GPU whose recorded results a lesson reads when it cannot measure
RECORDED_GPU = "h200"


def fmt_shape(M: int, N: int) -> str:
    return f"{M}×{N}"

TEACH_PREFIX = "teach."
#: the same bytes moved by the simplest kernel with the op's access pattern, at each shape
COPY_OF = {"fwd": "teach.copy", "bwd": "teach.copy2r1w"}


def teach_path(op: str, gpu: Optional[str] = None, root: Optional[Path] = None) -> Path:
    return Path(root or RESULTS_ROOT) / (gpu or RECORDED_GPU) / f"teach-{op}.csv"


def load_teach(op: str, gpu: Optional[str] = None, root: Optional[Path] = None
               ) -> Optional[pd.DataFrame]:
    """The newest teaching-kernel rows of ``op`` (``results/<gpu>/teach-<op>.csv``), or None
    when the file is not there."""
    path = teach_path(op, gpu, root)
    if not path.exists():
        return None
    return results_io.latest(results_io.load(path))


def teach_table(df: pd.DataFrame, op: str) -> pd.DataFrame:
    """Per implementation and shape: median µs, GB/s, and both against the same-shape copy
    (``% of copy``: the copy's time over the kernel's; above 100 the kernel moved its bytes
    faster than the copy moved the same number)."""
    d = df[(df["op"] == op) & (df["path"] == "graph")]
    t = d[d["metric"] == "time"].pivot_table(index=["impl", "M", "N"], values="p50",
                                             aggfunc="last")["p50"]
    bw = d[d["metric"] == "bandwidth"].pivot_table(index=["impl", "M", "N"], values="p50",
                                                   aggfunc="last")["p50"]
    out = pd.DataFrame({"µs": t, "GB/s": bw})
    copy = out.xs(COPY_OF[op], level="impl") if COPY_OF[op] in out.index.get_level_values(0) \
        else None
    if copy is not None:
        ref = copy["GB/s"]
        out["copy GB/s"] = [ref.get((m, n), math.nan) for _, m, n in out.index]
        out["% of copy"] = 100 * out["GB/s"] / out["copy GB/s"]
    return out


def record_dir(root: Path, gpu: str) -> Path:
    """Where a GPU's Nsight Compute record lives under a profiles root: a folder of its own."""
    return Path(root) / gpu / "ncu"


def ncu_path(gpu: Optional[str] = None, root: Optional[Path] = None) -> Path:
    return record_dir(Path(root or PROFILES_ROOT), gpu or RECORDED_GPU) / "ncu-teach.csv"


def sass_path(gpu: Optional[str] = None, root: Optional[Path] = None) -> Path:
    return record_dir(Path(root or PROFILES_ROOT), gpu or RECORDED_GPU) / "sass-teach.txt"


#: what the lessons show of an Nsight Compute record: label -> (metric names, first found wins)
NCU_VIEW = {
    "duration µs": ("gpu__time_duration.sum",),
    "DRAM throughput % of peak": ("dram__throughput.avg.pct_of_peak_sustained_elapsed",
                                  "SpeedOfLight/DRAM Throughput"),
    "DRAM GB read": ("dram__bytes_read.sum",),
    "DRAM GB written": ("dram__bytes_write.sum",),
    "achieved occupancy %": ("sm__warps_active.avg.pct_of_peak_sustained_active",
                             "Occupancy/Achieved Occupancy"),
    "theoretical occupancy %": ("sm__maximum_warps_per_active_cycle_pct",
                                "Occupancy/Theoretical Occupancy"),
    "registers / thread": ("launch__registers_per_thread", "LaunchStats/Registers Per Thread"),
    "CTAs / SM (register limit)": ("launch__occupancy_limit_registers",
                                   "Occupancy/Block Limit Registers"),
    "global load instructions (M)": ("smsp__sass_inst_executed_op_global_ld.sum",),
    "local (spill) ld+st instructions": ("smsp__sass_inst_executed_op_local_ld.sum",
                                         "smsp__sass_inst_executed_op_local_st.sum"),
}


def load_ncu(gpu: Optional[str] = None, root: Optional[Path] = None) -> Optional[pd.DataFrame]:
    """``profiles/<gpu>/ncu/ncu-teach.csv`` (written by ``rmsnorm_workbook.profiling.ncu_teach`` on a
    GPU) or None."""
    path = ncu_path(gpu, root)
    if not path.exists():
        return None
    return pd.read_csv(path)


def _unit_scale(unit: str, label: str) -> float:
    unit = (unit or "").strip().lower()
    if label == "duration µs":
        return {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3,
                "msecond": 1e3, "s": 1e6, "second": 1e6}.get(unit, 1e-3)
    if label.startswith("DRAM GB"):
        return {"byte": 1e-9, "kbyte": 1e-6, "mbyte": 1e-3, "gbyte": 1.0}.get(unit, 1e-9)
    if label == "global load instructions (M)":
        return 1e-6
    return 1.0


def ncu_view(ncu: pd.DataFrame, kernels: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """One row per kernel, the ``NCU_VIEW`` columns (missing metrics left empty)."""
    rows = []
    for kernel in (kernels or list(dict.fromkeys(ncu["kernel"]))):
        k = ncu[ncu["kernel"] == kernel]
        if k.empty:
            continue
        row = {"kernel": kernel}
        for label, names in NCU_VIEW.items():
            vals = []
            for name in names:
                hit = k[k["metric"] == name]
                if not hit.empty:
                    vals.append(float(hit["value"].iloc[0])
                                * _unit_scale(str(hit["unit"].iloc[0]), label))
                    if label != "local (spill) ld+st instructions":
                        break
            row[label] = sum(vals) if vals else math.nan
        rows.append(row)
    return pd.DataFrame(rows).set_index("kernel") if rows else pd.DataFrame()


def recorded_sass(kernel: str, gpu: Optional[str] = None, root: Optional[Path] = None
                  ) -> Optional[str]:
    """The excerpt of ``kernel`` from ``profiles/<gpu>/ncu/sass-teach.txt``, or None."""
    path = sass_path(gpu, root)
    if not path.exists():
        return None
    text = path.read_text()
    m = re.search(rf"^== {re.escape(kernel)} .*?$(.*?)(?=^== |\Z)", text, re.M | re.S)
    return m.group(1).strip("\n") if m else None
