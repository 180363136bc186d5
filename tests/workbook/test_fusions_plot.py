"""The report's figure of the fused ops against their fastest peers, on the recorded H100 SXM
results: a panel an op with a bar a shape of its table, coloured by the ratio, the run named,
the title naming the GPU and fitting the figure. CPU only (headless)."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from rmsnorm_workbook import results  # noqa: E402
from rmsnorm_workbook.analysis import tables  # noqa: E402
from rmsnorm_workbook.viz import fusions as fz  # noqa: E402

RESULTS = Path(__file__).resolve().parents[2] / "results"


def test_each_fused_op_gets_a_panel_whose_bars_are_its_tables_ratios():
    df = results.load_all(RESULTS)
    made = {name: tables.fusion_table(df, name, "h100_sxm") for name in tables.FUSIONS}
    made = {n: t for n, t in made.items() if not t.empty}
    assert set(made) == {"fwd-fp8", "fwd-fp8-static", "fwd-qk-rope", "bwd-qk-rope"}
    assert made["fwd-fp8"].attrs["peers"] == ["torch.compile+fp8"]  # no other per-token kernel swept
    fig = Figure(figsize=(13, 5), layout="constrained")
    axes = fz.plot_fusions_vs_peer(made, "h100_sxm", fig)
    assert [ax.get_title().split("\n")[0] for ax in axes] == list(made)
    for ax, (name, t) in zip(axes, made.items()):
        ratios = t[fz.RATIO].dropna()
        bars = ax.patches
        top = ax.get_xlim()[1]  # one range for all panels, a bar past it cut there
        assert top <= fz.XMAX and [b.get_width() for b in bars] == [min(v, top) for v in ratios]
        assert [to_hex(b.get_facecolor()) for b in bars] == [to_hex(fz.colour(v)) for v in ratios]
        assert t.attrs["run"][0][:7] in ax.get_title()
    assert {to_hex(fz.colour(v)) for v in (0.5, 1.002, 1.05)} == {
        to_hex(c) for c in (fz.BLUE, fz.GREY, fz.VERMILLION)}
    title = fig._suptitle
    assert title.get_text().startswith("H100 SXM: ")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    box = title.get_window_extent(canvas.get_renderer())
    assert box.x0 >= -1 and box.x1 <= fig.bbox.width + 1


def test_a_ratio_past_the_range_is_cut_and_says_so():
    import pandas as pd
    t = pd.DataFrame({fz.RATIO: [0.9, 2.5]}, index=pd.MultiIndex.from_tuples(
        [(1024, 4096), (16384, 16384)], names=["M", "N"]))
    (ax,) = fz.plot_fusions_vs_peer({"fwd-fp8-static": t}, "h200", Figure())
    assert [b.get_width() for b in ax.patches] == [0.9, fz.XMAX]
    assert [x.get_text() for x in ax.texts] == ["0.90", "2.50 ›"]


def test_no_table_with_a_ratio_draws_nothing():
    fig = Figure()
    assert fz.plot_fusions_vs_peer({}, "h200", fig) == [] and fig._suptitle is None
