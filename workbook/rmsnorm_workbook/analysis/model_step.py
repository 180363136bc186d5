"""The model step's results (``bench --op model``) as tables, and the arithmetic that predicts
them from the op sweeps: how many norms a step calls, on how many rows, and what the per-call
device times of ``fwd.csv``/``bwd.csv`` add up to.

A host-bound step's numbers move between runs (a GPU host's CPU is part of them), so every
comparison here is between rows of one run: ``one_run`` picks them.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import pandas as pd

#: the column names of ``step_table``: (workload, path, metric)
COLUMNS = {
    "train wall": ("train", "eager", "wall"),
    "train events": ("train", "eager", "time"),
    "prefill wall": ("prefill", "eager", "wall"),
    "decode wall": ("decode", "eager", "wall"),
    "decode events": ("decode", "eager", "time"),
    "decode host": ("decode", "host", "host"),
    "decode graph": ("decode", "graph", "time"),
}


def workload(op: str, M: int, decode_rows: int = 64) -> str:
    """The workload of a row: the train step is op ``full``; a forward of at most
    ``decode_rows`` tokens is a decode step, a larger one a prefill."""
    if op == "full":
        return "train"
    return "decode" if M <= decode_rows else "prefill"


def split_impl(impl: str) -> tuple:
    """``llama.lab+carry`` -> ("llama", "lab+carry"); ``llama.compile.torch`` -> ("llama",
    "compile.torch")."""
    arch, _, choice = str(impl).partition(".")
    return arch, choice


def one_run(steps: pd.DataFrame, containing: str) -> pd.DataFrame:
    """The rows of the newest run (one timestamp: one run's provenance) that timed ``containing``
    (an impl, e.g. ``llama.lab``)."""
    if steps.empty or not (steps["impl"] == containing).any():
        return steps.iloc[0:0]
    stamp = steps.loc[steps["impl"] == containing, "timestamp"].max()
    return steps[steps["timestamp"] == stamp].reset_index(drop=True)


def step_table(run: pd.DataFrame, columns: Dict[str, tuple] = COLUMNS,
               unit: float = 1e3, q: str = "p50") -> pd.DataFrame:
    """(arch, choice) x ``columns``, the quantile ``q`` (p50: the median) in ms (``unit`` µs
    each); NaN where not measured."""
    df = run.assign(workload=[workload(o, m) for o, m in zip(run["op"], run["M"])])
    out = {}
    for name, (wl, path, metric) in columns.items():
        sel = df[(df["workload"] == wl) & (df["path"] == path) & (df["metric"] == metric)]
        out[name] = sel.set_index("impl")[q] / unit
    table = pd.DataFrame(out)
    table.index = pd.MultiIndex.from_tuples([split_impl(i) for i in table.index],
                                            names=["arch", "norm"])
    return table.sort_index()


def versus(table: pd.DataFrame, baseline: str = "torch") -> pd.DataFrame:
    """``table`` divided, per architecture, by its ``baseline`` norm's row (1.0 = as fast)."""
    parts = []
    for arch, rows in table.groupby(level="arch"):
        if (arch, baseline) in rows.index:
            parts.append(rows / rows.loc[(arch, baseline)])
    return pd.concat(parts) if parts else table.iloc[0:0]


def versus_spread(run: pd.DataFrame, columns: Dict[str, tuple] = COLUMNS,
                  baseline: str = "torch") -> Tuple[pd.DataFrame, pd.DataFrame]:
    """``(lo, hi)``: the ratio of ``versus`` at its extremes, each choice's p20 over
    ``baseline``'s p80 and its p80 over the baseline's p20: how far the two p20-p80 ranges let
    the ratio move."""
    p20, p80 = step_table(run, columns, q="p20"), step_table(run, columns, q="p80")
    lo, hi = [], []
    for arch in p20.index.get_level_values("arch").unique():
        if (arch, baseline) in p20.index:
            lo.append(p20.loc[[arch]] / p80.loc[(arch, baseline)])
            hi.append(p80.loc[[arch]] / p20.loc[(arch, baseline)])
    if not lo:
        return p20.iloc[0:0], p80.iloc[0:0]
    return pd.concat(lo), pd.concat(hi)


def norm_calls(config, tokens: int) -> pd.DataFrame:
    """The norms one forward of ``tokens`` tokens calls in a decoder of ``config``, grouped by
    where they sit: rows and width of each call, and calls per step. Qwen3-style models add a
    norm of each attention head's query and key (``head_dim`` wide, tokens x heads rows)."""
    layers = config.num_hidden_layers
    hidden = config.hidden_size
    rows = [{"where": "before attention, before the MLP", "calls": 2 * layers, "M": tokens,
             "N": hidden},
            {"where": "after the last layer", "calls": 1, "M": tokens, "N": hidden}]
    if "qwen3" in type(config).__name__.lower():
        head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
        rows.append({"where": "each head's query", "calls": layers,
                     "M": tokens * config.num_attention_heads, "N": head_dim})
        rows.append({"where": "each head's key", "calls": layers,
                     "M": tokens * config.num_key_value_heads, "N": head_dim})
    return pd.DataFrame(rows)


def per_call_us(ops: pd.DataFrame, impl: str, op: str, M: int, N: int,
                gpu: str = "h200") -> Optional[float]:
    """Device µs of one call from the op sweeps (graph replay, bf16), scaled linearly in rows
    from the nearest measured row count at width N (a norm's time is its bytes once the GPU is
    full); None where the width was not measured."""
    sel = ops[(ops["gpu"] == gpu) & (ops["op"] == op) & (ops["impl"] == impl)
              & (ops["N"] == N) & (ops["path"] == "graph") & (ops["metric"] == "time")
              & (ops["dtype"] == "bf16")]
    if sel.empty:
        return None
    nearest = sel.iloc[(sel["M"] - M).abs().argsort().iloc[0]]
    return float(nearest["p50"]) * M / float(nearest["M"])


def predicted_norm_ms(calls: pd.DataFrame, ops: pd.DataFrame, impl: str,
                      op_names: Sequence[str] = ("fwd", "bwd")) -> Optional[float]:
    """The norms' device ms in one step: every call of ``calls`` times its per-call time, for
    each op in ``op_names`` (a training step runs each norm forward and backward)."""
    total = 0.0
    for r in calls.itertuples(index=False):
        for op in op_names:
            t = per_call_us(ops, impl, op, r.M, r.N)
            if t is None:
                return None
            total += r.calls * t
    return total / 1e3


