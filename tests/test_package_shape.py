"""The package's shape (scripts/check_layers.py): no import cycle, the library never importing
the lab's tooling, no source file over the line limit, few modules at the top."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_checker():
    spec = importlib.util.spec_from_file_location("check_layers",
                                                  ROOT / "scripts" / "check_layers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_checker_finds_a_cycle_and_a_library_module_importing_tooling():
    c = load_checker()
    edges = {"rmsnorm_lab.api": {"rmsnorm_lab.dispatch"},
             "rmsnorm_lab.dispatch": {"rmsnorm_lab.api", "rmsnorm_lab.viz.sweeps"},
             "rmsnorm_lab.viz.sweeps": {"rmsnorm_lab.api"},
             "rmsnorm_lab.cute": {"rmsnorm_lab.cute.plan"},  # a package and its own module
             "rmsnorm_lab.cute.plan": {"rmsnorm_lab.cute"}}
    assert c.cycles(edges) == [["rmsnorm_lab.api", "rmsnorm_lab.dispatch",
                                "rmsnorm_lab.viz.sweeps"]]
    assert c.layer_breaches(edges) == ["rmsnorm_lab.dispatch imports rmsnorm_lab.viz.sweeps"]


def test_the_package_passes_its_own_checks(capsys):
    status = load_checker().main()
    out = capsys.readouterr().out
    assert status == 0, out
    assert out.strip().endswith("ok")
