"""Nsight Compute's view of the lesson notebooks' teaching kernels, recorded for readers without a
GPU.

    python3 -m rmsnorm_workbook.profiling.ncu_teach [--out results] [--M 16384] [--N 4096]
                                               [--kernels scalar,fused]

On a GPU host with ``ncu`` on PATH (or ``$NCU``), from the repository root. For every teaching
kernel (the five forward kernels of ``notebooks/01_forward.ipynb``, the three backward kernels of
``notebooks/02_backward.ipynb``) and the library's default forward (``cute.auto``, for
comparison), one child process is profiled:

    ncu --csv --clock-control none --section SpeedOfLight --section Occupancy
        --section LaunchStats --metrics <METRICS> --kernel-name regex:<its name>
        --launch-skip 1 --launch-count 1 python3 -m rmsnorm_workbook.profiling.ncu_teach --child NAME

The child compiles the kernel (from the notebook's cells tagged ``kernel``: the kernels live in
the notebooks, and this script runs exactly what a reader runs), allocates one input set at M x N
(bf16) and launches the kernel twice; ncu profiles the second launch. Written:

* ``<out>/<gpu>/ncu/ncu-teach.csv`` -- columns
  ``kernel,M,N,metric,unit,value,gpu,commit,timestamp``,
  one row per metric ncu reported (command-line metrics by their names, section metrics as
  ``<section>/<name>``);
* ``<out>/<gpu>/ncu/sass-teach.txt`` -- per kernel, its register and stack use and the SASS lines
  that move global or local memory (``LDG``/``STG``/``LDL``/``STL``), from the cubin the same
  compilation produced (``cuobjdump``);
* ``<out>/<gpu>/ncu/ncu-teach.log`` -- every ncu command of the run and its output (the place
  to look when a kernel failed).

``<out>`` is the repository's ``profiles/`` (a profiler's record, beside the results, not in
them). A run of a few kernels (``--kernels``) replaces their records and keeps the others'.

A metric this ncu does not know makes ncu refuse the whole run; the script then retries with the
metrics the lab has used on the H200 before, then with the sections alone, and says so. A kernel
that fails is reported and the others are still profiled; exit status 1 if any failed.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

from .. import paths

NOTEBOOKS = {"fwd": paths.NOTEBOOKS / "01_forward.ipynb",
             "bwd": paths.NOTEBOOKS / "02_backward.ipynb"}
FWD_KERNELS = ("scalar", "vectorized", "cta_row", "warp_row")
BWD_KERNELS = ("split_dx", "split_dw", "fused")
LIBRARY = ("cute.auto",)
SHAPE = (16384, 4096)
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats")
#: metrics an earlier ncu run on the H200 accepted (results/h200/logs/fwd-ncu-*.txt)
CORE_METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
                "dram__throughput.avg.pct_of_peak_sustained_elapsed",
                "sm__warps_active.avg.pct_of_peak_sustained_active",
                "launch__registers_per_thread", "launch__occupancy_limit_registers",
                "launch__grid_size", "launch__block_size")
#: more, tried first: theoretical occupancy and executed global / local (spill) instructions
EXTRA_METRICS = ("sm__maximum_warps_per_active_cycle_pct",
                 "smsp__sass_inst_executed_op_global_ld.sum",
                 "smsp__sass_inst_executed_op_local_ld.sum",
                 "smsp__sass_inst_executed_op_local_st.sum")
FIELDS = ("kernel", "M", "N", "metric", "unit", "value", "gpu", "commit", "timestamp")


def impl_name(kernel: str) -> str:
    return kernel if kernel in LIBRARY else f"teach.{kernel}"


def kernel_regex(kernel: str) -> str:
    """What ncu's ``--kernel-name regex:`` matches: CuTe DSL names a kernel
    ``kernel_cutlass_<function>_<arguments>``."""
    if kernel == "cute.auto":
        return "RMSNormForward"
    return f"cutlass_{kernel}_kernel_"


# ------------------------------------------------------------------------------------------------
# the kernels, from the notebooks' cells

def kernel_source(notebook: Path) -> str:
    """The code cells of ``notebook`` tagged ``kernel``, in order (json: no nbformat needed)."""
    nb = json.loads(Path(notebook).read_text())
    parts = []
    for cell in nb["cells"]:
        if cell.get("cell_type") == "code" and "kernel" in cell.get("metadata", {}).get("tags", []):
            src = cell["source"]
            parts.append("".join(src) if isinstance(src, list) else src)
    if not parts:
        raise RuntimeError(f"{notebook.name} has no code cell tagged 'kernel'")
    return "\n\n".join(parts) + "\n"


def load_kernels(notebook: Path, where: Optional[str] = None):
    """The notebook's kernel cells as a module, from a file (CuTe DSL reads kernel source with
    ``inspect``, which needs one)."""
    where = where or tempfile.mkdtemp(prefix="rmsnorm-teach-")
    name = f"teach_{Path(notebook).stem.replace('-', '_')}"
    path = Path(where) / f"{name}.py"
    path.write_text(kernel_source(notebook))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def op_of(kernel: str) -> str:
    return "bwd" if kernel in BWD_KERNELS else "fwd"


def compile_kernel(module, kernel: str, N: int, arch: str, dump_dir: Optional[str] = None):
    launcher = getattr(module, kernel)
    fake = module.fake_bwd_args(N) if op_of(kernel) == "bwd" else module.fake_fwd_args(N)
    return module.compile_for(launcher, fake, arch, dump_dir)


# ------------------------------------------------------------------------------------------------
# the profiled child

def child(kernel: str, M: int, N: int) -> None:
    """Compile ``kernel``, make one input set, launch it twice (ncu profiles the second)."""
    import torch

    from ..viz import lesson

    if kernel == "cute.auto":
        from rmsnorm_lab import rms_norm
        s = lesson.forward_set(M, N)
        for _ in range(2):
            rms_norm(s["x"], s["w"], eps=lesson.EPS, casting_mode="llama")
        torch.cuda.synchronize()
        return
    module = load_kernels(NOTEBOOKS[op_of(kernel)])
    fn = compile_kernel(module, kernel, N, lesson.target_arch())
    if op_of(kernel) == "fwd":
        s = lesson.forward_set(M, N)
        for _ in range(2):
            fn(s["x"], s["w"], s["y"], lesson.EPS)
    else:
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        s = lesson.backward_set(M, N, module.dw_partial_rows(kernel, M, N, sms))
        for _ in range(2):
            fn(s["dy"], s["x"], s["w"], s["rstd"], s["dx"], s["dwp"])
    torch.cuda.synchronize()


# ------------------------------------------------------------------------------------------------
# reading ncu's CSV

def _number(text: str) -> Optional[float]:
    t = text.strip().replace(",", "")
    try:
        return float(t)
    except ValueError:
        return None


def parse_ncu_csv(text: str) -> List[Dict[str, object]]:
    """The metric rows of ``ncu --csv`` output (its ``details`` page: one row per kernel launch,
    section and metric), the application's own output and ncu's ``==PROF==`` lines skipped.
    Each row: ``launch`` (ncu's ID), ``kernel_name``, ``metric`` (command-line metrics by name,
    section metrics as ``<section>/<name>``), ``unit``, ``value`` (a float; non-numeric values
    are left out)."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    if not lines:
        return []
    reader = csv.DictReader(io.StringIO("\n".join(lines)))
    need = {"ID", "Kernel Name", "Section Name", "Metric Name", "Metric Unit", "Metric Value"}
    if not need <= set(reader.fieldnames or ()):
        raise ValueError(f"not ncu --csv output: columns {reader.fieldnames}")
    out = []
    for r in reader:
        if r["ID"] == "ID":  # a repeated header (several processes)
            continue
        value = _number(r["Metric Value"])
        if value is None:
            continue
        section, name = r["Section Name"].strip(), r["Metric Name"].strip()
        metric = name if section == "Command line profiler metrics" else f"{section}/{name}"
        out.append({"launch": int(r["ID"]), "kernel_name": r["Kernel Name"], "metric": metric,
                    "unit": r["Metric Unit"].strip(), "value": value})
    return out


def last_launch(rows: List[Dict[str, object]]) -> List[Dict[str, object]]:
    """The rows of the last profiled launch (the child launches twice; ncu skips the first)."""
    if not rows:
        return []
    last = max(r["launch"] for r in rows)
    return [r for r in rows if r["launch"] == last]


# ------------------------------------------------------------------------------------------------
# the parent

def ncu_binary() -> Optional[str]:
    for cand in (os.environ.get("NCU"), shutil.which("ncu"), "/usr/local/cuda/bin/ncu"):
        if cand and os.path.exists(cand):
            return cand
    return None


def ncu_command(ncu: str, kernel: str, M: int, N: int, metrics) -> List[str]:
    cmd = [ncu, "--csv", "--clock-control", "none"]
    for s in SECTIONS:
        cmd += ["--section", s]
    if metrics:
        cmd += ["--metrics", ",".join(metrics)]
    cmd += ["--kernel-name", f"regex:{kernel_regex(kernel)}", "--launch-skip", "1",
            "--launch-count", "1", sys.executable, "-m", "rmsnorm_workbook.profiling.ncu_teach",
            "--child", kernel, "--M", str(M), "--N", str(N)]
    return cmd


def profile(ncu: str, kernel: str, M: int, N: int, log) -> List[Dict[str, object]]:
    """ncu over one child; falls back to fewer metrics when ncu refuses some."""
    for metrics in (CORE_METRICS + EXTRA_METRICS, CORE_METRICS, ()):
        cmd = ncu_command(ncu, kernel, M, N, metrics)
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=paths.REPO, timeout=900)
        log.write(f"$ {' '.join(cmd)}\n(exit {res.returncode})\n{res.stdout}\n{res.stderr}\n")
        try:
            rows = last_launch(parse_ncu_csv(res.stdout))
        except ValueError:
            rows = []
        if rows:
            if metrics != CORE_METRICS + EXTRA_METRICS:
                print(f"  note: {kernel}: profiled with {len(metrics) or 'no'} command-line "
                      "metrics (ncu refused the longer list; see the log)")
            return rows
        errors = [line for line in (res.stdout + res.stderr).splitlines() if "ERROR" in line]
        print(f"  {kernel}: ncu gave no rows (exit {res.returncode})"
              + (f": {errors[0].strip()}" if errors else ""))
        if any("ERR_NVGPUCTRPERM" in e or "permission" in e.lower() for e in errors):
            break  # no access to the counters: fewer metrics will not help
    return []


def sass_record(module, kernel: str, N: int, arch: str) -> str:
    from ..viz import lesson

    with tempfile.TemporaryDirectory() as d:
        compile_kernel(module, kernel, N, arch, d)
        c = lesson.read_compiled(d, kernel, N, arch)
    counts = ", ".join(f"{k} {v}" for k, v in c.sass_counts().items())
    head = (f"== {impl_name(kernel)} ({arch}, N={N}) ==\n"
            f"registers {c.registers}, stack {c.stack_bytes} bytes; memory instructions "
            f"(static): {counts}")
    return head + "\n" + c.excerpt(("LDG", "STG", "LDL", "STL"), limit=12) + "\n"


def kept_records(out_dir: Path, replaced: set) -> tuple:
    """``(rows, sass)`` of an earlier record in ``out_dir`` for every kernel but ``replaced``
    (``impl_name``s): a run of a few kernels replaces their records and keeps the others'."""
    rows, sass = [], []
    csv_path, sass_path = out_dir / "ncu-teach.csv", out_dir / "sass-teach.txt"
    if csv_path.exists():
        with open(csv_path, newline="") as f:
            rows = [r for r in csv.DictReader(f) if r["kernel"] not in replaced]
    if sass_path.exists():  # blocks of "== <kernel> (<arch>, N=<N>) ==" and their lines
        blocks = re.split(r"^(?=== )", sass_path.read_text(), flags=re.M)[1:]
        sass = [b.rstrip("\n") + "\n" for b in blocks if b.split()[1] not in replaced]
    return rows, sass


def write_outputs(out_dir: Path, rows: List[Dict[str, object]], sass: List[str], arch: str,
                  prov: dict) -> None:
    """``ncu-teach.csv`` and ``sass-teach.txt`` from what has been profiled so far."""
    from ..viz import lesson

    if rows:
        with open(out_dir / "ncu-teach.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n")
            w.writeheader()
            w.writerows(rows)
    if sass:
        head = (f"# SASS excerpts of the teaching kernels ({arch}, cuobjdump "
                f"{lesson.tool_version('cuobjdump')}); newest run: gpu {prov['gpu']}, commit "
                f"{prov['commit']}, {prov['timestamp']} (each kernel's rows in ncu-teach.csv "
                "name their own)\n")
        (out_dir / "sass-teach.txt").write_text(head + "\n".join(sass))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(paths.PROFILES), help="profiles root (default: "
                    "the repository's profiles/)")
    ap.add_argument("--M", type=int, default=SHAPE[0])
    ap.add_argument("--N", type=int, default=SHAPE[1])
    ap.add_argument("--kernels", help="comma-separated subset of: " + ", ".join(
        FWD_KERNELS + BWD_KERNELS + LIBRARY))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.M, args.N)
        return 0

    import torch

    from ..results.provenance import collect
    from ..viz import lesson, recorded

    if not torch.cuda.is_available():
        print("error: ncu_teach profiles on a CUDA GPU; none is visible here", file=sys.stderr)
        return 2
    ncu = ncu_binary()
    if ncu is None:
        print("error: ncu (Nsight Compute) not found: put it on PATH or set NCU",
              file=sys.stderr)
        return 2
    kernels = list(FWD_KERNELS + BWD_KERNELS + LIBRARY)
    if args.kernels:
        kernels = [k for k in args.kernels.split(",") if k]
        unknown = set(kernels) - set(FWD_KERNELS + BWD_KERNELS + LIBRARY)
        if unknown:
            print(f"error: unknown kernels {sorted(unknown)}", file=sys.stderr)
            return 2
    prov = collect()
    out_dir = recorded.record_dir(Path(args.out), prov["gpu"])
    out_dir.mkdir(parents=True, exist_ok=True)
    arch = lesson.target_arch()
    rows, sass = kept_records(out_dir, {impl_name(k) for k in kernels})
    failed = []
    modules = {}
    log_path = out_dir / "ncu-teach.log"  # beside what it explains
    print(f"ncu_teach: {len(kernels)} kernels at {args.M}x{args.N} bf16 on {prov['gpu']} "
          f"({arch}); ncu output logged to {log_path}")
    with open(log_path, "w") as log:
        for kernel in kernels:
            print(f"- {kernel}", flush=True)
            try:
                got = profile(ncu, kernel, args.M, args.N, log)
            except subprocess.TimeoutExpired:
                got = []
                print(f"  {kernel}: ncu timed out")
            if not got:
                failed.append(kernel)
            for r in got:
                rows.append({"kernel": impl_name(kernel), "M": args.M, "N": args.N,
                             "metric": r["metric"], "unit": r["unit"], "value": r["value"],
                             "gpu": prov["gpu"], "commit": prov["commit"],
                             "timestamp": prov["timestamp"]})
            if kernel not in LIBRARY:  # the library's kernels have no cell to excerpt
                try:
                    op = op_of(kernel)
                    if op not in modules:
                        modules[op] = load_kernels(NOTEBOOKS[op])
                    sass.append(sass_record(modules[op], kernel, args.N, arch))
                except Exception as e:  # noqa: BLE001 - the profile still counts
                    print(f"  {kernel}: no SASS excerpt ({type(e).__name__}: {e})")
            write_outputs(out_dir, rows, sass, arch, prov)  # after each kernel: a run cut
            # short by a time limit keeps what it profiled
    print(f"wrote {out_dir / 'ncu-teach.csv'} ({len(rows)} rows) and {out_dir / 'sass-teach.txt'}")
    if failed:
        print(f"FAILED: {', '.join(failed)} (see {log_path})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
