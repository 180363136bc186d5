"""Results files: long-format CSV, one measurement a row, with provenance on every row.

``results/<gpu>/<name>.csv`` holds exactly ``COLUMNS``. Files are validated on the way in and on
the way out, and a malformed file is an error that names the file, the line and the column:
a plot drawn from a silently mis-parsed number is worse than no plot.

``results/reported/`` holds figures quoted from elsewhere (with a source column); ``load_all``
skips it, so reported figures can never be mistaken for measurements.
"""

from __future__ import annotations

import csv
import datetime
import math
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Union

import pandas as pd

from .. import paths
from ..legend import CEILINGS as CEILING_IMPLS

PROVENANCE_COLUMNS = ("gpu", "sm_count", "driver", "torch", "triton", "cutlass_dsl", "commit",
                      "timestamp")
COLUMNS = PROVENANCE_COLUMNS + ("op", "impl", "path", "M", "N", "dtype", "metric", "unit",
                                "p20", "p50", "p80")

OPS = ("fwd", "bwd", "full")
#: eager: triton do_bench per call; graph: CUDA-graph replay (device time); host: enqueue cost
PATHS = ("eager", "graph", "host")
#: wall: wall-clock µs per step of a back-to-back loop (bench --op model)
METRIC_UNITS = {"time": "us", "bandwidth": "GBps", "host": "us", "peak_mem": "MiB", "wall": "us"}
DTYPES = ("fp32", "bf16", "fp16")
#: impl names of the bandwidth ceilings measured in the same run (not RMSNorm implementations):
#: ``copy`` and ``copy2r1w`` on 1 GiB tensors, their ``.shape`` forms at each swept shape
CEILINGS = CEILING_IMPLS
REPORTED_DIR = "reported"
#: directories of results/ that hold no measurements: quoted figures, the compiled-code table
NOT_MEASURED_DIRS = (REPORTED_DIR,)
#: the first word of a model step's impl (``bench --op model``: ``llama.lab``)
MODEL_ARCHS = ("llama", "qwen3")

_INT_COLUMNS = ("sm_count", "M", "N")
_QUANTILES = ("p20", "p50", "p80")
_NONEMPTY = ("gpu", "driver", "torch", "triton", "cutlass_dsl", "commit", "impl")
PathLike = Union[str, Path]


class ResultsError(ValueError):
    """A malformed results file or row; ``file``, ``line`` and ``column`` say where."""

    def __init__(self, file: object, line: Optional[int], column: Optional[str], problem: str):
        self.file, self.line, self.column, self.problem = str(file), line, column, problem
        where = self.file + (f":{line}" if line is not None else "")
        what = f" column {column!r}:" if column else ""
        super().__init__(f"{where}:{what} {problem}")


def results_dir() -> Path:
    """The checkout's ``results/`` directory."""
    return paths.RESULTS


def _check_row(row: Mapping[str, object], file: object, line: Optional[int]) -> Dict[str, object]:
    """Validate one row and return it with typed values (ints, floats)."""
    def fail(column, problem):
        raise ResultsError(file, line, column, problem)

    out: Dict[str, object] = {}
    for col in COLUMNS:
        if col not in row:
            fail(col, "missing")
        value = row[col]
        out[col] = value.strip() if isinstance(value, str) else value
    for col in _NONEMPTY:
        if out[col] in ("", None):
            fail(col, "empty")
    for col, allowed in (("op", OPS), ("path", PATHS), ("metric", tuple(METRIC_UNITS)),
                         ("dtype", DTYPES)):
        if out[col] not in allowed:
            fail(col, f"{out[col]!r} is not one of {allowed}")
    if out["unit"] != METRIC_UNITS[out["metric"]]:
        fail("unit", f"metric {out['metric']!r} is measured in {METRIC_UNITS[out['metric']]!r},"
                     f" not {out['unit']!r}")
    for col in _INT_COLUMNS:
        try:
            out[col] = int(str(out[col]))
        except ValueError:
            fail(col, f"{out[col]!r} is not an integer")
        if out[col] < (0 if col == "sm_count" else 1):
            fail(col, f"{out[col]} is out of range")
    try:
        datetime.datetime.fromisoformat(str(out["timestamp"]))
    except ValueError:
        fail("timestamp", f"{out['timestamp']!r} is not an ISO-8601 time")
    for col in _QUANTILES:
        try:
            out[col] = float(str(out[col]))
        except ValueError:
            fail(col, f"{out[col]!r} is not a number")
        if not math.isfinite(out[col]) or out[col] < 0:
            fail(col, f"{out[col]} is not a finite non-negative number")
    if out["p20"] > out["p50"]:
        fail("p20", f"p20={out['p20']} is above p50={out['p50']}")
    if out["p50"] > out["p80"]:
        fail("p80", f"p80={out['p80']} is below p50={out['p50']}")
    return out


def _frame(rows: List[Dict[str, object]]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    for col in _INT_COLUMNS:
        df[col] = df[col].astype("int64")
    for col in _QUANTILES:
        df[col] = df[col].astype("float64")
    return df


def write(rows: Iterable[Mapping[str, object]], path: PathLike) -> Path:
    """Validate ``rows`` (mappings with every column) and write them as CSV with header
    ``COLUMNS``. Nothing is written when any row is invalid."""
    path = Path(path)
    checked = [_check_row(r, path, None) for r in rows]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(COLUMNS), lineterminator="\n")
        w.writeheader()
        for r in checked:
            w.writerow({k: (repr(v) if isinstance(v, float) else v) for k, v in r.items()})
    return path


def load(path: PathLike) -> pd.DataFrame:
    """One results file as a DataFrame with exactly ``COLUMNS``; ``ResultsError`` when malformed."""
    return _read(Path(path), expect_gpu=None)


def _read(path: Path, expect_gpu: Optional[str]) -> pd.DataFrame:
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise ResultsError(path, 1, None, "empty file: no header")
        header = [h.strip() for h in header]
        if tuple(header) != COLUMNS:
            column = next((c for c, h in zip(COLUMNS, header + [""] * len(COLUMNS)) if c != h),
                          None)
            raise ResultsError(path, 1, column, "bad header: expected exactly "
                               + ",".join(COLUMNS))
        rows = []
        for fields in reader:
            line = reader.line_num
            if not fields:  # a blank line (e.g. a trailing newline added by an editor)
                continue
            if len(fields) != len(COLUMNS):
                column = COLUMNS[min(len(fields), len(COLUMNS) - 1)]
                raise ResultsError(path, line, column,
                                   f"{len(fields)} fields, expected {len(COLUMNS)}")
            row = _check_row(dict(zip(COLUMNS, fields)), path, line)
            if expect_gpu is not None and row["gpu"] != expect_gpu:
                raise ResultsError(path, line, "gpu", f"{row['gpu']!r} does not match the "
                                   f"directory {expect_gpu!r} (a misfiled measurement)")
            rows.append(row)
    return _frame(rows)


def is_model_step(impl: str) -> bool:
    """Is ``impl`` a whole model's step (``llama.lab``, ``qwen3.compile.torch``: ``bench --op
    model``) rather than one op's implementation?"""
    return str(impl).split(".", 1)[0] in MODEL_ARCHS


def load_all(root: Optional[PathLike] = None, *, model_steps: bool = False) -> pd.DataFrame:
    """Every ``<root>/<gpu>/*.csv`` (default root: ``results_dir()``) in one DataFrame.

    ``<root>/reported/`` and ``<root>/compiled/`` are skipped: quoted figures and compiler output
    are not measurements. Rows must name the GPU of their directory. A model's step rows
    (``is_model_step``) share ops and
    widths with the op's own rows, so they come only when asked for: ``model_steps=True``
    returns them alone."""
    root = Path(root) if root is not None else results_dir()
    frames = [_read(path, expect_gpu=path.parent.name)
              for path in sorted(root.glob("*/*.csv"))
              if path.parent.name not in NOT_MEASURED_DIRS]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return _frame([])
    df = pd.concat(frames, ignore_index=True)
    steps = df["impl"].map(is_model_step).astype(bool)
    return df[steps if model_steps else ~steps].reset_index(drop=True)


#: what identifies one measurement; a later run of the same key supersedes an earlier one
KEY = ("gpu", "op", "impl", "path", "M", "N", "dtype", "metric")


def latest(df: pd.DataFrame) -> pd.DataFrame:
    """Only the newest row of each ``KEY`` (several runs may have measured the same thing)."""
    if df.empty:
        return df
    order = pd.to_datetime(df["timestamp"], utc=True)
    newest = df.assign(_t=order).sort_values("_t", kind="stable")
    return newest.drop_duplicates(list(KEY), keep="last").drop(columns="_t") \
        .reset_index(drop=True)


#: what a table that compares kernels shape by shape holds fixed in each of its rows
SHAPE_KEY = ("gpu", "op", "M", "N", "dtype")


def newest_run_per_shape(df: pd.DataFrame) -> pd.DataFrame:
    """Of each shape (``SHAPE_KEY``), only the rows of the newest run that measured it (a run:
    the rows sharing one ``timestamp``, which every row of one benchmark run carries), one row
    per ``KEY``. Unlike ``latest``, an implementation that run did not measure at that shape
    (one the code refused there, or one left out of it) keeps no older row: the kernels of a
    shape are compared as one run measured them. Select the rows the comparison draws (path,
    metric, implementations) first: the newest run is the newest among those rows."""
    if df.empty:
        return df
    order = pd.to_datetime(df["timestamp"], utc=True)
    newest = order.groupby([df[c] for c in SHAPE_KEY]).transform("max")
    return latest(df[order == newest])


def read_jsonl(path: PathLike) -> List[dict]:
    """The JSON objects of a log written one per line (notebook 02's numerics record); other
    lines (a tool's stray output captured with them) are skipped."""
    import json

    return [json.loads(line) for line in Path(path).read_text().splitlines()
            if line.strip().startswith("{")]
