"""What every command shares: exit statuses, one-line errors, checked folders, the GPU check,
ninja on PATH."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable

import torch

# Exit codes: 0 ok; 1 a kernel failed its check, the results or an nsys report could not be read;
# 2 it cannot run as asked: no GPU (bench, profile), a missing tool, a path that is empty, is
# missing, is not what the command reads (a results folder without results among them) or cannot
# be written (as argparse's own usage errors)
EXIT_FAILED, EXIT_NO_GPU, EXIT_USAGE = 1, 2, 2


class UsageError(Exception):
    """A problem with what the command was given; main() prints it as one line and exits 2."""


def error(message: str, status: int) -> int:
    print(f"error: {message}", file=sys.stderr)
    return status


def one_line(message: object) -> str:
    """A multi-line message (e.g. one quoting a tool's output) as one line: its first line and,
    when there are more, the last (where tools put the reason)."""
    lines = [ln.strip() for ln in str(message).splitlines() if ln.strip()]
    if not lines:
        return type(message).__name__ if isinstance(message, BaseException) else ""
    if len(lines) == 1:
        return lines[0]
    return f"{lines[0].rstrip(':')}: {lines[-1]}"


def reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def path_arg(option: str, what: str = "folder") -> Callable[[str], Path]:
    """argparse's ``type`` for the path of ``option``: ``Path(text)``, refusing an empty text,
    which ``Path`` reads as the current folder (``report --out ""`` would write there). The
    refusal is a UsageError, which argparse passes on (it converts only ValueError and
    TypeError): main() prints it as one line and exits 2."""
    def path(text: str) -> Path:
        if not text.strip():
            hint = f" (for the current folder: {option} .)" if what == "folder" else ""
            raise UsageError(f"{option} is empty: name a {what}{hint}")
        return Path(text)
    return path


def writable_dir(path: Path, option: str) -> Path:
    """``path`` created if needed and checked writable (by writing a file there), before any
    work is done; UsageError naming the option and the path as given otherwise."""
    if path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path}: not a folder (a file of that name exists)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{option} {path}: cannot create that folder ({reason(e)})") from None
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise UsageError(f"{option} {path}: cannot write there ({reason(e)})") from None
    return path


def existing_dir(path: Path, option: str) -> Path:
    if not path.exists():
        raise UsageError(f"{option} {path}: no such folder")
    if not path.is_dir():
        raise UsageError(f"{option} {path}: not a folder")
    return path


def put_ninja_on_path() -> None:
    """torch builds and loads the native autograd node with the ``ninja`` executable, looked up
    on PATH. In a virtual environment that is not activated (``.venv/bin/python -m rmsnorm_lab``)
    the ninja package's executable is beside the interpreter but not on PATH."""
    if shutil.which("ninja"):
        return
    dirs = [os.path.dirname(sys.executable)]
    try:
        import ninja
        dirs.append(ninja.BIN_DIR)
    except (ImportError, AttributeError):
        pass
    for d in dirs:
        if os.path.isfile(os.path.join(d, "ninja")):
            os.environ["PATH"] = d + os.pathsep + os.environ.get("PATH", "")
            return


def no_gpu(command: str, hint: str) -> int:
    print(f"error: {command} needs a CUDA GPU, and torch.cuda.is_available() is False here "
          f"(torch {torch.__version__}, CUDA {torch.version.cuda or 'none'}). {hint}",
          file=sys.stderr)
    return EXIT_NO_GPU
