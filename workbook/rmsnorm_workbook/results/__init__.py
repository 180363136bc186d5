"""Measurements as data: the results schema, its files and their provenance.

``store`` reads, validates and writes ``results/<gpu>/<name>.csv`` (the names below are its
public ones); ``provenance`` collects what every row records about the machine and the code.
"""

from .store import (COLUMNS, CEILINGS, DTYPES, KEY, METRIC_UNITS, NOT_MEASURED_DIRS, OPS, PATHS,
                    PROVENANCE_COLUMNS, REPORTED_DIR, SHAPE_KEY, PathLike, ResultsError, latest,
                    load, load_all, newest_run_per_shape, read_jsonl, results_dir, write)

__all__ = ["COLUMNS", "CEILINGS", "DTYPES", "KEY", "METRIC_UNITS", "NOT_MEASURED_DIRS", "OPS",
           "PATHS", "PROVENANCE_COLUMNS", "REPORTED_DIR", "SHAPE_KEY", "PathLike", "ResultsError",
           "latest", "load", "load_all", "newest_run_per_shape", "read_jsonl",
           "results_dir", "write"]
