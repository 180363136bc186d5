import pytest

from rmsnorm_lab.settings import Settings, from_environ, settings


def test_environment_read_into_fields():
    s = from_environ({"RMSNORM_LAB_BACKEND": "triton", "RMSNORM_LAB_FORWARD_VARIANT": "warp",
                      "UNRELATED": "x"})
    assert s.backend == "triton" and s.forward_variant == "warp"


def test_unknown_environment_variable_is_an_error():
    with pytest.raises(ValueError, match="RMSNORM_LAB_BACKENDS"):
        from_environ({"RMSNORM_LAB_BACKENDS": "cute"})


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
