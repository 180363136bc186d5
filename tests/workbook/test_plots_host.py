"""The host-overhead figures and the nsys trace parsers, on the CPU.

Results frames are SYNTHETIC, built here with invented numbers in host.csv's row format; the trace
CSVs in tests/workbook/data/nsys_trace/ are hand-written FORMAT FIXTURES (see the README there). Neither is
a measurement.
"""

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from rmsnorm_workbook.profiling import trace as nt  # noqa: E402
from rmsnorm_workbook.viz import host as ph  # noqa: E402
from rmsnorm_workbook import results  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "tests" / "workbook" / "data" / "nsys_trace"

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
        "cute.auto@tvm_ffi+python_node": (13.0, 18.0, 66.0),
        "cute.auto@tvm_ffi+settings_per_call": (30.0, 35.0, 100.0),
        "triton.row": (30.0, 36.0, 90.0), "liger.triton": (60.0, 70.0, 160.0),
        "torch.native": (11.0, 16.0, 120.0)}
#: synthetic device µs of cute.auto against M (graph)
DEVICE = {128: 4.0, 256: 5.0, 512: 8.0, 1024: 12.0, 2048: 20.0, 4096: 40.0, 8192: 80.0,
          16384: 160.0}
#: synthetic device µs of the sweeps' kernels against M (torch.native's: 1.5 x these)
KERNELS = {"cute.auto": {1024: 5.0, 4096: 20.0, 16384: 80.0, 65536: 320.0}}
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
    for M, us in KERNELS["cute.auto"].items():  # the sweeps' kernel rows, inputs from DRAM
        rows.append(row("fwd", "cute.auto", "graph", M, 4096, "time", us, spread=0.1))
        rows.append(row("fwd", "torch.native", "graph", M, 4096, "time", 1.5 * us, spread=0.1))
    for cap, (mib, us) in CACHE.items():
        rows.append(row("full", f"cute.auto@cached:{cap}", "eager", 16384, 4096, "peak_mem", mib,
                        spread=0))
        rows.append(row("full", f"cute.auto@cached:{cap}", "eager", 16384, 4096, "time", us))
    rows.append(row("full", "triton.row", "eager", 16384, 4096, "peak_mem", 1000.0, spread=0))
    rows.append(row("full", "triton.row", "eager", 16384, 4096, "time", 8600.0))
    # a toggle the settings no longer have: every table leaves it out
    rows.append(row("fwd", "cute.auto@tvm_ffi-sm_count_cache", "host", 128, 4096, "host", 12.0))
    return pd.DataFrame(rows, columns=list(results.COLUMNS))


def varying_rows():
    """Synthetic +varying_m rows (M is the largest row count drawn)."""
    return [row(op, impl + "+varying_m", "host", 8192, 4096, "host", us)
            for op, impl, us in (("fwd", "cute.auto@tvm_ffi", 11.0), ("full", "cute.auto@tvm_ffi",
                                                                        70.0),
                                 ("fwd", "torch.native", 12.5), ("full", "torch.native", 130.0))]


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
    assert not ph.known_impl("cute.auto@tvm_ffi-sm_count_cache")
    assert ph.known_impl("cute.auto@cached:8") and ph.known_impl("quack")
    assert ph.split_impl("cute.auto@cached:8") == ("cute.auto", "cached", ":8")
    assert ph.split_impl("liger.triton") == ("liger.triton", None, "")
    assert ph.is_toggle("cute.auto@tvm_ffi+settings_per_call") and not ph.is_toggle("quack")


def test_default_impl_is_the_instruments_default():
    from rmsnorm_workbook.bench import instruments
    assert ph.DEFAULT_IMPL == f"cute.auto@{instruments.DEFAULTS.launch_path}" == \
        "cute.auto@tvm_ffi"


def test_host_table_has_three_workloads_in_order(frame):
    t = ph.host_table(frame)
    assert list(t.columns) == ["fwd", "fwd+autograd", "full"]
    for impl, values in HOST.items():
        assert tuple(t.loc[impl]) == values
    order = list(t.index)
    assert order[0] == "cute.auto@tvm_ffi"
    assert set(order[1:4]) == {"cute.auto@tvm_ffi+nvtx", "cute.auto@tvm_ffi+settings_per_call",
                               "cute.auto@tvm_ffi+python_node"}
    assert "cute.auto@tvm_ffi-sm_count_cache" not in order
    # lab paths before Triton, Triton before peers
    assert order.index("cute.auto@jit") < order.index("triton.row") < order.index("liger.triton")
    assert not any(i.endswith("+autograd") for i in order)


def test_host_table_keeps_a_forward_only_peer_to_inference(frame):
    """FlashInfer's norm has no backward: its inputs that require grad build no graph, so a row
    of it with autograd (as an older host sweep recorded) is inference again, not a workload."""
    extra = pd.DataFrame([row("fwd", "flashinfer", "host", 128, 4096, "host", 20.0),
                          row("fwd", "flashinfer+autograd", "host", 128, 4096, "host", 19.0)])
    t = ph.host_table(pd.concat([frame, extra]))
    assert t.loc["flashinfer", "fwd"] == 20.0
    assert t.loc["flashinfer"][["fwd+autograd", "full"]].isna().all()
    assert t.loc["liger.triton", "fwd+autograd"] == 70.0


def test_recorded_name_maps_settings_to_host_rows():
    assert ph.recorded_name({}) == "cute.auto@tvm_ffi"
    assert ph.recorded_name({"launch_path": "jit"}) == "cute.auto@jit"
    # the other launch paths always take the Python node
    assert ph.recorded_name({"launch_path": "cached", "autograd_node": "python"}) == \
        "cute.auto@cached"
    assert ph.recorded_name({"launch_path": "cached", "tensor_cache_cap": 0}) is None
    assert ph.recorded_name({"nvtx": True}) == "cute.auto@tvm_ffi+nvtx"
    assert ph.recorded_name({"autograd_node": "python"}) == "cute.auto@tvm_ffi+python_node"
    assert ph.recorded_name({"nvtx": True, "settings_per_call": True}) is None  # not recorded
    assert ph.recorded_name({"backend": "triton"}) is None
    from rmsnorm_workbook.bench.instruments import use
    with use(launch_path="compiled"):
        assert ph.recorded_name() == "cute.auto@compiled"
    with use(settings_per_call=True):
        assert ph.recorded_name() == "cute.auto@tvm_ffi+settings_per_call"
    with use(launch_path="cached", tensor_cache_cap=4):
        assert ph.recorded_name() is None  # the host rows ran the default cap
    with use(nvtx=True):  # a library setting, through the same door
        assert ph.recorded_name() == "cute.auto@tvm_ffi+nvtx"
    assert ph.recorded_name() == "cute.auto@tvm_ffi"


def test_host_runs_look_up_the_recorded_rows_of_the_settings_in_force(frame, capsys):
    from rmsnorm_workbook.analysis.host_live import HostRuns
    from rmsnorm_workbook.bench.instruments import use
    runs = HostRuns(frame, live=False)
    with use(launch_path="cached"):
        m = runs.measure("cached")
    assert m.loc[("now", "fwd"), "p50"] == HOST["cute.auto@cached"][0]
    assert m.loc[("default", "full"), "p50"] == HOST["cute.auto@tvm_ffi"][2]
    assert m.loc[("torch", "fwd+autograd"), "p50"] == HOST["torch.native"][1]
    s = runs.summary("cached")
    assert list(s.index) == ["fwd", "fwd+autograd", "full"]
    assert s.loc["fwd", "/ torch"] == pytest.approx(14.0 / 11.0)
    with use(nvtx=True, settings_per_call=True):
        assert runs.measure("two toggles") is None
    assert "not recorded" in capsys.readouterr().out
    assert list(runs.runs) == ["cached"]


def test_varying_rows_never_reach_the_fixed_shape_tables(tmp_path):
    d = results.load(results.write(synthetic_frame().to_dict("records") + varying_rows(),
                                   tmp_path / "h200" / "host.csv"))
    assert not any("varying" in i for i in ph.host_table(d).index)
    assert tuple(ph.host_table(d).loc["cute.auto@tvm_ffi"]) == HOST["cute.auto@tvm_ffi"]


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


def test_crossover_table_compares_each_path_with_its_own_kernel(frame):
    paths = ["cute.auto@tvm_ffi", "torch.native", "cute.auto@cached", "cute.auto@jit"]
    t = ph.crossover_table(frame, paths, workload="fwd")
    assert list(t.index) == paths
    assert list(t["kernel"]) == ["cute.auto", "torch.native", "cute.auto", "cute.auto"]
    # tvm_ffi: 10 µs between 1024 (5 µs) and 4096 (20 µs), device time proportional to M
    assert t.loc["cute.auto@tvm_ffi", "crossover M"] == pytest.approx(2048)
    # torch: 11 µs against its own kernel (7.5 µs at 1024, 30 at 4096), not the lab's
    assert t.loc["torch.native", "crossover M"] == pytest.approx(1024 * 11 / 7.5)
    assert t.loc["cute.auto@jit", "bound"] == "="
    assert t.loc["cute.auto@jit", "crossover M"] == pytest.approx(16384)
    assert ph.crossover_table(frame[frame["path"] != "graph"], paths).empty


def test_crossover_figure_marks_each_ring_on_its_own_kernels_curve(frame):
    fig, ax = plt.subplots()
    ph.plot_crossover(frame, workload="fwd", ax=ax)
    t = ph.crossover_table(frame, ph.CROSSOVER_IMPLS, workload="fwd")
    rings = [(line.get_xdata()[0], line.get_ydata()[0]) for line in ax.get_lines()
             if line.get_marker() == "o" and line.get_markerfacecolor() == "none"]
    assert sorted(rings) == sorted(zip(t["crossover M"], t["host µs"]))
    labels = [x.get_text() for x in ax.get_legend().get_texts()]
    assert len(labels) <= 5 and any("torch.native's kernel" in x for x in labels)
    plt.close(fig)


# --- cache cap -------------------------------------------------------------------------------

def test_cache_table_orders_caps_and_ratios(frame):
    t = ph.cache_table(frame)
    assert list(t.index) == ["0", "4", "8", "16", "unbounded"]
    assert t.loc["unbounded", "peak MiB"] == 3000.0
    assert t.loc["8", "peak / triton.row"] == pytest.approx(1.02)
    assert t.loc["0", "step / triton.row"] == pytest.approx(9000 / 8600)


# --- plots -----------------------------------------------------------------------------------

def test_plots_draw(frame):
    fig, axes = plt.subplots(2, 3, figsize=(18, 8))  # one panel left empty
    ph.plot_host(frame, ax=axes[0, 0])
    assert len(axes[0, 0].get_yticklabels()) == 7  # 4 paths + triton.row + 2 peers
    key = axes[0, 0].texts[-1].get_text()  # what each path and workload is, by the legend
    assert all(f"{p}: " in key for p in ("@tvm_ffi", "@cached", "@compiled", "@jit", "full"))
    ph.plot_host(frame, toggles=True, ax=axes[0, 1])
    assert len(axes[0, 1].get_yticklabels()) == 10
    ax = ph.plot_crossover(frame, workload="fwd+autograd", ax=axes[0, 2])
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(legend) <= 5 and any("the library's call" in t for t in legend)
    assert not any("@" in t for t in legend)  # the launch paths by what they are
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
    assert labels[0] == "iter" and labels[-1] == "GPU kernels" and "CUDA API (host)" in labels
    assert ax.get_xlim()[0] < 0 < ax.get_xlim()[1]
    plt.close(fig)
    # without the API trace: ranges and kernels only
    fig, ax = plt.subplots()
    ph.plot_timeline(nt.Trace(trace.nvtx, trace.gpu, None, {}), ax=ax)
    assert [t.get_text() for t in ax.get_yticklabels()][-1] == "GPU kernels"
    plt.close(fig)


def graph_trace(eager, step_ns=500.0):
    """A SYNTHETIC trace of the fixture's kernels laid back to back, as a graph replay would
    launch them (one cudaGraphLaunch before them, a replay range, no iter ranges), each
    ``step_ns`` after the previous one's end (negative: overlapping it, as PDL lets it)."""
    import numpy as np
    k = nt.kernels(eager)
    d = k["dur_ns"].to_numpy()
    start = float(k["start_ns"].iloc[0])
    starts = start + np.concatenate([[0.0], np.cumsum(d[:-1] + step_ns)])
    gpu = k.assign(start_ns=starts, end_ns=starts + d, corr_id=pd.array([90] * len(k),
                                                                        dtype="Int64"))
    api = pd.DataFrame({"start_ns": [start - 4000.0], "end_ns": [start - 1000.0],
                        "dur_ns": [3000.0], "name": ["cudaGraphLaunch_v10000"],
                        "corr_id": pd.array([90], dtype="Int64"), "launch": [True]})
    nvtx = pd.DataFrame({"start_ns": [start - 5000.0], "end_ns": [start - 500.0],
                         "dur_ns": [4500.0], "name": ["rmsnorm_lab:replay"],
                         "range": ["replay"], "stage": ["replay"]})
    return nt.Trace(nvtx, gpu, api, {})


def test_steady_state_of_an_eager_loop_and_of_a_graph_replay():
    eager = nt.load_trace(TRACE)
    e = nt.steady_state(eager, skip=1)
    assert e["iterations"] == 3 and e["kernels_per_iter"] == 1
    assert e["iter_host_us"] == pytest.approx(17.0)
    assert 0 < e["busy"] < 1 and e["period_us"] > e["kernel_us"]
    g = nt.steady_state(graph_trace(eager), skip=1)
    assert g["gap_us"] == pytest.approx(0.5)
    assert g["period_us"] < e["period_us"] and g["busy"] > e["busy"]
    assert math.isnan(g["iter_host_us"])
    assert g["overlap_us"] == 0
    # kernels that start before the previous one ends (PDL) are counted once: busy stays <= 1
    d = nt.kernels(eager)["dur_ns"].to_numpy()
    overlapped = graph_trace(eager, step_ns=-300.0)
    o = nt.steady_state(overlapped, skip=0)
    k = nt.kernels(overlapped)
    assert o["busy"] == pytest.approx(1.0) and o["gap_us"] == 0
    assert o["overlap_us"] == pytest.approx(0.3)
    span = float(k["end_ns"].max() - k["start_ns"].min())
    assert span == pytest.approx(d.sum() - 300 * (len(d) - 1))
    its = nt.kernel_iterations(graph_trace(eager))
    assert len(its) == 4 and (its["kernels"] == 1).all()
    # a graph trace has no iter ranges around its kernels: the window follows the kernels
    t0, t1 = nt.steady_window(graph_trace(eager), skip=1, span_ns=3000.0)
    assert t0 == its.loc[1, "start_ns"] and t1 == t0 + 3000.0


def test_kernels_before_the_first_iter_range_are_not_the_loop():
    """A capture taken whole holds the set-up's and warm-up's kernels before the loop."""
    eager = nt.load_trace(TRACE)
    loop = nt.kernels(eager)
    first_iter = nt.iterations(eager.nvtx)["start_ns"].min()
    early = loop.iloc[:1].assign(start_ns=first_iter - 10_000.0, end_ns=first_iter - 9_000.0,
                                 name="setup_fill_kernel")
    whole = nt.Trace(eager.nvtx, pd.concat([early, eager.gpu]), eager.api, {})
    assert len(nt.kernels(whole)) == len(loop)
    assert nt.steady_state(whole, skip=1)["kernels_per_iter"] == 1


def test_timelines_draw_the_eager_loop_above_the_graph_replay():
    eager = nt.load_trace(TRACE)
    axes = ph.plot_timelines(eager, graph_trace(eager), first=1, count=2)
    assert len(axes) == 2
    assert "eager loop" in axes[0].get_title(loc="left")
    assert "CUDA graph" in axes[1].get_title(loc="left")
    assert axes[0].get_xlim() == pytest.approx(axes[1].get_xlim(), rel=0.05)  # the same span
    labels = [t.get_text() for t in axes[1].get_yticklabels()]
    assert labels[-2:] == ["CUDA API (host)", "GPU kernels"]
    assert any("no CUDA API calls" in t.get_text() for t in axes[1].texts)
    plt.close("all")
    only = ph.plot_timelines(eager, None)
    assert len(only) == 1
    plt.close("all")


def test_short_kernel_names():
    assert ph.short_kernel_name("kernel_cutlass_kernel_rmsnorm_labcuteforwardRMSNormForward_o"
                                "bject_at__tensorptr") == "forward"
    assert ph.short_kernel_name("kernel_cutlass_kernel_rmsnorm_labcutedw_reduceDwReduce_x") == \
        "dW reduce"
    assert ph.short_kernel_name("triton_poi_fused_0") == "triton_poi_fused_0"


def test_typical_start_skips_an_outlier_iteration():
    starts = [0, 10, 20, 80, 90, 100, 110, 120]  # the period from 20 to 80 is an outlier
    nvtx = pd.DataFrame({"start_ns": [float(s) for s in starts],
                         "end_ns": [s + 5.0 for s in starts], "dur_ns": [5.0] * len(starts),
                         "name": ["rmsnorm_lab:iter"] * len(starts),
                         "range": ["iter"] * len(starts), "stage": ["iter"] * len(starts)})
    trace = nt.Trace(nvtx, None, None, {})
    assert nt.typical_start(trace, skip=1, count=3) == 3  # 80 → 90 → 100 → 110: all median
    assert nt.typical_start(trace, skip=0, count=2) == 0  # 0 → 10 → 20: typical too
