"""Fingerprints of the code every CuTe kernel compiles to, so a refactor of the kernels can show
that it changed no instruction.

    python scripts/kernel_fingerprints.py save DIR     # compile a spread of plans, keep their PTX
    python scripts/kernel_fingerprints.py check DIR    # compile again, compare with DIR's

Each plan is compiled for its target (no GPU needed) and its PTX normalised: comments dropped,
the kernel's symbol (which spells the Python module and class) replaced by ``KERNEL``, and
registers renumbered in order of first use, so moving a kernel to another module or renaming a
local changes nothing while any changed instruction, operand or order does. ``check`` prints a
unified diff of the first plans that differ.
"""

from __future__ import annotations

import argparse
import difflib
import glob
import itertools
import json
import multiprocessing
import os
import re
import sys
import tempfile
from typing import Callable, Dict, List, Tuple

import torch

BF16, F32, F16 = torch.bfloat16, torch.float32, torch.float16
WIDTHS = (64, 128, 1024, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 1023, 65537)
# (x dtype, w dtype, casting mode, store rstd / dh, residual, pdl, row class)
FORWARD_COMBOS = ((BF16, BF16, "llama", False, False, True, 0),
                  (BF16, None, "gemma", True, True, False, 0),
                  (F32, F32, "none", True, False, True, 1),
                  (F16, F32, "llama", False, True, True, 2))
BACKWARD_COMBOS = ((BF16, BF16, "llama", False, True),
                   (BF16, None, "gemma", True, False),
                   (F32, F32, "none", False, True),
                   (F16, F32, "llama", True, True))
ARCH = "sm_90a"


def forward_cases() -> List[Tuple[str, Callable]]:
    from rmsnorm_lab.cute.plan.forward import NotEligible, plan_forward
    from rmsnorm_lab.registry import FORWARD_VARIANTS
    cases = []
    for variant, N, combo in itertools.product(FORWARD_VARIANTS, WIDTHS, FORWARD_COMBOS):
        x, w, mode, rstd, residual, pdl, rows = combo
        try:
            plan = plan_forward(variant, N, x, w, mode, rstd, True, arch=ARCH, pdl=pdl,
                                residual=residual, row_class=rows)
        except NotEligible:
            continue
        label = f"fwd-{variant}-{N}-{x}-{w}-{mode}-rstd{rstd}-res{residual}-pdl{pdl}-rc{rows}"
        cases.append((label.replace("torch.", ""), plan))
    return cases


def backward_cases() -> List[Tuple[str, object]]:
    import dataclasses
    from rmsnorm_lab.cute.plan.backward import (NotEligible, plan_backward,
                                                plan_cluster_backward, plan_staged_backward,
                                                with_dw_cluster)
    planners = {
        "fused": lambda N, x, w, m, dh: plan_backward("fused", N, x, w, m, True, dh),
        "dx": lambda N, x, w, m, dh: plan_backward("dx", N, x, w, m, True, dh),
        "dw": lambda N, x, w, m, dh: plan_backward("dw", N, x, w, m, True),
        "dx-unaligned": lambda N, x, w, m, dh: plan_backward("dx", N, x, w, m, False, dh),
        "fused-unaligned": lambda N, x, w, m, dh: plan_backward("fused", N, x, w, m, False, dh),
        "cluster": lambda N, x, w, m, dh: plan_cluster_backward(N, x, w, m, True, dh, ARCH),
        "staged": lambda N, x, w, m, dh: plan_staged_backward(N, x, w, m, True, dh),
    }
    cases = []
    for (kind, planner), N, combo in itertools.product(planners.items(), WIDTHS,
                                                       BACKWARD_COMBOS):
        x, w, mode, dh, pdl = combo
        try:
            plan = with_dw_cluster(planner(N, x, w, mode, dh), ARCH)
        except NotEligible:
            continue
        plan = dataclasses.replace(plan, pdl=pdl)
        label = f"bwd-{kind}-{N}-{x}-{w}-{mode}-dh{dh}-pdl{pdl}-cl{plan.dw_cluster}"
        cases.append((label.replace("torch.", ""), plan))
    for N, w, pdl in itertools.product((4096, 1023, 128), (BF16, F32), (False, True)):
        cases.append((f"dw_reduce-{N}-{w}-pdl{pdl}".replace("torch.", ""), ("dw_reduce", N, w,
                                                                              pdl)))
    return cases


def compile_ptx(case) -> Tuple[str, str]:
    label, plan = case
    from rmsnorm_lab.cute.launch.backward import compile_backward, compile_dw_reduce
    from rmsnorm_lab.cute.plan.forward import ForwardPlan
    from rmsnorm_lab.cute.launch.forward import compile_forward
    with tempfile.TemporaryDirectory() as tmp:
        if isinstance(plan, tuple):
            _, N, w, pdl = plan
            compile_dw_reduce(N, w, ARCH, keep_ptx_dir=tmp, pdl=pdl)
        elif isinstance(plan, ForwardPlan):
            compile_forward(plan, ARCH, keep_ptx_dir=tmp)
        else:
            compile_backward(plan, ARCH, keep_ptx_dir=tmp)
        (path,) = glob.glob(os.path.join(tmp, f"*.{ARCH}.ptx"))
        with open(path) as f:
            return label, normalise(f.read())


def normalise(ptx: str) -> str:
    lines = []
    for line in ptx.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("//"):
            continue
        lines.append(line.split("//")[0].rstrip())
    text = "\n".join(lines)
    text = re.sub(r"\bkernel_cutlass_\w*?(_param_\d+)?\b",
                  lambda m: "KERNEL" + (m.group(1) or ""), text)
    names: Dict[str, str] = {}
    counts: Dict[str, int] = {}

    def rename(m):
        reg = m.group(0)
        if reg not in names:
            kind = m.group(1)
            counts[kind] = counts.get(kind, 0) + 1
            names[reg] = f"%{kind}#{counts[kind]}"
        return names[reg]
    return re.sub(r"%(rd|r|f|fd|p|rs|h|hh|b)(\d+)\b", rename, text)


def run(cases, workers: int) -> Dict[str, str]:
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        return dict(pool.imap_unordered(compile_ptx, cases, chunksize=4))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("save", "check"))
    parser.add_argument("dir")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--only", default="", help="labels containing this text")
    args = parser.parse_args(argv)
    os.environ.setdefault("CUTE_DSL_ARCH", ARCH)
    cases = [c for c in forward_cases() + backward_cases() if args.only in c[0]]
    print(f"{len(cases)} kernels", flush=True)
    found = run(cases, args.workers)
    if args.command == "save":
        os.makedirs(args.dir, exist_ok=True)
        for label, ptx in found.items():
            with open(os.path.join(args.dir, label + ".ptx"), "w") as f:
                f.write(ptx)
        with open(os.path.join(args.dir, "labels.json"), "w") as f:
            json.dump(sorted(found), f, indent=0)
        return 0
    with open(os.path.join(args.dir, "labels.json")) as f:
        saved = set(json.load(f))
    missing, added = saved - set(found), set(found) - saved
    if args.only:
        missing = {m for m in missing if args.only in m}
    differ = []
    for label in sorted(set(found) & saved):
        with open(os.path.join(args.dir, label + ".ptx")) as f:
            old = f.read()
        if old != found[label]:
            differ.append(label)
            if len(differ) <= 2:
                sys.stdout.writelines(difflib.unified_diff(
                    old.splitlines(True), found[label].splitlines(True), label, "now", n=2))
    for name, group in (("missing", missing), ("new", added), ("different", differ)):
        if group:
            print(f"{len(group)} {name}: " + ", ".join(sorted(group)[:8]))
    print("identical" if not (missing or added or differ) else "CHANGED")
    return 0 if not (missing or added or differ) else 1


if __name__ == "__main__":
    sys.exit(main())
