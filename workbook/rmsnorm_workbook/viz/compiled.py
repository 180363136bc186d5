"""What the compiler made of a kernel, read without a GPU: the PTX and the cubin CuTe DSL keeps
(``--keep-ptx --keep-cubin``), the PTX through ``rmsnorm_lab.cute.inspect_ptx.ptx_facts``, the
cubin through ``cuobjdump`` (registers, stack, shared memory, SASS); it is the cubin a GPU would
load."""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Dict, Iterable, Optional, Sequence

import pandas as pd

from .recorded import RECORDED_GPU, TEACH_PREFIX, recorded_sass


def target_arch() -> str:
    """The compile target: the GPU's (``sm_90a`` on an H100/H200) or, without one,
    ``CUTE_DSL_ARCH`` (the notebooks set ``sm_90a``: the H200 the results were recorded on)."""
    import torch
    if torch.cuda.is_available():
        from rmsnorm_lab.lab import arch_name
        return arch_name(*torch.cuda.get_device_capability())
    return os.environ.get("CUTE_DSL_ARCH", "sm_90a")


def _tool(name: str) -> Optional[str]:
    """``cuobjdump``/``nvdisasm``: on PATH, in a CUDA toolkit, or the copy Triton ships."""
    found = shutil.which(name)
    if found:
        return found
    for path in sorted(glob.glob(f"/usr/local/cuda*/bin/{name}"), reverse=True):
        return path
    try:
        import triton
        path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
        if os.path.exists(path):
            return path
    except ImportError:
        pass
    return None


def tool_version(name: str = "cuobjdump") -> str:
    path = _tool(name)
    if path is None:
        return "none"
    out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else "unknown"


_SASS_MEM = re.compile(r"\b(LDG|STG|LDL|STL|LDS|STS)(\.[A-Z0-9_]+)*")


@dataclasses.dataclass
class Compiled:
    """One kernel compiled for one row width: its PTX and cubin, read."""
    name: str
    N: int
    arch: str
    ptx: str = dataclasses.field(repr=False)
    sass: str = dataclasses.field(repr=False)  # "" when no cuobjdump was found
    registers: Optional[int] = None
    stack_bytes: Optional[int] = None           # spilled registers live here
    smem_bytes: Optional[int] = None
    ptx_ld16: int = 0       # ld.global of 16 bytes (v4.b32 ...), static count in the PTX
    ptx_ld_narrow: int = 0  # narrower ld.global
    ptx_st16: int = 0
    ptx_shfl: int = 0
    ptx_bar: int = 0

    def sass_counts(self) -> Dict[str, int]:
        """Static count of each memory instruction form in the SASS (``LDG.E.128``, ``STL``...)."""
        counts: Dict[str, int] = {}
        for m in _SASS_MEM.finditer(self.sass):
            counts[m.group(0)] = counts.get(m.group(0), 0) + 1
        return dict(sorted(counts.items()))

    def spills(self) -> Optional[int]:
        """Spill instructions (STL + LDL) in the SASS; None without a SASS listing."""
        if not self.sass:
            return None
        c = self.sass_counts()
        return sum(v for k, v in c.items() if k.startswith(("STL", "LDL")))

    def row(self) -> dict:
        """The facts a learner reads, as one table row."""
        c = self.sass_counts()
        wide = sum(v for k, v in c.items() if k.startswith("LDG") and k.endswith(".128"))
        narrow = sum(v for k, v in c.items() if k.startswith("LDG") and not k.endswith(".128"))
        return {"kernel": self.name, "N": self.N,
                "PTX ld.global 16 B": self.ptx_ld16, "PTX ld.global narrower": self.ptx_ld_narrow,
                "PTX st.global 16 B": self.ptx_st16, "shfl.sync": self.ptx_shfl,
                "bar.sync": self.ptx_bar,
                "SASS LDG.E.128": wide if self.sass else None,
                "SASS narrower LDG": narrow if self.sass else None,
                "registers": self.registers, "spill STL+LDL": self.spills(),
                "stack bytes": self.stack_bytes}

    def excerpt(self, patterns: Sequence[str] = ("LDG", "STG", "STL", "LDL"),
                limit: int = 8) -> str:
        """The SASS lines holding any of ``patterns`` (their addresses and encodings dropped),
        at most ``limit``, with a count of the rest."""
        if not self.sass:
            recorded = recorded_sass(f"{TEACH_PREFIX}{self.name}")
            if recorded:
                return ("(no cuobjdump here: the excerpt recorded on the "
                        f"{RECORDED_GPU.upper()})\n{recorded}")
            return "(no SASS: cuobjdump was not found)"
        rx = re.compile(r"\b(" + "|".join(re.escape(p) for p in patterns) + r")")
        lines = []
        for line in self.sass.splitlines():
            m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;", line)
            if m and rx.search(m.group(1)):
                lines.append("    " + re.sub(r"\s+", " ", m.group(1)))
        shown = lines[:limit]
        if len(lines) > limit:
            shown.append(f"    ... and {len(lines) - limit} more")
        return "\n".join(shown) if shown else "(none)"


def read_compiled(dump_dir: str, name: str, N: int, arch: str) -> Compiled:
    """Read the PTX and cubin CuTe DSL kept in ``dump_dir`` (one kernel compiled there)."""
    from rmsnorm_lab.lab import ptx_facts

    ptx_paths = glob.glob(os.path.join(dump_dir, "*.ptx"))
    cubins = glob.glob(os.path.join(dump_dir, "*.cubin"))
    if len(ptx_paths) != 1:
        raise RuntimeError(f"expected one PTX file in the dump directory, found {len(ptx_paths)}")
    ptx = Path(ptx_paths[0]).read_text()
    f = ptx_facts(ptx, arch)
    every_load = len(re.findall(r"\bld\.global\b", ptx))
    out = Compiled(name, N, arch, ptx, "", ptx_ld16=f.global_loads_16B,
                   ptx_ld_narrow=every_load - f.global_loads_16B, ptx_st16=f.global_stores_16B,
                   ptx_shfl=f.shuffles, ptx_bar=f.barriers)
    tool = _tool("cuobjdump")
    if cubins and tool:
        res = subprocess.run([tool, "-res-usage", cubins[0]], capture_output=True, text=True)
        m = re.search(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)", res.stdout)
        if m:
            out.registers, out.stack_bytes, out.smem_bytes = (int(v) for v in m.groups())
        out.sass = subprocess.run([tool, "-sass", cubins[0]], capture_output=True,
                                  text=True).stdout
    else:  # no cuobjdump: registers from ptxas -v where one is installed
        from rmsnorm_lab.lab import ptxas_report
        try:
            rep = ptxas_report(ptx_paths[0], arch)
        except (RuntimeError, OSError):
            rep = None
        if rep is not None:
            out.registers, out.stack_bytes = rep["registers"], rep["stack_bytes"]
    return out


def inspect(compile_fn: Callable, launcher, fake_args, name: str, N: int,
            arch: Optional[str] = None) -> Compiled:
    """Compile ``launcher`` for rows of ``N`` with ``compile_fn(launcher, fake_args, arch,
    dump_dir)`` (the notebook's ``compile_for``), keeping its PTX and cubin, and read them."""
    arch = arch or target_arch()
    with tempfile.TemporaryDirectory() as d:
        compile_fn(launcher, fake_args, arch, d)
        return read_compiled(d, name, N, arch)


def compiled_table(items: Iterable[Compiled]) -> pd.DataFrame:
    """One row per compiled kernel (``Compiled.row``), without the columns that are all empty."""
    df = pd.DataFrame([c.row() for c in items]).set_index(["kernel", "N"])
    return df.dropna(axis=1, how="all")
