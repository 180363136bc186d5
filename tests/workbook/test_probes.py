"""The probe tables the lessons read (the strips sweep of notebook 02, the PDL probe of notebook
01) and the strips figure, on SYNTHETIC probe rows built here (invented numbers in the probes'
row format, not measurements), plus the recorded probes' own shapes."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from rmsnorm_workbook import results  # noqa: E402
from rmsnorm_workbook.analysis import probes  # noqa: E402
from rmsnorm_workbook.viz import probes as figs  # noqa: E402

LOGS = Path(__file__).resolve().parents[2] / "results" / "h200" / "logs"


def strips_sweep():
    """Two shapes; the plan picks 2 strips at N=4096 and 4 at N=1024; the prefetch saves 10%."""
    rows = [{"M": 16384, "N": 4096, "impl": "split", "us": 200.0, "gbs": 1.0}]
    for (M, N, plan), best in (((16384, 4096, 2), 2), ((65536, 1024, 4), 8)):
        for k in (1, 2, 4, 8):
            us = 100.0 * (1 + abs(k - best) / 4)
            for pf in (0, 1):
                t = us * (1.0 if pf else 1.1)
                rows.append({"M": M, "N": N, "impl": f"fused.k{k}.pf{pf}", "us": t,
                             "gbs": 1e4 / t, "model_k": plan})
    return pd.DataFrame(rows)


def test_strips_table_and_the_plans_choices():
    t = probes.strips_table(strips_sweep())
    assert set(t["per SM"]) == {1, 2, 4, 8} and len(t) == 8  # the prefetch rows only
    assert t.groupby(["M", "N"])["% of best"].max().eq(100).all()
    c = probes.strips_choices(t)
    assert c.loc[(16384, 4096), "agree"] and not c.loc[(65536, 1024), "agree"]
    assert c.loc[(65536, 1024), "plan % of best"] == pytest.approx(100 * 100 / 200)
    plain = probes.strips_table(strips_sweep(), prefetch=False)
    assert probes.strips_ratio(plain, 1, 2, 4096).loc[16384] == pytest.approx(1.25)


def test_strips_figure_draws_every_shape_once_on_one_scale():
    t = probes.strips_table(strips_sweep())
    axes = figs.plot_strips(t)
    assert [a.get_title() for a in axes] == ["16384×4096", "65536×1024"]  # N=4096 first
    assert len({a.get_ylim() for a in axes}) == 1
    stars = [line for a in axes for line in a.get_lines() if line.get_marker() == "*"]
    assert len(stars) == 2
    plt.close("all")


def test_the_recorded_strips_sweep_draws_all_its_shapes():
    sweep = sorted(LOGS.glob("bwd-strips-sweep-*.jsonl"))
    if not sweep:
        pytest.skip("no recorded strips sweep")
    t = probes.strips_table(pd.read_json(sweep[-1], lines=True))
    axes = figs.plot_strips(t)
    assert len(axes) == len(set(zip(t["M"], t["N"])))
    plt.close("all")


def test_pdl_table_pairs_plain_and_pdl_and_says_when_they_separate():
    rows = []
    for rep in range(3):
        rows += [{"rep": rep, "M": 1024, "N": 4096, "impl": "auto:row", "pdl": False,
                  "us": 6.0 + 0.01 * rep},
                 {"rep": rep, "M": 1024, "N": 4096, "impl": "auto:row", "pdl": True,
                  "us": 5.0 + 0.01 * rep},
                 {"rep": rep, "M": 1024, "N": 4096, "impl": "auto:warp", "pdl": False,
                  "us": 6.0 + 0.5 * rep},
                 {"rep": rep, "M": 1024, "N": 4096, "impl": "auto:warp", "pdl": True,
                  "us": 6.2 + 0.5 * rep}]
    rows.append({"rep": 0, "impl": "copy", "us": 500.0})  # a ceiling row, no pdl column value
    t = probes.pdl_table(pd.DataFrame(rows))
    assert list(t.index.get_level_values("kernel")) == ["auto:row", "auto:warp"]
    assert t.loc[("auto:row", 1024, 4096), "PDL / plain"] == pytest.approx(5.01 / 6.01)
    assert t.loc[("auto:row", 1024, 4096), "resolved"]
    assert not t.loc[("auto:warp", 1024, 4096), "resolved"]  # the ranges overlap
    recorded = sorted(LOGS.glob("fwd-pdl-probe-*.jsonl"))
    if recorded:
        assert len(probes.pdl_table(results.load_probe(recorded[-1]))) > 0


def small_m_probe():
    """Two shapes, two timings each (invented numbers in the probe's row format)."""
    rows = []
    for (M, N), us in (((1024, 4096), (7.0, 6.5, 7.5, 11.5)), ((4096, 4096), (25, 24, 27, 31))):
        for rep in (0, 1):
            for variant, t in zip(("copy2r1w", "split-dx-only", "fused-nodw", "auto"), us):
                rows.append({"shape": [M, N], "variant": variant, "rep": rep, "p50": t + rep})
            rows.append({"shape": [M, N], "variant": "staged c1 s9", "rep": rep, "p50": 99.0})
    return pd.DataFrame(rows)


def test_small_m_parts_splits_the_fused_time_over_the_dx_kernel():
    t = probes.small_m_parts(small_m_probe())
    assert list(t.index) == [(1024, 4096), (4096, 4096)]
    r = t.loc[(1024, 4096)]
    assert r["fused"] == pytest.approx(12.0) and r["copy2r1w"] == pytest.approx(7.5)
    assert r["strips"] == pytest.approx(1.0) and r["dW"] == pytest.approx(4.0)
    assert r["dx kernel alone"] + r["strips"] + r["dW"] == pytest.approx(r["fused"])
    assert r["fused / copy2r1w"] == pytest.approx(12.0 / 7.5)
    with pytest.raises(ValueError, match="fused, no dW"):
        probes.small_m_parts(small_m_probe().query("variant != 'fused-nodw'"))


def test_small_m_figure_stacks_the_parts_to_the_fused_time():
    t = probes.small_m_parts(small_m_probe())
    ax = figs.plot_small_m_parts(t)
    ends = {}
    for bar in ax.patches:
        y = round(bar.get_y() + bar.get_height() / 2)
        ends[y] = max(ends.get(y, 0), bar.get_x() + bar.get_width())
    assert [ends[0], ends[1]] == pytest.approx(list(t["fused / copy2r1w"]))
    plt.close("all")
    recorded = sorted(LOGS.glob("bwd-small-m-stages-probe-*.jsonl"))
    if recorded:
        assert len(probes.small_m_parts(pd.read_json(recorded[-1], lines=True))) == 3


def test_dw_cluster_table_compares_each_cluster_size_with_a_partial_row_a_cta():
    rows = []
    for M, base in ((1024, 10.0), (65536, 400.0)):
        for k, f in ((1, 1.0), (2, 0.9), (4, 1.4)):
            for rep in (0, 1):
                rows.append({"M": M, "N": 4096, "dtype": "bfloat16", "dh": False,
                             "impl": f"fused dwc{k}", "rep": rep, "us": base * f + rep * 0.01})
        rows.append({"M": M, "N": 4096, "dtype": "bfloat16", "dh": True, "impl": "fused dwc2",
                     "us": 1.0})                                   # the fused add: left out
        rows.append({"M": M, "N": 4096, "dtype": "bfloat16", "dh": False, "impl": "auto",
                     "us": 1.0})
    rows.append({"M": 1000, "N": 4096, "dtype": "bfloat16", "dh": False, "impl": "fused dwc4",
                 "us": 9.0})                                       # no K = 1 to compare with
    t = probes.dw_cluster_table(pd.DataFrame(rows))
    assert list(t.index) == [(1024, 4096), (65536, 4096)]
    assert list(t.columns) == ["1 (µs)", "2 (µs)", "4 (µs)", "2 / 1", "4 / 1"]
    assert t.loc[(1024, 4096), "1 (µs)"] == pytest.approx(10.005)
    assert t.loc[(65536, 4096), "2 / 1"] == pytest.approx(360.005 / 400.005)
    recorded = sorted(LOGS.glob("bwd-dw-cluster-probe-*.jsonl"))
    if recorded:
        assert len(probes.dw_cluster_table(pd.read_json(recorded[-1], lines=True))) >= 10
