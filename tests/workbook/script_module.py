"""The repository's scripts (``scripts/``, not a package) imported as modules by their tests."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_script(path: str):
    """The Python file at ``path``, relative to the repository's root, as a module named after
    its stem."""
    file = ROOT / path
    spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
