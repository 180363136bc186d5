"""The decisions behind install.sh, in Python so that they can be tested (tests/workbook/test_packaging.py).

Standard library only: it runs before anything is installed, under whichever Python install.sh
was given. Subcommands (each prints one line, or nothing, on stdout):

  torch                  which torch this interpreter would import, without importing it:
                         ``none``, or ``<build> <version> <accelerator version>`` where build is
                         cuda, rocm or cpu (read from torch/version.py, so a torch whose CUDA
                         libraries cannot load still reports what it is)
  link SITE_PACKAGES     make the virtual environment whose site-packages is SITE_PACKAGES see
                         this interpreter's packages (a .pth file listing its site-packages
                         directories): how a GPU user's torch is reused instead of replaced
  constraints OUT FILE.. merge the constraints FILEs (later files win per package) into OUT for
                         the interpreter running this; when that interpreter has a GPU build of
                         torch, its torch (and the triton beside it) are pinned to what is
                         installed instead of the tested versions, so pip never replaces them
  requirement NAME FILE  the requirement for NAME in the constraints FILE (``NAME`` if none)
  reachable URL [SECONDS]
                         exit status 0 when URL answers (any HTTP status) within SECONDS
                         (default 10), 1 otherwise: install.sh asks PyTorch's CPU index this
                         before pip does, so that an unreachable index costs seconds, not pip's
                         retries

Why a GPU torch is kept: the tested versions (.ci/constraints.txt) are what CI installs on a CPU
machine. A GPU user's torch was picked for their driver and CUDA version; replacing it would
download several GB and may not run on their machine.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import re
import site
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

#: the .pth file that links a GPU user's environment into the lab's virtual environment
LINK_FILE = "_rmsnorm_lab_base_env.pth"
#: packages kept at the installed version when torch is a GPU build: torch, and the triton that
#: torch's wheel pins (a different triton breaks torch.compile with that torch)
KEPT_WITH_GPU_TORCH = ("torch", "triton", "pytorch-triton-rocm")


def normalize(name: str) -> str:
    """PEP 503 name: lower case, runs of -_. as one dash."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(line: str) -> Optional[str]:
    """The package a constraints line constrains, or None for comments, blanks and options."""
    line = line.split("#", 1)[0].strip()
    if not line or line.startswith("-"):
        return None
    m = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line)
    return normalize(m.group(0)) if m else None


# --- torch ----------------------------------------------------------------------------------

def torch_build(version_py: Path) -> Tuple[str, str, str]:
    """``(build, version, accelerator_version)`` from torch/version.py, without importing torch."""
    values: Dict[str, object] = {}
    tree = ast.parse(version_py.read_text(encoding="utf-8"))
    for node in tree.body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and value is not None:
            try:
                values[target.id] = ast.literal_eval(value)
            except ValueError:
                pass
    version = str(values.get("__version__", "unknown"))
    if values.get("cuda"):
        return "cuda", version, str(values["cuda"])
    if values.get("hip"):
        return "rocm", version, str(values["hip"])
    return "cpu", version, "-"


def find_torch() -> Optional[Tuple[str, str, str]]:
    """What ``import torch`` would load in this interpreter (None: no torch)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        version_py = Path(location) / "version.py"
        if version_py.is_file():
            return torch_build(version_py)
    return None


def installed_version(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


# --- linking a GPU user's environment ---------------------------------------------------------

def site_dirs() -> List[str]:
    """This interpreter's package directories, in import order: its site-packages (also those a
    virtual environment with system site packages adds) and the user site when enabled."""
    dirs = [p for p in sys.path if os.path.basename(p.rstrip(os.sep)) in
            ("site-packages", "dist-packages")]
    dirs += site.getsitepackages()
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    seen, out = set(), []
    for d in dirs:
        d = os.path.abspath(d)
        if d not in seen and os.path.isdir(d):
            seen.add(d)
            out.append(d)
    return out


def link(venv_site_packages: Path, dirs: Sequence[str]) -> Path:
    """Write the .pth file. At start-up Python's site module runs its lines, each adding one of
    ``dirs`` after the virtual environment's own site-packages (so what the venv installs comes
    first), with the .pth files in it (editable installs, e.g. a torch built from source): what
    ``python -m venv --system-site-packages`` does, also when the given Python is itself a
    virtual environment (whose packages --system-site-packages would not see)."""
    own = os.path.abspath(venv_site_packages)
    path = Path(venv_site_packages) / LINK_FILE
    path.write_text("".join(f"import site; site.addsitedir({d!r})\n"
                            for d in dirs if os.path.abspath(d) != own))
    return path


# --- constraints -----------------------------------------------------------------------------

def merge_constraints(texts: Sequence[Tuple[str, str]],
                      keep: Dict[str, str]) -> str:
    """One constraints file from ``(source, text)`` pairs; a later source's line for a package
    replaces an earlier one. Packages in ``keep`` (name -> installed version) are pinned to that
    version; a name in ``keep`` with version "" has its line dropped (not installed: pip picks)."""
    lines: Dict[str, str] = {}
    other: List[str] = []
    for source, text in texts:
        for raw in text.splitlines():
            line = raw.split("#", 1)[0].strip()
            name = requirement_name(line)
            if name is None:
                if line and line not in other:
                    other.append(line)  # an option line (e.g. --extra-index-url): kept as is
                continue
            lines[name] = f"{line}  # from {source}"
    out = ["# Written by install.sh (scripts/install_helper.py): the constraints pip installs "
           "under.", *other]
    for name, line in lines.items():
        if name in keep:
            continue
        out.append(line)
    for name, version in keep.items():
        if version:
            out.append(f"{name}=={version}  # installed GPU build: kept, never replaced")
    return "\n".join(out) + "\n"


def kept_packages() -> Dict[str, str]:
    """What must stay as installed here: with a GPU build of torch, torch and its triton."""
    found = find_torch()
    if found is None or found[0] == "cpu":
        return {}
    keep = {}
    for name in KEPT_WITH_GPU_TORCH:
        keep[name] = installed_version(name) or ""
    if not keep["torch"]:  # importable but no metadata (a source build): pin what it says
        keep["torch"] = found[1]
    return keep


def release(version: str) -> Tuple[int, ...]:
    """The release numbers of a version: "2.11.0+cu128" -> (2, 11, 0), "2.6.0a0" -> (2, 6, 0)."""
    out = []
    for part in version.split("+")[0].split("."):
        m = re.match(r"\d+", part)
        if not m:
            break
        out.append(int(m.group(0)))
        if m.group(0) != part:
            break
    return tuple(out)


def lower_bound(name: str, pyproject: Path) -> Optional[str]:
    """The ``>=`` bound of ``name`` among pyproject.toml's dependencies (extras included)."""
    import tomllib

    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    deps = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        deps += extra
    for spec in deps:
        if requirement_name(spec) == normalize(name):
            m = re.search(r">=\s*([0-9][^,;\s]*)", spec)
            return m.group(1) if m else None
    return None


def too_old(keep: Dict[str, str], pyproject: Path) -> Optional[str]:
    """Why a kept GPU torch cannot serve the lab (older than pyproject's bound), or None."""
    version = keep.get("torch")
    bound = lower_bound("torch", pyproject) if version else None
    if bound and release(version) < release(bound):
        return (f"your torch {version} (a GPU build, kept as installed) is older than the lab "
                f"needs (torch>={bound}, pyproject.toml): upgrade it in that Python (the "
                "PyTorch site's install line for your CUDA version), or remove .venv and run "
                "install.sh with "
                "PYTHON=<a python without torch> to install the tested build in .venv")
    return None


def requirement(name: str, text: str) -> str:
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if requirement_name(line) == normalize(name):
            return line
    return name


def reachable(url: str, timeout: float = 10.0) -> bool:
    """Does ``url`` answer within ``timeout`` seconds (connect and first response)? Any HTTP
    status counts as an answer; proxies are those of the environment, as pip's are."""
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):  # URLError, timeouts, refused, bad URL
        return False


def main(argv: Sequence[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, args = argv[0], list(argv[1:])
    if cmd == "torch" and not args:
        found = find_torch()
        print("none" if found is None else " ".join(found))
    elif cmd == "link" and len(args) == 1:
        link(Path(args[0]), site_dirs())
    elif cmd == "constraints" and len(args) >= 2:
        out, files = Path(args[0]), args[1:]
        texts = [(f, Path(f).read_text(encoding="utf-8")) for f in files]
        keep = kept_packages()
        problem = too_old(keep, Path(__file__).resolve().parent.parent / "pyproject.toml")
        if problem:
            print(f"[install] error: {problem}", file=sys.stderr)
            return 3
        out.write_text(merge_constraints(texts, keep))
        if keep:
            print(", ".join(f"{n} {v}" for n, v in keep.items() if v))
    elif cmd == "requirement" and len(args) == 2:
        print(requirement(args[0], Path(args[1]).read_text(encoding="utf-8")))
    elif cmd == "reachable" and len(args) in (1, 2):
        return 0 if reachable(args[0], float(args[1]) if len(args) == 2 else 10.0) else 1
    else:
        print(f"usage: {Path(__file__).name} torch | link SITE_PACKAGES | constraints OUT FILE... "
              "| requirement NAME FILE | reachable URL [SECONDS]", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
