"""What the CuTe DSL compiler makes of every lab kernel for Hopper (sm_90a) and Blackwell
(sm_100a), read without a GPU: the kept PTX (instruction mix, 16-byte accesses, shuffles,
barriers) and ``ptxas -v`` (registers, spills, stack, shared memory).

Compiling takes a while, so the table is cached in ``compiled/ptx_table.csv`` (beside
``results/``: compiler output, not a measurement); ``table()``
reads the cache and ``regenerate()`` rebuilds it (``python -m rmsnorm_workbook.analysis.compiled``).
Nothing here is a measurement of a GPU: it is what the compiler emitted.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import pandas as pd

from ..results import results_dir

ARCHS = ("sm_90a", "sm_100a")
CACHE = Path("compiled") / "ptx_table.csv"

#: (kernel label, family, plan arguments); bf16 rows of the lab's reference width, plus the
#: wide chunked row and the scalar fallback
FORWARD_KERNELS: Tuple[Tuple[str, str, int, str], ...] = (
    ("fwd.row", "row", 4096, "bf16"),
    ("fwd.row N=16384", "row", 16384, "bf16"),
    ("fwd.row N=262144 (chunked)", "row", 262144, "bf16"),
    ("fwd.persistent", "persistent", 4096, "bf16"),
    ("fwd.warp N=1024", "warp", 1024, "bf16"),
    ("fwd.warp", "warp", 4096, "bf16"),
    ("fwd.fallback N=4095", "fallback", 4095, "bf16"),
)
BACKWARD_KERNELS: Tuple[Tuple[str, str, int, str], ...] = (
    ("bwd.fused", "fused", 4096, "bf16"),
    ("bwd.fused N=16384 (chunked, dW in smem)", "fused", 16384, "bf16"),
    ("bwd.dx (split)", "dx", 4096, "bf16"),
    ("bwd.dw (split)", "dw", 4096, "bf16"),
)

#: PTX opcode families counted in the instruction mix
MIX = {
    "ld.global": r"ld\.global", "st.global": r"st\.global", "ld.shared": r"ld\.shared",
    "st.shared": r"st\.shared", "fma": r"fma", "mul": r"mul", "add/sub": r"(?:add|sub)",
    "cvt": r"cvt", "rsqrt": r"rsqrt", "shfl": r"shfl", "bar": r"(?:bar|barrier)",
    "setp/selp": r"(?:setp|selp)", "mov": r"mov", "branch": r"bra",
}
_OPCODE = re.compile(r"^\s*(?:@!?%\w+\s+)?([a-z][\w.:]*)", re.M)


def instruction_mix(ptx: str) -> Dict[str, int]:
    """Counts of PTX instructions by family, plus ``instructions`` (all of them). Static counts
    in the text, not executed instructions: an unrolled loop counts every copy."""
    ops = [m.group(1) for m in _OPCODE.finditer(ptx)
           if not m.group(1).startswith(".")]
    ops = [o for o in ops if not o.endswith(":")]
    counts = {"instructions": len(ops),
              "packed f32x2": sum(1 for o in ops if ".f32x2" in o)}
    for name, pat in MIX.items():
        rx = re.compile(rf"^{pat}(?:\.|$)")
        counts[name] = sum(1 for o in ops if rx.match(o))
    return counts


def _dtype(name: str):
    import torch
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def _plan(family: str, kind: str, N: int, dtype: str, arch: str):
    dt = _dtype(dtype)
    if family == "fwd":
        from rmsnorm_lab.lab import plan_forward
        return plan_forward(kind, N, dt, dt, "llama", store_rstd=True, aligned=kind != "fallback",
                            arch=arch)
    from rmsnorm_lab.lab import plan_backward
    return plan_backward(kind, N, dt, dt, "llama", aligned=True)


def inspect_kernel(label: str, family: str, kind: str, N: int, dtype: str, arch: str) -> dict:
    """One row of the table: compile, then read the PTX and ptxas -v."""
    from rmsnorm_lab.lab import compile_and_inspect
    t = time.perf_counter()
    plan = _plan(family, kind, N, dtype, arch)
    facts = compile_and_inspect(plan, arch)
    row = {"kernel": label, "arch": arch, "N": N, "dtype": dtype,
           "threads": plan.threads, "vec_bytes": plan.vec * {"bf16": 2, "fp16": 2, "fp32": 4}[
               dtype], "registers": facts.registers,
           "spill_bytes": facts.spill_bytes, "stack_bytes": facts.stack_bytes,
           "smem_bytes": facts.smem_bytes,
           "ld.global 16B": facts.global_loads_16B, "ld.global scalar": facts.global_loads_scalar,
           "st.global 16B": facts.global_stores_16B, "local": facts.local_accesses,
           "shuffles": facts.shuffles, "barriers": facts.barriers}
    row.update(instruction_mix(facts.ptx))
    row["compile_s"] = round(time.perf_counter() - t, 2)
    return row


def kernels() -> List[Tuple[str, str, str, int, str]]:
    return ([(label, "fwd", kind, N, dt) for label, kind, N, dt in FORWARD_KERNELS]
            + [(label, "bwd", kind, N, dt) for label, kind, N, dt in BACKWARD_KERNELS])


def build_table(archs: Sequence[str] = ARCHS) -> pd.DataFrame:
    """Compile every kernel for every arch (a few seconds each on one core)."""
    rows = [inspect_kernel(label, fam, kind, N, dt, arch)
            for arch in archs for label, fam, kind, N, dt in kernels()]
    return pd.DataFrame(rows)


def cache_path(root: Optional[Path] = None) -> Path:
    # ``root`` is a results directory, as everywhere else; the cache lives beside it
    return (Path(root) if root is not None else results_dir()).parent / CACHE


def regenerate(root: Optional[Path] = None, archs: Sequence[str] = ARCHS) -> pd.DataFrame:
    """Rebuild the table and write it to ``compiled/ptx_table.csv``."""
    df = build_table(archs)
    path = cache_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(path, index=False)
    return df


def table(root: Optional[Path] = None, regenerate_if_missing: bool = False) -> pd.DataFrame:
    """The cached table (empty DataFrame when there is no cache and ``regenerate_if_missing`` is
    False: the report never compiles)."""
    path = cache_path(root)
    if path.exists():
        return pd.read_csv(path)
    if regenerate_if_missing:
        return regenerate(root)
    return pd.DataFrame()


if __name__ == "__main__":
    t0 = time.perf_counter()
    out = regenerate()
    print(out.to_string())
    print(f"wrote {cache_path()} in {time.perf_counter() - t0:.1f} s")
