"""Tables of the probes the lessons read (``results/<gpu>/logs/*-probe-*.jsonl``,
``*-sweep-*.jsonl``: one JSON object per timed configuration, read with
``results.load_probe`` or ``pandas.read_json(lines=True)``): the fused backward's strips per SM
(notebook 02), the small-M backward's parts (notebook 02) and programmatic dependent launch on
and off (notebook 01)."""

from __future__ import annotations

import pandas as pd

STRIPS = r"fused\.k(\d+)\.pf(\d)"


def strips_table(sweep: pd.DataFrame, prefetch: bool = True) -> pd.DataFrame:
    """The strips sweep's fused-kernel rows (``fused.k<strips>.pf<prefetch>``) with or without
    the prefetch: one row per shape and strips per SM, columns ``M``, ``N``, ``per SM``,
    ``us``, ``gbs``, ``% of best`` (GB/s over the best count's at that shape, same prefetch) and
    ``plan`` (the plan's count for that shape)."""
    parts = sweep["impl"].str.extract(STRIPS)
    keep = parts[0].notna() & (parts[1] == str(int(prefetch)))
    t = sweep[keep].assign(**{"per SM": parts.loc[keep, 0].astype(int)})
    t = t.assign(**{"% of best": 100 * t["gbs"] / t.groupby(["M", "N"])["gbs"].transform("max"),
                    "plan": t["model_k"].astype(int)})
    return t[["M", "N", "per SM", "us", "gbs", "% of best", "plan"]].sort_values(
        ["N", "M", "per SM"]).reset_index(drop=True)


def strips_choices(table: pd.DataFrame) -> pd.DataFrame:
    """Per shape of ``strips_table``: the measured best count, the plan's, whether they agree,
    and the plan's share of the best (``% of best``)."""
    rows = []
    for (M, N), g in table.groupby(["M", "N"]):
        best = g.loc[g["gbs"].idxmax()]
        plan = g[g["per SM"] == g["plan"].iloc[0]]
        rows.append({"M": M, "N": N, "best": int(best["per SM"]), "plan": int(g["plan"].iloc[0]),
                     "agree": int(best["per SM"]) == int(g["plan"].iloc[0]),
                     "plan % of best": float(plan["% of best"].iloc[0]) if len(plan) else None})
    return pd.DataFrame(rows).set_index(["M", "N"])


def strips_ratio(table: pd.DataFrame, fewer: int, more: int, N: int) -> pd.Series:
    """Per M at width N: the time with ``fewer`` strips per SM over the time with ``more``."""
    t = table[table["N"] == N].pivot_table(index="M", columns="per SM", values="us")
    return (t[fewer] / t[more]).dropna()


def pdl_table(probe: pd.DataFrame) -> pd.DataFrame:
    """The PDL probe's rows (a ``pdl`` column) as one row per kernel and shape: the median µs
    launched plainly and with PDL, their fastest-slowest ranges, PDL over plain, and
    ``resolved``: whether the two ranges do not overlap. A kernel is named as the probe names
    it (``auto:row``: what ``auto`` launched, ``row:row``: the row kernel asked for)."""
    d = probe.dropna(subset=["pdl"]).assign(pdl=lambda f: f["pdl"].astype(bool))
    g = d.groupby(["impl", "M", "N", "pdl"])["us"].agg(["median", "min", "max", "count"])
    rows = []
    for (impl, M, N), r in g.groupby(level=[0, 1, 2]):
        r = r.droplevel([0, 1, 2])
        if not {False, True} <= set(r.index):
            continue
        plain, pdl = r.loc[False], r.loc[True]
        rows.append({"kernel": impl, "M": int(M), "N": int(N), "plain µs": plain["median"],
                     "PDL µs": pdl["median"], "PDL / plain": pdl["median"] / plain["median"],
                     "repetitions": int(min(plain["count"], pdl["count"])),
                     "resolved": plain["max"] < pdl["min"] or pdl["max"] < plain["min"]})
    return pd.DataFrame(rows).set_index(["kernel", "M", "N"])


#: the small-M backward probe's variants (``bwd-small-m-stages-probe-*.jsonl``), by what each
#: times: the same-shape copy, the split path's dx kernel alone (a CTA a row), the fused kernel
#: without a weight (its strips, no dW), and the fused kernel as ``auto`` launches it
SMALL_M_VARIANTS = {"copy2r1w": "copy2r1w", "split-dx-only": "dx kernel alone",
                    "fused-nodw": "fused, no dW", "auto": "fused"}


def small_m_parts(probe: pd.DataFrame) -> pd.DataFrame:
    """The small-M backward probe (one row per timing: ``shape`` [M, N], ``variant``, ``p50`` µs)
    as one row per shape (index M, N): the median µs of each of ``SMALL_M_VARIANTS``, then the
    fused kernel's time in two parts over the dx kernel alone: ``strips`` (fused without dW minus
    the dx kernel: a strip's rows walked one after another) and ``dW`` (fused minus fused without
    dW: the partial rows, the wait for the grid's end, their sum), and ``fused / copy2r1w``."""
    d = probe[probe["variant"].isin(SMALL_M_VARIANTS) & probe["p50"].notna()]
    d = d.assign(M=d["shape"].str[0].astype(int), N=d["shape"].str[1].astype(int))
    t = d.pivot_table(index=["M", "N"], columns="variant", values="p50", aggfunc="median")
    t = t[[v for v in SMALL_M_VARIANTS if v in t]].rename(columns=SMALL_M_VARIANTS)
    missing = set(SMALL_M_VARIANTS.values()) - set(t.columns)
    if missing:
        raise ValueError(f"the small-M probe lacks {', '.join(sorted(missing))}")
    t = t.dropna()
    t["strips"] = t["fused, no dW"] - t["dx kernel alone"]
    t["dW"] = t["fused"] - t["fused, no dW"]
    t["fused / copy2r1w"] = t["fused"] / t["copy2r1w"]
    return t


def dw_cluster_table(probe: pd.DataFrame, dtype: str = "bfloat16") -> pd.DataFrame:
    """The dW-cluster probe (``bwd-dw-cluster-probe-*.jsonl``: ``M``, ``N``, ``dtype``, ``dh``,
    ``impl`` = ``fused dwc<K>`` for clusters of K CTAs summing their dW rows, ``us``) for
    ``dtype`` without the fused add, at the shapes timed with K = 1: the median µs per shape
    (index M, N) and cluster size (``K (µs)``), then each size's time over one partial row a CTA
    (``K / 1``)."""
    d = probe[probe["impl"].str.startswith("fused dwc", na=False) & (probe["dtype"] == dtype)
              & ~probe["dh"].astype(bool) & probe["us"].notna()]
    d = d.assign(K=d["impl"].str.removeprefix("fused dwc").astype(int))
    t = d.pivot_table(index=["M", "N"], columns="K", values="us", aggfunc="median")
    t = t.dropna(subset=[1]).sort_index(level=["N", "M"])
    sizes = list(t.columns)
    for k in sizes[1:]:
        t[f"{k} / 1"] = t[k] / t[1]
    t = t.rename(columns={k: f"{k} (µs)" for k in sizes})
    t.columns.name = "CTAs a cluster"
    return t
