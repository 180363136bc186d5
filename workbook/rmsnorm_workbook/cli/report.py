"""``python -m rmsnorm_lab report``: benchmark on a GPU, then render every recorded result into
figures and ``report.md``; without a GPU, render what is recorded."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import pandas as pd
import torch

from .. import results as results_io
from ..bench.runner import OPS
from ..legend import impl, impl_order
from ..analysis import tables
from ..analysis.host import VARYING
from ..results.provenance import gpu_title
from ..viz import sweeps
from .bench import run_bench
from .common import (EXIT_FAILED, EXIT_USAGE, UsageError, error, existing_dir, reason,
                     writable_dir)
from .report_captions import (CROSSOVER_CAPTION, EAGER_NOTE, FLOW_CAPTION,
                              FUSED_VS_SPLIT_CAPTION, HOST_PER_PATH_CAPTION, LAYOUT_CAPTION,
                              bandwidth_caption, cache_cap_caption, cache_steps_caption,
                              eager_caption, timeline_caption)
from .report_sections import (PEER_RATIO, fusion_caption, fusion_figure, gemm_section,
                              figure_lines, names_section, newer_run, save_figure)
from .report_summary import Findings, markdown_lines, op_headline, stdout_lines


def shown_path(path: Path) -> str:
    """``path`` as report.md names it: relative to the repository when inside it (report.md is
    shared, and an absolute path names one machine's clone), else as given."""
    repo = results_io.results_dir().parent
    try:
        return str(Path(path).resolve().relative_to(repo))
    except ValueError:
        return str(path)


def _provenance(df: pd.DataFrame) -> str:
    d = results_io.latest(df)
    lines = []
    for col in ("sm_count", "driver", "torch", "triton", "cutlass_dsl", "commit"):
        lines.append(f"- {col}: " + ", ".join(str(v) for v in sorted(d[col].unique())))
    times = sorted(d["timestamp"].unique())
    lines.append(f"- measured (the newest row of each measurement): {times[0]}"
                 + (f" to {times[-1]}" if len(times) > 1 else ""))
    return "\n".join(lines)


def measured_files(root: Path) -> List[Path]:
    """The files ``results.load_all`` reads: every ``<gpu>/*.csv`` but ``reported/``'s."""
    return [p for p in Path(root).glob("*/*.csv")
            if p.parent.name not in results_io.NOT_MEASURED_DIRS]


def count_line(df: pd.DataFrame, root: Path) -> str:
    """What the report reads, said as counted: the rows of ``results.load_all`` (every
    ``<gpu>/*.csv`` but ``reported/``), of which the lessons' teaching kernels (``teach.*``,
    which notebook 04 leaves out), and the model steps' rows, read apart (notebook 05)."""
    files = measured_files(root)
    gpus = sorted(df["gpu"].unique())
    teach = int(df["impl"].astype(str).str.startswith(tables.TEACH_PREFIX).sum())
    steps = len(results_io.load_all(root, model_steps=True))
    return (f"{len(df)} measurements from {len(files)} files of {len(gpus)} GPU(s) "
            f"({', '.join(gpu_title(g) for g in gpus)}), of which {teach} are the "
            "lessons' teaching kernels "
            f"(`{tables.TEACH_PREFIX}*`; {len(df) - teach} without them); the {steps} rows of "
            "model steps (notebook 05) are read apart and not counted")


def ceiling_note(df: pd.DataFrame, op: str, gpu: str) -> str:
    """What a "% of copy" table divides by: each row by the ceiling measured in its own run,
    the runs listed by commit, with the count of the table's cells each holds where runs share
    a commit (a run that measured none: the sweep's, said so)."""
    runs = tables.ceiling_per_run(df, op, gpu)
    if runs.empty:
        return ""
    shared = runs["commit"].duplicated(keep=False)
    each = ", ".join(f"{str(commit)[:7]} {gbps:.0f} GB/s"
                     + (f" ({cells} cells)" if same else "")
                     + ("" if own else " (measured in another run: the sweep's)")
                     for commit, gbps, own, cells, same in zip(
                         runs["commit"], runs["GB/s"], runs["own"], runs["cells"], shared))
    return f" (each row against the {tables.CEILING_OF_OP[op]} measured in its own run: {each})"


def host_method(op: str) -> str:
    """How the host benchmark times (``bench.host``) and why the sweeps' host rows of ``op``
    differ, said next to its table."""
    return ("every implementation timed on one host in interleaved rounds (one sample of each "
            "per round, so the host's drift falls on all alike), the lab's settings entered "
            "once outside the timed loop (Python's garbage collector is off inside each "
            "sample here and in the sweeps). "
            f"The host rows of the sweep files (`{op}.csv` and the other `{op}-*.csv`) are not "
            "shown and do not compare with these: there each implementation is timed in a "
            "block of its own after the sweep's device timings, not interleaved, and a lab row "
            "that pins a kernel variant or backward mode runs inside `settings.override`, whose "
            "entry and exit re-run the settings' listeners in every timed call; those rows can "
            "put the lab behind torch")


def host_section(df: pd.DataFrame, op: str, gpu: str) -> List[str]:
    """The op's host table with the method that produced it: the host benchmark's newest run
    where it timed the op, else the sweeps' own host rows (each row's run named)."""
    covered = tables.host_benchmark_covers(df, op, gpu)
    host = tables.host_table(df, op, gpu, with_commit=True)
    if host.empty:
        return []
    host["commit"] = host["commit"].astype(str).str[:7]
    # a varying-M row's M is the largest row count drawn: the calls draw from 1 to it
    host.index = pd.MultiIndex.from_tuples(
        [(i, f"1..{m}" if str(i).endswith(VARYING) else m, n) for i, m, n in host.index],
        names=host.index.names)
    if covered:
        caption = (f"{op}, host µs per call, from the host benchmark (`bench --op host`, its "
                   f"newest run, commit {', '.join(sorted(host['commit'].unique()))}): "
                   f"{host_method(op)}. The host benchmark's rows:")
        host = host.drop(columns="commit")
    else:
        caption = (f"{op}, host µs per call, from the sweeps' own host rows (the host benchmark "
                   f"does not time `{op}`; the newest row of each implementation, its run's "
                   "commit beside it; the lab's row is its default, `cute.auto`): each "
                   "implementation timed in a block of its own after its sweep's device "
                   "timings, not interleaved with the others, so rows of different runs and "
                   "hosts compare loosely:")
    return [caption, "", tables.markdown_table(host, 1, right_align=True), ""]


def _figures(df: pd.DataFrame, gpu: str, op: str, out: Path) -> List[Tuple[str, str]]:
    """Render the op's figures for one GPU; returns each one's file name and caption (those with
    data only)."""
    from matplotlib.figure import Figure  # no pyplot: no global figure state in a loop

    d = df[(df["gpu"] == gpu) & (df["op"] == op)]
    bw = tables.library_rows(d[(d["metric"] == "bandwidth") & (d["path"] == "graph")
                               & ~d["impl"].isin(results_io.CEILINGS)])
    names = []
    if not bw[bw["N"] == 4096].empty:
        fig = Figure(figsize=(7, 4.5), layout="constrained")
        sweeps.plot_bandwidth_vs_M(df, op, N=4096, gpu=gpu, ax=fig.subplots())
        names.append((save_figure(fig, out / f"{gpu}-{op}-bandwidth-vs-M.png"),
                      bandwidth_caption(df, op, gpu, "M")))
    if not bw[bw["M"] == 16384].empty:
        fig = Figure(figsize=(7, 4.5), layout="constrained")
        sweeps.plot_bandwidth_vs_N(df, op, M=16384, gpu=gpu, ax=fig.subplots())
        names.append((save_figure(fig, out / f"{gpu}-{op}-bandwidth-vs-N.png"),
                      bandwidth_caption(df, op, gpu, "N")))
    timed = tables.library_rows(d[(d["metric"] == "time") & (d["N"] == 4096)
                                  & ~d["impl"].isin(results_io.CEILINGS)])
    both = timed.groupby("impl")["path"].agg(lambda p: {"eager", "graph"} <= set(p))
    impls = impl_order(both.index[both.astype(bool)])  # measured both ways: the figure's
    if impls:
        cols = min(3, len(impls))
        rows = -(-len(impls) // cols)
        fig = Figure(figsize=(4.5 * cols, 3.4 * rows), layout="constrained")
        axes = fig.subplots(rows, cols, squeeze=False).ravel()
        for ax, name in zip(axes, impls):
            sweeps.plot_eager_vs_graph(df, op, name, N=4096, gpu=gpu, ax=ax)
            ax.set_title(impl(name).style["label"], fontsize="medium")  # the registry's words
        for ax in axes[len(impls):]:
            ax.set_visible(False)
        # one legend for the grid: every panel draws the same two series
        handles, labels = axes[0].get_legend_handles_labels()
        for ax in axes[:len(impls)]:
            if ax.get_legend() is not None:
                ax.get_legend().remove()
        fig.legend(handles, labels, loc="outside lower center", ncol=len(labels),
                   fontsize="small", frameon=False)
        fig.suptitle(f"{gpu_title(gpu)}: {op}, µs per call, eager vs CUDA-graph replay "
                     "(N=4096)\n"
                     f"{EAGER_NOTE}", linespacing=1.6)
        names.append((save_figure(fig, out / f"{gpu}-{op}-eager-vs-graph.png"),
                      eager_caption(df, op, gpu)))
    return names


def _notebook_figures(df: pd.DataFrame, gpu: str, out: Path, root: Path
                      ) -> List[Tuple[str, str]]:
    """The other notebooks' data figures for one GPU, each with its caption: 02's fused/split
    ratio, 03's host µs per launch path, host/device crossover, tensor-cache cost and nsys
    timeline."""
    from matplotlib.figure import Figure

    from ..profiling import trace as nsys_trace
    from ..viz import host as plots_host

    g = df[df["gpu"] == gpu]
    names = []

    def render(name, draw, size=(8, 4.5), panels=1, caption=""):
        fig = Figure(figsize=size, layout="constrained")
        axes = fig.subplots(1, panels) if panels > 1 else fig.subplots()
        try:
            draw(axes)
        except (KeyError, ValueError) as e:  # not enough rows for this figure in these results
            print(f"report: {gpu} {name} not drawn ({e})", file=sys.stderr)
            return
        names.append((save_figure(fig, out / f"{gpu}-{name}.png"), caption))

    if {"cute.fused", "cute.split"} <= set(g[g["op"] == "bwd"]["impl"]):
        render("bwd-fused-vs-split", lambda ax: sweeps.plot_time_ratio(df, gpu=gpu, ax=ax),
               caption=FUSED_VS_SPLIT_CAPTION)
    if any("@" in i for i in g[g["path"] == "host"]["impl"]):
        render("host-per-path", lambda ax: plots_host.plot_host(df, gpu=gpu, ax=ax), (9, 6),
               caption=HOST_PER_PATH_CAPTION)
        render("host-crossover", lambda ax: plots_host.plot_crossover(df, gpu=gpu, ax=ax),
               caption=CROSSOVER_CAPTION)
    if any(i.startswith("cute.auto@cached:") for i in g["impl"]):
        render("host-cache-cap", lambda axes: plots_host.plot_cache_cap(df, gpu=gpu, axes=axes),
               (13, 4.5), panels=2,
               caption=" ".join(filter(None, (cache_cap_caption(df, gpu),
                                              cache_steps_caption(df, gpu)))))
    trace_dir = root.parent / "profiles" / gpu  # nsys exports beside results/, not in it
    if trace_dir.is_dir():
        try:
            trace = nsys_trace.load_trace(trace_dir)
        except (OSError, ValueError) as e:
            print(f"report: {gpu} nsys trace not read ({e})", file=sys.stderr)
        else:
            render("nsys-timeline",
                   lambda ax: plots_host.plot_timeline(trace, first=10, ax=ax), (11, 4.5),
                   caption=timeline_caption(trace))
    return names


def _explainer_figures(out: Path) -> List[Tuple[str, str]]:
    """The figures that need no measurements: notebook 01's thread/value layout of the row and
    warp kernels, notebook 02's data flow of the split and fused backward."""
    import torch
    from matplotlib.figure import Figure

    from ..viz import flow as flow_plot
    from rmsnorm_lab.lab import plan_forward
    from ..viz.layout import draw_row_layout

    names = []
    fig = Figure(figsize=(12, 10), layout="constrained")
    for ax, variant in zip(fig.subplots(2, 1, height_ratios=(1, 3)), ("row", "warp")):
        draw_row_layout(plan_forward(variant, 4096, torch.bfloat16, torch.bfloat16, "llama",
                                     True, True), ax=ax, lanes=8)
    names.append((save_figure(fig, out / "layout-row-and-warp-4096-bf16.png"), LAYOUT_CAPTION))
    flows, sizes = flow_plot.backward_flows(16384, 4096, 132)
    fig = Figure(figsize=(15, 4.8), layout="constrained")
    for ax, (mode, steps) in zip(fig.subplots(1, 2), flows.items()):
        flow_plot.draw_flow(ax, f"{mode}: 16384×4096 bf16", steps, sizes, kernels="library")
    names.append((save_figure(fig, out / "backward-data-flow-16384x4096-bf16.png"),
                  FLOW_CAPTION))
    return names


def _quiet(_: str) -> None:
    pass


def write_report(df: pd.DataFrame, out: Path, root: Path,
                 progress: Callable[[str], None] = _quiet) -> Tuple[str, Findings]:
    """Render figures into ``out`` and write ``out/report.md``, its summary on top; returns the
    full tables' text (``report --tables``) and the findings the summary quotes. ``progress`` is
    told what is being rendered, one line per group of figures."""
    findings = Findings()
    md = ["## How it was measured", "",
          f"Measured by this lab's benchmark; results read from `{shown_path(root)}` (figures "
          "quoted from elsewhere, in `results/reported/`, appear only in the section across "
          "GPUs, labelled reported). `graph` is device time by CUDA-graph replay with L2-cold "
          "inputs; `eager` is `triton.testing.do_bench` (L2 flushed before each call), so it "
          "includes launch gaps; `host` is CPU enqueue µs "
          "per call. Bandwidth is the op's minimum traffic over time; ceilings (`copy`: 1 read "
          "+ 1 write, `copy2r1w`: 2 reads + 1 write) are SM kernels on 1 GiB tensors measured "
          f"in the same run. Read: {count_line(df, root)}.", ""]
    md += names_section(df)
    headline = []
    gpus = sorted(df["gpu"].unique())
    # one step per (gpu, op), one per gpu (its other figures), the explainers, the GPU
    # comparison, the model step
    swept = {gpu: {op: t for op in results_io.OPS  # ops whose sweep ran there, not others'
                   if not (t := tables.bandwidth_table(df, op, gpu)).empty} for gpu in gpus}
    fusions = {gpu: {name: t for name in tables.FUSIONS
                     if not (t := tables.fusion_table(df, name, gpu)).empty} for gpu in gpus}
    # a section where there is something to show, the GPU with the most sweeps first
    gpus = sorted((gpu for gpu in gpus if swept[gpu] or fusions[gpu]),
                  key=lambda gpu: -len(swept[gpu]))
    adds = {gpu: {op: t for op in ("fwd", "bwd")
                  if not (t := tables.fused_add_table(df, op, gpu)).empty} for gpu in gpus}
    findings.fused = {gpu: ["fused residual add"] * bool(adds[gpu]) + list(dict.fromkeys(
        tables.FUSION_TOPICS[n] for n in fusions[gpu])) for gpu in gpus
        if fusions[gpu] or adds[gpu]}
    total = sum(len(swept[gpu]) + 1 for gpu in gpus) + 3
    step = iter(range(1, total + 1))
    for gpu in gpus:
        g = df[df["gpu"] == gpu]
        md += [f"## {gpu_title(gpu)}", "", _provenance(g), ""]
        for op, table in swept[gpu].items():
            progress(f"[{next(step)}/{total}] {gpu} {op}: tables, bandwidth and "
                     "eager-vs-graph figures")
            md += [f"### {op}", ""]
            found = op_headline(table, gpu, op)
            if found is not None:
                findings.ops.append(found)
            for part in table.columns.get_level_values(0).unique():
                unit = "GB/s" if part == "GB/s" else part
                note = "" if part == "GB/s" else ceiling_note(df, op, gpu)
                md += [f"{op}, CUDA-graph replay, median, {unit}{note}; each shape from the "
                       "newest run that measured it ('-': not measured in that run):", "",
                       tables.markdown_table(table[part], 0 if part == "GB/s" else 1,
                                            right_align=True), ""]
                headline += [f"{gpu_title(gpu)} {op} ({unit}, graph, median)",
                             table[part].to_string(float_format=lambda v: f"{v:.0f}",
                                                   sparsify=False), ""]  # every row's M
            md += host_section(df, op, gpu)
            md += figure_lines(_figures(df, gpu, op, out))
        for op, add in adds[gpu].items():
            md += [f"### fused residual add, {op}", "",
                   f"`bench --op {op}-add`: µs per call, CUDA-graph replay, median, each "
                   "shape from the newest run that measured it; "
                   f"{tables.ADD_CEILING_OF_OP[op]} moves the same bytes; {PEER_RATIO}:",
                   "",
                   tables.markdown_table(add, 2, right_align=True), ""]
        warnings = {name: newer_run(name, gpu, fusions) for name in fusions[gpu]}
        for name, t in fusions[gpu].items():
            md += [f"### {name}", "", fusion_caption(name, t, warnings[name]), "",
                   tables.markdown_table(t, 2, right_align=True), ""]
        md += fusion_figure(fusions[gpu], gpu, out)
        older = [name for name, warning in warnings.items() if warning]
        if older:
            md += [f"Older than another GPU's run of the same op, from other code: "
                   f"{', '.join(older)} (their tables' captions name the newer run).", ""]
        md += gemm_section(df, gpu, root)
        progress(f"[{next(step)}/{total}] {gpu}: the fused ops' tables; backward and host "
                 "figures where recorded (notebooks 02 and 03)")
        extra = _notebook_figures(df, gpu, out, root)
        if extra:
            md += ["### backward and host figures (notebooks 02 and 03)", ""]
            md += figure_lines(extra)
    progress(f"[{next(step)}/{total}] how the kernels work: thread layout and backward "
             "data flow (notebooks 01 and 02)")
    md += ["## How the kernels work (notebooks 01 and 02)", ""]
    md += figure_lines(_explainer_figures(out))
    # notebooks 04 and 05's figures (reads only, no compiling)
    from .report_sections import gpu_section, model_section

    progress(f"[{next(step)}/{total}] across GPUs: roofline, crossover, reported vs "
             "modelled (notebook 04)")
    section, lines = gpu_section(df, out, root, findings)
    md += section
    headline += lines
    progress(f"[{next(step)}/{total}] in a model: the model step against torch's norm "
             "(notebook 05)")
    section, lines = model_section(results_io.load_all(root, model_steps=True), out, findings)
    md += section
    headline += lines
    top = ["# rmsnorm-lab report", ""] + markdown_lines(df, len(measured_files(root)), findings)
    (out / "report.md").write_text("\n".join(top + md))
    return "\n".join(headline), findings


def _progress(line: str) -> None:
    print(f"report: {line}", file=sys.stderr, flush=True)


def _mtimes(out: Path) -> Dict[str, int]:
    return {f.name: f.stat().st_mtime_ns for f in out.iterdir() if f.is_file()}


def _written(out: Path, before: Dict[str, int], start_ns: int) -> List[Path]:
    """The files in ``out`` written since ``before`` was taken at ``start_ns``: new, changed, or
    stamped since then (a rewrite within the file system's time resolution); report.md first."""
    files = [out / name for name, t in _mtimes(out).items()
             if before.get(name) != t or t >= start_ns]
    return sorted(files, key=lambda f: (f.name != "report.md", f.name))


def nothing_to_report(root: Path, label: str) -> str:
    """The error of a results folder without measurements: an empty report helps no one."""
    return (f"{label} {root}: no results to report (no measurements in <gpu>/*.csv files "
            "there); record some on a GPU with `python -m rmsnorm_lab bench --op fwd`")


def cmd_report(args: argparse.Namespace) -> int:
    bench = not args.no_bench and torch.cuda.is_available()
    root = args.results if args.results is not None else results_io.results_dir()
    label = "--results" if args.results is not None else "the results folder (--results)"
    if bench:  # benchmarking writes into it
        writable_dir(root, label)
    else:
        existing_dir(root, label)
        if not measured_files(root):  # before --out is made: nothing is written
            raise UsageError(nothing_to_report(root, label))
    writable_dir(args.out, "--out")  # before benchmarking or rendering anything
    status = 0
    if bench:
        for op in OPS:  # every op the bench knows, so a new op joins the report by itself
            _progress(f"benchmarking {op} on {torch.cuda.get_device_name()}")
            status = max(status, run_bench(op, args.quick, root, None))
    elif not args.no_bench:
        print(f"no CUDA GPU here: rendering the recorded results in {root}")
    _progress(f"reading the results in {root}")
    try:
        df = results_io.load_all(root)
    except results_io.ResultsError as e:
        return error(f"malformed results: {e}", EXIT_FAILED)
    if df.empty:  # files without a row of measurements (headers only, model steps only)
        return error(nothing_to_report(root, label), EXIT_USAGE)
    before, start_ns, started = _mtimes(args.out), time.time_ns(), time.perf_counter()
    try:
        _progress(f"rendering into {args.out}")
        text, findings = write_report(df, args.out, root, progress=_progress)
    except OSError as e:
        where = e.filename if e.filename else args.out
        return error(f"could not write {where} ({reason(e)})", EXIT_USAGE)
    seconds = time.perf_counter() - started
    written = _written(args.out, before, start_ns)
    if args.tables:
        print(text)
        print(f"wrote {len(written)} files to {args.out} in {seconds:.0f} s:")
        for f in written:
            print(f"  {args.out / f.name}")
        print()
    figures = sum(f.suffix == ".png" for f in written)
    print("\n".join(stdout_lines(df, len(measured_files(root)), findings,
                                 args.out / "report.md", figures, seconds)))
    return status
