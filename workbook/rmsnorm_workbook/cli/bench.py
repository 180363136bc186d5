"""``python -m rmsnorm_lab bench``: one op's sweep on this GPU, into a results file."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import List, Optional, Tuple

import torch

from .common import EXIT_FAILED, EXIT_USAGE, UsageError, error, no_gpu, writable_dir


def parse_shapes(text: str) -> List[Tuple[int, int]]:
    """``"65536x128,262144x128"`` -> ``[(65536, 128), (262144, 128)]`` (argparse's type)."""
    shapes = []
    for item in text.split(","):
        m, sep, n = item.strip().lower().partition("x")
        if not (sep and m.isdigit() and n.isdigit()):
            raise argparse.ArgumentTypeError(f"{item.strip()!r} is not MxN (e.g. 65536x128)")
        if int(m) < 1 or int(n) < 1:
            raise argparse.ArgumentTypeError(f"{item.strip()!r}: rows and width must be positive")
        shapes.append((int(m), int(n)))
    return shapes


def run_bench(op: str, quick: bool, out: Optional[Path], tag: Optional[str],
              with_compile: Optional[bool] = None,
              shapes: Optional[List[Tuple[int, int]]] = None,
              only_compiled: bool = False) -> int:
    from ..bench.runner import bench

    if op == "host":  # launch paths, crossover and cache memory: bench/host.py
        from ..bench.host import bench_host
        outcome = bench_host(out=out, tag=tag, repeats=5 if quick else 15)
    elif op == "model":  # the norm inside transformers models: bench/model.py
        from ..bench.model import bench_model
        outcome = bench_model(out=out, tag=tag, quick=quick, with_compile=with_compile,
                              only_compiled=only_compiled)
    else:
        outcome = bench(op, quick=quick, out=out, tag=tag, shapes=shapes)
    print(f"wrote {len(outcome.rows)} rows to {outcome.path}")
    if outcome.skipped and op == "model":
        print(f"{len(outcome.skipped)} norm choices skipped:", *outcome.skipped, sep="\n  ")
    elif outcome.skipped:
        print(f"{len(outcome.skipped)} implementation/shape pairs skipped (not eligible)")
    if outcome.failures:
        print(f"{len(outcome.failures)} FAILURES (not timed):", *outcome.failures, sep="\n  ")
        return EXIT_FAILED
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    # the arguments first: a wrong command says so on any machine
    if args.compile is not None and args.op != "model":
        raise UsageError("--compile/--no-compile apply to --op model only")
    if args.shapes and (args.op in ("host", "model") or not args.tag):
        raise UsageError("--shapes applies to the sweeps (fwd, bwd, full, fwd-add, bwd-add) "
                         "and needs --tag")
    if args.only_compiled and (args.op != "model" or not args.tag):
        raise UsageError("--only-compiled applies to --op model and needs --tag")
    if not torch.cuda.is_available():
        return no_gpu("bench", "Recorded results render without one: "
                                "python -m rmsnorm_lab report --no-bench (the ops), notebook 05 "
                                "(the model step)")
    if args.op == "model":
        try:
            import transformers  # noqa: F401 - the models are built from its configs
        except ImportError as e:
            return error(f"bench --op model builds transformers models, and transformers does "
                         f"not import here ({e}); pip install 'transformers>=4.51'", EXIT_USAGE)
    if args.out is not None:
        writable_dir(args.out, "--out")
    return run_bench(args.op, args.quick, args.out, args.tag, args.compile, args.shapes,
                     args.only_compiled)
