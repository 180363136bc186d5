"""The summary of ``python -m rmsnorm_lab report``: what stdout says by default (a few lines, none
wider than ``WIDTH``) and what report.md opens with. Both say what was read (measurements, files,
GPUs, the runs and their dates) and the headline findings: per GPU and op, the lab's default
against the fastest peer at one shape and the count of shapes where it is the fastest; the model
step against torch's norm; the cross-GPU model's verdict. The numbers are those of the report's
own tables (``write_report`` hands them over), not computed a second time."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pandas as pd

from ..analysis import tables
from ..legend import impl, impl_order
from ..results.provenance import gpu_title

#: the widest line the summary prints
WIDTH = 100
#: the lab's default, the implementation the headline compares
LAB_DEFAULT = "cute.auto"
#: the shape the headline quotes (a Llama-sized hidden size, a prefill-sized batch)
HEADLINE_SHAPE = (16384, 4096)


@dataclasses.dataclass
class OpHeadline:
    """One row of the headline table: on ``gpu``, ``op`` at ``shape``, the lab's ``lab`` against
    the fastest peer there, and in how many of the shapes both measured the lab's is fastest."""
    gpu: str
    op: str
    shape: Tuple[int, int]
    lab: str
    lab_gbps: float
    lab_pct: Optional[float]   # of the op's ceiling (None: the op has none)
    ceiling: str
    peer: Optional[str]
    peer_gbps: Optional[float]
    fastest: int               # shapes where the lab's is at least as fast as every peer
    shapes: int                # shapes where the lab's and at least one peer were measured
    peers: Tuple[str, ...] = ()  # the peers of the table


def op_headline(table: pd.DataFrame, gpu: str, op: str) -> Optional[OpHeadline]:
    """The headline of ``op`` on ``gpu`` from its ``tables.bandwidth_table``: the lab's default
    (else the lab's first implementation measured) at ``HEADLINE_SHAPE`` (else the widest row
    count of the widest row it measured). None without a lab column."""
    gbps = table["GB/s"]
    lab_cols = [c for c in gbps.columns if impl(c).kind == "lab"]
    if not lab_cols:
        return None
    lab = LAB_DEFAULT if LAB_DEFAULT in lab_cols else lab_cols[0]
    peers = [c for c in gbps.columns if impl(c).kind == "peer"]
    measured = gbps[lab].dropna()
    if measured.empty:
        return None
    shape = HEADLINE_SHAPE if HEADLINE_SHAPE in measured.index else max(
        measured.index, key=lambda mn: (mn[1], mn[0]))
    pct_part = next((p for p in table.columns.get_level_values(0).unique()
                     if str(p).startswith("% of ")), None)
    lab_pct = float(table[pct_part].loc[shape, lab]) if pct_part is not None else None
    row = gbps.loc[shape, peers].dropna() if peers else pd.Series(dtype=float)
    peer = str(row.idxmax()) if not row.empty else None
    both = gbps[[lab] + peers].dropna(subset=[lab])
    best_peer = both[peers].max(axis=1) if peers else pd.Series(dtype=float)
    compared = best_peer.notna()
    return OpHeadline(gpu=gpu, op=op, shape=tuple(shape), lab=lab,
                      lab_gbps=float(gbps.loc[shape, lab]), lab_pct=lab_pct,
                      ceiling=tables.CEILING_OF_OP.get(op, ""), peer=peer,
                      peer_gbps=float(row.max()) if peer else None,
                      fastest=int((both.loc[compared, lab] >= best_peer[compared]).sum()),
                      shapes=int(compared.sum()), peers=tuple(peers))


@dataclasses.dataclass
class Findings:
    """What the summary quotes, gathered while the report is written."""
    ops: List[OpHeadline] = dataclasses.field(default_factory=list)
    #: (gpu, arch, train, decode eager, decode from a graph): the lab's step over torch's
    model: List[Tuple[str, str, float, float, float]] = dataclasses.field(default_factory=list)
    #: the cross-GPU model's verdict (model.finding: "overall" and one per GPU)
    verdict: Dict[str, str] = dataclasses.field(default_factory=dict)
    #: each GPU with a table of a fused op: what those ops are (fp8 output, q/k norms with RoPE)
    fused: Dict[str, List[str]] = dataclasses.field(default_factory=dict)


def _runs(df: pd.DataFrame) -> List[str]:
    """Per GPU: its name, its runs and their dates (``H200: 74 runs, 2026-11-29 to 2026-12-02``)."""
    out = []
    for gpu in sorted(df["gpu"].unique()):
        stamps = sorted(df.loc[df["gpu"] == gpu, "timestamp"].astype(str).unique())
        first, last = stamps[0][:10], stamps[-1][:10]
        dates = first if first == last else f"{first} to {last}"
        out.append(f"{gpu_title(gpu)}: {len(stamps)} run{'s' * (len(stamps) != 1)}, {dates}")
    return out


def _files(n: int) -> str:
    return f"{n} file{'s' * (n != 1)}"


def _shape(shape: Tuple[int, int]) -> str:
    return f"{shape[0]}x{shape[1]}"


def _lab_cell(h: OpHeadline) -> str:
    pct = f" ({h.lab_pct:.0f}% of {h.ceiling})" if h.lab_pct is not None else ""
    return f"{h.lab_gbps:.0f} GB/s{pct}"


def _peer_cell(h: OpHeadline) -> str:
    return f"{h.peer} {h.peer_gbps:.0f} GB/s" if h.peer else "no peer measured"


def _fastest_cell(h: OpHeadline, of: str = "/") -> str:
    return f"fastest in {h.fastest}{of}{h.shapes} shapes" if h.shapes else "no peer to compare"


def _wrap(line: str) -> List[str]:
    return textwrap.wrap(line, WIDTH, subsequent_indent="  ", break_on_hyphens=False) or [""]


def stdout_lines(df: pd.DataFrame, files: int, findings: Findings, report_md: Path,
                 figures: int, seconds: float) -> List[str]:
    """The default stdout of ``report``: what was read, the headline rows, where report.md and
    the figures are; every line at most ``WIDTH`` characters but for a long path."""
    lines = _wrap(f"read {len(df)} measurements from {_files(files)}; " + "; ".join(_runs(df)))
    if findings.ops:
        shapes = {h.shape for h in findings.ops}
        one = _shape(next(iter(shapes))) if len(shapes) == 1 else None
        lines += _wrap(f"the lab against the fastest peer at {one or 'the shape named'} "
                       "(graph replay, median GB/s; % of a 1 GiB copy's):")
        cells = [(f"{gpu_title(h.gpu)} {h.op}" + ("" if one else f" {_shape(h.shape)}"),
                  f"{h.lab} {_lab_cell(h)}", _peer_cell(h), _fastest_cell(h))
                 for h in findings.ops]
        widths = [max(len(c[i]) for c in cells) for i in range(3)]
        lines += ["  " + "  ".join(c[i].ljust(widths[i]) for i in range(3)) + "  " + c[3]
                  for c in cells]
    by_gpu: Dict[str, List[str]] = {}
    for gpu, arch, train, eager, graph in findings.model:
        by_gpu.setdefault(gpu, []).append(f"{arch} {train:.3f}, {eager:.3f}, {graph:.3f}")
    if by_gpu:
        lines += _wrap("in a model, the lab's step time over torch's norm's (train, decode "
                       "eager, decode from a graph):")
        for gpu, cells in by_gpu.items():
            lines += _wrap(f"  {gpu_title(gpu)}  " + "   ".join(cells))
    if findings.verdict.get("overall"):
        lines += _wrap(f"across GPUs (modelled): {findings.verdict['overall']}")
    lines += [f"wrote report.md and {figures} figures in {seconds:.0f} s: {report_md}",
              "the full tables on stdout, and every file written: report --tables"]
    return lines


#: the ops as the summary names them
OP_WORDS = {"fwd": "forward (`fwd`)", "bwd": "backward (`bwd`)",
            "full": "forward and backward in one call (`full`)"}


def markdown_lines(df: pd.DataFrame, files: int, findings: Findings) -> List[str]:
    """The top of report.md: what it covers, the GPUs and the runs' dates, and the headline
    findings as small tables."""
    peers = impl_order(p for h in findings.ops for p in h.peers)
    ops = [OP_WORDS[o] for o in OP_WORDS if o in {h.op for h in findings.ops}]
    swept = {h.gpu for h in findings.ops} or set(df["gpu"].unique())  # GPUs the sections cover
    gpus = ", ".join(gpu_title(g) for g in sorted(swept))
    modelled = [gpu_title(g) for g in findings.verdict if g != "overall"]
    also = [f"a model of the same calls on other GPUs ({', '.join(modelled)})"] if modelled else []
    if findings.fused:
        also.append("the fused ops against their peers (" + "; ".join(
            f"{gpu_title(g)}: {', '.join(ops)}" for g, ops in findings.fused.items()) + ")")
    if findings.model:
        also.append("the training, prefill and decode steps of Llama and Qwen3 models with "
                    "each norm")
    what = f"RMSNorm's {', '.join(ops)}" if ops else "RMSNorm"
    md = ["## Summary", "",
          f"This report covers {what} on the {gpus}: the lab's kernels "
          f"(CuTe DSL, Triton) against the peers installed where it ran "
          f"({', '.join(f'`{p}`' for p in peers) or 'none'}), timed on the device (CUDA-graph "
          "replay) and on the host (µs per call)"
          + "".join(f"; {a}" for a in also)
          + f". Read: {len(df)} measurements from {_files(files)}; runs: "
          + "; ".join(_runs(df)) + ".", ""]
    if findings.ops:
        md += ["The lab (its default, `cute.auto`, where measured) against the fastest peer at "
               "one shape (CUDA-graph replay, median; the percentage is of the 1 GiB copy's GB/s, "
               "`copy` for the forward and `copy2r1w` for the backward, a ceiling at every "
               "shape; the README divides by a copy at the op's own shape instead, which reads "
               "higher where that copy is slower; the sections below have every shape):", "",
               "| GPU | op | shape | lab | GB/s | fastest peer | the lab is |",
               "|---|---|---|---|---|---|---|"]
        md += [f"| {gpu_title(h.gpu)} | {h.op} | {_shape(h.shape)} | `{h.lab}` | {_lab_cell(h)} "
               f"| {_peer_cell(h)} | {_fastest_cell(h, ' of ')} |" for h in findings.ops]
        md += [""]
    if findings.model:
        md += ["In a model, the lab's step time over torch's norm's (below 1: faster):", "",
               "| GPU | model | train | decode, eager | decode, from a graph |",
               "|---|---|---|---|---|"]
        md += [f"| {gpu_title(g)} | {a} | {t:.3f} | {e:.3f} | {gr:.3f} |"
               for g, a, t, e, gr in findings.model]
        md += [""]
    if findings.verdict.get("overall"):
        md += ["Across GPUs (modelled): Liger-Kernel PR #1336 found its CuTe DSL RMSNorm "
               "faster than its Triton one on the B200, the host dominating, and level with it "
               f"on the H100; the model of those calls: {findings.verdict['overall']}.", ""]
    return md
