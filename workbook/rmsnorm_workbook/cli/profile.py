"""``python -m rmsnorm_lab profile`` (a loop for Nsight Systems to capture) and ``nsys-summary``
(what the capture says per NVTX range)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from rmsnorm_lab import settings
from .common import (EXIT_FAILED, EXIT_NO_GPU, UsageError, error, existing_dir, no_gpu, one_line,
                     reason, writable_dir)


PROFILE_EPILOG = """\
Capture the timed loop (and only it) with Nsight Systems, then summarize:

  {profile}
  python3 -m rmsnorm_lab nsys-summary {report}.nsys-rep

Warm-up runs outside the capture, so each compile range appears once, before it; with
--include-compile the capture starts before the warm-up. Every timed iteration is an NVTX range
"iter" of the rmsnorm_lab domain; the lab's compile/marshal/launch/reduce ranges nest inside.
Exit status: 0 ok; 2 no CUDA GPU, no nvtx package, or a configuration that cannot run (e.g. --op
full with a backend that has no backward)."""


def cmd_profile(args: argparse.Namespace) -> int:
    from ..profiling import workload

    cfg = workload.ProfileConfig(
        op=args.op, backend=args.backend, launch_path=args.launch_path,
        forward_variant=args.variant, backward=args.backward, M=args.M, N=args.N,
        dtype=args.dtype, iters=args.iters, warmup=args.warmup,
        include_compile=args.include_compile, graph=args.graph)
    if not torch.cuda.is_available():
        return no_gpu("profile", "On a GPU host run: "
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
        raise UsageError(f"{path}: cannot read it ({reason(e)})") from None
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
    from ..profiling import nsys

    try:
        if args.csv_dir is not None:
            existing_dir(args.csv_dir, "--csv-dir")
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
                writable_dir(args.out, "--out")
            csvs = nsys.run_nsys_stats(args.report, args.out)
        print(nsys.summary_text(csvs))
    except nsys.NsysMissing as e:
        return error(one_line(e), EXIT_NO_GPU)
    except nsys.NsysError as e:
        return error(one_line(e), EXIT_FAILED)
    return 0
