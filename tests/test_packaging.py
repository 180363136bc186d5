"""environment.yml builds the same environment as pyproject.toml (conda itself is not needed)."""

import re
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def _name(spec: str) -> str:
    return re.split(r"[<>=!~ \[]", spec.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _pyproject():
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return data["dependencies"], data["optional-dependencies"]["test"]


def _environment():
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    conda, pip = [], []
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            pip += dep["pip"]
        else:
            conda.append(dep)
    return env, conda, pip


def test_every_dependency_and_test_tool_is_in_environment_yml_with_the_same_bound():
    deps, test_deps = _pyproject()
    _, conda, pip = _environment()
    declared = {_name(s): s.replace(" ", "") for s in conda + pip if not s.startswith("-e")}
    for spec in deps + test_deps:
        name = _name(spec)
        assert name in declared, f"{name} is in pyproject.toml but not in environment.yml"
        assert declared[name].lower() == spec.replace(" ", "").lower().replace("_", "-"), \
            f"{name}: pyproject says {spec!r}, environment.yml {declared[name]!r}"


def test_environment_installs_the_lab_itself_and_a_supported_python():
    env, conda, pip = _environment()
    assert env["name"] == "rmsnorm-lab"
    assert "-e ." in pip
    python = [d for d in conda if d.startswith("python")]
    assert python and python[0].startswith("python=3.1")


def test_torch_is_a_lower_bound_not_a_pin():
    # a GPU user's CUDA build of torch must never be replaced by the install
    deps, _ = _pyproject()
    torch_spec = next(s for s in deps if _name(s) == "torch")
    assert ">=" in torch_spec and "==" not in torch_spec
