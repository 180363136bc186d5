"""Notebook 05's arithmetic and figures on the CPU, from synthetic rows (gpu ``testgpu``)."""

import pandas as pd
import pytest

from rmsnorm_workbook.analysis import model_step as ms


def _row(impl, op, M, path, metric, p50, stamp="2000-01-01T00:00:00+00:00", N=4096):
    return {"gpu": "testgpu", "timestamp": stamp, "commit": "c", "op": op, "impl": impl,
            "path": path, "M": M, "N": N, "dtype": "bf16", "metric": metric, "unit": "us",
            "p20": p50, "p50": p50, "p80": p50}


def _run():
    rows = []
    for impl, scale in (("llama.torch", 1.0), ("llama.lab", 0.9)):
        rows += [_row(impl, "full", 16384, "eager", "wall", 300e3 * scale),
                 _row(impl, "fwd", 16384, "eager", "wall", 100e3 * scale),
                 _row(impl, "fwd", 8, "eager", "wall", 8e3 * scale),
                 _row(impl, "fwd", 8, "graph", "time", 2e3 * scale)]
    rows.append(_row("llama.lab", "fwd", 8, "graph", "time", 5.0, stamp="1999-01-01T00:00:00"))
    return pd.DataFrame(rows)


def test_one_run_keeps_the_newest_run_that_timed_the_impl():
    run = ms.one_run(_run(), "llama.lab")
    assert len(run) == 8 and run["timestamp"].nunique() == 1
    assert ms.one_run(_run(), "qwen3.lab").empty


def test_step_table_and_ratios_against_torch():
    table = ms.step_table(ms.one_run(_run(), "llama.lab"))
    assert table.loc[("llama", "lab"), "train wall"] == pytest.approx(270.0)
    assert table.loc[("llama", "torch"), "decode graph"] == pytest.approx(2.0)
    assert pd.isna(table.loc[("llama", "lab"), "decode host"])  # not measured: NaN
    ratios = ms.versus(table)
    assert ratios.loc[("llama", "lab"), "train wall"] == pytest.approx(0.9)
    assert ratios.loc[("llama", "torch"), "decode wall"] == pytest.approx(1.0)


@pytest.mark.parametrize("op,M,expect", [("full", 16384, "train"), ("fwd", 16384, "prefill"),
                                         ("fwd", 8, "decode")])
def test_workload_of_a_row(op, M, expect):
    assert ms.workload(op, M) == expect


def test_norm_calls_of_llama_and_qwen3_configs():
    transformers = pytest.importorskip("transformers")
    llama = ms.norm_calls(transformers.LlamaConfig(num_hidden_layers=8, hidden_size=4096,
                                                   num_attention_heads=32), 16384)
    assert llama["calls"].sum() == 17 and set(llama["N"]) == {4096}
    qwen = ms.norm_calls(transformers.Qwen3Config(num_hidden_layers=8, hidden_size=4096,
                                                  num_attention_heads=32, num_key_value_heads=8,
                                                  head_dim=128), 16384)
    heads = qwen[qwen["N"] == 128].set_index("where")["M"]
    assert qwen["calls"].sum() == 33
    assert heads["each head's query"] == 16384 * 32 and heads["each head's key"] == 16384 * 8


def test_per_call_time_scales_from_the_nearest_row_count_and_sums_over_calls():
    ops = pd.DataFrame([_row("cute.auto", op, M, "graph", "time", t, N=N) for op, M, N, t in (
        ("fwd", 16384, 4096, 60.0), ("fwd", 1024, 4096, 9.0), ("bwd", 16384, 4096, 100.0))])
    assert ms.per_call_us(ops, "cute.auto", "fwd", 32768, 4096, gpu="testgpu") == 120.0
    assert ms.per_call_us(ops, "cute.auto", "fwd", 1024, 4096, gpu="testgpu") == 9.0
    assert ms.per_call_us(ops, "cute.auto", "fwd", 1024, 128, gpu="testgpu") is None
    calls = pd.DataFrame([{"where": "x", "calls": 3, "M": 16384, "N": 4096}])
    ops["gpu"] = "h200"
    assert ms.predicted_norm_ms(calls, ops, "cute.auto") == pytest.approx(3 * 160.0 / 1e3)
    assert ms.predicted_norm_ms(calls, ops, "torch.native") is None


def test_the_ratio_figure_draws_a_bar_per_norm_and_workload():
    pytest.importorskip("matplotlib")
    from rmsnorm_workbook.viz import model_step as figs
    ratios = ms.versus(ms.step_table(ms.one_run(_run(), "llama.lab")))
    ax = figs.plot_vs_torch(ratios, "llama", ["train wall", "decode graph"])
    assert len(ax.patches) == 2  # one norm (lab) x two workloads; torch is the line at 1
    import matplotlib.pyplot as plt
    plt.close("all")
