"""Checks the shape of the two packages: no import cycle; the library (``rmsnorm_lab``) never
importing the workbook (``rmsnorm_workbook``); the workbook reaching the library through its
public modules only (``PUBLIC``); no source file over 500 lines; at most 9 modules beside the
packages at the top of the library.

    python3 scripts/check_layers.py          # prints what it found; exit status 1 on a breach

Imports are read from the source (``ast``), at any depth in a module (a function's lazy import
counts), so nothing is imported to check.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Dict, List, Set

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "rmsnorm_lab"
#: the workbook: it imports the library, the library never imports it
WORKBOOK = "rmsnorm_workbook"
#: where each package's sources are
SOURCES = {PACKAGE: ROOT / PACKAGE, WORKBOOK: ROOT / "workbook" / WORKBOOK}
#: the library modules the workbook may import: the top-level names, the oracle, the settings,
#: and the workbook's surface (rmsnorm_lab/lab.py)
PUBLIC = (PACKAGE, f"{PACKAGE}.reference", f"{PACKAGE}.settings", f"{PACKAGE}.lab")
#: the library's command-line entry point hands over to the workbook by name; nothing imports it
ENTRY = f"{PACKAGE}.__main__"
#: modules beside __init__/__main__ at the top of the package
MAX_TOP_MODULES = 9
MAX_LINES = 500


def module_name(path: Path) -> str:
    top = next(name for name, src in SOURCES.items() if path.is_relative_to(src))
    parts = (top,) + path.relative_to(SOURCES[top]).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, name: str) -> Set[str]:
    """The two packages' modules ``path`` imports (relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith(tuple(SOURCES)))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if not base.startswith(tuple(SOURCES)):
                continue
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return found


def graph() -> Dict[str, Set[str]]:
    files = {module_name(p): p for src in SOURCES.values() for p in src.rglob("*.py")}
    return {name: {m for m in imports_of(path, name) if m in files and m != name}
            for name, path in files.items()}


def cycles(edges: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components of more than one module (Tarjan). A package importing
    its own submodule is not a cycle of layers, so those edges are left out."""
    edges = {a: {b for b in bs if not b.startswith(a + ".")} for a, bs in edges.items()}
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def layer_breaches(edges: Dict[str, Set[str]]) -> List[str]:
    """Library modules that import the workbook, and workbook modules that import a library
    module outside ``PUBLIC``."""
    found = []
    for m in sorted(edges):
        for t in sorted(edges[m]):
            if _in(m, PACKAGE) and m != ENTRY and _in(t, WORKBOOK):
                found.append(f"{m} imports {t}")
            elif _in(m, WORKBOOK) and _in(t, PACKAGE) and t not in PUBLIC:
                found.append(f"{m} imports {t}, not a public module of the library")
    return found


def long_files() -> List[str]:
    sources = [p for src in SOURCES.values() for ext in ("py", "cpp", "h")
               for p in src.rglob(f"*.{ext}")]
    sources += list((ROOT / "tests").rglob("*.py")) + list((ROOT / "scripts").glob("*.py"))
    return [f"{p.relative_to(ROOT)}: {n} lines" for p in sorted(sources)
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES]


def top_modules() -> List[str]:
    return sorted(p.name for p in (ROOT / PACKAGE).glob("*.py")
                  if p.name not in ("__init__.py", "__main__.py"))


def main() -> int:
    edges = graph()
    problems = [f"import cycle: {' <-> '.join(c)}" for c in cycles(edges)]
    problems += [f"layer: {b}" for b in layer_breaches(edges)]
    problems += [f"too long: {f}" for f in long_files()]
    top = top_modules()
    if len(top) > MAX_TOP_MODULES:
        problems.append(f"{len(top)} modules at the top of {PACKAGE}/ (at most "
                        f"{MAX_TOP_MODULES}): {', '.join(top)}")
    print(f"{len(edges)} modules, {sum(map(len, edges.values()))} imports between them; "
          f"{len(top)} at the top: {', '.join(top)}")
    for p in problems:
        print(p)
    print("ok" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
