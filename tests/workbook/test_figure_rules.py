"""The figure rules on the committed H200 results: titles that fit and say what is shown (and on
which GPU), axes not from zero saying so, panels fitted to what they draw, labels clear of each
other, curves that coincide told apart. CPU only (headless)."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from rmsnorm_workbook import results  # noqa: E402
from rmsnorm_workbook.analysis import model, reported, speed  # noqa: E402
from rmsnorm_workbook.profiling import trace as nt  # noqa: E402
from rmsnorm_workbook.viz import gpus, model_step, sweeps  # noqa: E402
from rmsnorm_workbook.viz import host as ph  # noqa: E402
from test_plots_host import TRACE, synthetic_frame  # noqa: E402

RESULTS = Path(__file__).resolve().parents[2] / "results"


@pytest.fixture
def frame(tmp_path):
    """test_plots_host's synthetic host results, through the writer and loader."""
    path = results.write(synthetic_frame().to_dict("records"), tmp_path / "h200" / "host.csv")
    return results.load(path)


def _draw(fig):
    """Lay ``fig`` out and draw it (a bare ``Figure``'s own canvas draws nothing); returns the
    renderer, for the extents of what was drawn."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def _inside(fig, artist) -> bool:
    """Whether ``artist``'s drawn extent lies within ``fig`` (1 px of slack)."""
    box = artist.get_window_extent(_draw(fig))
    return box.x0 >= -1 and box.x1 <= fig.bbox.width + 1


@pytest.mark.parametrize("draw", [sweeps.plot_bandwidth_vs_M, sweeps.plot_bandwidth_vs_N])
def test_bandwidth_titles_fit_and_the_axis_says_it_is_not_from_zero(df, draw):
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = draw(df, "bwd", gpu="h200", ax=fig.subplots())
    assert ax.get_title().startswith("H200: bwd bandwidth")
    assert _inside(fig, ax.title)
    assert ax.get_ylim()[0] > 0 and sweeps.NOT_FROM_ZERO in ax.get_ylabel()


def test_eager_vs_graph_range_fits_the_panels_drawn(df):
    ax = sweeps.plot_eager_vs_graph(df, "full", "cute.auto", gpu="h200", ax=Figure().subplots())
    every = df[(df["gpu"] == "h200") & (df["op"] == "full") & (df["metric"] == "time")
               & (df["N"] == 4096) & (df["path"] == "graph")]
    assert ax.get_ylim()[1] < 1.5 * every["p50"].max()  # no decade above the data


def test_cross_gpu_figures_have_titles_the_ridge_label_inside_and_coinciding_curves_apart(df):
    rep = reported.load_reported(RESULTS)
    cal = model.calibrate(df)
    fig = Figure(figsize=(16, 4.2), layout="constrained")
    axes = gpus.plot_speed_of_light(speed.sol_points(df, rep, cal), df=df,
                                    axes=fig.subplots(1, 3, sharey=True))
    assert fig.get_suptitle().startswith("Roofline")
    r = _draw(fig)
    for ax in axes:
        ridge = next(t for t in ax.texts if t.get_text().startswith("ridge"))
        box = ridge.get_window_extent(r)
        assert ax.get_window_extent(r).contains(box.x0, box.y0)
        assert ax.get_window_extent(r).contains(box.x1, box.y1)
    fig = Figure(figsize=(15, 4), layout="constrained")
    axes = gpus.plot_crossover(df, cal=cal, axes=fig.subplots(1, 3, sharey=True))
    assert "host time per call" in fig.get_suptitle()
    measured = [ln for ln in axes[0].get_lines() if ln.get_linestyle() == "-"]
    assert len({ln.get_marker() for ln in measured}) == len(measured) > 1
    notes = " ".join(t.get_text() for t in axes[0].texts)
    assert "within" in notes
    # sizes left of the first kernel time from DRAM are greyed out and say so; none when the
    # sweeps start at the axis' first size
    for first, note in ((1024, True), (128, False)):
        ax = Figure().subplots()
        gpus._unmeasured_span(ax, [128, 256, 512, 1024, 2048], first)
        assert any("no kernel time" in t.get_text() for t in ax.texts) == note


def test_model_vs_torch_names_the_gpu_and_keeps_its_labels_inside():
    ratios = pd.DataFrame({"train wall": [0.996, 1.10, 0.871], "decode graph": [0.93, 1.03, 1.2]},
                          index=pd.MultiIndex.from_tuples([("llama", "lab"), ("llama", "shipped"),
                                                           ("llama", "liger")]))
    fig = Figure(figsize=(6.6, 4.2), layout="constrained")
    ax = model_step.plot_vs_torch(ratios, "llama", ["train wall", "decode graph"],
                                  ax=fig.subplots(), xlim=(0.80, 1.32), gpu="h200")
    assert ax.get_title().startswith("H200: llama")
    r = _draw(fig)
    left = ax.get_window_extent(r).x0
    assert all(t.get_window_extent(r).x0 >= left for t in ax.texts)  # none on the tick labels
    tips = [ln for ln in ax.get_lines() if ln.get_marker() == "D"]
    assert len(tips) == 3 and np.allclose(tips[1].get_xdata(), [0.996])  # lab's bar of 0.996


# --- host figures: off-scale rows, titles, labels clear of lines, every colour named

def test_a_row_far_slower_than_the_rest_is_drawn_off_the_scale(frame):
    slow = frame.copy()
    jit = slow["impl"].str.startswith("cute.auto@jit") & (slow["metric"] == "host")
    slow.loc[jit, ["p20", "p50", "p80"]] = slow.loc[jit, ["p20", "p50", "p80"]] * 600
    assert ph.off_scale(ph.host_rows(slow)) == ["cute.auto@jit"]
    assert ph.off_scale(ph.host_rows(frame)) == []  # 80 µs is not far off the rest
    fig, ax = plt.subplots()
    ph.plot_host(slow, ax=ax)
    assert ax.get_xlim()[1] < 1000  # the rest keep the axis; 48 ms is written, not drawn
    note = [t.get_text() for t in ax.texts if "off this scale" in t.get_text()]
    assert len(note) == 1 and "fwd 48.0 ms" in note[0]
    assert ax.get_title().startswith("H200:")
    plt.close(fig)


def test_host_figures_have_titles_and_labels_clear_of_the_lines(frame):
    fig, ax = plt.subplots()
    ph.plot_crossover(frame, workload="fwd", ax=ax)
    assert ax.get_title().startswith("H200:")
    plt.close(fig)
    fig, axes = plt.subplots(1, 2)
    near = frame.copy()  # cap 0's step at triton.row's: its label must leave the line
    cap0 = (near["impl"] == "cute.auto@cached:0") & (near["metric"] == "time")
    near.loc[cap0, ["p20", "p50", "p80"]] = [8599.5, 8600.0, 8600.5]
    ph.plot_cache_cap(near, axes=axes)
    assert all(a.get_title().startswith("H200:") for a in axes)
    assert axes[0].get_ylim()[0] == 0  # memory from zero, as the step time
    label = next(t for t in axes[1].texts if t.get_text() == "8.6")
    assert label.xyann[1] != 0  # moved off the line at 8.6 ms
    # triton.row drawn alike in both panels
    ref = [[ln for ln in a.get_lines() if "triton.row" in ln.get_label()][0] for a in axes]
    assert ref[0].get_color() == ref[1].get_color()
    assert ref[0].get_linestyle() == ref[1].get_linestyle()
    plt.close(fig)


def test_timeline_legend_names_the_range_colours_and_the_title_the_gpu(tmp_path):
    import shutil
    trace = nt.load_trace(TRACE)
    fig, ax = plt.subplots()
    ph.plot_timeline(trace, first=0, count=2, ax=ax)
    legend = {t.get_text() for t in ax.get_legend().get_texts()}
    assert "NVTX range (its row names it)" in legend and len(legend) <= 5
    colours = {tuple(p.get_facecolor()) for p in ax.get_legend().get_patches()}
    for bars in ax.collections:  # every colour drawn is in the legend
        if hasattr(bars, "get_facecolors"):
            assert {tuple(c) for c in bars.get_facecolors()} <= colours
    assert "nsys timeline" in ax.get_title()
    plt.close(fig)
    folder = tmp_path / "h200"
    shutil.copytree(TRACE, folder)
    assert ph.trace_gpu(nt.load_trace(folder)) == "h200"
    assert ph.trace_gpu(trace) == ""  # a folder not named after a GPU


def test_timeline_of_whole_iterations_draws_no_part_of_their_neighbours():
    trace = nt.load_trace(TRACE)
    nv = trace.nvtx.copy()  # iterations 0.1 µs apart: each neighbour's end inside the padding
    its = nv["range"] == "iter"
    nv.loc[its, "end_ns"] = nv.loc[its, "start_ns"].shift(-1).fillna(nv["end_ns"].max()) - 100
    trace = nt.Trace(nv, trace.gpu, trace.api, trace.files)
    fig, ax = plt.subplots()
    ph.plot_timeline(trace, first=1, count=1, ax=ax)
    lo, hi = ax.get_xlim()
    for bars in ax.collections:  # every box drawn lies wholly inside the view
        for path in bars.get_paths():
            xs = path.vertices[:, 0]
            assert xs.min() >= lo and xs.max() <= hi
    assert len(nt.iterations(trace.nvtx)) > 2  # neighbours on both sides to leave out
    plt.close(fig)


def test_model_vs_torch_keeps_its_range_to_the_differences_and_marks_bars_past_it():
    ratios = pd.DataFrame({"decode wall": [0.846, 2.163, 0.615],
                           "train wall": [0.990, 1.10, 0.986]},
                          index=pd.MultiIndex.from_tuples([("llama", "lab"), ("llama", "shipped"),
                                                           ("llama", "lab+carry")]))
    span = (0.8, 1.25)  # a range kept to the differences: not stretched to 2.163 nor to 0.615
    fig = Figure(figsize=(6.6, 4.2), layout="constrained")
    ax = model_step.plot_vs_torch(ratios, "llama", ["decode wall", "train wall"],
                                  ax=fig.subplots(), xlim=span, gpu="h200")
    ends = [p.get_x() + p.get_width() for p in ax.patches]
    assert max(ends) <= span[1] + 1e-9 and min(p.get_x() for p in ax.patches) >= span[0] - 1e-9
    chevrons = [ln for ln in ax.get_lines() if ln.get_marker() in (">", "<")]
    assert len(chevrons) == 2
    labels = {t.get_text() for t in ax.texts}
    assert {"2.163", "0.615", "0.846", "0.990"} <= labels
    r = _draw(fig)
    box = ax.get_window_extent(r)
    assert all(box.x0 <= t.get_window_extent(r).x0 and t.get_window_extent(r).x1 <= box.x1
               for t in ax.texts)


def test_model_vs_torch_labels_stay_inside_the_axes_and_off_the_whiskers():
    """A bar past the range draws no whisker (its ratio sits inside it); a bar whose whisker
    reaches the range's edge has its label moved where it fits, not onto the whisker or past
    the spine."""
    idx = pd.MultiIndex.from_tuples([("qwen3", "shipped"), ("qwen3", "lab")])
    cols = ["decode wall", "decode graph"]
    ratios = pd.DataFrame([[1.466, 1.176], [0.908, 0.972]], index=idx, columns=cols)
    low = pd.DataFrame([[1.379, 1.076], [0.878, 0.898]], index=idx, columns=cols)
    high = pd.DataFrame([[1.517, 1.249], [0.998, 1.054]], index=idx, columns=cols)
    fig = Figure(figsize=(6.6, 4.2), layout="constrained")
    ax = model_step.plot_vs_torch(ratios, "qwen3", cols, norms=("shipped", "lab"),
                                  ax=fig.subplots(), xlim=(0.8, 1.25), gpu="h200",
                                  spread=(low, high))
    r = _draw(fig)
    box = ax.get_window_extent(r)
    texts = {t.get_text(): t.get_window_extent(r) for t in ax.texts}
    assert {"1.466", "1.176", "0.908", "0.972"} <= set(texts)
    for text, extent in texts.items():
        assert box.x0 <= extent.x0 and extent.x1 <= box.x1, text
    whiskers = [seg for c in ax.containers if hasattr(c, "has_xerr")
                for seg in c.lines[2][0].get_segments()]
    assert whiskers and all(max(x for x, _ in s) <= 1.25 + 1e-9 for s in whiskers)
    # none at the 1.466 bar (past the range), and no label across a whisker
    shipped_wall = [p for p in ax.patches if p.get_width() > 0.2][0]
    y_clipped = shipped_wall.get_y() + shipped_wall.get_height() / 2
    assert not any(abs(s[0][1] - y_clipped) < 1e-9 for s in whiskers)
    for s in whiskers:
        (x0, y0), (x1, y1) = ax.transData.transform(s)
        for text, extent in texts.items():
            crosses = extent.y0 <= y0 <= extent.y1 and x0 < extent.x1 and extent.x0 < x1
            assert not crosses, (text, s)


def test_model_vs_torch_marks_a_whisker_cut_at_the_range_edge():
    idx = pd.MultiIndex.from_tuples([("qwen3", "shipped"), ("qwen3", "lab")])
    ratios = pd.DataFrame([[1.176], [0.972]], index=idx, columns=["decode graph"])
    low = pd.DataFrame([[1.076], [0.898]], index=idx, columns=["decode graph"])
    fig = Figure(figsize=(6.6, 4.2), layout="constrained")
    for top, cut in ((1.249, 0), (1.31, 1)):
        high = pd.DataFrame([[top], [1.054]], index=idx, columns=["decode graph"])
        ax = model_step.plot_vs_torch(ratios, "qwen3", ["decode graph"], norms=("shipped", "lab"),
                                      ax=fig.add_subplot(), xlim=(0.8, 1.25), spread=(low, high))
        open_marks = [ln for ln in ax.get_lines() if ln.get_fillstyle() == "none"]
        assert len(open_marks) == cut
        assert all(ln.get_xdata()[0] == 1.25 and ln.get_marker() == ">" for ln in open_marks)


def test_timeline_names_the_calls_it_draws_grey_from_the_trace():
    """The grey bar after a graph's replayed kernels is a CUDA API call: its name, read from
    the trace (version suffix dropped), is written on it and listed in the legend."""
    from test_plots_host import graph_trace

    eager = nt.load_trace(TRACE)
    graph = graph_trace(eager)
    end = float(graph.gpu["end_ns"].max())
    sync = pd.DataFrame({"start_ns": [end + 200.0], "end_ns": [end + 40_000.0],
                         "dur_ns": [39_800.0], "name": ["cudaStreamSynchronize_v3020"],
                         "corr_id": pd.array([91], dtype="Int64"), "launch": [False]})
    graph = nt.Trace(graph.nvtx, graph.gpu, pd.concat([graph.api, sync], ignore_index=True), {})
    assert ph.api_call_name("cudaGraphLaunch_v10000") == "cudaGraphLaunch"
    axes = ph.plot_timelines(eager, graph, first=1, count=2)
    assert "cudaStreamSynchronize" in [t.get_text() for t in axes[1].texts]
    legend = [t.get_text() for t in axes[0].get_legend().get_texts()]
    other = [t for t in legend if t.startswith("CUDA API: another call")]
    assert len(other) == 1 and "cudaStreamSynchronize" in other[0]
    assert "graph launch, sync" not in other[0]  # names from the data, not a guess
    plt.close("all")


def test_the_recorded_graph_timeline_names_its_synchronize():
    profiles = Path(__file__).resolve().parents[2] / "profiles" / "h200"
    eager, graph = nt.load_trace(profiles, "profile-fwd"), nt.load_trace(profiles,
                                                                       "profile-fwd-graph")
    names = {ph.api_call_name(n) for n in graph.api["name"]}
    axes = ph.plot_timelines(eager, graph, first=nt.typical_start(eager, 10), stats_from=10)
    # a call's name is written on its bar where the bar is wide enough, and is then a call of
    # the trace; the legend names every other call in view, the graph's synchronize included
    written = [t.get_text() for t in axes[1].texts]
    assert all(w in names for w in written)
    legend = [t.get_text() for t in axes[0].get_legend().get_texts()]
    other = [t for t in legend if t.startswith("CUDA API: another call")]
    syncs = {n for n in names if "Synchronize" in n}
    assert len(other) == 1 and syncs and any(n in other[0] for n in syncs)
    plt.close("all")


def test_model_step_rows_each_fit_their_data_so_nothing_is_cut_nor_labelled_on_a_whisker():
    idx = pd.MultiIndex.from_tuples([(a, n) for a in ("llama", "qwen3")
                                     for n in ("shipped", "lab")])
    cols = ["train wall", "decode wall"]
    ratios = pd.DataFrame([[1.10, 1.27], [0.99, 1.005], [1.20, 1.53], [0.97, 0.997]],
                          index=idx, columns=cols)
    low = ratios - pd.DataFrame([[0.01, 0.05], [0.01, 0.05], [0.01, 0.33], [0.01, 0.23]],
                                index=idx, columns=cols)
    high = ratios + pd.DataFrame([[0.01, 0.05], [0.01, 0.09], [0.01, 0.50], [0.01, 0.32]],
                                 index=idx, columns=cols)
    fig = Figure(figsize=(13, 5), layout="constrained")
    axes = model_step.plot_step_ratios(ratios, ["llama", "qwen3"], [["train wall"],
                                                                     ["decode wall"]],
                                       notes=["eager decode"], gpu="h200",
                                       spread=(low, high), fig=fig)
    assert axes[0][0].get_xlim()[1] < 1.3 < axes[1][0].get_xlim()[1]  # a range per row
    assert axes[0][0].get_xlim() == axes[0][1].get_xlim()  # one range across a row
    assert axes[1][1].get_title().startswith("qwen3: eager decode")
    r = _draw(fig)
    for ax in np.ravel(axes):
        assert not [ln for ln in ax.get_lines() if ln.get_marker() in (">", "<")]  # none cut
        assert "chevron" not in ax.get_xlabel()
        box = ax.get_window_extent(r)
        texts = [t.get_window_extent(r) for t in ax.texts]
        assert all(box.x0 <= t.x0 and t.x1 <= box.x1 for t in texts)
        whiskers = [seg for c in ax.containers if hasattr(c, "has_xerr")
                    for seg in c.lines[2][0].get_segments()]
        for s in whiskers:
            (x0, y0), (x1, _) = ax.transData.transform(s)
            assert not any(t.y0 <= y0 <= t.y1 and x0 < t.x1 and t.x0 < x1 for t in texts)


def test_host_crossover_draws_each_run_of_the_sweeps_apart(frame):
    early = frame.copy()  # the kernels' few-rows points, from another run of the sweeps
    early = early[(early["path"] == "graph") & early["impl"].isin(["cute.auto", "torch.native"])]
    early = early.assign(M=early["M"] // 16, timestamp="2000-01-01T00:00:00+00:00",
                         **{q: early[q] / 16 for q in ("p20", "p50", "p80")})
    both = pd.concat([frame, early], ignore_index=True)
    fig, ax = plt.subplots()
    ph.plot_crossover(both, workload="fwd", ax=ax)
    drawn = [ln for ln in ax.get_lines()  # the kernels' curves, not the host lines
             if len(ln.get_xdata()) > 1 and ln.get_marker() not in ("None", None, "")]
    runs = {str(t) for t in both.loc[both["path"] == "graph", "timestamp"]}
    assert len(drawn) == 2 * len(runs)  # two kernels, one curve per run each
    for ln in drawn:  # no curve holds points of two runs
        xs = set(ln.get_xdata())
        assert xs <= set(early["M"]) or not xs & set(early["M"])
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert sum(t.startswith("run ") for t in legend) == len(runs)
    assert any(t.startswith("run 01-01 00:00: M = ") for t in legend)
    plt.close(fig)


def test_roofline_names_the_shapes_of_its_points_and_draws_stars_beside_the_lab(df):
    rep = reported.load_reported(RESULTS)
    pts = speed.sol_points(df, rep, model.calibrate(df))
    fig = Figure(figsize=(16, 4.2), layout="constrained")
    axes = gpus.plot_speed_of_light(pts, df=df, axes=fig.subplots(1, 3, sharey=True))
    legend = [t.get_text() for t in axes[-1].get_legend().get_texts()]
    assert any("65536×4096" in t for t in legend)
    assert axes[1].get_title().startswith("H100 SXM:")
    notes = [t.get_text() for t in axes[1].texts if t.get_text().startswith("stars")]
    assert notes and "8192×4096" in notes[0]
    r = _draw(fig)
    for ax, g in zip(axes, model.MODEL_GPUS):
        lab = pts[(pts["gpu"] == g) & (pts["kind"] != "reported")]
        stars = [ln for ln in ax.get_lines() if ln.get_marker() == "*"]
        for ln in stars:  # drawn right of its intensity: never on the lab's point
            x, y = ln.get_xydata()[0]
            shown = ln.get_transform().transform((x, y))[0]
            assert shown > ax.transData.transform((x, y))[0]
        assert len(stars) == int((pts["gpu"] == g).sum() - len(lab))
