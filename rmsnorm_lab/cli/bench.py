"""``python -m rmsnorm_lab bench``: one op's sweep on this GPU, into a results file."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

import torch

from .common import EXIT_FAILED, no_gpu, writable_dir


def run_bench(op: str, quick: bool, out: Optional[Path], tag: Optional[str]) -> int:
    from ..bench.runner import bench

    if op == "host":  # launch paths, crossover and cache memory: rmsnorm_lab/bench/host.py
        from ..bench.host import bench_host
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


def cmd_bench(args: argparse.Namespace) -> int:
    if not torch.cuda.is_available():
        return no_gpu("bench", "Recorded results render without one: "
                                "python -m rmsnorm_lab report --no-bench")
    if args.out is not None:
        writable_dir(args.out, "--out")
    return run_bench(args.op, args.quick, args.out, args.tag)
