"""The command line: python -m rmsnorm_lab {bench,report,profile,nsys-summary}; this module builds
the parser, and each command lives in ``cli/``.

  bench         runs the benchmark sweep of one op on the current GPU and writes a results file.
  report        (on a GPU, after benchmarking) renders every recorded result into figures and
                a markdown report, with a short summary on stdout (``--tables``: the full
                tables); without a GPU it renders what is recorded.
  profile       a workload for Nsight Systems: one shape, NVTX on, the timed loop between
                cudaProfilerStart/Stop (run it under the nsys line its --help prints).
  nsys-summary  per NVTX range of the rmsnorm_lab domain: wall time, kernel time, the difference.

Errors the user can fix (a path that is empty, missing or cannot be written, a file that is not
what the command reads, a missing tool, no GPU) are one line on stderr, ``error: ...``, naming the
path as given, and a non-zero exit status (``cli/common.py``); so is a bad ``RMSNORM_LAB_*``
value, reported as the library is imported (``rmsnorm_lab/settings.py``). Progress goes to
stderr, results (the summary, tables, the list of files written) to stdout.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

from .bench.instruments import LAUNCH_PATHS
from .bench.runner import OPS
from .cli.bench import cmd_bench, parse_shapes
from .cli.common import EXIT_USAGE, UsageError, error, path_arg, put_ninja_on_path
from .cli.profile import PROFILE_EPILOG, cmd_nsys_summary, cmd_profile
from .cli.report import cmd_report
from rmsnorm_lab import __version__
from rmsnorm_lab.settings import BACKENDS, BACKWARD_CHOICES, FORWARD_CHOICES

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
2 no GPU, a missing tool, a bad RMSNORM_LAB_* value, or a path that is empty, missing, cannot be
written or holds nothing to read (a results folder without results)."""


def version_line() -> str:
    """``--version``'s answer: the library's version (the workbook's is the same)."""
    return f"rmsnorm_lab {__version__}"


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rmsnorm_lab", description=DESCRIPTION,
                                     epilog=EPILOG, formatter_class=_TopFormatter)
    parser.add_argument("--version", action="version", version=version_line(),
                        help="print the lab's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, title="commands",
                                metavar="COMMAND")

    b = sub.add_parser(
        "bench", help="benchmark one op on this GPU and write a results file",
        description="Benchmark one op on this GPU: every lab kernel and every installed peer "
                    "(Liger-Kernel, quack, FlashInfer, torch), each checked against the "
                    "reference first, timed eagerly and by CUDA-graph replay; writes "
                    "<results>/<gpu>/<op>.csv with provenance. Needs a CUDA GPU (exit status 2 "
                    "without one).")
    b.add_argument("--op", choices=sorted(OPS) + ["host", "model"], default="fwd",
                   help="the op to sweep; 'host': host µs per launch path, the host/device "
                        "crossover and the tensor-cache memory cost; 'model': train, prefill "
                        "and decode steps of Llama and Qwen3 models (transformers, random "
                        "weights) with each norm (transformers', torch's, the lab's, Liger's)")
    b.add_argument("--quick", action="store_true",
                   help="two shapes, shorter timers (--op model: 2 layers, fewer tokens); the "
                        "file is tagged 'quick' unless --tag")
    b.add_argument("--shapes", type=parse_shapes, default=None, metavar="MxN,...",
                   help="these shapes instead of the op's sweep (e.g. 65536x128,262144x128); "
                        "needs --tag, so the sweep's own file is kept")
    b.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="--op model: also time both models under torch.compile with torch's and "
                        "the lab's norms (minutes of compiling; default: on, off with --quick)")
    b.add_argument("--only-compiled", action="store_true",
                   help="--op model: only the torch.compile part (and the reference it is "
                        "checked against); needs --tag")
    b.add_argument("--out", type=path_arg("--out"), default=None, metavar="DIR",
                   help="results root: writes DIR/<gpu>/<op>[-TAG].csv (default: the "
                        "repository's results/)")
    b.add_argument("--tag", default=None, help="suffix of the file name: <op>-TAG.csv")
    b.set_defaults(func=cmd_bench)

    r = sub.add_parser(
        "report", help="render the recorded results into report/ (benchmark first on a GPU)",
        description="On a GPU, benchmark every op first (unless --no-bench); then render every "
                    "recorded result into figures and report.md in --out and print a short "
                    "summary (what was read, the headline numbers, where report.md is; the full "
                    "tables with --tables). Without a GPU it renders the recorded results "
                    "(results/ of this repository).")
    r.add_argument("--out", type=path_arg("--out"), default=Path("report"), metavar="DIR",
                   help="where report.md and the figures go (default: ./report)")
    r.add_argument("--results", type=path_arg("--results"), default=None, metavar="DIR",
                   help="results root to read, and to write when benchmarking (default: the "
                        "repository's results/)")
    r.add_argument("--tables", action="store_true",
                   help="also print the full bandwidth tables, the cross-GPU and model verdicts "
                        "with their caveats, and every file written (by default: a short "
                        "summary, and where report.md is)")
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
                   help="how tensors reach a CuTe forward kernel: the library's own "
                        "(tvm_ffi, the default) or one of the host lesson's (the workbook's "
                        "bench/launch_paths.py)")
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
    n.add_argument("report", type=path_arg("REPORT", "report file"), nargs="?",
                   metavar="REPORT.nsys-rep",
                   help="the nsys report (with --csv-dir: optional, picks DIR/<name>_*.csv)")
    n.add_argument("--csv-dir", type=path_arg("--csv-dir"), default=None, metavar="DIR",
                   help="read existing CSVs from DIR instead of running nsys stats")
    n.add_argument("--out", type=path_arg("--out"), default=None, metavar="DIR",
                   help="where nsys stats writes the CSVs (default: beside the report)")
    n.set_defaults(func=cmd_nsys_summary)
    return parser


def parse(parser: argparse.ArgumentParser, argv: Optional[List[str]]) -> argparse.Namespace:
    """``parser.parse_args``, except that an argument no command knows is reported with the
    usage of the command it was given to, not the top-level one."""
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    given = sys.argv[1:] if argv is None else list(argv)
    if not any(a in commands.choices for a in given):
        unknown = [a for a in given if a.startswith("-")
                   and a not in ("-h", "--help", "--version")]
        if unknown:  # an option before any command: name it, not the missing command
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    args, extra = parser.parse_known_args(argv)
    if extra:
        commands.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    try:
        args = parse(build_parser(), argv)
    except UsageError as e:  # a path option given empty (cli.common.path_arg)
        return error(str(e), EXIT_USAGE)
    put_ninja_on_path()
    try:
        return args.func(args)
    except UsageError as e:
        return error(str(e), EXIT_USAGE)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
