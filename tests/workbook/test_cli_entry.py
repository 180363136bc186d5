"""The command line's entry: what it says before any command runs (--help, --version, a
bad ``RMSNORM_LAB_*`` value, an empty path) and the documented ``python -m`` commands beside it (the
sanitizer's workload) on a machine without a GPU. Subprocesses, as ``test_cli.py`` runs them."""

import os
import sys

import pytest

from test_cli import REPO, assert_one_line_error, cli


@pytest.mark.parametrize("argv", [["report", "--out", ""], ["report", "--results", ""],
                                  ["bench", "--out", ""], ["nsys-summary", "--csv-dir", ""],
                                  ["nsys-summary", ""]])
def test_an_empty_path_is_refused_not_read_as_the_current_folder(argv):
    before = sorted(p.name for p in REPO.iterdir())
    p = cli(*argv)
    option = next((a for a in argv if a.startswith("-")), "REPORT")
    assert_one_line_error(p, says=[f"{option} is empty"])
    assert sorted(p.name for p in REPO.iterdir()) == before  # nothing written where it runs


def test_version():
    from rmsnorm_lab import __version__
    p = cli("--version")
    assert p.returncode == 0 and p.stdout == f"rmsnorm_lab {__version__}\n", p.stderr


@pytest.mark.parametrize("module, argv", [
    ("rmsnorm_lab", ["report", "--no-bench"]), ("rmsnorm_lab", ["--version"]),
    ("rmsnorm_lab", ["bench", "--op", "fwd"]), ("rmsnorm_workbook", ["report"]),
    ("rmsnorm_workbook.profiling.sanitize", [])])
def test_a_bad_setting_in_the_environment_is_one_line_naming_it(module, argv):
    p = cli(*argv, module=module, env={"RMSNORM_LAB_BACKEND": "cuda"})
    assert_one_line_error(p, says=["RMSNORM_LAB_BACKEND='cuda'", "'cute', 'triton', 'torch'"])


def test_the_sanitizer_workload_without_a_gpu_says_what_it_needs():
    p = cli(module="rmsnorm_workbook.profiling.sanitize")
    assert_one_line_error(p, says=["needs a CUDA GPU", "compute-sanitizer --tool memcheck"])


# --- help --------------------------------------------------------------------------------------

COMMANDS = ("bench", "report", "profile", "nsys-summary")


def test_help_lists_each_command_once_with_one_line():
    p = cli("--help")
    assert p.returncode == 0
    for command in COMMANDS:
        listed = [ln for ln in p.stdout.splitlines() if ln.split()[:1] == [command]]
        assert len(listed) == 1, (command, p.stdout)
        assert len(listed[0].split()) > 2  # the name and its description on one line
    assert "{bench" not in p.stdout  # no second list (argparse's {a,b,...} or the docstring's)
    assert p.stdout.count("nsys-summary") == 1 and "/tmp/gpu" not in p.stdout


def test_every_command_has_a_one_line_help_and_a_description():
    from rmsnorm_workbook.__main__ import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    helps = {a.dest: a.help for a in sub._choices_actions}
    assert set(sub.choices) == set(COMMANDS) == set(helps)
    for name, command in sub.choices.items():
        assert helps[name] and "\n" not in helps[name], name
        assert command.description and len(command.description) > 40, name
        text = command.format_help()
        assert command.description.split()[0] in text and "/tmp/gpu" not in text


def test_ninja_of_the_environment_is_put_on_path(tmp_path, monkeypatch):
    """`.venv/bin/python -m rmsnorm_lab` without activating .venv: torch finds ninja anyway."""
    from rmsnorm_workbook.cli.common import put_ninja_on_path

    venv_bin = tmp_path / "bin"
    venv_bin.mkdir()
    (venv_bin / "ninja").write_text("#!/bin/sh\n")
    (venv_bin / "ninja").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(venv_bin / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setitem(sys.modules, "ninja", None)  # the package's own BIN_DIR not consulted
    put_ninja_on_path()
    assert os.environ["PATH"].split(os.pathsep)[0] == str(venv_bin)
