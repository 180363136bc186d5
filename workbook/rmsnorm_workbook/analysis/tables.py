"""Tables computed from a results DataFrame (``results.load_all``): bandwidth per shape and
implementation against the ceiling measured in the same run, host µs per call, time ratios with
their spread, a fixed-cost-per-launch fit, the forward/backward/training breakdown, and pipe tables
for the report. The figures in ``viz/sweeps.py`` draw from these.

Every function reads the newest measurement of each point (``results.latest``) of one GPU: pass
``gpu=`` (a slug such as ``"h200"``) when the results hold several. The tables that compare
kernels shape by shape (``bandwidth_table``, ``fused_add_table``, ``time_ratio``, ``eager_pair``)
read, per shape, only the newest run that measured it (``results.newest_run_per_shape``), so a
kernel that run did not measure there shows no older number. Rows of the lesson notebooks'
teaching kernels (``impl`` ``teach.*``) are left out unless named.
"""

from __future__ import annotations

from typing import Optional, Tuple

import pandas as pd

from ..legend import impl_order
from ..results import CEILINGS, latest, newest_run_per_shape

#: the ceiling each op is drawn against: the forward reads one tensor and writes one, the
#: backward reads two (x, dy) and writes one (dx). ``full`` (forward then backward) has no single
#: access pattern and is drawn without a ceiling.
CEILING_OF_OP = {"fwd": "copy", "bwd": "copy2r1w"}
#: implementations of the lesson notebooks' teaching kernels
TEACH_PREFIX = "teach."


def every_run(df: pd.DataFrame, gpu: Optional[str]) -> Tuple[pd.DataFrame, str]:
    """Every run's rows of ``gpu`` (the only GPU of ``df`` when None), not only the newest."""
    gpus = sorted(df["gpu"].unique())
    if gpu is None:
        if len(gpus) != 1:
            raise ValueError(f"the results hold {len(gpus)} GPUs {gpus}; pass gpu=")
        gpu = gpus[0]
    elif gpu not in gpus:
        raise ValueError(f"no results for gpu {gpu!r}; have {gpus}")
    return df[df["gpu"] == gpu], gpu


def one_gpu(df: pd.DataFrame, gpu: Optional[str]) -> Tuple[pd.DataFrame, str]:
    """The newest row of each measurement (``results.latest``) of ``gpu``."""
    d, gpu = every_run(df, gpu)
    return latest(d), gpu


#: impl names of rows that share an op with the sweeps but are not one of their series: the
#: fused residual add's (``...+add``, its own sweep: ``bench --op fwd-add/bwd-add``), the fp8
#: output's and the q/k-rope prologue's (``+fp8``, ``+rope``, ``liger.rope``: ``--op fwd-fp8``,
#: ``fwd-qk-rope``...) and the host benchmark's launch paths and cache caps (``...@path``)
OTHER_BENCHMARKS = r"\+add$|@|\+fp8|\.fp8\.|\+rope|^liger\.rope$|\+bf16\+mm$"


def library_rows(d: pd.DataFrame) -> pd.DataFrame:
    """The rows of the lab's forward, backward and training sweeps: without the lesson notebooks'
    teaching kernels, the fused residual add's rows and the host benchmark's."""
    impl = d["impl"].astype(str)
    return d[~impl.str.startswith(TEACH_PREFIX) & ~impl.str.contains(OTHER_BENCHMARKS)]


def ceiling_run(df: pd.DataFrame, op: str, gpu: Optional[str] = None) -> Optional[pd.Series]:
    """The row of ``op``'s ceiling on ``gpu`` that the op's tables are held against (its
    ``p50``, ``timestamp`` and ``commit`` name the run): of the runs of ``op`` that measured it,
    the one that measured most of ``op``'s rows (its sweep, not a tagged run of a few shapes;
    the newest of equal sweeps); else the newest run that measured it; None when not
    measured."""
    name = CEILING_OF_OP.get(op)
    # every run's rows (not only the newest of each measurement): runs are what is compared
    d, gpu = every_run(df, gpu)
    d = d[(d["metric"] == "bandwidth") & (d["path"] == "graph")]
    ceilings = d[(d["impl"] == name) & (d["op"] == op)]
    if not ceilings.empty:
        rows_per_run = d[d["op"] == op]["timestamp"].value_counts()
        best = max(ceilings["timestamp"],  # the most rows; of equal sweeps, the newest
                   key=lambda t: (rows_per_run.get(t, 0), pd.Timestamp(t)))
        return ceilings[ceilings["timestamp"] == best].iloc[0]
    d = d[d["impl"] == name]
    if d.empty:
        return None
    return d.loc[pd.to_datetime(d["timestamp"], utc=True).idxmax()]


def ceiling_gbps(df: pd.DataFrame, op: str, gpu: Optional[str] = None) -> Optional[float]:
    """Median GB/s of ``op``'s ceiling on ``gpu``, measured in the same run as the kernels it
    bounds (``ceiling_run``); None when not measured."""
    row = ceiling_run(df, op, gpu)
    return None if row is None else float(row["p50"])


def _bandwidth_rows(df: pd.DataFrame, op: str, gpu: Optional[str], path: str
                    ) -> Tuple[pd.DataFrame, str]:
    """The GB/s rows of ``op`` on ``path`` of the lab's sweeps' series (no ceilings, no fused
    add, no host benchmark, no teaching kernel), per shape those of the newest run that measured
    it (``results.newest_run_per_shape``)."""
    d, gpu = every_run(df, gpu)
    return newest_run_per_shape(library_rows(
        d[(d["op"] == op) & (d["path"] == path) & (d["metric"] == "bandwidth")
          & ~d["impl"].isin(CEILINGS)])), gpu


def _ceiling_per_run(df: pd.DataFrame, rows: pd.DataFrame, op: str, gpu: str) -> pd.DataFrame:
    """One row per run (``timestamp``) that measured some of ``rows``: its ``commit``, how
    many of ``rows`` it measured (``cells``), and the ceiling they are held against
    (``GB/s``): the one measured in that run (``own`` true), else, for a run that measured none
    (one stopped before its ceilings), ``ceiling_gbps``'s."""
    name = CEILING_OF_OP.get(op)
    d = df[(df["gpu"] == gpu) & (df["op"] == op) & (df["impl"] == name)
           & (df["metric"] == "bandwidth") & (df["path"] == "graph")]
    own = d.groupby("timestamp")["p50"].last()
    commits = rows["commit"] if "commit" in rows.columns else pd.Series("", index=rows.index)
    runs = rows.assign(commit=commits).groupby("timestamp").agg(
        commit=("commit", "first"), cells=("p50", "size"))
    runs["GB/s"] = runs.index.map(own).astype(float)
    runs["own"] = runs["GB/s"].notna()
    if not runs["own"].all():
        fallback = ceiling_gbps(df, op, gpu)
        runs["GB/s"] = runs["GB/s"].fillna(fallback if fallback is not None else float("nan"))
    return runs


def ceiling_per_run(df: pd.DataFrame, op: str, gpu: Optional[str] = None,
                    path: str = "graph") -> pd.DataFrame:
    """The ceilings ``bandwidth_table``'s percentages divide by: per run (``timestamp``) whose
    rows the table shows, its ``commit``, the number of cells (``cells``), the ceiling's
    ``GB/s`` and whether that run measured it (``own``). Empty for an op without a ceiling."""
    rows, gpu = _bandwidth_rows(df, op, gpu, path)
    if op not in CEILING_OF_OP or rows.empty:
        return pd.DataFrame(columns=["commit", "cells", "GB/s", "own"])
    return _ceiling_per_run(df, rows, op, gpu)


def bandwidth_table(df: pd.DataFrame, op: str, gpu: Optional[str] = None,
                    path: str = "graph") -> pd.DataFrame:
    """Median GB/s per shape (rows ``M``, ``N``) and implementation (columns under ``"GB/s"``),
    and the same as a percentage of the op's ceiling (columns under ``"% of copy"`` for the
    forward, ``"% of copy2r1w"`` for the backward; absent when none was measured). Each cell is
    held against the ceiling measured in the run that measured the cell (a sweep and a tagged
    run of other shapes each have their own), or ``ceiling_gbps`` for a run that measured none
    (``ceiling_per_run`` lists them)."""
    d, gpu = _bandwidth_rows(df, op, gpu, path)

    def pivot(values: pd.Series) -> pd.DataFrame:
        t = d.assign(v=values).pivot_table(index=["M", "N"], columns="impl", values="v",
                                           aggfunc="last")
        t = t.reindex(columns=impl_order(t.columns)).sort_index(level=["N", "M"])
        t.columns.name = None
        return t

    gbps = pivot(d["p50"])
    parts = {"GB/s": gbps}
    if op in CEILING_OF_OP and not d.empty:
        ceiling = d["timestamp"].map(_ceiling_per_run(df, d, op, gpu)["GB/s"])
        if ceiling.notna().any():
            parts[f"% of {CEILING_OF_OP[op]}"] = pivot(100 * d["p50"] / ceiling).reindex(
                index=gbps.index, columns=gbps.columns)
    return pd.concat(parts, axis=1)


#: the same-shape ceiling of the fused residual add's sweeps, by op (bench.fused_add.SAME_SHAPE)
ADD_CEILING_OF_OP = {"fwd": "copy2r2w.shape", "bwd": "copy3r1w.shape"}


def fused_add_table(df: pd.DataFrame, op: str, gpu: Optional[str] = None) -> pd.DataFrame:
    """The fused residual add's sweep (``bench --op fwd-add`` or ``bwd-add``): median µs per
    shape (rows ``M``, ``N``) by CUDA-graph replay for every ``...+add`` implementation and the
    same-shape ceiling (a copy moving the same bytes), then ``lab / best peer`` (the lab's
    ``cute.auto+add`` over the fastest peer; below 1: the lab is faster). Empty when the results
    hold no such sweep. Per shape, the newest run that measured it (``newest_run_per_shape``)."""
    d, gpu = every_run(df, gpu)
    ceiling = ADD_CEILING_OF_OP[op]
    impl = d["impl"].astype(str)
    d = newest_run_per_shape(d[(d["op"] == op) & (d["path"] == "graph")
                               & (d["metric"] == "time")
                               & (impl.str.endswith("+add") | (impl == ceiling))])
    if d.empty:
        return pd.DataFrame()
    t = d.pivot_table(index=["M", "N"], columns="impl", values="p50", aggfunc="last")
    adds = [c for c in impl_order(t.columns) if c != ceiling]
    t = t.reindex(columns=adds + ([ceiling] if ceiling in t.columns else []))
    peers = [c for c in adds if not c.startswith(("cute.", "triton."))]
    if "cute.auto+add" in t.columns and peers:
        t["lab / best peer"] = t["cute.auto+add"] / t[peers].min(axis=1)
    t.columns.name = None
    return t.sort_index(level=["N", "M"])


#: the fused ops' sweeps, beside the norm's: ``bench --op`` name -> (op, its rows' impl names,
#: its same-shape copies (the ceiling first; the bench's ``Op.same_shape``, a test holds them
#: equal), the lab's fused kernel)
_FP8_COPIES = ("copy.narrow.shape", "copy.fp8.shape")
FUSIONS = {
    "fwd-fp8": ("fwd", r"\+fp8(?:\.unfused(?:\.inductor)?)?$", _FP8_COPIES, "cute.auto+fp8"),
    "fwd-fp8-static": ("fwd", r"\+fp8\.static(?:\.unfused(?:\.inductor)?)?$", _FP8_COPIES,
                       "cute.auto+fp8.static"),
    "fwd-qk-rope": ("fwd", r"\+rope(?:\.eager)?$|^liger\.rope$", ("copy.shape",), "cute.qk+rope"),
    "bwd-qk-rope": ("bwd", r"\+rope(?:\.eager)?$|^liger\.rope$", ("copy2r1w.shape",),
                    "cute.qk+rope"),
}
#: what each fused op is, as the report's summary names it
FUSION_TOPICS = {"fwd-fp8": "fp8 output", "fwd-fp8-static": "fp8 output",
                 "fwd-qk-rope": "q/k norms with RoPE", "bwd-qk-rope": "q/k norms with RoPE"}


def fusion_table(df: pd.DataFrame, name: str, gpu: Optional[str] = None) -> pd.DataFrame:
    """A fused op's sweep (``FUSIONS[name]``) from its newest run: median µs per shape by
    CUDA-graph replay of every implementation and the run's same-shape copies, then ``lab /
    best peer`` (the lab's fused kernel over the fastest implementation that is not the lab's;
    below 1: the lab is faster); ``attrs["run"]``: the run's commit and date (in full:
    ``attrs["timestamp"]``), ``attrs["peers"]`` the implementations it counts as peers. Empty
    when the results hold no such run."""
    op, pattern, copies, lab = FUSIONS[name]
    d, gpu = every_run(df, gpu)
    d = d[(d["op"] == op) & (d["path"] == "graph") & (d["metric"] == "time")]
    ours = d[d["impl"].astype(str).str.contains(pattern)]
    if ours.empty:
        return pd.DataFrame()
    run = d[d["timestamp"] == ours["timestamp"].max()]
    run = run[run["impl"].astype(str).str.contains(pattern) | run["impl"].isin(copies)]
    t = run.pivot_table(index=["M", "N"], columns="impl", values="p50", aggfunc="last")
    impls = [c for c in impl_order(t.columns) if c not in copies]
    t = t.reindex(columns=impls + [c for c in copies if c in t.columns])
    peers = [c for c in impls if not c.startswith(("cute.", "triton."))]
    if lab in t.columns and peers:
        t["lab / best peer"] = t[lab] / t[peers].min(axis=1)
    t.columns.name = None
    t = t.sort_index(level=["N", "M"])
    t.attrs["run"] = (str(run["commit"].iloc[0]), str(run["timestamp"].iloc[0])[:10])
    t.attrs["timestamp"] = str(run["timestamp"].iloc[0])
    t.attrs["peers"] = peers
    return t


def host_benchmark_run(d: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``d`` from the newest run of the host benchmark (``bench --op host``: the one
    that times the lab's launch paths, ``cute.auto@tvm_ffi``...), where every implementation was
    timed interleaved on one host, so their costs compare; ``d`` itself when it holds no such
    run. The sweeps time host rows too, each in its own run (and the lab's variants inside
    ``settings.override``, whose cost they include): those are left out. So are a forward-only
    peer's rows with autograd or a backward: its inputs that require grad build no autograd
    graph, so such a call is its inference again, not a row of its own."""
    from ..bench.peers import forward_only

    impl = d["impl"].astype(str)
    runs = d.loc[impl.str.contains("@", regex=False), "timestamp"]
    if runs.empty:
        return d
    newest = runs.iloc[pd.to_datetime(runs, utc=True).argmax()]
    inference_again = (impl.str.split("+").str[0].isin(forward_only())
                       & (impl.str.endswith("+autograd") | (d["op"] == "full")))
    return d[(d["timestamp"] == newest) & ~inference_again]


#: the lab as a user calls it (the default variant and backward; the fused add): what the host
#: table shows of the lab for an op the host benchmark does not time
LAB_DEFAULT_HOST = ("cute.auto", "cute.auto+add")


def host_benchmark_covers(df: pd.DataFrame, op: str, gpu: Optional[str] = None) -> bool:
    """Has the host benchmark (``bench --op host``) timed ``op`` on ``gpu``? It times the
    forward and forward + backward (``full``), not the backward alone."""
    d, _ = every_run(df, gpu)
    d = d[(d["op"] == op) & (d["metric"] == "host")]
    return bool(d["impl"].astype(str).str.contains("@", regex=False).any())


def host_table(df: pd.DataFrame, op: str, gpu: Optional[str] = None,
               with_commit: bool = False) -> pd.DataFrame:
    """Host µs per call (p20, p50, p80) per implementation and shape. Where the host benchmark
    timed ``op`` (``host_benchmark_covers``): its newest run (``host_benchmark_run``), the lab's
    launch paths and the peers. Elsewhere (``bwd``): the sweeps' own host rows, the newest of
    each implementation, the lab's by its default (``LAB_DEFAULT_HOST``), its pinned variants
    and backward modes left out. ``with_commit``: each row's run's commit beside it."""
    d, gpu = every_run(df, gpu)
    d = d[(d["op"] == op) & (d["metric"] == "host")]
    covered = host_benchmark_covers(df, op, gpu)
    d = latest(host_benchmark_run(d))  # one row per key: an op the host benchmark does not
    impl = d["impl"].astype(str)         # time (bwd) has its sweeps' rows, one set per run
    lab = impl.str.contains("@") if covered else impl.isin(LAB_DEFAULT_HOST)
    d = d[lab | ~impl.str.startswith(("cute.", TEACH_PREFIX))]
    d = d.assign(impl=pd.Categorical(d["impl"], impl_order(d["impl"]), ordered=True))
    columns = ["p20", "p50", "p80"] + (["commit"] if with_commit else [])
    return d.sort_values(["impl", "M", "N"]).set_index(["impl", "M", "N"])[columns]


def shape_order(index) -> list:
    """Shapes sorted as the sweep reads: by N, then M."""
    return sorted(index, key=lambda s: (s[1], s[0]))


def time_ratio(df: pd.DataFrame, op: str = "bwd", slower: str = "cute.split",
               faster: str = "cute.fused", path: str = "graph",
               gpu: Optional[str] = None) -> pd.DataFrame:
    """Per shape (rows ``M``, ``N``): the median µs of ``slower`` and ``faster`` and
    ``ratio = t(slower) / t(faster)`` (above 1: ``faster`` is faster), plus the ratio's spread
    from the quantiles (``lo`` = p20(slower)/p80(faster), ``hi`` = p80(slower)/p20(faster)).
    Only shapes where the newest run that timed either measured both."""
    d, _ = every_run(df, gpu)
    d = newest_run_per_shape(d[(d["op"] == op) & (d["path"] == path) & (d["metric"] == "time")
                               & d["impl"].isin([slower, faster])])
    q = {k: d.pivot_table(index=["M", "N"], columns="impl", values=k, aggfunc="last")
         for k in ("p20", "p50", "p80")}
    cols = ["M", "N", slower, faster, "ratio", "lo", "hi"]
    if q["p50"].empty or not {slower, faster} <= set(q["p50"].columns):
        return pd.DataFrame(columns=cols).set_index(["M", "N"])
    out = pd.DataFrame({slower: q["p50"][slower], faster: q["p50"][faster],
                        "ratio": q["p50"][slower] / q["p50"][faster],
                        "lo": q["p20"][slower] / q["p80"][faster],
                        "hi": q["p80"][slower] / q["p20"][faster]}).dropna()
    return out.reindex(shape_order(out.index))


#: how close two CUDA-graph times must lie for ``eager_pair`` to count them the same
SAME_GRAPH = 0.02


def eager_pair(df: pd.DataFrame, op: str, gpu: Optional[str] = None, N: int = 4096,
               same: float = SAME_GRAPH, prefix: str = "cute.") -> Optional[dict]:
    """At the smallest M timed both ways at width ``N``: of the lab's implementations (``prefix``)
    whose CUDA-graph times lie within ``same`` of each other, the two whose eager times lie
    furthest apart: ``M``, ``impls`` (eager-slower first), ``graph`` and ``eager`` µs of each;
    None when no two are that close. Kernels that take the same time, read apart eagerly: the
    eager time there is the host's, and it moves. Per shape, the newest run that timed it."""
    d, _ = every_run(df, gpu)
    d = newest_run_per_shape(library_rows(
        d[(d["op"] == op) & (d["metric"] == "time") & (d["N"] == N)
          & d["path"].isin(["eager", "graph"]) & d["impl"].astype(str).str.startswith(prefix)]))
    t = d.pivot_table(index=["M", "impl"], columns="path", values="p50", aggfunc="last")
    if not {"eager", "graph"} <= set(t.columns):
        return None
    t = t.dropna(subset=["eager", "graph"])
    if t.empty:
        return None
    at = t.loc[t.index.get_level_values("M").min()]
    best = None
    for a in at.index:
        for b in at.index:
            g, e = at.loc[[a, b], "graph"], at.loc[[a, b], "eager"]
            if a != b and g.max() / g.min() - 1 <= same and e[a] > e[b] and (
                    best is None or e[a] / e[b] > best["eager"][0] / best["eager"][1]):
                best = {"M": int(t.index.get_level_values("M").min()), "impls": (a, b),
                        "graph": (float(g[a]), float(g[b])), "eager": (float(e[a]), float(e[b]))}
    return best


def markdown_table(table: pd.DataFrame, digits: int = 2, right_align: bool = False) -> str:
    """A pipe table for the report: a named or multi-level index becomes the leading columns;
    floats print with ``digits`` decimals, missing values as '-'."""
    named = bool(table.index.name) or isinstance(table.index, pd.MultiIndex)
    flat = table.reset_index() if named else table
    head = "| " + " | ".join(str(c) for c in flat.columns) + " |"
    rule = "|" + "|".join(("---:" if right_align else "---") for _ in flat.columns) + "|"

    def cell(v):
        if isinstance(v, float):
            return "-" if pd.isna(v) else f"{v:.{digits}f}"
        return str(v)

    body = ["| " + " | ".join(cell(v) for v in row) + " |"
            for row in flat.itertuples(index=False)]
    return "\n".join([head, rule, *body])
