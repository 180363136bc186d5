"""The report and notebooks 03-05 say one thing wherever they say it: host costs of one benchmark
in one table, a call's bound by the same model as its ratio, each "% of copy" against the copy
of its own run, the caveats under eager numbers, and figures whose points and labels read true.
CPU only (headless), on the committed results and on small synthetic ones."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from rmsnorm_workbook import results  # noqa: E402
from rmsnorm_workbook.analysis import model, model_step, specs, speed, tables  # noqa: E402
from rmsnorm_workbook.cli.report_sections import gpu_section, model_section  # noqa: E402
from rmsnorm_workbook.legend import impl  # noqa: E402
from rmsnorm_workbook.viz import gpus  # noqa: E402
from test_figure_rules import _draw  # noqa: E402

RESULTS = Path(__file__).resolve().parents[2] / "results"


# --- the crossover table: host-benchmark rows only -------------------------------------------

def _host_row(impl, p50, t):
    return {"gpu": "h200", "path": "host", "metric": "host", "op": "fwd", "impl": impl,
            "M": 128, "N": 4096, "p20": p50, "p50": p50, "p80": p50, "timestamp": t}


def test_shown_hosts_keep_the_host_benchmarks_rows_and_drop_the_sweeps():
    bench, sweep = "2000-01-01T00:00:00+00:00", "2000-01-02T00:00:00+00:00"
    rows = pd.DataFrame([_host_row("cute.auto@tvm_ffi", 7.0, bench),
                         _host_row("triton.row", 45.0, bench),
                         _host_row("triton.row", 60.0, sweep),   # newer, but a sweep's
                         _host_row("cute.auto", 10.0, sweep),    # the sweep's own lab rows
                         _host_row("cute.row", 19.0, sweep)])
    hosts = model.host_costs(rows).set_index("impl")
    assert hosts.loc["triton.row", "source"] == model.HOST_BENCHMARK
    assert (hosts.loc[["cute.auto", "cute.row"], "source"] == "sweep").all()
    shown = model.shown_hosts(model.host_costs(rows))
    assert list(shown["impl"]) == ["cute.auto@tvm_ffi", "triton.row"]  # HOSTS_SHOWN's order
    assert shown.set_index("impl").loc["triton.row", "host_us"] == 45.0


def test_the_reports_crossover_table_compares_host_benchmark_rows_only(tmp_path, df):
    md, _ = gpu_section(df, tmp_path, RESULTS)
    text = "\n".join(md)
    table = text.split("Crossover M (")[1].split("\n\n")[1]
    names = [line.split("|")[1].strip() for line in table.splitlines()[2:]]
    hosts = model.host_costs(df).set_index("impl")
    assert names == [n for n in model.HOSTS_SHOWN if n in hosts.index]
    assert (hosts.loc[names, "source"] == model.HOST_BENCHMARK).all()
    assert "cute.auto@tvm_ffi" in names and "cute.row" not in names and "cute.auto" not in names


# --- the verdict's bound: the call model the ratio uses ---------------------------------------

def test_bound_is_the_larger_term_of_the_call_model():
    flush = model.flush_us("b200")
    assert model.bound(flush - 1, 5.0, "b200") == "device"          # hidden under the flush
    assert model.bound(flush + 30, 20.0, "b200") == "host"          # 30 µs beyond, 20 µs kernel
    assert model.bound(flush + 10, 20.0, "b200") == "device"
    assert model.bound(30.0, 20.0, "b200", "pipelined") == "host"


def test_the_verdicts_bound_agrees_with_the_modelled_call_ratio(df, rep, cal):
    ce = model.copy_efficiency(df)
    for how in model.CALL_MODELS:
        pr = model.pr_comparison(df, rep, cal=cal, how=how)
        for _, r in pr.iterrows():
            for side, b in zip(("cute", "triton"), r["bound (cute, triton)"].split(", ")):
                host, dev = r[f"host {side}_us"], r[f"device {side}_us"]
                shown = model.call_us(host, dev, r["gpu"], how, ce) - dev
                # do_bench: the host time beyond the flush; pipelined: max(host, device)
                larger = host > dev if how == "pipelined" else shown > dev
                assert b == ("host" if larger else "device"), (how, r["gpu"], r["M"], side)
    pr = model.pr_comparison(df, rep, cal=cal)
    v = model.finding(pr)
    b200 = pr.set_index(["pair", "gpu", "M"]).loc[("liger.cutedsl / liger.triton", "b200", 8192)]
    hidden = b200["host cute_us"] <= b200["flush_us"]  # the recorded host cost decides the words
    assert ("CuTe's call device-bound, its" in v["b200"]
            and "hidden under the" in v["b200"]) == hidden


def test_the_cross_gpu_table_says_which_device_ratio_is_modelled_and_which_measured(df, rep,
                                                                                    cal, tmp_path):
    pr = model.pr_comparison(df, rep, cal=cal)
    assert "device ratio" not in pr.columns  # a bare name would read as measured
    here = pr[pr["gpu"] == model.CALIBRATION_GPU].set_index(["pair", "M"]).loc[
        "liger.cutedsl / liger.triton"]
    g = results.latest(df[(df["gpu"] == "h200") & (df["op"] == "fwd") & (df["path"] == "graph")
                          & (df["metric"] == "time") & (df["N"] == 4096)])
    t = g.pivot_table(index="M", columns="impl", values="p50")
    for M in (4096, 8192):
        want = t.loc[M, "liger.cutedsl"] / t.loc[M, "liger.triton"]
        got = here.loc[M, "measured device ratio"]
        assert got == pytest.approx(want)
        assert f"{got:.2f}" != f"{here.loc[M, 'device ratio (modelled)']:.2f}"  # told apart
    # measured only where the lab ran
    assert pr.loc[pr["gpu"] != model.CALIBRATION_GPU, "measured device ratio"].isna().all()
    md = "\n".join(gpu_section(df, tmp_path, RESULTS)[0])
    head = md.split("CuTe / Triton time per call")[1].split("\n|---")[0]
    assert "| device ratio (modelled) | measured device ratio |" in head
    row = next(line for line in md.splitlines()
               if line.startswith("| liger.cutedsl / liger.triton | H200 | 4096 |"))
    assert row.split(" | ")[4] == f"{here.loc[4096, 'measured device ratio']:.2f}"


# --- % of copy: one copy per run, the report's and the notebooks' alike -----------------------

def _bw(t, commit, op, impl, M, N, p50):
    return dict(gpu="h200", op=op, path="graph", dtype="bf16", metric="bandwidth", p20=p50,
                p80=p50, timestamp=t, commit=commit, impl=impl, M=M, N=N, p50=p50)


def test_the_measured_copy_is_the_forward_sweeps_and_a_run_asks_for_its_own():
    sweep, tagged, bwd = ("2026-01-01T00:00:00+00:00", "2026-01-02T00:00:00+00:00",
                          "2026-01-03T00:00:00+00:00")
    rows = [_bw(sweep, "s", "fwd", "cute.auto", m, 4096, 4000.0) for m in (1024, 2048, 4096)]
    rows += [_bw(sweep, "s", "fwd", "copy", 131072, 4096, 4290.0),
             _bw(tagged, "w", "fwd", "cute.auto", 4096, 32768, 4100.0),
             _bw(tagged, "w", "fwd", "copy", 131072, 4096, 4276.0),   # newer, a few shapes
             _bw(bwd, "b", "bwd", "copy", 131072, 4096, 4289.0),      # newest of all
             _bw(bwd, "b", "bwd", "copy2r1w", 131072, 4096, 4410.0)]
    df = pd.DataFrame(rows)
    assert specs.measured_copy_bandwidth(df, "h200") == 4290.0  # the sweep's, not the newest
    assert specs.measured_copy_bandwidth(df, "h200", run=tagged) == 4276.0
    assert specs.measured_copy_bandwidth(df, "h200", "copy2r1w") == 4410.0
    assert specs.measured_copy_bandwidth(df, "h200", run="2030-01-01") is None
    assert specs.measured_copy_bandwidth(df, "b200") is None
    t = specs.bandwidth_table(df)
    assert t.loc["h200", "measured copy GB/s"] == 4290.0
    assert t.loc["h200", "copy measured in"] == "fwd run s (2026-01-01)"
    # the table's cells of the sweep are divided by that same copy
    pct = tables.bandwidth_table(df, "fwd")["% of copy"]["cute.auto"]
    assert pct[(2048, 4096)] == 100 * 4000.0 / specs.measured_copy_bandwidth(df, "h200")


def test_a_percent_of_copy_quoted_from_the_chart_is_the_tables(df, rep, cal):
    """Notebook 04 divides the chart's measured forward by ``measured_copy_bandwidth``; the
    report's forward table divides the same cell by its own run's copy: one number."""
    pts = speed.sol_points(df, rep, cal)
    fwd = pts[(pts["kind"] == "measured") & (pts["op"] == "fwd")].iloc[0]
    M, N = speed.SOL_SHAPE
    cell = tables.bandwidth_table(df, "fwd", "h200")["% of copy"].loc[(M, N), "cute.auto"]
    assert 100 * fwd["GBps"] / specs.measured_copy_bandwidth(df, "h200") == pytest.approx(
        cell, rel=1e-12)
    assert 100 * fwd["GBps"] / fwd["ceiling GBps"] == pytest.approx(cell, rel=1e-12)


# --- the caveats under eager numbers ----------------------------------------------------------

def _steps():
    rows = []
    for choice, wall, graph in (("torch", 5.5, 2.7), ("lab", 4.7, 2.8), ("lab+carry", 4.6, 2.8)):
        for op, M, path, metric, ms in (("full", 16384, "eager", "wall", 340.0),
                                        ("fwd", 16384, "eager", "wall", 106.0),
                                        ("fwd", 8, "eager", "wall", wall),
                                        ("fwd", 8, "graph", "time", graph)):
            rows.append(dict(gpu="h200", timestamp="2026-01-01T00:00:00+00:00",
                             impl=f"llama.{choice}", op=op, M=M, N=4096, path=path,
                             metric=metric, p20=ms * 1e3, p50=ms * 1e3, p80=ms * 1e3))
    return pd.DataFrame(rows)


def test_the_in_a_model_section_says_what_eager_decode_measures(tmp_path):
    md, headline = model_section(_steps(), tmp_path)
    text = "\n".join(md)
    caveat = next(line for line in md if line.startswith("Eager decode"))
    assert text.index("time over torch's norm's") < text.index(caveat)
    assert "paced by the host" in caveat and "`decode graph` leaves the host out" in caveat
    assert any(h.startswith("  caveat: eager decode") for h in headline)


def test_a_compiled_run_of_the_fused_prologue_as_a_node_has_a_table_of_its_own(tmp_path):
    """The H100 SXM's compiled runs: the newest of the compiled choices, then the run of lab+qk
    as a graph node against torch's compiled norms, each its own run's table with each choice
    over its own run's compile.torch."""
    steps = results.load_all(RESULTS, model_steps=True)
    md, _ = model_section(steps, tmp_path)
    text = "\n".join(md)
    section = text[text.index("### H100"):text.index("### H200")]
    first, second = section.split("The fused prologue as a graph node (`compile.lab+qk`)")
    assert "compile.lab@decompose" in first and "compile.lab+qk@decompose" in first
    node = model_step.one_run(steps[steps["gpu"] == "h100_sxm"], "qwen3.compile.lab+qk")
    ms = model_step.step_table(node, {"train wall": ("train", "eager", "wall")})
    over = ms.loc[("qwen3", "compile.lab+qk"), "train wall"] / ms.loc[("qwen3", "compile.torch"),
                                                                      "train wall"]
    for norm, ratio in (("compile.lab+qk", over), ("compile.torch", 1.0)):
        assert (f"| qwen3 | {norm} | {ms.loc[('qwen3', norm), 'train wall']:.2f} |" in second
                and f"| {ratio:.3f} |" in second.split(f"{norm} |", 1)[1].split("\n", 1)[0]
                + "|")
    # the run's own decomposed prologue, named in the caption where the run has it
    decomposed = ("qwen3", "compile.lab+qk@decompose") in ms.index
    assert ("and decomposed (`compile.lab+qk@decompose`) against" in second) == decomposed
    assert ("| qwen3 | compile.lab+qk@decompose |" in second) == decomposed
    assert "compile.lab@decompose" not in second  # the other run's rows stay in theirs


def test_eager_caption_names_kernels_alike_by_graph_and_apart_eagerly(df):
    from rmsnorm_workbook.cli.report_captions import eager_caption

    text = eager_caption(df, "bwd", "h200")
    pair = tables.eager_pair(df, "bwd", "h200")
    (a, b), (ga, gb), (ea, eb) = pair["impls"], pair["graph"], pair["eager"]
    assert abs(ga / gb - 1) <= 0.02 and ea > 1.25 * eb
    assert text.startswith("Eager (`do_bench`) at small M is host-bound")
    if f"{ga:.1f}" == f"{gb:.1f}":  # one graph time, said once: no "11.7 and 11.7"
        times = f"the same graph time ({ga:.1f} µs)"
        assert f"{ga:.1f} and {gb:.1f}" not in text
    else:
        times = f"graph times within 2% ({ga:.1f} and {gb:.1f} µs)"
    # named as the tables name them (the figure's panel titles are the legend's words)
    assert (f"At M={pair['M']}, two kernels with {times}, `{a}` and `{b}`, read {ea:.0f} and "
            f"{eb:.0f} µs eager") in text
    assert "chosen as the furthest apart eagerly" in text
    # graph times that differ in the first decimal are both given, with the tolerance
    near = df.copy()
    sel = ((near["impl"] == a) & (near["op"] == "bwd") & (near["path"] == "graph")
           & (near["metric"] == "time") & (near["M"] == pair["M"]) & (near["N"] == 4096))
    factor = gb * 1.015 / ga  # a's graph time 1.5% above b's
    near.loc[sel, ["p20", "p50", "p80"]] = near.loc[sel, ["p20", "p50", "p80"]] * factor
    moved = eager_caption(near, "bwd", "h200")
    assert f"graph times within 2% ({gb * 1.015:.1f} and {gb:.1f} µs)" in moved


def test_cache_cap_caption_says_what_the_memory_panel_counts(df):
    from rmsnorm_workbook.analysis import host as H
    from rmsnorm_workbook.bench.host import LAYERS
    from rmsnorm_workbook.cli.report_captions import cache_cap_caption

    text = cache_cap_caption(df, "h200")
    mem = H.cache_memory_table(df, LAYERS, "h200")
    capped = mem.drop(index=["0", "unbounded"])
    assert "counted from what was allocated when the measured step began" in text
    assert ", ".join(f"{v:,.0f}" for v in capped["below cap 0 (MiB)"]) + " MiB below" in text
    assert "They do not need less memory" in text
    assert f"{int(mem.loc['unbounded', 'pinned tensors'])} such tensors" in text
    # the caption reads the bars the panel draws: solid the count, hatched what the cache pins
    assert "solid part of each bar" in text and "hatched" in text
    assert "their bars reach " + ", ".join(
        f"{v:,.0f}" for v in capped["peak with pinned (MiB)"]) + " MiB" in text
    assert f"its bar reaches {mem.loc['unbounded', 'peak with pinned (MiB)']:,.0f} MiB" in text


# --- figures whose points and labels read true ------------------------------------------------

def test_roofline_points_sit_at_their_own_intensity(df, rep, cal):
    pts = speed.sol_points(df, rep, cal)
    fig = Figure(figsize=(16, 4.2), layout="constrained")
    axes = gpus.plot_speed_of_light(pts, df=df, axes=fig.subplots(1, 3, sharey=True))
    for ax, g in zip(axes, model.MODEL_GPUS):
        drawn = sorted((float(ln.get_xdata()[0]), float(ln.get_ydata()[0]))
                       for ln in ax.get_lines() if len(ln.get_xdata()) == 1)
        want = sorted(zip(pts.loc[pts["gpu"] == g, "intensity"], pts.loc[pts["gpu"] == g,
                                                                          "TFLOPs"]))
        assert np.allclose(drawn, want, rtol=1e-12), g


def test_coinciding_reported_stars_share_one_label_clear_of_the_curves(df, rep, cal):
    fig = Figure(figsize=(8.5, 4.6), layout="constrained")
    ax = gpus.plot_bandwidth_vs_M(df, rep, cal=cal, ax=fig.subplots())
    labels = [t for t in ax.texts if "H100 SXM" in t.get_text()]  # the GPU as the text names it
    assert len(labels) == 1 and labels[0].get_text().startswith("3 Liger-Kernel kernels (H100 SXM)")
    renderer = _draw(fig)
    box = Text.get_window_extent(labels[0], renderer).padded(1)
    frame = ax.get_window_extent(renderer)  # the whole label inside the axes, its ")" too
    assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0
    for line in ax.get_lines():
        xy = ax.transData.transform(line.get_xydata())
        if len(xy) > 1:  # the curves, sampled along every segment
            t = np.linspace(0, 1, 50)[:, None]
            xy = np.concatenate([a + t * (b - a) for a, b in zip(xy[:-1], xy[1:])])
        assert not any(box.contains(x, y) for x, y in xy), line.get_label()


def test_reported_stars_group_by_point_and_gpu():
    stars = [(8192, 78.0, "h100_sxm", "liger.cutedsl"), (8192, 50.0, "b200", "liger.triton"),
             (8192, 78.5, "h100_sxm", "liger.triton"), (8192, 90.0, "h100_sxm", "quack")]
    groups = gpus._star_groups(stars)
    assert [(g, names) for _, _, g, names in groups] == [
        ("b200", ["liger.triton"]), ("h100_sxm", ["liger.cutedsl", "liger.triton"]),
        ("h100_sxm", ["quack"])]
    label = gpus._star_label(groups[1][3], "h100_sxm")
    assert label == "2 Liger-Kernel kernels (H100 SXM):\nCuTe DSL, Triton"


def test_the_reports_count_says_what_it_counts(df):
    """The report reads every row notebook 04 reads and the teaching kernels' too: its count
    says how many of those there are, so both numbers are found in it."""
    from rmsnorm_workbook.cli.report import count_line

    line = count_line(df, RESULTS)
    teach = int(df["impl"].str.startswith("teach.").sum())
    files = [p for p in RESULTS.glob("*/*.csv") if p.parent.name != "reported"]
    steps = len(results.load_all(RESULTS, model_steps=True))
    assert teach > 0 and steps > 0
    from rmsnorm_workbook.results.provenance import gpu_title
    gpus = sorted(df["gpu"].unique())
    assert "h200" in gpus
    assert line.startswith(f"{len(df)} measurements from {len(files)} files of {len(gpus)} "
                           f"GPU(s) ({', '.join(gpu_title(g) for g in gpus)})")
    assert f"of which {teach} are the lessons' teaching kernels" in line
    assert f"{len(df) - teach} without them" in line  # notebook 04's count
    assert f"the {steps} rows of model steps (notebook 05) are read apart" in line


# --- the summary on top of report.md: the sections' numbers, not others ----------------------

def test_the_summarys_headline_rows_are_cells_of_the_bandwidth_tables(df):
    from rmsnorm_workbook.cli.report_summary import (HEADLINE_SHAPE, Findings, markdown_lines,
                                                    op_headline)

    findings = Findings()
    for op in ("fwd", "bwd", "full"):
        table = tables.bandwidth_table(df, op, "h200")
        h = op_headline(table, "h200", op)
        findings.ops.append(h)
        gbps = table["GB/s"]
        peers = [c for c in gbps.columns if impl(c).kind == "peer"]
        assert (h.lab, h.shape, h.peers) == ("cute.auto", HEADLINE_SHAPE, tuple(peers))
        assert h.lab_gbps == gbps.loc[HEADLINE_SHAPE, "cute.auto"]
        assert h.peer_gbps == gbps.loc[HEADLINE_SHAPE, h.peer] == gbps.loc[HEADLINE_SHAPE,
                                                                            peers].max()
        if op in tables.CEILING_OF_OP:
            pct = table[f"% of {tables.CEILING_OF_OP[op]}"]
            assert h.lab_pct == pct.loc[HEADLINE_SHAPE, "cute.auto"]
        else:
            assert h.lab_pct is None
        # shape by shape: the lab's default at least as fast as every peer measured there
        wins = [gbps.loc[s, "cute.auto"] >= gbps.loc[s, peers].max() for s in gbps.index
                if pd.notna(gbps.loc[s, "cute.auto"]) and gbps.loc[s, peers].notna().any()]
        assert (h.fastest, h.shapes) == (sum(wins), len(wins))
        # the number the summary prints is the one the op's section prints
        row = next(line for line in tables.markdown_table(gbps, 0).splitlines()
                   if line.startswith(f"| {HEADLINE_SHAPE[0]} | {HEADLINE_SHAPE[1]} |"))
        assert row.split(" | ")[2 + list(gbps.columns).index("cute.auto")] == \
            f"{h.lab_gbps:.0f}"
    md = "\n".join(markdown_lines(df, 80, findings))
    assert f"| H200 | fwd | 16384x4096 | `cute.auto` | {findings.ops[0].lab_gbps:.0f} GB/s (" in md
    assert "H200: " in md.split("runs: ", 1)[1] and md.startswith("## Summary")


# --- the fused ops' sweeps: their own tables, out of the norm's ------------------------------

def test_a_fused_ops_table_is_its_newest_run_with_its_ceiling_and_best_peer():
    """The q/k-rope forward recorded on the H100 SXM: its implementations and the run's
    same-shape copy, and the lab's fused kernel over the fastest non-lab chain; none of its
    rows in the norm's forward table."""
    df = results.load_all(RESULTS)
    t = tables.fusion_table(df, "fwd-qk-rope", "h100_sxm")
    assert {"cute.qk+rope", "torch.compile+rope", "liger.rope", "copy.shape"} <= set(t.columns)
    row = t.loc[(16384 * 40, 128)]
    peers = row[["torch.eager+rope.eager", "torch.compile+rope", "liger.rope"]]
    assert row["lab / best peer"] == pytest.approx(row["cute.qk+rope"] / peers.min())
    assert tables.bandwidth_table(df, "fwd", "h100_sxm").empty
    assert tables.fusion_table(df, "fwd-qk-rope", "h200").empty


def test_the_timeline_caption_states_the_profiles_own_numbers():
    from rmsnorm_workbook.cli.report_captions import timeline_caption
    from rmsnorm_workbook.profiling import trace as nsys_trace

    trace = nsys_trace.load_trace(Path(__file__).parents[2] / "profiles" / "h200")
    s = nsys_trace.steady_state(trace)
    text = timeline_caption(trace)
    assert (f"each iteration's {s['kernels_per_iter']:.0f} kernels run {s['kernel_us']:.1f} µs "
            f"of its {s['period_us']:.0f}: the GPU is busy {s['busy']:.1%}") in text
    assert s["busy"] < 0.5 and "host's pace" in text  # the claim the sentence makes


def test_the_cache_steps_caption_spans_the_caps_step_times(df):
    from rmsnorm_workbook.analysis import host as H
    from rmsnorm_workbook.cli.report_captions import cache_steps_caption

    t = H.cache_table(df, "h200").dropna(subset=["step µs"])
    default = H.step_of(df, H.DEFAULT_IMPL, "h200")["time"]
    text = cache_steps_caption(df, "h200")
    assert (f"takes {t['step µs'].min() / 1e3:.1f} to {t['step µs'].max() / 1e3:.1f} ms against "
            f"the library's call's {default / 1e3:.1f} ms") in text
    assert t["step µs"].min() > default  # the sentence says the cached path is the slower
