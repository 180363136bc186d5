"""The library stands alone: it imports and works with its own dependencies only (torch, triton,
nvidia-cutlass-dsl, apache-tvm-ffi), never reaching for the workbook's (pandas, matplotlib,
Jupyter, tqdm) nor the workbook itself, and a wheel of it holds the library and nothing else and
works outside a checkout."""

import re
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: what the library must never import: the workbook and the workbook's own dependencies (tqdm
#: is left out: torch itself asks for it, as an option of torch.hub)
WORKBOOK_ONLY = ("pandas", "matplotlib", "IPython", "jupyterlab", "jupyter_core", "nbformat",
                 "rmsnorm_workbook")

# A user's script: the public names, patch and unpatch, the fused add; imports of the modules in
# WORKBOOK_ONLY are refused and recorded, and the script prints what was attempted.
USER_SCRIPT = textwrap.dedent("""
    import sys

    BLOCKED = {blocked!r}
    attempts = []

    class Refuse:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                attempts.append(name)
                raise ImportError(f"{{name}} is not installed here")
            return None

    sys.meta_path.insert(0, Refuse())
    import torch
    import rmsnorm_lab
    from rmsnorm_lab import RMSNorm, FusedAddRMSNorm, rms_norm

    x = torch.randn(4, 64)
    w = torch.randn(64)
    assert torch.equal(rms_norm(x, w), torch.nn.functional.rms_norm(x, (64,), w))
    assert torch.equal(rms_norm(x, (64,), w, 1e-6), torch.nn.functional.rms_norm(x, (64,), w, 1e-6))
    y, h = rms_norm(x, w, residual=torch.ones_like(x))
    torch.testing.assert_close(h, x + 1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.RMSNorm(64))
    before = model(x)
    replaced = rmsnorm_lab.patch(model)
    assert len(replaced) == 1 and isinstance(model[1], RMSNorm)
    torch.testing.assert_close(model(x), before)
    rmsnorm_lab.unpatch(model)
    assert type(model[1]) is torch.nn.RMSNorm
    FusedAddRMSNorm(64)(x, x)
    print("attempted:", sorted(set(attempts)))
    print("from:", rmsnorm_lab.__file__)
""")


def run_user_script(cwd: Path, env_path: str = None) -> str:
    env = None
    if env_path is not None:
        import os
        env = dict(os.environ, PYTHONPATH=env_path)
    done = subprocess.run([sys.executable, "-c", USER_SCRIPT.format(blocked=WORKBOOK_ONLY)],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_library_works_without_the_workbook_or_its_dependencies(tmp_path):
    out = run_user_script(tmp_path)
    assert "attempted: []" in out, out


def test_the_library_never_imports_the_workbook_even_lazily():
    """No module of the library names the workbook's package, its command line excepted (the
    entry point hands ``python -m rmsnorm_lab`` over to it, by name)."""
    library = REPO / "rmsnorm_lab"
    importing = re.compile(r"(import|from)\s+rmsnorm_workbook|import_module\([\"']rmsnorm_workbook")
    naming = [p.relative_to(REPO).as_posix() for p in library.rglob("*.py")
              if importing.search(p.read_text()) and p.name != "__main__.py"]
    assert naming == []


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-q", "-w", str(out), str(REPO)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        pytest.fail(f"pip wheel failed: {done.stderr[-2000:]}")
    (found,) = out.glob("rmsnorm_lab-*.whl")
    return found


def test_the_wheel_holds_the_library_alone(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    packages = {n.split("/")[0] for n in names if not n.endswith(".dist-info/")
                and ".dist-info/" not in n}
    assert packages == {"rmsnorm_lab"}, packages
    assert "rmsnorm_lab/native/native_node.cpp" in names  # the native node builds from a wheel
    for module in ("cute/kernels/forward.py", "triton/forward.py", "models/patch.py", "lab.py"):
        assert f"rmsnorm_lab/{module}" in names
    metadata = zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    required = [line.split(":", 1)[1].strip() for line in metadata.splitlines()
                if line.startswith("Requires-Dist:") and "extra ==" not in line]
    assert sorted(r.split(">")[0].split("=")[0] for r in required) == [
        "apache-tvm-ffi", "ninja", "nvidia-cutlass-dsl", "torch", "triton"]


def test_the_wheel_works_outside_a_checkout(wheel, tmp_path):
    """Installed from the wheel into a folder of its own and run from elsewhere: the copy in the
    checkout is not what is imported, and nothing of the workbook is reached."""
    target = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q",
                           "--target", str(target), str(wheel)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = run_user_script(elsewhere, env_path=str(target))
    assert "attempted: []" in out and f"from: {target}" in out, out
