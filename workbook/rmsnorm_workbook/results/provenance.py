"""Where a measurement came from: the GPU, the software stack and the lab's own commit.

Every row of a results file carries these fields (see ``results.PROVENANCE_COLUMNS``), so a number
can always be traced back to the machine and code that produced it.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict, Optional, Union

import torch

from ..paths import REPO as REPO_ROOT  # ``git`` runs there

# Matched as whole words of the device name, so "gh200" is not read as "h200".
_KNOWN_GPUS = frozenset({"gb300", "gb200", "b300", "b200", "b100", "gh200", "h200", "h100", "h20",
                         "a100", "a10g", "a10", "l40s", "l40", "l4", "v100", "t4"})


#: form factors that differ in bandwidth under one chip name: the H100's PCIe card has 2.0 TB/s
#: to the SXM part's 3.35, so their results must not share a directory
_FORMS = {"h100": ("sxm", {"pcie": "pcie", "nvl": "nvl"}), "h200": ("", {"nvl": "nvl"})}


def gpu_slug(name: str) -> str:
    """A short lower-case name for a GPU, used as the results directory and the ``gpu`` column
    (and as the key of its datasheet figures, ``analysis.specs``).

    ``"NVIDIA H200"`` -> ``"h200"``, ``"NVIDIA H100 80GB HBM3"`` -> ``"h100_sxm"``,
    ``"NVIDIA H100 PCIe"`` -> ``"h100_pcie"``; an unknown name becomes its own sanitized form
    (``"NVIDIA RTX 6000 Ada"`` -> ``"rtx-6000-ada"``).
    """
    low = name.lower().replace("nvidia", " ")
    tokens = [t for t in re.split(r"[^a-z0-9]+", low) if t]
    for tok in tokens:
        if tok in _KNOWN_GPUS:
            default, forms = _FORMS.get(tok, ("", {}))
            form = next((forms[t] for t in tokens if t in forms), default)
            return f"{tok}_{form}" if form else tok
    slug = re.sub(r"[^a-z0-9]+", "-", low).strip("-")
    return slug or "unknown"


def gpu_title(gpu: str) -> str:
    """A results slug (``gpu_slug``) as text names the GPU: ``h200`` -> H200, ``h100_sxm`` ->
    H100 SXM, ``h100_pcie`` -> H100 PCIe."""
    return gpu.upper().replace("_", " ").replace("PCIE", "PCIe")


def _run(cmd, cwd: Optional[Path] = None) -> Optional[str]:
    """stdout of a command, or None when it is missing or fails (provenance never crashes)."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _driver(index: int) -> str:
    out = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader",
                "-i", str(index)])
    if out:
        return out.splitlines()[0].strip()
    # Without nvidia-smi the driver is unknown; the CUDA runtime torch was built for is a hint.
    return f"unknown (cuda {torch.version.cuda})" if torch.version.cuda else "unknown"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def _cutlass_dsl() -> str:
    # Distribution metadata first: importing cutlass costs seconds and is not needed for a string.
    version = _version("nvidia-cutlass-dsl")
    if version != "none":
        return version
    try:
        import cutlass
    except Exception:  # noqa: BLE001 - any failure to import means "not usable here"
        return "none"
    return str(getattr(cutlass, "__version__", "none"))


def commit() -> str:
    """The commit the measured code came from: ``LAB_COMMIT`` when the caller names it (a copy of
    the tree shipped to a GPU host, whose own ``.git``, if any, need not match what was shipped);
    otherwise ``git rev-parse --short=12 HEAD`` of the lab's repository, ``+dirty`` when tracked
    files differ from it; ``unknown`` outside a git checkout (e.g. an installed wheel)."""
    named = os.environ.get("LAB_COMMIT")
    if named:
        return named
    head = _run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO_ROOT)
    if not head:
        return "unknown"
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT)
    return head + ("+dirty" if status else "")


def collect(device: Union[None, int, str, torch.device] = None) -> Dict[str, object]:
    """The provenance fields of a results row, for ``device`` (default: the current CUDA device).

    Without CUDA it still answers (``gpu="cpu"``, ``sm_count=0``) so that CPU tooling and tests
    can call it; the bench itself refuses to run there.
    """
    if torch.cuda.is_available():
        dev = torch.device("cuda", torch.cuda.current_device()) if device is None \
            else torch.device(device)
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        gpu, sm_count, driver = gpu_slug(props.name), int(props.multi_processor_count), \
            _driver(index)
    else:
        gpu, sm_count, driver = "cpu", 0, _driver(0)
    return {
        "gpu": gpu,
        "sm_count": sm_count,
        "driver": driver,
        "torch": torch.__version__,
        "triton": _version("triton"),
        "cutlass_dsl": _cutlass_dsl(),
        "commit": commit(),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
