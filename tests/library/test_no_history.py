"""The library's and the workbook's source state rules and reasons, not their history: no commit-hashed result paths,
no citations of the old lab notes, no section marks, no "used to". Where a comment needs evidence
it names an entry of the design record (``docs/design-record.md, 'Entry name'``), which must
exist as a heading there; the record itself stays short."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (ROOT / "rmsnorm_lab", ROOT / "workbook" / "rmsnorm_workbook")
RECORD = ROOT / "docs" / "design-record.md"
SUFFIXES = (".py", ".h", ".cpp")
MAX_RECORD_LINES = 400

HISTORY = {
    # "-d1797d7.csv", and a hash a wrapped comment starts its line with
    "a commit-hashed result path": re.compile(r"(?<![\w.])[0-9a-f]{7,12}\.(?:csv|jsonl|txt)\b"),
    "the old lab notes": re.compile(r"NOTES\.md"),
    "a section mark": re.compile("§"),
    "'used to'": re.compile(r"\bused to\b", re.IGNORECASE),
}
#: a pointer into the design record: ``design-record.md, 'Entry name'`` on one line
POINTER = re.compile(r"design-record\.md, '([^']+)'")


def library_sources():
    files = [p for package in PACKAGES for p in sorted(package.rglob("*"))
             if p.suffix in SUFFIXES and p.is_file()]
    assert files, "no library sources found"
    return files


def record_entries():
    return {line[3:].strip() for line in RECORD.read_text(encoding="utf-8").splitlines()
            if line.startswith("## ")}


@pytest.mark.parametrize("what", sorted(HISTORY))
def test_library_source_carries_no_history(what):
    found = []
    for path in library_sources():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if HISTORY[what].search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not found, f"{what} in the library:\n" + "\n".join(found)


def test_the_design_record_is_short():
    lines = RECORD.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_RECORD_LINES, len(lines)
    assert len(record_entries()) >= 10  # one entry per decision: there are many


def test_every_entry_a_comment_names_is_in_the_design_record():
    entries = record_entries()
    named, missing, loose = 0, [], []
    for path in library_sources():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "design-record" not in line:
                continue
            pointers = POINTER.findall(line)
            if not pointers:  # a mention the check cannot read: keep the name on the line
                loose.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
            for name in pointers:
                named += 1
                if name not in entries:
                    missing.append(f"{path.relative_to(ROOT)}:{n}: {name!r}")
    assert not loose, "write design-record.md, 'Entry name' on one line:\n" + "\n".join(loose)
    assert not missing, "entries named in the library but not in docs/design-record.md:\n" \
        + "\n".join(missing)
    assert named, "no library comment points into the design record"
