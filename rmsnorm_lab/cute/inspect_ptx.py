"""Reading what the CuTe compiler produced, without a GPU: kept PTX and ``ptxas -v``.

Used by the CPU tests (16-byte global accesses present, no local memory, no spills) and by the
cross-GPU notebook's compiled-code table.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tempfile
import dataclasses
from dataclasses import dataclass
from typing import List, Optional


@dataclass
class PtxFacts:
    arch: str
    global_loads_16B: int
    global_loads_scalar: int
    global_stores_16B: int
    local_accesses: int
    shuffles: int
    barriers: int
    grid_dependency_waits: int = 0   # griddepcontrol.wait (programmatic dependent launch)
    dependents_triggers: int = 0     # griddepcontrol.launch_dependents
    registers: Optional[int] = None
    spill_bytes: Optional[int] = None
    stack_bytes: Optional[int] = None
    smem_bytes: Optional[int] = None
    ptx: str = dataclasses.field(default="", repr=False)


# A 16-byte access is spelled v4 of 32-bit, v2 of 64-bit (what sm_100a's PTX uses for fp32 rows)
# or v8 of 16-bit words.
_WIDE = r"(?:\.v4\.[bfsu]32|\.v2\.[bfsu]64|\.v8\.[bfsu]16|\.b128)\s"


def ptx_facts(ptx: str, arch: str) -> PtxFacts:
    return PtxFacts(
        arch=arch,
        global_loads_16B=len(re.findall(r"\bld\.global(?:\.(?:nc|ca|cg|cs|lu|L1::\w+|L2::\w+))*"
                                       + _WIDE, ptx)),
        global_loads_scalar=len(re.findall(r"\bld\.global(?:\.(?!v\d)[\w:]+)*\s", ptx)),
        global_stores_16B=len(re.findall(r"\bst\.global(?:\.(?:cg|cs|wb|wt|L1::\w+|L2::\w+))*"
                                        + _WIDE, ptx)),
        local_accesses=len(re.findall(r"\b(?:ld|st)\.local\b", ptx)) + ptx.count(".local "),
        shuffles=len(re.findall(r"\bshfl\.sync\b", ptx)),
        barriers=len(re.findall(r"\bbar\.sync\b|\bbarrier\.sync\b", ptx)),
        grid_dependency_waits=len(re.findall(r"\bgriddepcontrol\.wait\b", ptx)),
        dependents_triggers=len(re.findall(r"\bgriddepcontrol\.launch_dependents\b", ptx)),
    )


def waits_before_global_access(ptx: str) -> bool:
    """Does griddepcontrol.wait come before the first global load or store in the PTX text?
    (The kernels are straight-line up to that point: no branch can reach a global access first.)"""
    wait = re.search(r"\bgriddepcontrol\.wait\b", ptx)
    access = re.search(r"\b(?:ld|st)\.global\b", ptx)
    return wait is not None and (access is None or wait.start() < access.start())


def _tool_paths(tool: str, *first: Optional[str]) -> List[str]:
    """Where a CUDA tool may be, in order: ``first``, PATH, /usr/local/cuda*, then the copy
    Triton ships; only paths that exist."""
    candidates = [*first, shutil.which(tool)]
    candidates += sorted(glob.glob(f"/usr/local/cuda*/bin/{tool}"), reverse=True)
    try:
        import triton
        candidates.append(os.path.join(os.path.dirname(triton.__file__),
                                       f"backends/nvidia/bin/{tool}"))
    except ImportError:
        pass
    return [path for path in candidates if path and os.path.exists(path)]


def find_ptxas(ptx_version: str) -> Optional[str]:
    """A ptxas new enough for the PTX's ``.version`` (CUDA 12.9+ for PTX 8.8), or None."""
    want = tuple(int(v) for v in ptx_version.split("."))
    for path in _tool_paths("ptxas", os.environ.get("PTXAS")):
        out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
        m = re.search(r"release (\d+)\.(\d+)", out)
        if not m:
            continue
        cuda = (int(m.group(1)), int(m.group(2)))
        # PTX ISA 8.8 shipped with CUDA 12.9; 9.x with CUDA 13.x.
        ptx_max = (9, cuda[1]) if cuda[0] >= 13 else (8, max(0, cuda[1] - 1))
        if want <= ptx_max:
            return path
    return None


def find_nvdisasm() -> Optional[str]:
    """An ``nvdisasm`` (CUDA's, else the one Triton ships), or None."""
    return next(iter(_tool_paths("nvdisasm")), None)


def _ptxas_for(ptx_path: str) -> Optional[str]:
    """A ptxas for the PTX file's ``.version`` (``find_ptxas``), or None."""
    with open(ptx_path) as f:
        return find_ptxas(re.search(r"^\.version\s+(\S+)", f.read(), re.M).group(1))


def ptxas_report(ptx_path: str, arch: str) -> Optional[dict]:
    """Registers, spill and stack bytes from ``ptxas -v``; None when no suitable ptxas exists."""
    ptxas = _ptxas_for(ptx_path)
    if ptxas is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        res = subprocess.run([ptxas, f"-arch={arch}", "-v", ptx_path, "-o",
                              os.path.join(tmp, "k.cubin")], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"ptxas failed on {ptx_path}:\n{res.stderr}")
    log = res.stderr + res.stdout
    regs = max(int(r) for r in re.findall(r"Used (\d+) registers", log))
    spills = sum(int(a) + int(b) for a, b in
                 re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log))
    stack = max((int(s) for s in re.findall(r"(\d+) bytes stack frame", log)), default=0)
    smem = max((int(s) for s in re.findall(r"(\d+) bytes smem", log)), default=0)
    return {"registers": regs, "spill_bytes": spills, "stack_bytes": stack, "smem_bytes": smem}


def sass(ptx_path: str, arch: str) -> Optional[str]:
    """The machine code ptxas makes of the PTX, as ``nvdisasm`` prints it; None when no
    suitable ptxas and nvdisasm exist."""
    ptxas, nvdisasm = _ptxas_for(ptx_path), find_nvdisasm()
    if ptxas is None or nvdisasm is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        subprocess.run([ptxas, f"-arch={arch}", ptx_path, "-o", cubin], check=True,
                       capture_output=True)
        return subprocess.run([nvdisasm, "-c", cubin], check=True, capture_output=True,
                              text=True).stdout


def compile_and_inspect(plan, arch: str) -> PtxFacts:
    """Compile a forward or backward ``plan`` for ``arch`` with the PTX kept, and read the facts
    off it (``facts.ptx`` holds the text)."""
    from .plan.forward import ForwardPlan
    if isinstance(plan, ForwardPlan):
        from .launch.forward import compile_forward as compile_with_ptx
    else:
        from .launch.backward import compile_backward as compile_with_ptx
    with tempfile.TemporaryDirectory() as tmp:
        compile_with_ptx(plan, arch, keep_ptx_dir=tmp)
        paths = glob.glob(os.path.join(tmp, f"*.{arch}.ptx")) or glob.glob(
            os.path.join(tmp, "*.ptx"))
        if len(paths) != 1:
            raise RuntimeError(f"expected one kept PTX file in {tmp}, found {paths}")
        with open(paths[0]) as f:
            ptx = f.read()
        report = ptxas_report(paths[0], arch)
    facts = ptx_facts(ptx, arch)
    facts.ptx = ptx
    if report is not None:
        for name, value in report.items():
            setattr(facts, name, value)
    return facts
