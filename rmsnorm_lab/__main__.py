"""The command line: python -m rmsnorm_lab {bench,report,profile,nsys-summary}

  bench         runs the benchmark sweep of one op on the current GPU and writes a results file.
  report        (on a GPU, after benchmarking) renders every recorded result into figures, a
                markdown report and a table on stdout; without a GPU it renders what is recorded.
  profile       a workload for Nsight Systems: one shape, NVTX on, the timed loop between
                cudaProfilerStart/Stop (run it under the nsys line its --help prints).
  nsys-summary  per NVTX range of the rmsnorm_lab domain: wall time, kernel time, the difference.

Errors the user can fix (a path that is missing or cannot be written, a file that is not what
the command reads, a missing tool, no GPU) are one line on stderr, ``error: ...``, naming the
path as given, and a non-zero exit status (EXIT_* below); progress goes to stderr, results
(tables, the list of files written) to stdout.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import pandas as pd
import torch

from . import results as results_io
from .bench.runner import OPS
from .registry import BACKENDS, impl_order
from .settings import BACKWARD_CHOICES, FORWARD_CHOICES, LAUNCH_PATHS, settings
from .viz import sweeps

# Exit codes: 0 ok; 1 a kernel failed its check, the results or an nsys report could not be read;
# 2 it cannot run as asked: no GPU (bench, profile), a missing tool, a path that is missing, is
# not what the command reads or cannot be written (as argparse's own usage errors)
EXIT_FAILED, EXIT_NO_GPU, EXIT_USAGE = 1, 2, 2

DESCRIPTION = """\
Measure RMSNorm GPU kernels (CuTe DSL, Triton) and report what was measured: figures, a
markdown report and tables."""
EPILOG = """\
typical use:
  python -m rmsnorm_lab report                 on a GPU: benchmark, then render; without one:
                                               render the recorded results (results/) into report/
  python -m rmsnorm_lab bench --op fwd         benchmark one op on this GPU
  python -m rmsnorm_lab COMMAND --help         the options of one command

exit status: 0 ok; 1 a kernel failed its check, or results or an nsys report could not be read;
2 no GPU, a missing tool, or a path that is missing or cannot be written."""


class _TopFormatter(argparse.RawDescriptionHelpFormatter):
    """The commands listed once, one a line, without the lone ``COMMAND`` line argparse puts
    above them."""

    def _format_action(self, action):
        text = super()._format_action(action)
        if isinstance(action, argparse._SubParsersAction):
            text = text.split("\n", 1)[1]
        return text

    def _iter_indented_subactions(self, action):  # the commands at the options' indent
        yield from getattr(action, "_get_subactions", lambda: [])()


class UsageError(Exception):
    """A problem with what the command was given; main() prints it as one line and exits 2."""


def _error(message: str, status: int) -> int:
    print(f"error: {message}", file=sys.stderr)
    return status


def _one_line(message: object) -> str:
    """A multi-line message (e.g. one quoting a tool's output) as one line: its first line and,
    when there are more, the last (where tools put the reason)."""
    lines = [ln.strip() for ln in str(message).splitlines() if ln.strip()]
    if not lines:
        return type(message).__name__ if isinstance(message, BaseException) else ""
    if len(lines) == 1:
        return lines[0]
    return f"{lines[0].rstrip(':')}: {lines[-1]}"


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def _writable_dir(path: Path, option: str) -> Path:
    """``path`` created if needed and checked writable (by writing a file there), before any
    work is done; UsageError naming the option and the path as given otherwise."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path}: not a folder (a file of that name exists)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{option} {path}: cannot create that folder ({_reason(e)})") from None
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise UsageError(f"{option} {path}: cannot write there ({_reason(e)})") from None
    return path


def _existing_dir(path: Path, option: str) -> Path:
    if not path.exists():
        raise UsageError(f"{option} {path}: no such folder")
    if not path.is_dir():
        raise UsageError(f"{option} {path}: not a folder")
    return path


def _put_ninja_on_path() -> None:
    """torch builds and loads the native autograd node with the ``ninja`` executable, looked up
    on PATH. In a virtual environment that is not activated (``.venv/bin/python -m rmsnorm_lab``)
    the ninja package's executable is beside the interpreter but not on PATH."""
    if shutil.which("ninja"):
        return
    dirs = [os.path.dirname(sys.executable)]
    try:
        import ninja
        dirs.append(ninja.BIN_DIR)
    except (ImportError, AttributeError):
        pass
    for d in dirs:
        if os.path.isfile(os.path.join(d, "ninja")):
            os.environ["PATH"] = d + os.pathsep + os.environ.get("PATH", "")
            return


def _bench(op: str, quick: bool, out: Optional[Path], tag: Optional[str]) -> int:
    from .bench.runner import bench

    if op == "host":  # launch paths, crossover and cache memory: rmsnorm_lab/bench/host.py
        from .bench.host import bench_host
        outcome = bench_host(out=out, tag=tag, repeats=5 if quick else 15)
    else:
        outcome = bench(op, quick=quick, out=out, tag=tag)
    print(f"wrote {len(outcome.rows)} rows to {outcome.path}")
    if outcome.skipped:
        print(f"{len(outcome.skipped)} implementation/shape pairs skipped (not eligible)")
    if outcome.failures:
        print(f"{len(outcome.failures)} FAILURES (not timed):", *outcome.failures, sep="\n  ")
        return EXIT_FAILED
    return 0


def _no_gpu(command: str, hint: str) -> int:
    print(f"error: {command} needs a CUDA GPU, and torch.cuda.is_available() is False here "
          f"(torch {torch.__version__}, CUDA {torch.version.cuda or 'none'}). {hint}",
          file=sys.stderr)
    return EXIT_NO_GPU


def cmd_bench(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        return _no_gpu("bench", "Recorded results render without one: "
                                "python -m rmsnorm_lab report --no-bench")
    if args.out is not None:
        _writable_dir(args.out, "--out")
    return _bench(args.op, args.quick, args.out, args.tag)


# --- profile, nsys-summary -------------------------------------------------------------------

PROFILE_EPILOG = """\
Capture the timed loop (and only it) with Nsight Systems, then summarize:

  {profile}
  python3 -m rmsnorm_lab nsys-summary {report}.nsys-rep

Warm-up runs outside the capture, so each compile range appears once, before it; with
--include-compile the capture starts before the warm-up. Every timed iteration is an NVTX range
"iter" of the rmsnorm_lab domain; the lab's compile/marshal/launch/reduce ranges nest inside.
Exit status: 0 ok; 2 no CUDA GPU, no nvtx package, or a configuration that cannot run (e.g. --op
full with a backend that has no backward yet)."""


def cmd_profile(args: argparse.Namespace) -> int:
    from .profiling import workload

    cfg = workload.ProfileConfig(
        op=args.op, backend=args.backend, launch_path=args.launch_path,
        forward_variant=args.variant, backward=args.backward, M=args.M, N=args.N,
        dtype=args.dtype, iters=args.iters, warmup=args.warmup,
        include_compile=args.include_compile, graph=args.graph)
    if not torch.cuda.is_available():
        return _no_gpu("profile", "On a GPU host run: "
                       + workload.nsys_profile_line(cfg, args.backend or settings.backend))
    try:
        import nvtx  # noqa: F401
    except ImportError:
        print("error: profile emits NVTX ranges and needs the nvtx package: pip install nvtx",
              file=sys.stderr)
        return EXIT_NO_GPU
    backend = args.backend or settings.backend
    print("capture this loop with:\n  " + workload.nsys_profile_line(cfg, backend), flush=True)
    try:
        result = workload.run_profile(cfg)
    except workload.ProfileError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_NO_GPU
    how = "replayed from one CUDA graph" if result.graph else "NVTX on"
    print(f"profiled {result.iters} iterations of {cfg.op} (backend {result.backend}, "
          f"{cfg.M}x{cfg.N} {cfg.dtype}, {how}): {result.us_per_iter:.2f} µs per iteration "
          f"(host wall, synchronized at the end)")
    print(f"then: python3 -m rmsnorm_lab nsys-summary {cfg.report_name(backend)}.nsys-rep")
    return 0


#: what ``nsys stats`` reads: the report ``nsys profile`` writes, its pre-2021.4 name, and the
#: SQLite export of either
NSYS_REPORT_SUFFIXES = (".nsys-rep", ".qdrep", ".sqlite")
NOT_A_REPORT = ("is not an Nsight Systems report (nsys-summary reads the .nsys-rep file that "
                "`nsys profile` writes{hint})")


def check_nsys_report(path: Path) -> None:
    """UsageError, naming the problem, when ``path`` cannot be an nsys report: missing, a folder,
    unreadable, or another kind of file (by its name, and by its first bytes: a report is a
    binary file, a .sqlite export starts with SQLite's header). nsys itself judges the rest."""
    if not path.exists():
        raise UsageError(f"{path}: no such file")
    if path.is_dir():
        raise UsageError(f"{path}: a folder, not an nsys report file; for a folder of CSVs that "
                         "nsys stats exported use --csv-dir")
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError as e:
        raise UsageError(f"{path}: cannot read it ({_reason(e)})") from None
    suffix = "".join(path.suffixes[-1:]).lower()
    name = path.name.lower()
    is_report_name = any(name.endswith(s) for s in NSYS_REPORT_SUFFIXES)
    if not is_report_name:
        hint = ("; for CSVs that nsys stats exported use --csv-dir DIR" if suffix == ".csv"
                else "")
        raise UsageError(f"{path} " + NOT_A_REPORT.format(hint=hint))
    if name.endswith(".sqlite"):
        if head and not head.startswith(b"SQLite format 3\x00"):
            raise UsageError(f"{path} is not an SQLite file (nor an nsys export)")
        return
    if head and b"\x00" not in head:
        try:
            head.decode("utf-8")
        except UnicodeDecodeError:
            return  # binary: may well be a report
        raise UsageError(f"{path} " + NOT_A_REPORT.format(
            hint="; this one is a text file"))


def cmd_nsys_summary(args: argparse.Namespace) -> int:
    from .profiling import nsys

    try:
        if args.csv_dir is not None:
            _existing_dir(args.csv_dir, "--csv-dir")
            stem = None
            if args.report is not None:
                name = args.report.name
                stem = name[:-len(".nsys-rep")] if name.endswith(".nsys-rep") else name
            csvs = nsys.find_csvs(args.csv_dir, stem)
        elif args.report is None:
            raise UsageError("name a report (REPORT.nsys-rep) or a folder of its CSVs "
                             "(--csv-dir DIR)")
        else:
            check_nsys_report(args.report)  # before looking for nsys: say what is wrong first
            if args.out is not None:
                _writable_dir(args.out, "--out")
            csvs = nsys.run_nsys_stats(args.report, args.out)
        print(nsys.summary_text(csvs))
    except nsys.NsysMissing as e:
        return _error(_one_line(e), EXIT_NO_GPU)
    except nsys.NsysError as e:
        return _error(_one_line(e), EXIT_FAILED)
    return 0


# --- report ----------------------------------------------------------------------------------

def _provenance(df: pd.DataFrame) -> str:
    d = results_io.latest(df)
    lines = []
    for col in ("sm_count", "driver", "torch", "triton", "cutlass_dsl", "commit"):
        lines.append(f"- {col}: " + ", ".join(str(v) for v in sorted(d[col].unique())))
    times = sorted(d["timestamp"].unique())
    lines.append(f"- measured: {times[0]}" + (f" to {times[-1]}" if len(times) > 1 else ""))
    return "\n".join(lines)


def _save(fig, path: Path) -> str:
    fig.savefig(path, dpi=110)
    return path.name


def _figures(df: pd.DataFrame, gpu: str, op: str, out: Path) -> List[str]:
    """Render the op's figures for one GPU; returns the file names (those with data only)."""
    from matplotlib.figure import Figure  # no pyplot: no global figure state in a loop

    d = df[(df["gpu"] == gpu) & (df["op"] == op)]
    bw = d[(d["metric"] == "bandwidth") & (d["path"] == "graph")
           & ~d["impl"].isin(results_io.CEILINGS)]
    names = []
    if not bw[bw["N"] == 4096].empty:
        fig = Figure(figsize=(7, 4.5), layout="constrained")
        sweeps.plot_bandwidth_vs_M(df, op, N=4096, gpu=gpu, ax=fig.subplots())
        names.append(_save(fig, out / f"{gpu}-{op}-bandwidth-vs-M.png"))
    if not bw[bw["M"] == 16384].empty:
        fig = Figure(figsize=(7, 4.5), layout="constrained")
        sweeps.plot_bandwidth_vs_N(df, op, M=16384, gpu=gpu, ax=fig.subplots())
        names.append(_save(fig, out / f"{gpu}-{op}-bandwidth-vs-N.png"))
    timed = d[(d["metric"] == "time") & (d["N"] == 4096) & ~d["impl"].isin(results_io.CEILINGS)]
    impls = impl_order(timed["impl"])
    if impls:
        cols = min(3, len(impls))
        rows = -(-len(impls) // cols)
        fig = Figure(figsize=(4.5 * cols, 3.4 * rows), layout="constrained")
        axes = fig.subplots(rows, cols, squeeze=False).ravel()
        for ax, impl in zip(axes, impls):
            sweeps.plot_eager_vs_graph(df, op, impl, N=4096, gpu=gpu, ax=ax)
            ax.set_title(impl, fontsize="medium")
        for ax in axes[len(impls):]:
            ax.set_visible(False)
        fig.suptitle(f"{gpu}: {op}, µs per call, eager vs CUDA-graph replay (N=4096)")
        names.append(_save(fig, out / f"{gpu}-{op}-eager-vs-graph.png"))
    return names


def _notebook_figures(df: pd.DataFrame, gpu: str, out: Path, root: Path) -> List[str]:
    """The other notebooks' data figures for one GPU: 02's fused/split ratio, 03's host µs per
    launch path, host/device crossover, tensor-cache cost and nsys timeline."""
    from matplotlib.figure import Figure

    from .profiling import trace as nsys_trace
    from .viz import host as plots_host

    g = df[df["gpu"] == gpu]
    names = []

    def render(name, draw, size=(8, 4.5), panels=1):
        fig = Figure(figsize=size, layout="constrained")
        axes = fig.subplots(1, panels) if panels > 1 else fig.subplots()
        try:
            draw(axes)
        except (KeyError, ValueError) as e:  # not enough rows for this figure in these results
            print(f"report: {gpu} {name} not drawn ({e})", file=sys.stderr)
            return
        names.append(_save(fig, out / f"{gpu}-{name}.png"))

    if {"cute.fused", "cute.split"} <= set(g[g["op"] == "bwd"]["impl"]):
        render("bwd-fused-vs-split", lambda ax: sweeps.plot_time_ratio(df, gpu=gpu, ax=ax))
    if any("@" in i for i in g[g["path"] == "host"]["impl"]):
        render("host-per-path", lambda ax: plots_host.plot_host(df, gpu=gpu, ax=ax), (9, 6))
        render("host-crossover", lambda ax: plots_host.plot_crossover(df, gpu=gpu, ax=ax))
    if any(i.startswith("cute.auto@cached:") for i in g["impl"]):
        render("host-cache-cap", lambda axes: plots_host.plot_cache_cap(df, gpu=gpu, axes=axes),
               (11, 4), panels=2)
    trace_dir = root.parent / "profiles" / gpu  # nsys exports beside results/, not in it
    if trace_dir.is_dir():
        try:
            trace = nsys_trace.load_trace(trace_dir)
        except (OSError, ValueError) as e:
            print(f"report: {gpu} nsys trace not read ({e})", file=sys.stderr)
        else:
            render("nsys-timeline", lambda ax: plots_host.plot_timeline(trace, first=10, ax=ax), (11, 4.5))
    return names


def _explainer_figures(out: Path) -> List[str]:
    """The figures that need no measurements: notebook 01's thread/value layout of the row and
    warp kernels, notebook 02's data flow of the split and fused backward."""
    import torch
    from matplotlib.figure import Figure

    from .viz import flow as flow_plot
    from .cute.plan import plan_forward
    from .viz.layout import draw_row_layout

    names = []
    fig = Figure(figsize=(12, 10), layout="constrained")
    for ax, variant in zip(fig.subplots(2, 1, height_ratios=(1, 3)), ("row", "warp")):
        draw_row_layout(plan_forward(variant, 4096, torch.bfloat16, torch.bfloat16, "llama",
                                     True, True), ax=ax, lanes=8)
    names.append(_save(fig, out / "layout-row-and-warp-4096-bf16.png"))
    flows, sizes = flow_plot.backward_flows(16384, 4096, 132)
    fig = Figure(figsize=(15, 4.8), layout="constrained")
    for ax, (mode, steps) in zip(fig.subplots(1, 2), flows.items()):
        flow_plot.draw_flow(ax, f"{mode}: 16384×4096 bf16", steps, sizes)
    names.append(_save(fig, out / "backward-data-flow-16384x4096-bf16.png"))
    return names


def _quiet(_: str) -> None:
    pass


def write_report(df: pd.DataFrame, out: Path, root: Path,
                 progress: Callable[[str], None] = _quiet) -> str:
    """Render figures into ``out`` and write ``out/report.md``; returns the headline text.
    ``progress`` is told what is being rendered, one line per group of figures."""
    md = ["# rmsnorm-lab report", "",
          f"Measured by this lab's benchmark; results read from `{root}` (figures quoted from "
          "elsewhere, in `results/reported/`, appear only in the last section, labelled "
          "reported). `graph` is device "
          "time by CUDA-graph replay with L2-cold inputs; `eager` is `triton.testing.do_bench` "
          "(L2 flushed before each call), so it includes launch gaps; `host` is CPU enqueue µs "
          "per call. Bandwidth is the op's minimum traffic over time; ceilings (`copy`: 1 read "
          "+ 1 write, `copy2r1w`: 2 reads + 1 write) are SM kernels on 1 GiB tensors measured "
          "in the same run.", ""]
    headline = []
    gpus = sorted(df["gpu"].unique())
    # one step per (gpu, op), one per gpu (its other figures), the explainers, the GPU comparison
    total = sum(len(set(df[df["gpu"] == gpu]["op"]) & set(results_io.OPS)) + 1
                for gpu in gpus) + 2
    step = iter(range(1, total + 1))
    for gpu in gpus:
        g = df[df["gpu"] == gpu]
        md += [f"## {gpu}", "", _provenance(g), ""]
        for op in [o for o in results_io.OPS if o in set(g["op"])]:
            progress(f"[{next(step)}/{total}] {gpu} {op}: tables, bandwidth and "
                     "eager-vs-graph figures")
            md += [f"### {op}", ""]
            table = sweeps.bandwidth_table(df, op, gpu)
            for part in table.columns.get_level_values(0).unique():
                unit = "GB/s" if part == "GB/s" else part
                md += [f"{op}, CUDA-graph replay, median, {unit}:", "",
                       sweeps.markdown_table(table[part], 0 if part == "GB/s" else 1,
                                            right_align=True), ""]
                headline += [f"{gpu} {op} ({unit}, graph, median)",
                             table[part].to_string(float_format=lambda v: f"{v:.0f}"), ""]
            host = sweeps.host_table(df, op, gpu)
            if not host.empty:
                md += [f"{op}, host µs per call:", "",
                       sweeps.markdown_table(host, 1, right_align=True), ""]
            for name in _figures(df, gpu, op, out):
                md += [f"![{name}]({name})", ""]
        progress(f"[{next(step)}/{total}] {gpu}: backward and host figures "
                 "(notebooks 02 and 03)")
        extra = _notebook_figures(df, gpu, out, root)
        if extra:
            md += ["### backward and host figures (notebooks 02 and 03)", ""]
            md += [f"![{name}]({name})\n" for name in extra]
    progress(f"[{next(step)}/{total}] how the kernels work: thread layout and backward "
             "data flow (notebooks 01 and 02)")
    md += ["## how the kernels work (notebooks 01 and 02)", ""]
    md += [f"![{name}]({name})\n" for name in _explainer_figures(out)]
    from .analysis.report import gpu_section  # notebook 04's figures (reads only, no compiling)

    progress(f"[{next(step)}/{total}] across GPUs: roofline, crossover, reported vs "
             "modelled (notebook 04)")
    section, lines = gpu_section(df, out, root)
    md += section
    headline += lines
    (out / "report.md").write_text("\n".join(md))
    return "\n".join(headline)


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


def cmd_report(args: argparse.Namespace) -> int:
    bench = not args.no_bench and torch.cuda.is_available()
    root = args.results if args.results is not None else results_io.results_dir()
    label = "--results" if args.results is not None else "the results folder (--results)"
    if bench:  # benchmarking writes into it
        _writable_dir(root, label)
    else:
        _existing_dir(root, label)
    _writable_dir(args.out, "--out")  # before benchmarking or rendering anything
    status = 0
    if bench:
        for op in OPS:  # every op the bench knows, so a new op joins the report by itself
            _progress(f"benchmarking {op} on {torch.cuda.get_device_name()}")
            status = max(status, _bench(op, args.quick, root, None))
    elif not args.no_bench:
        print(f"no CUDA GPU here: rendering the recorded results in {root}")
    _progress(f"reading the results in {root}")
    try:
        df = results_io.load_all(root)
    except results_io.ResultsError as e:
        return _error(f"malformed results: {e}", EXIT_FAILED)
    before, start_ns, started = _mtimes(args.out), time.time_ns(), time.perf_counter()
    report_md = args.out / "report.md"
    try:
        if df.empty:
            report_md.write_text(
                "# rmsnorm-lab report\n\nThere are no results: no `<gpu>/*.csv` files in "
                f"`{root}`. Record some on a GPU with `python -m rmsnorm_lab bench --op fwd`.\n")
            print(f"no results in {root}; wrote {report_md} saying so")
            return status
        gpus = sorted(df["gpu"].unique())
        _progress(f"{len(df)} measurements of {len(gpus)} GPU(s) ({', '.join(gpus)}); "
                  f"rendering into {args.out}")
        headline = write_report(df, args.out, root, progress=_progress)
    except OSError as e:
        where = e.filename if e.filename else args.out
        return _error(f"could not write {where} ({_reason(e)})", EXIT_USAGE)
    print(headline)
    written = _written(args.out, before, start_ns)
    print(f"wrote {len(written)} files to {args.out} in {time.perf_counter() - started:.0f} s:")
    for f in written:
        print(f"  {args.out / f.name}")
    return status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rmsnorm_lab", description=DESCRIPTION,
                                     epilog=EPILOG, formatter_class=_TopFormatter)
    sub = parser.add_subparsers(dest="command", required=True, title="commands",
                                metavar="COMMAND")

    b = sub.add_parser(
        "bench", help="benchmark one op on this GPU and write a results file",
        description="Benchmark one op on this GPU: every lab kernel and every installed peer "
                    "(Liger-Kernel, quack, torch), each checked against the reference first, "
                    "timed eagerly and by CUDA-graph replay; writes <results>/<gpu>/<op>.csv "
                    "with provenance. Needs a CUDA GPU (exit status 2 without one).")
    b.add_argument("--op", choices=sorted(OPS) + ["host"], default="fwd",
                   help="the op to sweep; 'host': host µs per launch path, the host/device "
                        "crossover and the tensor-cache memory cost")
    b.add_argument("--quick", action="store_true",
                   help="two shapes, shorter timers; the file is tagged 'quick' unless --tag")
    b.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="results root: writes DIR/<gpu>/<op>[-TAG].csv (default: the "
                        "repository's results/)")
    b.add_argument("--tag", default=None, help="suffix of the file name: <op>-TAG.csv")
    b.set_defaults(func=cmd_bench)

    r = sub.add_parser(
        "report", help="render the recorded results into report/ (benchmark first on a GPU)",
        description="On a GPU, benchmark every op first (unless --no-bench); then render every "
                    "recorded result into figures and report.md in --out, print the bandwidth "
                    "tables, and list the files written. Without a GPU it renders the recorded "
                    "results (results/ of this repository).")
    r.add_argument("--out", type=Path, default=Path("report"), metavar="DIR",
                   help="where report.md and the figures go (default: ./report)")
    r.add_argument("--results", type=Path, default=None, metavar="DIR",
                   help="results root to read, and to write when benchmarking (default: the "
                        "repository's results/)")
    r.add_argument("--no-bench", action="store_true",
                   help="render only, even when a GPU is present")
    r.add_argument("--quick", action="store_true", help="when benchmarking, the quick sweep")
    r.set_defaults(func=cmd_report)

    from .profiling.workload import DTYPES, ProfileConfig, nsys_profile_line
    example = ProfileConfig(backend="cute")
    p = sub.add_parser(
        "profile", help="a workload to capture with nsys: NVTX on, the loop between "
                        "cudaProfilerStart/Stop",
        description="Run one shape on this GPU with NVTX ranges on, warm up outside the capture, "
                    "and bracket the timed loop with cudaProfilerStart/cudaProfilerStop.",
        epilog=PROFILE_EPILOG.format(profile=nsys_profile_line(example, "cute"),
                                     report=example.report_name("cute")),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", choices=("fwd", "full"), default="fwd",
                   help="fwd: the forward; full: forward + backward (y.backward(dy))")
    p.add_argument("--backend", choices=BACKENDS, default=None,
                   help="default: settings.backend (RMSNORM_LAB_BACKEND)")
    p.add_argument("--launch-path", choices=LAUNCH_PATHS, default=None,
                   help="how tensors reach a CuTe kernel (default: settings.experiments.launch_path)")
    p.add_argument("--variant", choices=FORWARD_CHOICES, default=None,
                   help="CuTe forward kernel (default: settings.forward_variant)")
    p.add_argument("--backward", choices=BACKWARD_CHOICES, default=None,
                   help="CuTe backward kernel (default: settings.backward)")
    p.add_argument("--M", type=int, default=example.M, help="rows (default %(default)s)")
    p.add_argument("--N", type=int, default=example.N, help="row width (default %(default)s)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=example.dtype)
    p.add_argument("--iters", type=int, default=example.iters,
                   help="captured iterations (default %(default)s)")
    p.add_argument("--warmup", type=int, default=example.warmup,
                   help="iterations before the capture (default %(default)s)")
    p.add_argument("--include-compile", action="store_true",
                   help="start the capture before the warm-up, so compile ranges are in it")
    p.add_argument("--graph", action="store_true",
                   help="capture the iterations into one CUDA graph (side stream, after the "
                        "warm-up) and replay it inside the capture range: the same work with "
                        "the host path taken out")
    p.set_defaults(func=cmd_profile)

    n = sub.add_parser(
        "nsys-summary", help="per NVTX range of the rmsnorm_lab domain: wall, kernels, overhead",
        description="Run `nsys stats --report nvtx_sum,cuda_gpu_kern_sum,nvtx_kern_sum --format "
                    "csv` on a report (CSVs written beside it as <name>_<report>.csv, or into "
                    "--out) and print, per range of the rmsnorm_lab domain, its instances, wall "
                    "time, the time of the kernels launched inside it and wall minus kernels per "
                    "instance. With --csv-dir nsys is not run: the CSVs are read from DIR.")
    n.add_argument("report", type=Path, nargs="?", metavar="REPORT.nsys-rep",
                   help="the nsys report (with --csv-dir: optional, picks DIR/<name>_*.csv)")
    n.add_argument("--csv-dir", type=Path, default=None, metavar="DIR",
                   help="read existing CSVs from DIR instead of running nsys stats")
    n.add_argument("--out", type=Path, default=None, metavar="DIR",
                   help="where nsys stats writes the CSVs (default: beside the report)")
    n.set_defaults(func=cmd_nsys_summary)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    _put_ninja_on_path()
    try:
        return args.func(args)
    except UsageError as e:
        return _error(str(e), EXIT_USAGE)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
