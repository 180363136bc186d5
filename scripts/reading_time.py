"""How long the committed notebooks take to read carefully, by one fixed measure.

    python3 scripts/reading_time.py [NOTEBOOK ...]     # a table; exit 1 if a budget is missed

The measure: 130 words a minute of prose (markdown, plus the text that outputs print: streams,
text/plain and text/markdown, a figure's own text/plain excepted), 15 lines a minute of analysis
code, 6 lines a minute of kernel code (a code cell that defines a ``@cute.kernel``, ``@cute.jit``
or ``@triton.jit``), 1.5 minutes a figure. A lesson is at most 60 minutes; the five together at
most 180.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parent.parent
LESSON_MAX_MIN = 60
WORKBOOK_MAX_MIN = 180
WORDS_A_MIN, ANALYSIS_LINES_A_MIN, KERNEL_LINES_A_MIN, FIGURE_MIN = 130, 15, 6, 1.5
KERNEL = re.compile(r"@cute\.(kernel|jit)|@triton\.jit")


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _lines(cells: List[str]) -> int:
    return sum(c.count("\n") + 1 for c in cells if c.strip())


def _printed(output) -> str:
    data = output.get("data", {})
    text = "".join(output.get("text", "")) + "".join(data.get("text/markdown", ""))
    if "image/png" not in data:  # a figure's text/plain is its repr, not read
        text += "".join(data.get("text/plain", ""))
    return text


def measure(path: Path) -> Dict[str, float]:
    """The counts of one notebook and the minutes they take."""
    cells = json.loads(Path(path).read_text())["cells"]
    markdown = "\n".join(_source(c) for c in cells if c["cell_type"] == "markdown")
    code = [_source(c) for c in cells if c["cell_type"] == "code"]
    kernel = [c for c in code if KERNEL.search(c)]
    analysis = [c for c in code if not KERNEL.search(c)]
    printed = " ".join(_printed(o) for c in cells for o in c.get("outputs", []))
    figures = sum(1 for c in cells for o in c.get("outputs", [])
                  if "image/png" in o.get("data", {}))
    row = {
        "markdown words": len(re.findall(r"\w+", markdown)),
        "printed words": len(re.findall(r"\w+", printed)),
        "analysis lines": _lines(analysis),
        "kernel lines": _lines(kernel),
        "figures": figures,
        "longest analysis cell": max((c.count("\n") + 1 for c in analysis if c.strip()),
                                     default=0),
    }
    row["minutes"] = ((row["markdown words"] + row["printed words"]) / WORDS_A_MIN
                      + row["analysis lines"] / ANALYSIS_LINES_A_MIN
                      + row["kernel lines"] / KERNEL_LINES_A_MIN + FIGURE_MIN * figures)
    return row


def main(argv: List[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    paths = [Path(a) for a in argv] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    rows = {p.stem: measure(p) for p in paths}
    cols = ["markdown words", "printed words", "analysis lines", "kernel lines", "figures",
            "longest analysis cell", "minutes"]
    print("| notebook | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for name, row in rows.items():
        print(f"| {name} | " + " | ".join(f"{row[c]:.0f}" for c in cols) + " |")
    total = sum(r["minutes"] for r in rows.values())
    print(f"total: {total:.0f} min (a lesson at most {LESSON_MAX_MIN}, the workbook at most "
          f"{WORKBOOK_MAX_MIN})")
    over = [n for n, r in rows.items() if r["minutes"] > LESSON_MAX_MIN]
    return 1 if over or (not argv and total > WORKBOOK_MAX_MIN) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
