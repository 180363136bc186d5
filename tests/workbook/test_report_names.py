"""The report's list of names: every implementation the recorded results name is explained, by
its base and by each part added to it, and the list shows only what the results use."""

import re

import pytest

from rmsnorm_workbook import results as results_io
from rmsnorm_workbook.cli.report_sections import names_section
from rmsnorm_workbook.legend import IMPLS, NAME_PARTS, glossary

EXPLAINED = {i.name for i in IMPLS if i.about}


@pytest.fixture(scope="module")
def names():
    df = results_io.load_all()
    return sorted(n for n in df["impl"].unique() if not n.startswith("teach."))


def _spans(name):
    return [m.span() for _, pattern, _ in NAME_PARTS for m in re.finditer(pattern, name)]


def test_every_recorded_name_is_explained_by_its_base_and_its_parts(names):
    for name in names:
        spans = _spans(name)
        base = re.split(r"[@+]", name)[0]
        assert base in EXPLAINED or any(a < len(base) for a, _ in spans), name
        for m in re.finditer(r"[@+]", name):  # each part added to the base
            assert any(a <= m.start() < b for a, b in spans), (name, m.group())


def test_the_list_has_the_names_the_results_use_and_no_others():
    rows = dict(glossary(["cute.auto@cached:4+autograd", "flashinfer+fp8.static"]))
    assert set(rows) == {"cute.auto", "flashinfer", "@cached:<cap>", "+autograd",
                         "+fp8.static"}
    assert "+fp8" not in rows and "@cached" not in rows  # their look-alikes
    assert rows["flashinfer"].startswith("FlashInfer")


def test_names_section_is_a_table_of_the_results_names(names):
    import pandas as pd

    md = names_section(pd.DataFrame({"impl": names + ["teach.warp_row"]}))
    assert md[0] == "### Names in the tables"
    listed = [line.split("`")[1] for line in md if line.startswith("| `")]
    assert "cute.auto" in listed and "copy2r1w" in listed
    assert not any(n.startswith("teach.") for n in listed)
    assert names_section(pd.DataFrame({"impl": ["teach.warp_row"]})) == []
