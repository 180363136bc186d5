"""The README is short, starts with the code, and its headline table is the recorded results'."""

import re
from pathlib import Path

from rmsnorm_workbook import results
from rmsnorm_workbook.analysis import headline

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def test_the_readme_is_short_and_its_first_example_is_on_the_first_screen():
    lines = README.splitlines()
    assert len(lines) <= 150
    first_python = next(i for i, line in enumerate(lines) if line.startswith("```python"))
    assert first_python < 50, first_python


def test_the_headline_table_is_the_recorded_results():
    written = README.split("<!-- headline", 1)[1].split("<!-- /headline -->", 1)[0]
    written = [line for line in written.splitlines()[1:] if line.strip()]
    table = headline.headline(results.load_all(REPO / "results"), "h200")
    assert len(table) <= 8
    assert written == headline.markdown(table)


def test_the_readme_links_resolve():
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        if not target.startswith("http"):
            assert (REPO / target).exists(), target
