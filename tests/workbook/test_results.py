"""Results I/O, provenance and plots, on the CPU.

All data here is synthetic, built in the test and written only under pytest's tmp_path (never
into results/): the GPU name is ``testgpu`` and the commit says ``synthetic``.
"""

import datetime
import json
import re

import pandas as pd
import pytest

from rmsnorm_workbook import results
from rmsnorm_workbook.results import provenance
from rmsnorm_workbook.analysis import tables
from rmsnorm_workbook.viz import sweeps as plots
from rmsnorm_workbook.results import COLUMNS, ResultsError

SYNTHETIC_GPU = "testgpu"
COPY_GBPS = 4000.0


def row(**changes):
    """One valid synthetic row; ``changes`` override fields."""
    r = {"gpu": SYNTHETIC_GPU, "sm_count": 132, "driver": "000.00", "torch": "0.0",
         "triton": "0.0", "cutlass_dsl": "none", "commit": "synthetic",
         "timestamp": "2000-01-01T00:00:00+00:00", "op": "fwd", "impl": "cute.row",
         "path": "graph", "M": 4096, "N": 4096, "dtype": "bf16", "metric": "time", "unit": "us",
         "p20": 9.0, "p50": 10.0, "p80": 11.0}
    r.update(changes)
    return r


def synthetic_rows(timestamp="2000-01-01T00:00:00+00:00"):
    """A small forward sweep: GB/s grows with M and differs per impl, so plots have content."""
    rows = []
    shapes = [(M, 4096) for M in (1024, 4096, 16384)] + [(16384, N) for N in (1024, 8192)]
    for k, impl in enumerate(("cute.row", "triton.row", "torch.native")):
        for M, N in shapes:
            gbps = 1000.0 + 100 * k + M / 100 + N / 1000
            t = 2 * M * N * 2 / gbps / 1e3
            for path, slow in (("graph", 1.0), ("eager", 1.5)):
                rows.append(row(timestamp=timestamp, impl=impl, path=path, M=M, N=N,
                                metric="time", unit="us", p20=0.9 * t * slow, p50=t * slow,
                                p80=1.1 * t * slow))
                rows.append(row(timestamp=timestamp, impl=impl, path=path, M=M, N=N,
                                metric="bandwidth", unit="GBps", p20=0.9 * gbps / slow,
                                p50=gbps / slow, p80=1.1 * gbps / slow))
        rows.append(row(timestamp=timestamp, impl=impl, path="host", M=128, N=4096,
                        metric="host", unit="us", p20=12.0 + k, p50=13.0 + k, p80=14.0 + k))
    rows.append(row(timestamp=timestamp, impl="copy", path="graph", M=131072, N=4096,
                    metric="bandwidth", unit="GBps", p20=COPY_GBPS - 10, p50=COPY_GBPS,
                    p80=COPY_GBPS + 10))
    return rows


def write_csv(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def csv_line(**changes):
    r = row(**changes)
    return ",".join(str(r[c]) for c in COLUMNS)


# --- schema round trip --------------------------------------------------------------------

def test_columns_are_exactly_the_design():
    assert ",".join(COLUMNS) == ("gpu,sm_count,driver,torch,triton,cutlass_dsl,commit,timestamp,"
                                 "op,impl,path,M,N,dtype,metric,unit,p20,p50,p80")


def test_write_then_load_round_trips(tmp_path):
    rows = synthetic_rows()
    path = results.write(rows, tmp_path / SYNTHETIC_GPU / "fwd.csv")
    assert path.read_text().splitlines()[0] == ",".join(COLUMNS)
    df = results.load(path)
    assert list(df.columns) == list(COLUMNS)
    assert len(df) == len(rows)
    back = df.to_dict("records")
    for want, got in zip(rows, back):
        for col in COLUMNS:
            if col in ("p20", "p50", "p80"):
                assert got[col] == pytest.approx(want[col], rel=1e-15)
            else:
                assert got[col] == want[col], col
    assert df["M"].dtype == "int64" and df["p50"].dtype == "float64"


def test_write_refuses_an_invalid_row_and_writes_nothing(tmp_path):
    path = tmp_path / "x" / "fwd.csv"
    with pytest.raises(ResultsError, match="op"):
        results.write([row(), row(op="forward")], path)
    assert not path.exists()


# --- validation names file, line and column -----------------------------------------------

@pytest.mark.parametrize("changes, column, message", [
    ({"op": "forward"}, "op", "forward"),
    ({"path": "cold"}, "path", "cold"),
    ({"metric": "speed"}, "metric", "speed"),
    ({"unit": "ms"}, "unit", "ms"),
    ({"p50": "fast"}, "p50", "not a number"),
    ({"p50": "nan"}, "p50", "finite"),
    ({"p20": 12.0}, "p20", "above p50"),
    ({"p80": 9.5}, "p80", "below p50"),
    ({"M": "4k"}, "M", "not an integer"),
    ({"dtype": "int8"}, "dtype", "int8"),
    ({"timestamp": "yesterday"}, "timestamp", "ISO-8601"),
    ({"commit": ""}, "commit", "empty"),
])
def test_malformed_value_names_file_line_and_column(tmp_path, changes, column, message):
    path = write_csv(tmp_path / "bad.csv",
                     [",".join(COLUMNS), csv_line(), csv_line(), csv_line(**changes)])
    with pytest.raises(ResultsError) as info:
        results.load(path)
    err = info.value
    assert (err.file, err.line, err.column) == (str(path), 4, column)
    assert f"bad.csv:4: column {column!r}" in str(err)
    assert message in str(err)


def test_bad_header_is_line_one_and_names_the_first_wrong_column(tmp_path):
    header = list(COLUMNS)
    header[2], header[3] = header[3], header[2]  # torch before driver
    path = write_csv(tmp_path / "swapped.csv", [",".join(header), csv_line()])
    with pytest.raises(ResultsError) as info:
        results.load(path)
    assert (info.value.line, info.value.column) == (1, "driver")
    assert "bad header" in str(info.value)


def test_missing_field_names_the_line(tmp_path):
    path = write_csv(tmp_path / "short.csv",
                     [",".join(COLUMNS), csv_line(), csv_line().rsplit(",", 1)[0]])
    with pytest.raises(ResultsError) as info:
        results.load(path)
    assert info.value.line == 3 and "18 fields" in str(info.value)


def test_empty_file_is_an_error(tmp_path):
    path = write_csv(tmp_path / "empty.csv", [])
    with pytest.raises(ResultsError, match="empty.csv:1"):
        results.load(path)


# --- load_all ------------------------------------------------------------------------------

def test_load_all_reads_every_gpu_and_skips_reported(tmp_path):
    results.write(synthetic_rows(), tmp_path / SYNTHETIC_GPU / "fwd.csv")
    results.write([row(gpu="othergpu")], tmp_path / "othergpu" / "fwd-quick.csv")
    # reported/ holds quoted figures in another format: it must not be read as measurements
    write_csv(tmp_path / "reported" / "liger_pr1336.csv",
              ["gpu,M,ratio,source", "b200,8192,0.93,x"])
    df = results.load_all(tmp_path)
    assert sorted(df["gpu"].unique()) == ["othergpu", SYNTHETIC_GPU]
    assert len(df) == len(synthetic_rows()) + 1


def test_load_all_keeps_model_steps_apart(tmp_path):
    results.write(synthetic_rows(), tmp_path / SYNTHETIC_GPU / "fwd.csv")
    results.write([row(impl="llama.lab", M=16384), row(impl="qwen3.compile.torch", M=8)],
                  tmp_path / SYNTHETIC_GPU / "model.csv")
    ops = results.load_all(tmp_path)
    assert len(ops) == len(synthetic_rows()) and not ops["impl"].str.contains("llama").any()
    steps = results.load_all(tmp_path, model_steps=True)
    assert sorted(steps["impl"]) == ["llama.lab", "qwen3.compile.torch"]


def test_every_model_the_benchmark_builds_is_known_as_a_model_step():
    from rmsnorm_workbook.bench import model_build
    from rmsnorm_workbook.results.store import MODEL_ARCHS, is_model_step
    assert set(model_build.ARCHS) <= set(MODEL_ARCHS)
    assert is_model_step("llama.lab+carry") and not is_model_step("cute.auto")


def test_load_all_refuses_a_misfiled_row(tmp_path):
    results.write([row(), row(gpu="h100")], tmp_path / SYNTHETIC_GPU / "fwd.csv")
    with pytest.raises(ResultsError) as info:
        results.load_all(tmp_path)
    assert (info.value.line, info.value.column) == (3, "gpu")


def test_load_all_of_nothing_is_empty_with_the_columns(tmp_path):
    assert results.load_all(tmp_path / "absent").empty
    assert list(results.load_all(tmp_path).columns) == list(COLUMNS)


def test_results_dir_is_beside_the_package():
    import rmsnorm_lab
    from pathlib import Path
    assert results.results_dir() == Path(rmsnorm_lab.__file__).resolve().parents[1] / "results"


def test_latest_keeps_the_newest_measurement_of_each_key():
    old = row(p20=1.0, p50=2.0, p80=3.0, timestamp="2000-01-01T00:00:00+00:00")
    new = row(p20=4.0, p50=5.0, p80=6.0, timestamp="2000-01-02T00:00:00+00:00")
    other = row(impl="triton.row")
    df = pd.DataFrame([new, old, other], columns=list(COLUMNS))
    got = results.latest(df)
    assert len(got) == 2
    assert got[got["impl"] == "cute.row"]["p50"].tolist() == [5.0]


# --- provenance ----------------------------------------------------------------------------

@pytest.mark.parametrize("name, slug", [
    ("NVIDIA H200", "h200"),
    ("NVIDIA H100 80GB HBM3", "h100_sxm"),
    ("NVIDIA H100 PCIe", "h100_pcie"),
    ("NVIDIA H100 NVL", "h100_nvl"),
    ("NVIDIA H200 NVL", "h200_nvl"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA GH200 480GB", "gh200"),
    ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA RTX 6000 Ada Generation", "rtx-6000-ada-generation"),
    ("Weird/GPU (rev 2)", "weird-gpu-rev-2"),
])
def test_gpu_slug(name, slug):
    assert provenance.gpu_slug(name) == slug


def test_collect_answers_every_provenance_column_without_a_gpu():
    prov = provenance.collect()
    assert tuple(prov) == results.PROVENANCE_COLUMNS
    assert prov["gpu"] and re.fullmatch(r"[a-z0-9_-]+", prov["gpu"])
    assert isinstance(prov["sm_count"], int)
    assert re.fullmatch(r"[0-9a-f]{12}(\+dirty)?|unknown", prov["commit"])
    stamp = datetime.datetime.fromisoformat(prov["timestamp"])
    assert stamp.utcoffset() == datetime.timedelta(0)
    # a row made of it passes validation
    results.store._check_row({**row(), **prov}, "collect()", None)


# --- plots and tables (synthetic data) -----------------------------------------------------

@pytest.fixture
def synthetic_df():
    return pd.DataFrame(synthetic_rows(), columns=list(COLUMNS))


def test_forward_bandwidth_table_pivots_gbps_and_percent_of_copy(synthetic_df):
    table = tables.bandwidth_table(synthetic_df, "fwd")
    gbps, pct = table["GB/s"], table["% of copy"]
    assert list(gbps.columns) == ["cute.row", "triton.row", "torch.native"]  # lab first
    assert list(gbps.index.names) == ["M", "N"]
    assert len(gbps) == 5 and (16384, 4096) in gbps.index
    want = 1000.0 + 100 + 16384 / 100 + 4096 / 1000
    assert gbps.loc[(16384, 4096), "triton.row"] == pytest.approx(want)
    assert pct.loc[(16384, 4096), "triton.row"] == pytest.approx(100 * want / COPY_GBPS)
    assert "copy" not in gbps.columns


def test_table_needs_a_gpu_when_there_are_several(synthetic_df):
    two = pd.concat([synthetic_df, synthetic_df.assign(gpu="othergpu")])
    with pytest.raises(ValueError, match="pass gpu="):
        tables.bandwidth_table(two, "fwd")
    assert len(tables.bandwidth_table(two, "fwd", gpu="othergpu")) == 5


def test_bandwidth_plots_draw_a_line_per_impl_and_the_measured_copy(synthetic_df, tmp_path):
    from matplotlib.figure import Figure

    for draw, fixed in ((plots.plot_bandwidth_vs_M, {"N": 4096}),
                        (plots.plot_bandwidth_vs_N, {"M": 16384})):
        fig = Figure()
        ax = draw(synthetic_df, "fwd", ax=fig.subplots(), **fixed)
        labels = [line.get_label() for line in ax.get_lines()]
        assert labels == ["cute.row", "triton.row", "torch.native",
                          "copy ceiling (read 1, write 1), measured"]
        assert list(ax.get_lines()[-1].get_ydata()) == [COPY_GBPS, COPY_GBPS]
        assert len(ax.get_lines()[0].get_xdata()) == 3
        out = tmp_path / f"{draw.__name__}.png"
        fig.savefig(out)
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eager_vs_graph_plot(synthetic_df):
    from matplotlib.figure import Figure

    ax = plots.plot_eager_vs_graph(synthetic_df, "fwd", "cute.row", ax=Figure().subplots())
    eager, graph = ax.get_lines()
    assert (eager.get_label(), graph.get_label()) == ("eager", "graph")
    assert all(e > g for e, g in zip(eager.get_ydata(), graph.get_ydata()))


def test_plot_without_ax_makes_a_figure(synthetic_df):
    import matplotlib.pyplot as plt

    ax = plots.plot_bandwidth_vs_M(synthetic_df, "fwd")
    assert ax.figure is not None
    plt.close(ax.figure)


def test_commit_named_by_the_caller_wins_over_any_git_checkout(monkeypatch):
    # A tree shipped to a GPU host may carry a stale .git; the shipper's LAB_COMMIT is the truth.
    monkeypatch.setenv("LAB_COMMIT", "abc123def456")
    assert provenance.commit() == "abc123def456"
    monkeypatch.delenv("LAB_COMMIT")
    assert provenance.commit() != "abc123def456"


def test_json_lines_logs_skip_stray_output(tmp_path):
    log = tmp_path / "numerics.jsonl"
    lines = [{"M": 8, "N": 64, "dx_bitwise_equal": 1.0}, {"M": 16, "N": 64}]
    log.write_text("warming up\n" + "\n".join(json.dumps(x) for x in lines) + "\n\n")
    assert results.read_jsonl(log) == lines


# --- the figure rules ------------------------------------------------------------------------

def many_impls_df(n=8, with_teach=True):
    """A forward sweep of ``n`` implementations (plus teaching rows): too many for one axes."""
    rows = []
    names = ["cute.auto", "cute.row", "triton.row", "liger.triton", "quack", "torch.compile",
             "torch.native", "liger.cutedsl"][:n]
    for k, impl in enumerate(names):
        for M in (1024, 4096, 16384):
            gbps = 3000.0 + 100 * k + M / 100
            rows.append(row(impl=impl, M=M, metric="bandwidth", unit="GBps", p20=gbps - 5,
                            p50=gbps, p80=gbps + 5))
    if with_teach:
        rows.append(row(impl="teach.cta_row", M=4096, metric="bandwidth", unit="GBps",
                        p20=1.0, p50=2.0, p80=3.0))
    rows.append(row(impl="copy", M=131072, metric="bandwidth", unit="GBps", p20=COPY_GBPS - 1,
                    p50=COPY_GBPS, p80=COPY_GBPS + 1))
    return pd.DataFrame(rows, columns=list(COLUMNS))


def test_bandwidth_plot_highlights_at_most_five_series_and_shows_the_differences():
    from matplotlib.figure import Figure

    df = many_impls_df()
    ax = plots.plot_bandwidth_vs_M(df, "fwd", ax=Figure().subplots())
    labels = [line.get_label() for line in ax.get_lines()]
    assert len(labels) <= plots.MAX_SERIES
    assert labels[0].startswith("cute.auto")
    assert labels[-1] == "copy ceiling (read 1, write 1), measured"
    assert not any(lbl.startswith("teach.") for lbl in labels)
    lo, hi = ax.get_ylim()
    assert lo > 2500 and hi >= COPY_GBPS  # not from 0: the differences between lines show
    assert "4 of 8 kernels" in ax.get_title()
    named = plots.plot_bandwidth_vs_M(df, "fwd", ax=Figure().subplots(),
                                      impls=["quack", "teach.cta_row"])
    assert [line.get_label() for line in named.get_lines()][:2] == ["quack", "teach.cta_row"]
    assert named.get_legend() is not None


def test_the_other_lab_kernel_drawn_is_the_one_fastest_at_the_most_widths():
    """A kernel measured at one width only (cute.cluster at the widest row) must not win the
    pick on its mean over that one width against kernels faster there and elsewhere."""
    rows = [("cute.auto", n, 3000) for n in (1024, 4096, 16384)]
    rows += [("cute.staged", n, g) for n, g in ((1024, 2900), (4096, 3100), (16384, 3950))]
    rows += [("cute.row", n, g) for n, g in ((1024, 2950), (4096, 3050), (16384, 3000))]
    rows += [("cute.cluster", 16384, 3815)]
    rows += [(p, n, 2000 + k) for k, p in enumerate(("quack", "flashinfer", "liger.triton",
                                                     "torch.native")) for n in (1024, 4096)]
    d = pd.DataFrame(rows, columns=["impl", "N", "p50"])
    shown = plots.highlight(d, "N", limit=3)
    assert "cute.staged" in shown and "cute.cluster" not in shown, shown


def test_tables_leave_out_the_teaching_kernels():
    df = many_impls_df(3)
    assert "teach.cta_row" not in tables.bandwidth_table(df, "fwd")["GB/s"].columns
    two = df[df["impl"].isin(["triton.row", "cute.row"])]
    assert plots.highlight(two, "M") == ["cute.row", "triton.row"]


def test_sweep_tables_leave_out_other_benchmarks_rows():
    """Rows sharing an op with the sweeps but not one of their series: the fused add's, the
    host benchmark's launch paths and cache caps, the teaching kernels'."""
    d = pd.DataFrame({"impl": ["cute.auto", "cute.auto+add", "torch.compile+add",
                               "cute.auto@tvm_ffi", "cute.auto@cached:8", "teach.fused",
                               "quack"]})
    assert list(tables.library_rows(d)["impl"]) == ["cute.auto", "quack"]


def test_series_read_on_white_and_coinciding_series_stay_visible():
    from matplotlib.figure import Figure

    assert plots.style_of("quack")["color"] == plots.ON_WHITE["#F0E442"]
    assert plots.style_of("cute.auto")["color"] == "#0072B2"
    df = many_impls_df(3, with_teach=False)
    twin = df[df["impl"] == "cute.auto"].assign(impl="cute.fused",
                                                p50=lambda d: d["p50"] * 1.001)
    df = pd.concat([df, twin])
    assert plots.coincides_with("cute.fused", df, "M", ["cute.auto", "cute.fused"]) == "cute.auto"
    assert plots.coincides_with("cute.row", df, "M", ["cute.auto", "cute.row"]) is None
    ax = plots.plot_bandwidth_vs_M(df, "fwd", ax=Figure().subplots(),
                                   impls=["cute.auto", "cute.fused"])
    fused = next(line for line in ax.get_lines() if line.get_label().startswith("cute.fused"))
    assert "within 1% of cute.auto" in fused.get_label()
    assert fused.get_linestyle() != "-" and fused.get_fillstyle() == "none"


def test_eager_vs_graph_panels_share_one_scale(synthetic_df):
    from matplotlib.figure import Figure

    lims = {impl: plots.plot_eager_vs_graph(synthetic_df, "fwd", impl,
                                            ax=Figure().subplots()).get_ylim()
            for impl in ("cute.row", "torch.native")}
    assert lims["cute.row"] == lims["torch.native"]
