"""The committed notebooks carry their outputs, executed on the recorded results; this keeps
them honest.

    python3 scripts/notebooks.py refresh [NOTEBOOK ...]   # execute in place on the recorded results
    python3 scripts/notebooks.py check [NOTEBOOK ...]     # exit 1 if any is stale
    python3 scripts/notebooks.py live --out DIR [NOTEBOOK ...]  # on a GPU, as plain scripts

``check`` fails a notebook that has no outputs, holds an error, or whose text outputs (streams,
text/plain, text/markdown) differ from a fresh execution on the recorded results; figures are not
compared, nor the text of a cell tagged ``machine`` (it prints what this machine's tools say, such
as the version of the ``ptxas`` on PATH), which must still run without an error. Both run each notebook from the ``notebooks/`` folder with ``CUDA_VISIBLE_DEVICES`` empty,
so a GPU machine also executes the recorded path.

``live`` runs each notebook as a plain Python script with the GPU visible (no Jupyter needed: the
code cells in order), from ``notebooks/``, so the lessons measure live and write what they
measure as they do in Jupyter (``results/<gpu>/teach-*.csv``...). Each script's output goes to
``DIR/<notebook>.log`` and its figures to ``DIR/`` (``LESSON_FIG_DIR``); exit 1 if any failed.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional


ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
TIMEOUT_S = 900
TEXT_TYPES = ("text/plain", "text/markdown")


def notebooks(names: Optional[List[str]] = None) -> List[Path]:
    if names:
        return [Path(n).resolve() for n in names]
    return sorted(NOTEBOOKS.glob("*.ipynb"))


def execute(nb: "nbformat.NotebookNode", cwd: Path) -> "nbformat.NotebookNode":
    """``nb`` executed on the recorded results (no GPU visible), outputs in place."""
    from nbclient import NotebookClient
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", MPLBACKEND="module://matplotlib_inline"
               ".backend_inline", PYTHONHASHSEED="0")
    saved = os.environ.copy()
    os.environ.update(env)
    try:
        NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3",
                       resources={"metadata": {"path": str(cwd)}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return nb


#: the tag of a cell whose printed text depends on the machine's tools (not compared)
MACHINE_TAG = "machine"


def text_outputs(nb: "nbformat.NotebookNode") -> List[List[str]]:
    """Per code cell, its text outputs in order (figures and execution counts left out; a cell
    tagged ``machine`` counts as having none)."""
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        texts = []
        if MACHINE_TAG in cell.get("metadata", {}).get("tags", []):
            cells.append(texts)
            continue
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                texts.append(f"[{out.name}] " + "".join(out.text).rstrip())
            elif out.output_type in ("execute_result", "display_data"):
                for kind in TEXT_TYPES:
                    if kind in out.get("data", {}):
                        texts.append(f"[{kind}] " + "".join(out.data[kind]).rstrip())
            elif out.output_type == "error":
                texts.append(f"[error] {out.ename}: {out.evalue}")
        cells.append(texts)
    return cells


def problems(path: Path) -> List[str]:
    """Why the committed ``path`` is stale, or nothing."""
    import nbformat
    committed = nbformat.read(path, as_version=4)
    found = []
    code = [c for c in committed.cells if c.cell_type == "code"]
    if code and not any(c.get("outputs") for c in code):
        found.append("holds no outputs: run `python3 scripts/notebooks.py refresh`")
    for i, c in enumerate(code):
        for out in c.get("outputs", []):
            if out.output_type == "error":
                found.append(f"code cell {i} holds an error: {out.ename}: {out.evalue}")
    if found:
        return found
    fresh = execute(copy.deepcopy(committed), path.parent)
    old, new = text_outputs(committed), text_outputs(fresh)
    for i, (a, b) in enumerate(zip(old, new)):
        if a != b:
            diff = "\n".join(difflib.unified_diff("\n".join(a).splitlines(),
                                                  "\n".join(b).splitlines(), "committed",
                                                  "fresh", lineterm="", n=1))
            found.append(f"code cell {i}'s text outputs differ from a fresh run:\n{diff}")
    return found


def refresh(path: Path) -> None:
    import nbformat
    nb = execute(nbformat.read(path, as_version=4), path.parent)
    nbformat.write(nb, path)


def as_script(path: Path) -> str:
    """The notebook's code cells, in order, as one Python script (read with json alone)."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    code = ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in cells if c["cell_type"] == "code"]
    return "\n\n".join(code) + "\n"


def live(paths: List[Path], out: Path) -> int:
    """Each notebook run as a script with the GPU visible; logs and figures in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for path in paths:
        script = out / f"{path.stem}.py"
        script.write_text(as_script(path), encoding="utf-8")
        env = dict(os.environ, LESSON_FIG_DIR=str(out), MPLBACKEND="Agg",
                   PYTHONUNBUFFERED="1")
        started = time.perf_counter()
        with open(out / f"{path.stem}.log", "w", encoding="utf-8") as log:
            status = subprocess.run([sys.executable, str(script)], cwd=path.parent, env=env,
                                    stdout=log, stderr=subprocess.STDOUT).returncode
        failed += status != 0
        print(f"{path.name}: {'ok' if status == 0 else f'FAILED (exit {status})'} in "
              f"{time.perf_counter() - started:.0f} s; log {out / (path.stem + '.log')}")
    return 1 if failed else 0


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("refresh", "check", "live"))
    p.add_argument("notebooks", nargs="*", help="default: every notebook in notebooks/")
    p.add_argument("--out", type=Path, help="live: where the logs and figures go")
    args = p.parse_intermixed_args(argv)
    if args.command == "live":
        if args.out is None:
            p.error("live needs --out DIR")
        return live(notebooks(args.notebooks), args.out.resolve())
    failed = 0
    for path in notebooks(args.notebooks):
        if args.command == "refresh":
            refresh(path)
            print(f"refreshed {path.relative_to(ROOT) if ROOT in path.parents else path}")
            continue
        found = problems(path)
        failed += bool(found)
        print(f"{path.name}: " + ("up to date" if not found else "STALE"))
        for f in found:
            print("  " + f.replace("\n", "\n  "))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
