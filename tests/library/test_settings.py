import pytest

from rmsnorm_lab.settings import Settings, UnknownVariableWarning, from_environ, settings


def test_environment_read_into_fields():
    s = from_environ({"RMSNORM_LAB_BACKEND": "triton", "RMSNORM_LAB_FORWARD_VARIANT": "warp",
                      "UNRELATED": "x"})
    assert s.backend == "triton" and s.forward_variant == "warp"


def test_unknown_environment_variable_is_a_warning_naming_the_valid_ones():
    with pytest.warns(UnknownVariableWarning, match="RMSNORM_LAB_BACKENDS.*RMSNORM_LAB_BACKEND,"):
        s = from_environ({"RMSNORM_LAB_BACKENDS": "triton"})
    assert s.backend == Settings().backend


def test_a_bad_value_in_the_environment_is_an_error_naming_the_variable():
    with pytest.raises(ValueError, match="RMSNORM_LAB_NVTX='maybe'"):
        from_environ({"RMSNORM_LAB_NVTX": "maybe"})


def test_importing_with_an_unknown_variable_warns_in_one_line():
    import os
    import subprocess
    import sys
    env = dict(os.environ, RMSNORM_LAB_BAKEND="cute")
    p = subprocess.run([sys.executable, "-c", "import rmsnorm_lab"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "Traceback" not in p.stderr
    assert "unknown environment variable RMSNORM_LAB_BAKEND" in p.stderr


def test_bad_choice_names_the_toggle():
    with pytest.raises(ValueError, match="forward_variant"):
        Settings().forward_variant = "fastest"


def test_unknown_toggle_is_refused():
    with pytest.raises(AttributeError, match="no toggle"):
        Settings().bakend = "cute"


def test_override_restores_even_on_error():
    before = settings.as_dict()
    with pytest.raises(RuntimeError):
        with settings.override(backend="torch", forward_variant="row"):
            assert settings.backend == "torch" and settings.forward_variant == "row"
            raise RuntimeError("boom")
    assert settings.as_dict() == before


def test_environment_not_read_after_import(monkeypatch):
    before = settings.backend
    monkeypatch.setenv("RMSNORM_LAB_BACKEND", "torch" if before != "torch" else "triton")
    assert settings.backend == before


def test_backward_mode_toggle():
    assert Settings().backward == "auto"
    assert from_environ({"RMSNORM_LAB_BACKWARD": "split"}).backward == "split"
    s = Settings()
    s.backward = "fused"
    assert s.backward == "fused"
    with pytest.raises(ValueError, match="backward"):
        s.backward = "fastest"
    with pytest.raises(ValueError, match="backward"):
        from_environ({"RMSNORM_LAB_BACKWARD": "persistent"})


def test_backward_mode_override_restores():
    before = settings.backward
    with settings.override(backward="split"):
        assert settings.backward == "split"
    assert settings.backward == before


def test_fused_strips_toggle_is_auto_by_default_and_refuses_negatives():
    assert from_environ({}).experiments.fused_strips == 0
    assert from_environ({"RMSNORM_LAB_FUSED_STRIPS": "264"}).experiments.fused_strips == 264
    with pytest.raises(ValueError, match="fused_strips"):
        from_environ({"RMSNORM_LAB_FUSED_STRIPS": "-1"})
    with pytest.raises(ValueError, match="integer"):
        from_environ({"RMSNORM_LAB_FUSED_STRIPS": "many"})


def test_pdl_toggle_is_on_by_default_and_read_from_the_environment():
    assert Settings().pdl is True
    assert from_environ({"RMSNORM_LAB_PDL": "0"}).pdl is False


def test_a_bad_value_in_the_environment_names_the_variable():
    with pytest.raises(ValueError, match=r"RMSNORM_LAB_BACKEND='bogus'.*one of"):
        from_environ({"RMSNORM_LAB_BACKEND": "bogus"})
    with pytest.raises(ValueError, match=r"RMSNORM_LAB_FUSED_STRIPS='many'"):
        from_environ({"RMSNORM_LAB_FUSED_STRIPS": "many"})


def test_a_bad_value_stops_a_program_that_imports_the_library_with_a_value_error(tmp_path):
    """The library raises (a program may catch it); only the lab's own command lines turn it
    into one line and exit status 2 (tests/workbook/test_cli.py)."""
    import os
    import subprocess
    import sys
    script = tmp_path / "uses_the_lab.py"
    script.write_text("try:\n    import rmsnorm_lab\nexcept ValueError as e:\n"
                      "    print(type(e).__name__, e)\n")
    env = dict(os.environ, RMSNORM_LAB_BACKEND="cuda")
    p = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("SettingsError environment variable RMSNORM_LAB_BACKEND='cuda'")
    p = subprocess.run([sys.executable, "-c", "import rmsnorm_lab"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "Traceback" in p.stderr


@pytest.mark.parametrize("argv, lab", [
    (["python", "-m", "rmsnorm_lab", "report"], True),
    (["python", "-X", "dev", "-m", "rmsnorm_workbook.profiling.sanitize"], True),
    (["python", "-mrmsnorm_workbook"], True),
    (["/venv/bin/python", "/venv/bin/rmsnorm-lab", "report"], True),
    (["python", "-m", "pytest", "-m", "rmsnorm_lab"], False),
    (["python", "my_script.py", "-m", "rmsnorm_lab"], False),
    (["python", "-c", "import rmsnorm_lab"], False),
    (["python"], False),
])
def test_the_lab_command_lines_are_told_from_programs_using_it(monkeypatch, argv, lab):
    import sys

    from rmsnorm_lab.settings import is_lab_command_line
    monkeypatch.setattr(sys, "orig_argv", argv)
    assert is_lab_command_line() is lab


def test_override_of_an_unknown_toggle_lists_the_toggles():
    from rmsnorm_lab import settings
    with pytest.raises(AttributeError, match=r"no toggle 'forward_varient'.*forward_variant"):
        with settings.override(forward_varient="row"):
            pass
