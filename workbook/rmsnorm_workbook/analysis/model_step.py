"""The model step's results (``bench --op model``) as tables, and the arithmetic that predicts
them from the op sweeps: how many norms a step calls, on how many rows, and what the per-call
device times of ``fwd.csv``/``bwd.csv`` add up to.

A host-bound step's numbers move between runs (a GPU host's CPU is part of them), so every
comparison here is between rows of one run: ``one_run`` picks them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

import pandas as pd

from ..results import latest

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


def ops_as_of(ops: pd.DataFrame, run: pd.DataFrame) -> pd.DataFrame:
    """The op sweeps' rows as they stood when ``run`` (a model run, ``one_run``) was measured:
    the newest row of each measurement no later than the run, so a prediction from them is made
    with the kernels the model ran, not with later ones."""
    if run.empty or ops.empty:
        return latest(ops)
    stamp = pd.to_datetime(run["timestamp"], utc=True).max()
    return latest(ops[pd.to_datetime(ops["timestamp"], utc=True) <= stamp])


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


#: the loops of the decode-timer probe (``results/<gpu>/logs/decode-timers-probe-*.jsonl``)
#: that time the host's enqueue of one step, each a different way of running the same step
PROBE_LOOPS = ("back_to_back_enqueue", "sync_before_enqueue", "dobench_loop_enqueue",
               "back_to_back_gc_off_enqueue")


def decode_probe(logs: Path) -> Tuple[pd.DataFrame, dict]:
    """The newest decode-timer probe in the folder ``logs`` (by its provenance's timestamp): the
    p50 ms per step of llama's decode step per norm choice (rows) and loop (``PROBE_LOOPS``,
    columns), and its provenance with the file's ``name``; an empty frame and ``{}`` when there
    is none."""
    from ..results import read_jsonl

    found = []
    for path in sorted(Path(logs).glob("decode-timers-probe-*.jsonl")):
        records = read_jsonl(path)
        prov = next((r["provenance"] for r in records if "provenance" in r), {})
        rows = {r["choice"]: {k: r[k]["p50"] for k in PROBE_LOOPS if k in r}
                for r in records if "choice" in r}
        if rows:
            found.append((str(prov.get("timestamp", "")), path.name, prov, rows))
    if not found:
        return pd.DataFrame(), {}
    _, name, prov, rows = max(found)
    return pd.DataFrame.from_dict(rows, orient="index"), {**prov, "name": name}


def _span(minutes: float) -> str:
    """A time span in the unit that reads best: minutes, hours or days."""
    if minutes < 120:
        return f"{minutes:.0f} minutes"
    return f"{minutes / 60:.0f} hours" if minutes < 72 * 60 else f"{minutes / 1440:.0f} days"


def decode_caveat(table: pd.DataFrame, run: pd.DataFrame, probe: pd.DataFrame,
                  prov: dict, arch: str = "llama") -> str:
    """What the decode-timer probe (``decode_probe``) says of ``run``'s eager decode column
    (``step_table``'s ``decode wall``): the probe's back-to-back order of the choices both timed
    against the run's, lab over torch in each, how far one step's host cost moved between the
    probe's loops, and when it ran relative to the run. Empty when they share too little."""
    if probe.empty or "back_to_back_enqueue" not in probe.columns or arch not in table.index:
        return ""
    wall = table.loc[arch, "decode wall"].dropna()
    both = [c for c in probe.index if c in wall.index]
    if not {"lab", "torch"} <= set(both):
        return ""
    back = probe.loc[both, "back_to_back_enqueue"].sort_values()
    ours = wall[both].sort_values()
    loops = probe.loc[both, [c for c in PROBE_LOOPS if c in probe.columns]]
    moved = float((loops.max(axis=1) / loops.min(axis=1)).max())
    minutes = (pd.Timestamp(prov.get("timestamp")) - pd.to_datetime(run["timestamp"]).max()
               ).total_seconds() / 60 if prov.get("timestamp") else float("nan")
    when = (f"{_span(abs(minutes))} {'after' if minutes >= 0 else 'before'} this run"
            if minutes == minutes else "in another run")
    order = ("the same order as this run" if list(back.index) == list(ours.index) else
             f"where this run ranks them {', '.join(ours.index)}")
    return (f"Eager decode (`decode wall`) is host-bound and does not hold still between runs: "
            f"a probe of {arch}'s decode step {when} (`logs/{prov.get('name', '')}`) timed it "
            "back to back at "
            + ", ".join(f"{c} {v:.2f}" for c, v in back.items())
            + f" ms a step, {order}; lab over torch {back['lab'] / back['torch']:.2f} there "
            f"against {ours['lab'] / ours['torch']:.3f} here, and one choice's step moved by up to "
            f"{moved:.1f}× between the probe's ways of timing it. The eager decode ratios are "
            "one run's ranking of the host, not of the norms; `decode graph` leaves the host out.")
