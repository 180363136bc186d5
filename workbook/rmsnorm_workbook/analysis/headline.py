"""The headline: a few shapes that say what the lab's kernels do on one GPU, each against the best
peer and against a copy of the same bytes measured in the same run. The README's table is this
table (a test checks it against the results files).

Device time by CUDA-graph replay (L2-cold), bf16. "Of a copy" is the copy's time over the lab's:
a copy that reads and writes what the op reads and writes (``copy.shape``: one read, one write for
the forward; ``copy2r1w.shape`` two reads for the backward; ``copy2r2w.shape`` and
``copy3r1w.shape`` for the fused add), timed at the same shape in the same run. Above 100% the
lab's kernel took less time than that copy, which happens where the copy's own launch is the
larger cost.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional

import pandas as pd

from ..legend import CEILINGS, LAB_PREFIXES, impl
from ..results import latest


class Row(NamedTuple):
    what: str      # the row's label
    op: str        # the results' op (the fused add's rows are the forward's and backward's)
    M: int
    N: int
    lab: str       # the lab's implementation
    copy: Optional[str]  # the same-shape copy (None: host rows)
    path: str = "graph"
    metric: str = "time"
    # the peers' suffix ("+add": the fused add's; "+autograd": the host benchmark's); none: the
    # plain op's peers, no fused variant ("+fp8", "+rope", ...) among them
    peer_suffix: str = ""


ROWS = (
    Row("forward", "fwd", 16384, 4096, "cute.auto", "copy.shape"),
    Row("forward, few rows", "fwd", 1024, 4096, "cute.auto", "copy.shape"),
    Row("forward, per-head rows", "fwd", 65536, 128, "cute.auto", "copy.shape"),
    Row("backward (dx and dW)", "bwd", 16384, 4096, "cute.auto", "copy2r1w.shape"),
    Row("backward, few rows", "bwd", 1024, 4096, "cute.auto", "copy2r1w.shape"),
    Row("residual add + norm, forward", "fwd", 16384, 4096, "cute.auto+add", "copy2r2w.shape",
        peer_suffix="+add"),
    Row("residual add + norm, backward", "bwd", 16384, 4096, "cute.auto+add",
        "copy3r1w.shape", peer_suffix="+add"),
    Row("host µs per call, forward with autograd", "fwd", 128, 4096,
        "cute.auto@tvm_ffi+autograd", None, path="host", metric="host", peer_suffix="+autograd"),
)


def _peer_label(name: str) -> str:
    base = name.removesuffix("+add").removesuffix("+autograd")
    return {"torch.native": "torch", "torch.compile": "torch.compile",
            "liger.triton": "Liger-Kernel (Triton)", "liger.cutedsl": "Liger-Kernel (CuTe)",
            "quack": "quack", "flashinfer": "FlashInfer"}.get(base, impl(base).name)


def headline(df: pd.DataFrame, gpu: str = "h200") -> pd.DataFrame:
    """One row per ``ROWS`` entry: the lab's µs, the best peer's µs and name, and the lab's time
    against the same-shape copy's (``of a copy``, %). Reads the newest row of each measurement;
    the host row reads the host benchmark's run (every implementation timed interleaved)."""
    d = latest(df[df["gpu"] == gpu])
    out: List[dict] = []
    for r in ROWS:
        at = d[(d["op"] == r.op) & (d["M"] == r.M) & (d["N"] == r.N) & (d["path"] == r.path)
               & (d["metric"] == r.metric) & (d["dtype"] == "bf16")]
        if r.path == "host":  # the host benchmark's run: lab and torch with autograd
            at = at[at["impl"].str.endswith("+autograd")]
        us = at.set_index("impl")["p50"]
        if r.lab not in us:
            continue
        peers = us[[i for i in us.index if not i.startswith(LAB_PREFIXES + ("teach.",))
                    and i not in CEILINGS and "@" not in i
                    and (i.endswith(r.peer_suffix) if r.peer_suffix else "+" not in i)]]
        best = peers.idxmin() if len(peers) else None
        row = {"what": r.what, "shape": f"{r.M}×{r.N}", "lab µs": us[r.lab],
               "best peer": _peer_label(best) if best else "", "peer µs": us.get(best)}
        if r.copy is not None and r.copy in us:
            row["of a copy %"] = 100.0 * us[r.copy] / us[r.lab]
        out.append(row)
    return pd.DataFrame(out).set_index("what")


def markdown(table: pd.DataFrame) -> List[str]:
    """The table as the README writes it: one line a row."""
    lines = ["| | shape | lab µs | best peer µs | lab against a copy of its bytes |",
             "|---|---|---|---|---|"]
    for what, r in table.iterrows():
        copy = f"{r['of a copy %']:.0f}%" if pd.notna(r.get("of a copy %")) else ""
        cells = [what, r["shape"], f"{r['lab µs']:.1f}",
                 f"{r['peer µs']:.1f} ({r['best peer']})", copy]
        lines.append(("| " + " | ".join(cells) + " |").replace("|  |", "| |"))
    return lines
