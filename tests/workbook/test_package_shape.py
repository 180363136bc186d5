"""The packages' shape (scripts/check_layers.py): no import cycle, the library never importing
the workbook, the workbook reaching the library through its public modules, no source file over
the line limit, few modules at the top."""

from script_module import load_script


def load_checker():
    return load_script("scripts/check_layers.py")


def test_the_checker_finds_a_cycle_and_a_library_module_importing_tooling():
    c = load_checker()
    edges = {"rmsnorm_lab.api": {"rmsnorm_lab.dispatch"},
             "rmsnorm_lab.dispatch": {"rmsnorm_lab.api", "rmsnorm_workbook.viz.sweeps"},
             "rmsnorm_workbook.viz.sweeps": {"rmsnorm_lab.api"},
             "rmsnorm_lab.cute": {"rmsnorm_lab.cute.plan.forward"},  # a package and its own module
             "rmsnorm_lab.cute.plan.forward": {"rmsnorm_lab.cute"}}
    assert c.cycles(edges) == [["rmsnorm_lab.api", "rmsnorm_lab.dispatch",
                                "rmsnorm_workbook.viz.sweeps"]]
    assert c.layer_breaches(edges) == [
        "rmsnorm_lab.dispatch imports rmsnorm_workbook.viz.sweeps",
        "rmsnorm_workbook.viz.sweeps imports rmsnorm_lab.api, not a public module of the library"]


def test_the_workbook_reaches_the_library_through_its_public_modules_only():
    c = load_checker()
    edges = {"rmsnorm_workbook.viz.flow": {"rmsnorm_lab.lab", "rmsnorm_lab.cute.plan.backward"},
             "rmsnorm_workbook.bench.ops": {"rmsnorm_lab", "rmsnorm_lab.reference",
                                            "rmsnorm_lab.settings"},
             "rmsnorm_lab.__main__": {"rmsnorm_workbook.__main__"}}  # the entry point
    assert c.layer_breaches(edges) == [
        "rmsnorm_workbook.viz.flow imports rmsnorm_lab.cute.plan.backward, not a public module "
        "of the library"]


def test_the_package_passes_its_own_checks(capsys):
    status = load_checker().main()
    out = capsys.readouterr().out
    assert status == 0, out
    assert out.strip().endswith("ok")
