"""The workbook's reading budget (scripts/reading_time.py): each lesson within an hour, the five
within three, counted from the committed notebooks, so a sentence or a printed line added to one
lesson has to be paid for in another."""

from script_module import ROOT, load_script


def _reading_time():
    return load_script("scripts/reading_time.py")


def test_the_workbook_reads_within_its_budget():
    rt = _reading_time()
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    minutes = {p.stem: rt.measure(p)["minutes"] for p in notebooks}
    assert len(minutes) == 5
    assert max(minutes.values()) <= rt.LESSON_MAX_MIN, minutes
    assert sum(minutes.values()) <= rt.WORKBOOK_MAX_MIN, minutes


def test_the_measure_counts_words_lines_and_figures(tmp_path):
    rt = _reading_time()
    nb = tmp_path / "n.ipynb"
    nb.write_text('{"cells": [{"cell_type": "markdown", "source": "one two three"},'
                  ' {"cell_type": "code", "source": "a = 1\\nb = 2", "outputs":'
                  ' [{"data": {"image/png": "x", "text/plain": "<Figure>"}}]}]}')
    row = rt.measure(nb)
    assert (row["markdown words"], row["analysis lines"], row["figures"]) == (3, 2, 1)
    assert row["minutes"] == 3 / rt.WORDS_A_MIN + 2 / rt.ANALYSIS_LINES_A_MIN + rt.FIGURE_MIN
