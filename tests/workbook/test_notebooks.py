"""The committed notebooks are up to date: each carries its outputs, holds no error, and its text
outputs equal a fresh execution on the recorded results (scripts/notebooks.py; figures are not
compared). A doctored notebook must fail the same check."""

import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import notebooks as nbtool  # noqa: E402

pytestmark = pytest.mark.notebooks


def tiny(tmp_path, source="print(1 + 1)", outputs=None):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# a lesson"), nbformat.v4.new_code_cell(source)]
    path = tmp_path / "tiny.ipynb"
    nbformat.write(nb, path)
    nbtool.refresh(path)
    if outputs is not None:
        nb = nbformat.read(path, as_version=4)
        nb.cells[1].outputs = outputs
        nbformat.write(nb, path)
    return path


def test_a_refreshed_notebook_is_up_to_date(tmp_path):
    path = tiny(tmp_path)
    assert nbformat.read(path, as_version=4).cells[1].outputs[0].text == "2\n"
    assert nbtool.problems(path) == []


def test_a_doctored_output_is_stale(tmp_path):
    path = tiny(tmp_path, outputs=[nbformat.v4.new_output("stream", name="stdout", text="3\n")])
    (found,) = nbtool.problems(path)
    assert "differ from a fresh run" in found and "-[stdout] 3" in found and "+[stdout] 2" in found


def test_a_notebook_without_outputs_or_with_an_error_is_stale(tmp_path):
    path = tiny(tmp_path, outputs=[])
    assert any("holds no outputs" in f for f in nbtool.problems(path))
    error = nbformat.v4.new_output("error", ename="KeyError", evalue="'cute.auto-pdl'",
                                   traceback=[])
    path = tiny(tmp_path, outputs=[error])
    assert any("holds an error: KeyError" in f for f in nbtool.problems(path))


@pytest.mark.parametrize("path", nbtool.notebooks(), ids=lambda p: p.name)
def test_committed_notebook_is_up_to_date(path):
    found = nbtool.problems(path)
    assert not found, f"{path.name} is stale:\n" + "\n".join(found)


def test_live_runs_a_notebook_as_a_plain_script_with_its_figures(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# a lesson"),
                nbformat.v4.new_code_cell("import os\nprint('figures to', os.environ['LESSON_FIG_DIR'])"),
                nbformat.v4.new_code_cell("print(6 * 7)")]
    path = tmp_path / "lesson.ipynb"
    nbformat.write(nb, path)
    assert nbtool.live([path], tmp_path / "out") == 0
    log = (tmp_path / "out" / "lesson.log").read_text()
    assert f"figures to {tmp_path / 'out'}" in log and "42" in log
    broken = tmp_path / "broken.ipynb"
    nb.cells.append(nbformat.v4.new_code_cell("raise SystemExit(3)"))
    nbformat.write(nb, broken)
    assert nbtool.live([broken], tmp_path / "out") == 1


def test_a_cell_tagged_machine_runs_but_its_text_is_not_compared(tmp_path):
    path = tiny(tmp_path, source="print('ptxas 13.0')")
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].metadata["tags"] = ["machine"]
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="ptxas 12.9\n")]
    nbformat.write(nb, path)
    assert nbtool.problems(path) == []
    nb.cells[1].source = "raise RuntimeError('no ptxas')"  # but it must run
    nbformat.write(nb, path)
    with pytest.raises(Exception, match="no ptxas"):
        nbtool.problems(path)
