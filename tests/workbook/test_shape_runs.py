"""Tables that compare kernels shape by shape read, per shape, only the newest run that measured
it: a kernel that run did not measure there (the code refuses it at that shape, so the benchmark
writes no row) shows no number from an older run."""

from pathlib import Path

import pandas as pd
import pytest

from rmsnorm_workbook import results
from rmsnorm_workbook.analysis import tables
from rmsnorm_workbook.results import COLUMNS
from test_results import row

RESULTS = Path(__file__).resolve().parents[2] / "results"
OLD, NEW = "2000-01-01T00:00:00+00:00", "2000-01-02T00:00:00+00:00"


def sweep(timestamp, commit, impls, M=4096, N=65536, gbps=3000.0):
    """One run's bandwidth rows at one shape, and its copy ceiling."""
    rows = [row(timestamp=timestamp, commit=commit, impl=i, M=M, N=N, metric="bandwidth",
                unit="GBps", p20=gbps - 1, p50=gbps, p80=gbps + 1) for i in impls]
    rows.append(row(timestamp=timestamp, commit=commit, impl="copy", M=131072, N=4096,
                    metric="bandwidth", unit="GBps", p20=3999.0, p50=4000.0, p80=4001.0))
    return rows


@pytest.fixture
def two_runs():
    """The older run measured cute.staged at 4096x65536; the newer one did not."""
    rows = (sweep(OLD, "old", ["cute.row", "cute.staged"], gbps=2000.0)
            + sweep(NEW, "new", ["cute.row"], gbps=3000.0)
            + sweep(OLD, "old", ["cute.row", "cute.staged"], M=16384, N=4096, gbps=2500.0))
    return pd.DataFrame(rows, columns=list(COLUMNS))


def test_newest_run_per_shape_drops_what_the_newest_run_did_not_measure(two_runs):
    got = results.newest_run_per_shape(two_runs[two_runs["impl"] != "copy"])
    wide = got[got["N"] == 65536]
    assert list(wide["impl"]) == ["cute.row"] and list(wide["commit"]) == ["new"]
    # a shape only the older run measured keeps that run's rows, every kernel of it
    assert sorted(got[got["N"] == 4096]["impl"]) == ["cute.row", "cute.staged"]
    # latest keeps the older run's row where no later run measured the same thing
    assert "cute.staged" in set(results.latest(two_runs)[lambda d: d["N"] == 65536]["impl"])


def test_bandwidth_table_shows_no_older_number_beside_the_newest_run(two_runs):
    t = tables.bandwidth_table(two_runs, "fwd")
    assert pd.isna(t["GB/s"].loc[(4096, 65536), "cute.staged"])
    assert pd.isna(t["% of copy"].loc[(4096, 65536), "cute.staged"])
    assert t["GB/s"].loc[(4096, 65536), "cute.row"] == 3000.0
    assert t["GB/s"].loc[(16384, 4096), "cute.staged"] == 2500.0
    # the runs the percentages divide by: only those whose rows the table shows
    runs = tables.ceiling_per_run(two_runs, "fwd")
    assert dict(zip(runs["commit"], runs["cells"])) == {"old": 2, "new": 1}


def test_the_tree_holds_one_file_per_run_and_no_superseded_copy():
    """An older run lives in git history, not beside the newest as ``<op>-<commit>.csv``."""
    import re
    copies = [p.name for p in RESULTS.glob("*/*.csv") if re.search(r"-[0-9a-f]{7,12}$", p.stem)]
    assert copies == []
