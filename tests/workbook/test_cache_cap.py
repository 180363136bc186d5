"""The tensor-handle cache's cost, read from the cache-cap step (notebook 03, section 8): the
replay of the cache's FIFO against the cached launch path's own cache and the memory it explains. Results
frames are SYNTHETIC (test_plots_host.synthetic_frame) but for the recorded H200 run's."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from rmsnorm_workbook.analysis import host as H  # noqa: E402
from rmsnorm_workbook.viz import host as ph  # noqa: E402
from test_plots_host import synthetic_frame  # noqa: E402


@pytest.fixture
def frame():
    return synthetic_frame()


def test_cache_replay_frees_what_the_warm_up_step_left_pinned(frame):
    assert H.cache_after_step(4, 12) == ["rstd10", "x11", "y11", "rstd11"]
    assert [H.pinned_activations(c, 12) for c in (0, 4, 8, 16, -1)] == [0, 2, 5, 10, 24]
    # peaks built as the cache-off peak minus what the replay says each cap frees
    d = frame.copy()
    act = 16384 * 4096 * 2 / 2**20
    for cap, n in (("4", 2), ("8", 5), ("16", 10)):
        sel = (d["impl"] == f"cute.auto@cached:{cap}") & (d["metric"] == "peak_mem")
        d.loc[sel, ["p20", "p50", "p80"]] = 1000.0 - n * act
    m = H.cache_memory_table(d, 12)
    assert (m["below cap 0 (MiB)"].drop(["unbounded"])
            == m["freed in the step (MiB)"].drop(["unbounded"])).all()
    assert m.loc["unbounded", "freed in the step (MiB)"] == 0


def test_cache_replay_follows_the_cached_paths_own_cache():
    """The replay in analysis.host against launch_paths.cached_handle on CPU tensors."""
    torch = pytest.importorskip("torch")
    paths = pytest.importorskip("rmsnorm_workbook.bench.launch_paths")
    w = torch.zeros(8)
    for cap in (0, 3, 4, 8, -1):
        paths.clear_caches()
        names = {}
        for layer in range(5):
            ts = {"x": torch.zeros(2, 8), "w": w, "y": torch.zeros(2, 8), "rstd": torch.zeros(2)}
            for name in H.CACHED_TENSORS:
                t = ts[name]
                names[(t.data_ptr(), t.dtype, tuple(t.shape), tuple(t.stride()))] = \
                    name if name == "w" else f"{name}{layer}"
                paths.cached_handle(t, 4, cap)
        kept = [names[k] for k in paths._HANDLES]
        paths.clear_caches()
        assert kept == H.cache_after_step(cap, 5), cap


def test_memory_panel_stacks_what_the_cache_pinned_on_each_bar():
    """On the recorded H200 run: a bounded cap's solid bar reads below the cache off by what its
    handles pinned, and the hatched segment stacked on it brings it back; unbounded stands 3 GiB
    above, as the caption says."""
    from pathlib import Path

    from rmsnorm_workbook import results
    from rmsnorm_workbook.bench.host import LAYERS

    df = results.load_all(Path(__file__).resolve().parents[2] / "results")
    mem = H.cache_memory_table(df, LAYERS, "h200")
    fig, axes = plt.subplots(1, 2)
    ph.plot_cache_cap(df, "h200", axes=axes)
    solid = [p for p in axes[0].patches if not p.get_hatch()]
    hatched = [p for p in axes[0].patches if p.get_hatch()]
    assert len(solid) == len(hatched) == len(mem)
    tops = pd.Series([p.get_y() + p.get_height() for p in hatched], index=mem.index)
    assert [p.get_height() for p in solid] == pytest.approx(list(mem["peak MiB"]))
    assert [p.get_height() for p in hatched] == pytest.approx(
        list(mem["pinned tensors"] * 16384 * 4096 * 2 / 2**20))
    assert (tops.drop("unbounded") - tops["0"]).abs().max() < 1  # bounded: no less memory
    assert tops["unbounded"] - tops["0"] == pytest.approx(24 * 128, abs=1)
    assert tops.to_dict() == pytest.approx(mem["peak with pinned (MiB)"].to_dict())
    legend = " ".join(t.get_text() for t in axes[0].get_legend().get_texts())
    assert "pinned by the cache" in legend and "triton.row" in legend
    assert axes[0].get_ylim()[1] > tops.max()  # the unbounded bar inside the panel
    plt.close(fig)
