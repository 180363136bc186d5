"""Packaging: environment.yml builds the same environment as pyproject.toml (conda itself is not
needed); the tested versions, the README's setup commands and CI agree; install.sh's decisions
(scripts/install_helper.py): a GPU user's torch is kept, the CPU index is asked with a timeout."""

import importlib.util
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import pytest
import torch
import yaml

from script_module import load_script

REPO = Path(__file__).resolve().parents[2]


def _name(spec: str) -> str:
    return re.split(r"[<>=!~ \[]", spec.strip(), maxsplit=1)[0].lower().replace("_", "-")


PYPROJECTS = (REPO / "pyproject.toml", REPO / "workbook" / "pyproject.toml")


def _project(path: Path) -> dict:
    return tomllib.loads(path.read_text())["project"]


def _pyproject():
    """The dependencies of the library (with its NVTX extra) and of the workbook (without the
    library itself), and the workbook's test tools."""
    library, workbook = (_project(p) for p in PYPROJECTS)
    deps = library["dependencies"] + library["optional-dependencies"]["nvtx"] + [
        d for d in workbook["dependencies"] if _name(d) != "rmsnorm-lab"]
    return deps, workbook["optional-dependencies"]["test"]


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
    assert "-e ." in pip and "-e ./workbook" in pip
    python = [d for d in conda if d.startswith("python")]
    assert python and python[0].startswith("python=3.1")


def test_torch_is_a_lower_bound_not_a_pin():
    # a GPU user's CUDA build of torch must never be replaced by the install
    torch_spec = next(s for s in _project(PYPROJECTS[0])["dependencies"] if _name(s) == "torch")
    assert ">=" in torch_spec and "==" not in torch_spec


# --- install.sh and its decisions (scripts/install_helper.py) ---------------------------------

HELPER_PATH = REPO / "scripts" / "install_helper.py"
helper = load_script("scripts/install_helper.py")

TESTED = REPO / ".ci" / "constraints.txt"


def _tested_pins():
    return {helper.requirement_name(ln): ln.split("==")[1].strip()
            for ln in TESTED.read_text().splitlines() if helper.requirement_name(ln)}


def test_the_tested_versions_meet_pyproject_bounds_and_the_install_doc_names_them():
    pins = _tested_pins()
    assert set(pins) == {"torch", "triton", "nvidia-cutlass-dsl", "apache-tvm-ffi",
                         "transformers"}
    for name, version in pins.items():
        bound = next(filter(None, (helper.lower_bound(name, p) for p in PYPROJECTS)), None)
        assert bound and helper.release(version) >= helper.release(bound), (name, version, bound)
    install = (REPO / "docs" / "install.md").read_text()
    for name, version in pins.items():
        assert f"{name}=={version}" in install, f"docs/install.md should name {name}=={version}"


def _setup_commands():
    readme = (REPO / "README.md").read_text()
    setup = readme.split("## Set up", 1)[1].split("\n## ", 1)[0]
    block = setup.split("```bash", 1)[1].split("```", 1)[0]
    return [ln.split("#", 1)[0].strip() for ln in block.splitlines()
            if ln.strip() and not ln.lstrip().startswith("#")]


def test_the_readme_setup_is_two_commands_and_ci_runs_the_test_one():
    commands = _setup_commands()
    assert len(commands) == 2, commands
    main, tests = commands
    assert main.startswith("bash install.sh && ") and "-m rmsnorm_lab report" in main
    assert tests == "bash install.sh && bash tests/run.sh"
    ci = (REPO / ".ci" / "run").read_text()
    assert tests in ci.splitlines(), "CI must run the README's test command"


def test_install_asks_the_cpu_index_first_with_a_timeout_and_falls_back():
    text = (REPO / "install.sh").read_text()
    assert "https://download.pytorch.org/whl/cpu" in text
    cpu = text.index('--index-url "$CPU_INDEX"')
    assert text.index('reachable "${CPU_INDEX%/}/torch/" 10') < cpu  # asked, 10 s at most
    assert text.index('pip_or_die "$TORCH_REQ"', cpu) > cpu  # then the default index
    assert "building the native autograd node (C++, under a minute, once)..." in text
    assert "the lab uses its Python autograd node" in text


FAKE_PIP = """import sys
for i in range(300):
    print(f"Collecting noise-{i}")
if "-e" in sys.argv:  # the lab's own install fails, as a broken build would
    print("ERROR: the build of the lab failed (fake pip)", file=sys.stderr)
    sys.exit(1)
"""


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_install_keeps_pips_output_in_a_log_and_shows_its_tail_when_pip_fails(tmp_path):
    """install.sh's own [install] lines are what it prints; pip's hundreds of lines go to
    <venv>/pip.log, and when pip fails the log's last lines (the error among them) are shown and
    the install stops. Run on an environment whose pip is a stand-in: torch "installs", the
    lab's install fails; nothing is downloaded."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    pip = _site(venv / "bin" / "python") / "pip"
    pip.mkdir()
    (pip / "__init__.py").write_text("")
    (pip / "__main__.py").write_text(FAKE_PIP)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "RMSNORM_VENV": str(venv),
           "RMSNORM_TORCH_CPU_INDEX": "http://127.0.0.1:9/whl/cpu", "CXX": "no-such-compiler"}
    p = subprocess.run(["bash", str(REPO / "install.sh")], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 1, p.stdout + p.stderr
    out, err = p.stdout.splitlines(), p.stderr.splitlines()
    assert out and all(line.startswith("[install] ") for line in out), p.stdout
    assert "Collecting noise" not in p.stdout
    assert any(line.startswith("[install] installed torch==") for line in out), p.stdout
    # the failure: the command, the log's last lines with pip's error, where the whole log is
    assert err[0].startswith("[install] pip install -e . -e ./workbook[test] failed (exit "
                             "status 1); the last lines of "), p.stderr
    assert "    ERROR: the build of the lab failed (fake pip)" in err
    assert err[-1].startswith("[install] error: pip could not install") and "pip.log" in err[-1]
    assert len(out) + len(err) < 40
    log = (venv / "pip.log").read_text()
    assert log.count("Collecting noise-299") == 2 and "$ pip install torch==" in log
    assert not (venv / ".rmsnorm_lab-installed").exists()  # a re-run tries again


@pytest.mark.parametrize("text, build", [
    ("__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\nhip: Optional[str] = None\n",
     ("cpu", "2.13.0+cpu", "-")),
    ("__version__ = '2.11.0+cu128'\ncuda: Optional[str] = '12.8'\nhip = None\n",
     ("cuda", "2.11.0+cu128", "12.8")),
    ("__version__ = '2.9.0+rocm6.4'\ncuda = None\nhip: Optional[str] = '6.4.1'\n",
     ("rocm", "2.9.0+rocm6.4", "6.4.1")),
])
def test_torch_build_is_read_without_importing_torch(tmp_path, text, build):
    (tmp_path / "version.py").write_text("from typing import Optional\n" + text)
    assert helper.torch_build(tmp_path / "version.py") == build


def test_merged_constraints_keep_a_gpu_torch_and_let_later_files_win():
    tested = "# tested\ntorch==2.13.0\ntriton==3.6.0\nnvidia-cutlass-dsl==4.8.1\n"
    caller = "nvidia_cutlass_dsl==4.9.0\n--extra-index-url https://example.invalid/simple\n"
    cpu = helper.merge_constraints([("tested", tested), ("caller", caller)], {})
    assert "torch==2.13.0" in cpu and "nvidia_cutlass_dsl==4.9.0" in cpu
    assert "4.8.1" not in cpu and "--extra-index-url https://example.invalid/simple" in cpu
    gpu = helper.merge_constraints([("tested", tested)], {"torch": "2.11.0+cu128", "triton": "",
                                                          "pytorch-triton-rocm": ""})
    lines = [ln.split("#")[0].strip() for ln in gpu.splitlines()]
    assert "torch==2.11.0+cu128" in lines and "torch==2.13.0" not in lines
    assert not any(ln.startswith("triton") for ln in lines)  # torch's own pin decides
    assert "nvidia-cutlass-dsl==4.8.1" in lines


def test_a_gpu_torch_older_than_the_lab_needs_is_refused_with_what_to_do():
    why = helper.too_old({"torch": "2.4.1+cu121"}, REPO / "pyproject.toml")
    assert "2.4.1+cu121" in why and "torch>=2.6" in why and "remove .venv" in why
    assert helper.too_old({"torch": "2.11.0+cu128"}, REPO / "pyproject.toml") is None
    assert helper.too_old({}, REPO / "pyproject.toml") is None


def _fake_dist(site, name, version, files):
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text("")
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)


def _site(python):
    return Path(subprocess.check_output(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        text=True).strip())


def test_a_gpu_users_torch_is_seen_pinned_and_never_replaced(tmp_path):
    """What install.sh does for a Python that has a CUDA torch: the new environment sees that
    Python's packages, the constraints pin torch and its triton to what is installed, and pip
    has nothing to install for torch (nothing of the user's Python changes)."""
    user, lab = tmp_path / "user", tmp_path / "lab"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(user)], check=True)
    user_site = _site(user / "bin" / "python")
    _fake_dist(user_site, "torch", "2.11.0+cu128", {
        "torch/__init__.py": "__version__ = '2.11.0+cu128'\n",
        "torch/version.py": "__version__ = '2.11.0+cu128'\ncuda = '12.8'\nhip = None\n"})
    _fake_dist(user_site, "triton", "3.5.1", {"triton/__init__.py": ""})
    before = sorted(p.name for p in user_site.iterdir())

    def run(python, *args):
        return subprocess.run([str(python), str(HELPER_PATH), *args], capture_output=True,
                              text=True, check=True).stdout.strip()

    assert run(user / "bin" / "python", "torch") == "cuda 2.11.0+cu128 12.8"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(lab)], check=True)
    lab_py = lab / "bin" / "python"
    assert run(lab_py, "torch") == "none"
    run(user / "bin" / "python", "link", str(_site(lab_py)))
    assert run(lab_py, "torch") == "cuda 2.11.0+cu128 12.8"
    out = tmp_path / "constraints.txt"
    assert run(lab_py, "constraints", str(out), str(TESTED)) == "torch 2.11.0+cu128, triton 3.5.1"
    lines = [ln.split("#")[0].strip() for ln in out.read_text().splitlines()]
    assert {"torch==2.11.0+cu128", "triton==3.5.1", "nvidia-cutlass-dsl==4.8.1"} <= set(lines)
    assert "torch==2.13.0" not in lines and "triton==3.6.0" not in lines
    # pip (this one, acting on the lab's environment) finds torch satisfied under them
    dry = subprocess.run([sys.executable, "-m", "pip", "--python", str(lab_py), "install",
                          "--dry-run", "--no-index", "-c", str(out), "torch>=2.6", "triton"],
                         capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    assert "Would install" not in dry.stdout
    assert "Requirement already satisfied: torch>=2.6" in dry.stdout
    assert sorted(p.name for p in user_site.iterdir()) == before


def test_a_cpu_torch_is_not_kept(tmp_path):
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    _fake_dist(_site(env / "bin" / "python"), "torch", "2.12.0+cpu", {
        "torch/__init__.py": "", "torch/version.py": "__version__ = '2.12.0+cpu'\ncuda = None\n"})
    out = tmp_path / "c.txt"
    got = subprocess.run([str(env / "bin" / "python"), str(HELPER_PATH), "constraints", str(out),
                          str(TESTED)], capture_output=True, text=True, check=True)
    assert got.stdout.strip() == ""  # nothing kept: the tested torch applies
    assert "torch==2.13.0" in out.read_text()


def test_an_unreachable_index_costs_the_timeout_not_more():
    """install.sh asks PyPI's CPU index with this before pip: refused, and silent (a server that
    accepts and never answers), both give up within the timeout."""
    assert not helper.reachable("http://127.0.0.1:9/whl/cpu/torch/", timeout=5)  # refused
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    try:
        start = time.monotonic()
        assert not helper.reachable(f"http://127.0.0.1:{silent.getsockname()[1]}/", timeout=1)
        assert time.monotonic() - start < 5
    finally:
        silent.close()


def test_an_answering_index_is_reachable_whatever_its_status():
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class NotFound(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_error(404)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert helper.reachable(f"http://127.0.0.1:{server.server_port}/torch/", timeout=5)
    finally:
        server.shutdown()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_shell_scripts_parse():
    for script in ("install.sh", "tests/run.sh", ".ci/run"):
        subprocess.run(["bash", "-n", str(REPO / script)], check=True)


def test_the_readme_script_example_runs_on_a_cpu():
    """The "Use it" block, as a reader copies it, on a machine without a GPU."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Use it", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    if torch.cuda.is_available():
        pytest.skip("the block picks the GPU where there is one")
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)
    y, h = scope["y"], scope["h"]
    assert torch.equal(h, scope["x"].detach() + scope["r"]) and y.shape == h.shape
    assert scope["x"].grad is not None and scope["replaced"]
