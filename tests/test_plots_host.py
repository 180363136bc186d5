"""The host-overhead figures and the nsys trace parsers, on the CPU.

Results frames are SYNTHETIC, built here with invented numbers in host.csv's row format; the trace
CSVs in tests/data/nsys_trace/ are hand-written FORMAT FIXTURES (see the README there). Neither is
a measurement.
"""

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from rmsnorm_lab.profiling import trace as nt  # noqa: E402
from rmsnorm_lab.viz import host as ph  # noqa: E402
from rmsnorm_lab import results  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TRACE = REPO / "tests" / "data" / "nsys_trace"

PROV = {"gpu": "h200", "sm_count": 132, "driver": "0.0", "torch": "x", "triton": "x",
        "cutlass_dsl": "x", "commit": "synthetic", "timestamp": "2026-01-01T00:00:00+00:00"}


def row(op, impl, path, M, N, metric, p50, spread=0.5):
    unit = results.METRIC_UNITS[metric]
    return {**PROV, "op": op, "impl": impl, "path": path, "M": M, "N": N, "dtype": "bf16",
            "metric": metric, "unit": unit, "p20": p50 - spread, "p50": p50,
            "p80": p50 + spread}


#: synthetic host µs per workload (fwd, fwd+autograd, full)
HOST = {"cute.auto@tvm_ffi": (10.0, 15.0, 60.0), "cute.auto@cached": (14.0, 19.0, 70.0),
        "cute.auto@compiled": (50.0, 55.0, 150.0), "cute.auto@jit": (80.0, 85.0, 200.0),
        "cute.auto@tvm_ffi+nvtx": (10.3, 15.2, 61.0),
        "cute.auto@tvm_ffi-sm_count_cache": (13.0, 18.0, 66.0),
        "cute.auto@tvm_ffi+settings_per_call": (30.0, 35.0, 100.0),
        "triton.row": (30.0, 36.0, 90.0), "liger.triton": (60.0, 70.0, 160.0),
        "torch.native": (11.0, 16.0, 120.0)}
#: synthetic device µs of cute.auto against M (graph)
DEVICE = {128: 4.0, 256: 5.0, 512: 8.0, 1024: 12.0, 2048: 20.0, 4096: 40.0, 8192: 80.0,
          16384: 160.0}
#: synthetic (peak MiB, step µs) per cache cap
CACHE = {"0": (1000.0, 9000.0), "4": (1010.0, 8800.0), "8": (1020.0, 8700.0),
         "16": (1040.0, 8700.0), "unbounded": (3000.0, 15000.0)}


def synthetic_frame() -> pd.DataFrame:
    rows = []
    for impl, (fwd, fwd_ag, full) in HOST.items():
        rows.append(row("fwd", impl, "host", 128, 4096, "host", fwd))
        rows.append(row("fwd", impl + "+autograd", "host", 128, 4096, "host", fwd_ag))
        rows.append(row("full", impl, "host", 128, 4096, "host", full))
    for M, us in DEVICE.items():
        rows.append(row("fwd", "cute.auto@tvm_ffi", "graph", M, 4096, "time", us, spread=0.1))
    for cap, (mib, us) in CACHE.items():
        rows.append(row("full", f"cute.auto@cached:{cap}", "eager", 16384, 4096, "peak_mem", mib,
                        spread=0))
        rows.append(row("full", f"cute.auto@cached:{cap}", "eager", 16384, 4096, "time", us))
    rows.append(row("full", "triton.row", "eager", 16384, 4096, "peak_mem", 1000.0, spread=0))
    rows.append(row("full", "triton.row", "eager", 16384, 4096, "time", 8600.0))
    return pd.DataFrame(rows, columns=list(results.COLUMNS))


@pytest.fixture
def frame(tmp_path):
    # through the results writer and loader: the frame has exactly the types a real file gives
    path = results.write(synthetic_frame().to_dict("records"), tmp_path / "h200" / "host.csv")
    return results.load(path)


# --- names and tables ------------------------------------------------------------------------

def test_split_impl():
    assert ph.split_impl("cute.auto@tvm_ffi") == ("cute.auto", "tvm_ffi", "")
    assert ph.split_impl("cute.auto@tvm_ffi+nvtx") == ("cute.auto", "tvm_ffi", "+nvtx")
    assert ph.split_impl("cute.auto@tvm_ffi-sm_count_cache") == ("cute.auto", "tvm_ffi",
                                                                 "-sm_count_cache")
    assert ph.split_impl("cute.auto@cached:8") == ("cute.auto", "cached", ":8")
    assert ph.split_impl("liger.triton") == ("liger.triton", None, "")
    assert ph.is_launch_path("cute.auto@jit") and not ph.is_launch_path("cute.auto@tvm_ffi+nvtx")
    assert ph.is_toggle("cute.auto@tvm_ffi+settings_per_call") and not ph.is_toggle("quack")


def test_default_impl_is_the_settings_default():
    from rmsnorm_lab.settings import Experiments
    assert ph.DEFAULT_IMPL == f"cute.auto@{Experiments().launch_path}"


def test_host_table_has_three_workloads_in_order(frame):
    t = ph.host_table(frame)
    assert list(t.columns) == ["fwd", "fwd+autograd", "full"]
    for impl, values in HOST.items():
        assert tuple(t.loc[impl]) == values
    order = list(t.index)
    assert order[0] == "cute.auto@tvm_ffi"
    assert set(order[1:4]) == {"cute.auto@tvm_ffi+nvtx", "cute.auto@tvm_ffi+settings_per_call",
                               "cute.auto@tvm_ffi-sm_count_cache"}
    # lab paths before Triton, Triton before peers
    assert order.index("cute.auto@jit") < order.index("triton.row") < order.index("liger.triton")
    assert not any(i.endswith("+autograd") for i in order)


def test_savings_table_costs_and_noise(frame):
    s = ph.savings_table(frame).set_index(["toggle", "workload"])
    assert len(s) == 3 * 3
    nvtx = s.loc[("+nvtx", "fwd")]
    assert nvtx["cost µs"] == pytest.approx(0.3)
    assert nvtx["noise µs"] == pytest.approx(1.0)
    assert not nvtx["resolved"]
    spc = s.loc[("+settings_per_call", "full")]
    assert spc["cost µs"] == pytest.approx(40.0) and spc["resolved"]


def test_savings_table_empty_without_toggles(frame):
    d = frame[~frame["impl"].str.contains(r"\+nvtx|-sm_count|\+settings")]
    assert ph.savings_table(d).empty


# --- crossover -------------------------------------------------------------------------------

def test_crossover_interpolates_in_log_log():
    c = ph.crossover_M([128, 256], [2.0, 4.0], 2 * math.sqrt(2))
    assert c.bound == "=" and c.M == pytest.approx(128 * math.sqrt(2))
    assert str(c).startswith("≈")


def test_crossover_bounds_outside_the_sweep():
    assert ph.crossover_M([128, 256, 512], [5.0, 6.0, 9.0], 4.0).bound == "<"
    c = ph.crossover_M([128, 256, 512], [5.0, 6.0, 9.0], 100.0)
    assert (c.bound, c.M) == (">", 512.0)
    # unsorted input, exact hit on a point
    assert ph.crossover_M([512, 128, 256], [9.0, 5.0, 6.0], 6.0).M == pytest.approx(256)


def test_crossover_table_per_launch_path(frame):
    t = ph.crossover_table(frame, workload="fwd")
    assert list(t.index) == ["cute.auto@tvm_ffi", "cute.auto@cached", "cute.auto@compiled",
                             "cute.auto@jit"]
    # tvm_ffi: 10 µs lies between 1024 (12 µs) and 512 (8 µs)
    m = t.loc["cute.auto@tvm_ffi", "crossover M"]
    assert 512 < m < 1024 and t.loc["cute.auto@tvm_ffi", "bound"] == "="
    # jit: 80 µs is hit exactly at M = 8192
    assert t.loc["cute.auto@jit", "crossover M"] == pytest.approx(8192)
    assert ph.crossover_table(frame[frame["path"] != "graph"]).empty


# --- cache cap -------------------------------------------------------------------------------

def test_cache_table_orders_caps_and_ratios(frame):
    t = ph.cache_table(frame)
    assert list(t.index) == ["0", "4", "8", "16", "unbounded"]
    assert t.loc["unbounded", "peak MiB"] == 3000.0
    assert t.loc["8", "peak / triton.row"] == pytest.approx(1.02)
    assert t.loc["0", "step / triton.row"] == pytest.approx(9000 / 8600)


# --- plots -----------------------------------------------------------------------------------

def test_plots_draw(frame):
    fig, axes = plt.subplots(2, 3, figsize=(18, 8))
    ph.plot_host(frame, ax=axes[0, 0])
    assert len(axes[0, 0].get_yticklabels()) == 7  # 4 paths + triton.row + 2 peers
    ph.plot_host(frame, toggles=True, ax=axes[0, 1])
    assert len(axes[0, 1].get_yticklabels()) == 10
    ax = ph.plot_crossover(frame, workload="fwd+autograd", ax=axes[0, 2])
    assert any("M≈" in t.get_text() for t in ax.texts)
    ph.plot_cache_cap(frame, axes=axes[1, :2])
    assert "triton.row" in " ".join(t.get_text() for t in axes[1, 0].get_legend().get_texts())
    plt.close(fig)


def test_plots_refuse_mixed_gpus(frame):
    other = frame.assign(gpu="b200")
    with pytest.raises(ValueError, match="pass gpu="):
        ph.host_table(pd.concat([frame, other]))
    assert len(ph.host_table(pd.concat([frame, other]), gpu="b200")) == len(HOST)


# --- trace parsers ---------------------------------------------------------------------------

def test_fixture_files_are_found_with_and_without_stem():
    files = nt.find_trace_csvs(TRACE)
    assert set(files) == {"nvtx", "cuda_gpu_trace", "cuda_api_trace"}
    assert nt.find_trace_csvs(TRACE, "fixture") == files
    assert nt.find_trace_csvs(TRACE, "nothing") == {}
    assert nt.find_trace_csvs(TRACE / "missing") == {}


def test_parse_nvtx_trace_keeps_lab_ranges():
    nv = nt.parse_nvtx_trace(TRACE / "fixture_nvtx_pushpop_trace.csv")
    assert set(nv["range"]) == {"iter", "launch row 128x4096"}
    assert set(nv["stage"]) == {"iter", "launch"}
    assert (nv["end_ns"] - nv["start_ns"] == nv["dur_ns"]).all()
    it = nt.iterations(nv)
    assert len(it) == 4 and list(it["dur_ns"]) == [17000.0] * 4
    every = nt.parse_nvtx_trace(TRACE / "fixture_nvtx_pushpop_trace.csv", lab_only=False)
    assert len(every) == len(nv) + 1
    durs = nt.range_durations(nv)
    assert list(durs.index) == ["iter", "launch row 128x4096"]
    assert durs.loc["launch row 128x4096", "median µs"] == pytest.approx(10.0)


def test_parse_gpu_and_api_traces_and_join():
    gpu = nt.parse_gpu_trace(TRACE / "fixture_cuda_gpu_trace.csv")
    assert list(gpu["kind"]) == ["memop"] + ["kernel"] * 4
    assert gpu.loc[1, "grid_x"] == 128 and pd.isna(gpu.loc[0, "grid_x"])
    api = nt.parse_api_trace(TRACE / "fixture_cuda_api_trace.csv")
    assert api["launch"].sum() == 4
    assert list(api["end_ns"] - api["start_ns"]) == list(api["dur_ns"])
    trace = nt.load_trace(TRACE)
    j = nt.launches(trace)
    assert len(j) == 5
    kernels = j[j["kind"] == "kernel"]
    assert (kernels["api_name"] == "cuLaunchKernelEx").all()
    assert (kernels["queue_ns"] == 6000.0).all()


def test_window_covers_kernels_launched_in_the_iterations():
    trace = nt.load_trace(TRACE)
    t0, t1 = nt.window(trace, 0, 2)
    it = nt.iterations(trace.nvtx)
    assert t0 == it.loc[0, "start_ns"]
    # the second iteration's kernel ends after its range closed
    assert t1 == trace.gpu[trace.gpu["kind"] == "kernel"]["end_ns"].iloc[1]
    assert t1 > it.loc[1, "end_ns"]


def test_parser_tolerates_preamble_units_and_missing_end(tmp_path):
    p = tmp_path / "x_cuda_gpu_trace.csv"
    p.write_text("Generating SQLite file x.sqlite\nProcessing [x.sqlite] with [cuda_gpu_trace]\n"
                 '"Start (us)","Duration (us)","CorrId","Strm","Name"\n'
                 '1.5,2.25,7,7,"k"\n\n')
    df = nt.parse_gpu_trace(p)
    assert df.loc[0, "start_ns"] == 1500.0 and df.loc[0, "end_ns"] == 3750.0
    assert df.loc[0, "stream"] == "7" and df.loc[0, "kind"] == "kernel"
    q = tmp_path / "y_nvtx_trace.csv"
    q.write_text('"Start (ns)","End (ns)","Name"\n10,30,"rmsnorm_lab:iter"\n')
    assert nt.parse_nvtx_trace(q).loc[0, "dur_ns"] == 20.0
    assert "nvtx" in nt.find_trace_csvs(tmp_path)


def test_parser_errors_name_the_file(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text('"Time (%)","Total Time (ns)","Name"\n1,2,"k"\n')
    with pytest.raises(nt.TraceError, match="bad.csv"):
        nt.read_trace_csv(p)
    p.write_text('"Start (ns)","Duration (ns)","Name"\nabc,2,"k"\n')
    with pytest.raises(nt.TraceError, match=r"bad.csv:2.*Start"):
        nt.read_trace_csv(p)


def test_timeline_draws_ranges_above_kernels():
    trace = nt.load_trace(TRACE)
    fig, ax = plt.subplots(figsize=(10, 3))
    ph.plot_timeline(trace, first=0, count=3, ax=ax)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[0] == "iter" and labels[-1] == "GPU" and "CUDA API (host)" in labels
    assert ax.get_xlim()[0] < 0 < ax.get_xlim()[1]
    plt.close(fig)
    # without the API trace: ranges and kernels only
    fig, ax = plt.subplots()
    ph.plot_timeline(nt.Trace(trace.nvtx, trace.gpu, None, {}), ax=ax)
    assert [t.get_text() for t in ax.get_yticklabels()][-1] == "GPU"
    plt.close(fig)


def test_host_parts_load_and_plot(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    f = tmp_path / "parts.jsonl"
    f.write_text('{"provenance": {"gpu": "h200"}}\n'
                 '{"task": "torch fwd+autograd", "p20": 1.0, "p50": 2.0, "p80": 3.0}\n'
                 '{"task": "ext.apply", "p20": 1.5, "p50": 1.6, "p80": 1.9}\n'
                 '{"task": "lab full", "p20": 9.0, "p50": 10.0, "p80": 12.0}\n')
    parts = ph.load_host_parts(f)
    assert list(parts.index) == ["torch fwd+autograd", "ext.apply", "lab full"]
    left, right = ph.plot_host_parts(parts)
    assert len(left.patches) == 2 and len(right.patches) == 1
    assert [t.get_text().split("\n")[0] for t in left.get_yticklabels()] == [
        "ext.apply", "torch fwd+autograd"]  # PART_LAYERS order, not the file's
    plt.close("all")
