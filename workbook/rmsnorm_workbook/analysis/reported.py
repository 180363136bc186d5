"""Figures quoted from elsewhere: ``results/reported/*.csv``, every row with its ``source``.

They are never measurements of this lab and are always drawn as *reported*. Columns:
``source,gpu,op,impl,baseline,path,M,N,dtype,metric,unit,value,note`` where ``metric`` is one of
``ratio`` (impl time / baseline time), ``speedup`` (baseline time / impl time), ``time`` (µs),
``host`` (µs per call), ``bandwidth`` (GB/s), ``peak_mem_ratio``; ``M``/``N`` may be empty when
the source does not say; ``path`` is eager | graph | device | host | unstated.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Optional, Union

import pandas as pd

from ..results import REPORTED_DIR, ResultsError, results_dir

COLUMNS = ("source", "gpu", "op", "impl", "baseline", "path", "M", "N", "dtype", "metric",
           "unit", "value", "note")
METRIC_UNITS = {"ratio": "x", "speedup": "x", "time": "us", "host": "us", "bandwidth": "GBps",
                "peak_mem_ratio": "x"}
PATHS = ("eager", "graph", "device", "host", "unstated")


def reported_dir(root: Optional[Union[str, Path]] = None) -> Path:
    return Path(root) / REPORTED_DIR if root is not None else results_dir() / REPORTED_DIR


def _read(path: Path) -> pd.DataFrame:
    rows = []
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader, [])]
        if tuple(header) != COLUMNS:
            col = next((c for c, h in zip(COLUMNS, header + [""] * len(COLUMNS)) if c != h), None)
            raise ResultsError(path, 1, col, "bad header: expected exactly " + ",".join(COLUMNS))
        for fields in reader:
            line = reader.line_num
            if not fields:
                continue
            if len(fields) != len(COLUMNS):
                raise ResultsError(path, line, COLUMNS[min(len(fields), len(COLUMNS) - 1)],
                                   f"{len(fields)} fields, expected {len(COLUMNS)}")
            r = dict(zip(COLUMNS, (v.strip() for v in fields)))
            if not r["source"].startswith(("http://", "https://")):
                raise ResultsError(path, line, "source", "a reported figure needs its source URL")
            for col in ("gpu", "op", "impl"):
                if not r[col]:
                    raise ResultsError(path, line, col, "empty")
            if r["metric"] not in METRIC_UNITS:
                raise ResultsError(path, line, "metric", f"{r['metric']!r} is not one of "
                                   f"{tuple(METRIC_UNITS)}")
            if r["unit"] != METRIC_UNITS[r["metric"]]:
                raise ResultsError(path, line, "unit", f"{r['metric']} is in "
                                   f"{METRIC_UNITS[r['metric']]!r}, not {r['unit']!r}")
            if r["path"] not in PATHS:
                raise ResultsError(path, line, "path", f"{r['path']!r} is not one of {PATHS}")
            for col in ("M", "N"):
                if r[col]:
                    try:
                        r[col] = int(r[col])
                    except ValueError:
                        raise ResultsError(path, line, col, f"{r[col]!r} is not an integer")
                else:
                    r[col] = None
            try:
                r["value"] = float(r["value"])
            except ValueError:
                raise ResultsError(path, line, "value", f"{r['value']!r} is not a number")
            if not math.isfinite(r["value"]) or r["value"] < 0:
                raise ResultsError(path, line, "value", "not a finite non-negative number")
            r["file"] = path.name
            rows.append(r)
    return pd.DataFrame(rows, columns=list(COLUMNS) + ["file"])


def load_reported(root: Optional[Union[str, Path]] = None) -> pd.DataFrame:
    """Every ``<root>/reported/*.csv`` (default: the repository's results/) in one DataFrame,
    with ``kind == "reported"`` on every row; empty (with the columns) when there are none."""
    frames = [_read(p) for p in sorted(reported_dir(root).glob("*.csv"))]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=list(COLUMNS) + ["file", "kind"])
    df = pd.concat(frames, ignore_index=True)
    df["M"] = df["M"].astype("Int64")
    df["N"] = df["N"].astype("Int64")
    return df.assign(kind="reported")


#: the host cost per forward call that PR #1388 reported for Liger's CuTe kernel before TVM-FFI
#: (results/reported/pr1388_b200_tvm_ffi.csv): the launch path the PR #1336 comparison ran on
PR_ERA = ("liger.cutedsl", "fwd", "host")


def pr_era_host(reported: pd.DataFrame) -> float:
    """The reported pre-TVM-FFI host µs of Liger's CuTe forward (NaN when absent)."""
    if reported.empty:
        return math.nan
    r = reported[(reported["impl"] == PR_ERA[0]) & (reported["op"] == PR_ERA[1])
                 & (reported["metric"] == PR_ERA[2])]
    return float(r["value"].iloc[0]) if len(r) else math.nan
