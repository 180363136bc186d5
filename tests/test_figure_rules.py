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

from rmsnorm_lab import results  # noqa: E402
from rmsnorm_lab.analysis import model, reported, speed  # noqa: E402
from rmsnorm_lab.profiling import trace as nt  # noqa: E402
from rmsnorm_lab.viz import gpus, model_step, sweeps  # noqa: E402
from rmsnorm_lab.viz import host as ph  # noqa: E402
from test_plots_host import TRACE, synthetic_frame  # noqa: E402

RESULTS = Path(__file__).resolve().parent.parent / "results"


@pytest.fixture(scope="module")
def df():
    return results.load_all(RESULTS)


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
    assert ax.get_title().startswith("h200: bwd bandwidth")
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
    assert "within" in notes and "no kernel time" in notes


def test_model_vs_torch_names_the_gpu_and_keeps_its_labels_inside():
    ratios = pd.DataFrame({"train wall": [0.996, 1.10, 0.871], "decode graph": [0.93, 1.03, 1.2]},
                          index=pd.MultiIndex.from_tuples([("llama", "lab"), ("llama", "shipped"),
                                                           ("llama", "liger")]))
    fig = Figure(figsize=(6.6, 4.2), layout="constrained")
    ax = model_step.plot_vs_torch(ratios, "llama", ["train wall", "decode graph"],
                                  ax=fig.subplots(), xlim=(0.80, 1.32), gpu="h200")
    assert ax.get_title().startswith("h200: llama")
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
    assert ax.get_title().startswith("h200:")
    plt.close(fig)


def test_host_figures_have_titles_and_labels_clear_of_the_lines(frame):
    fig, ax = plt.subplots()
    ph.plot_crossover(frame, workload="fwd", ax=ax)
    assert ax.get_title().startswith("h200:")
    plt.close(fig)
    fig, axes = plt.subplots(1, 2)
    near = frame.copy()  # cap 0's step at triton.row's: its label must leave the line
    cap0 = (near["impl"] == "cute.auto@cached:0") & (near["metric"] == "time")
    near.loc[cap0, ["p20", "p50", "p80"]] = [8599.5, 8600.0, 8600.5]
    ph.plot_cache_cap(near, axes=axes)
    assert all(a.get_title().startswith("h200:") for a in axes)
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


def test_model_vs_torch_keeps_its_range_to_the_differences_and_marks_bars_past_it():
    ratios = pd.DataFrame({"decode wall": [0.846, 2.163, 0.615], "train wall": [0.990, 1.10, 0.986]},
                          index=pd.MultiIndex.from_tuples([("llama", "lab"), ("llama", "shipped"),
                                                           ("llama", "lab+carry")]))
    span = model_step.shared_range(ratios, ["decode wall", "train wall"])
    assert span == model_step.RATIO_RANGE  # not stretched to 2.163 nor to 0.615
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
