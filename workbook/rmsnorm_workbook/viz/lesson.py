"""What the lesson notebooks (``notebooks/01_forward.ipynb``, ``02_backward.ipynb``) share: showing
things, reading what the compiler made of a kernel, measuring a kernel on a GPU, and reading the
measurements back without one.

The kernels themselves live in the notebooks' cells; this module holds no kernel. It serves three
ways of running a lesson:

* **in Jupyter** -- tables, Markdown and figures are displayed;
* **as a script** (``jupyter nbconvert --to script``, then ``python3``; no IPython needed) --
  the same cells print their tables and text, and figures are saved to ``$LESSON_FIG_DIR`` when
  it is set (otherwise one line names each figure);
* **live or recorded** -- with a CUDA GPU the lesson compiles, checks and times its kernels and
  writes ``results/<gpu>/teach-<op>.csv``; without one it reads those files.

The pieces live beside it and are reached through it: ``viz/compiled.py`` (what the compiler
made of a kernel, read without a GPU) and ``viz/recorded.py`` (the measurements a GPU recorded).
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import pandas as pd

from rmsnorm_lab import reference
from .. import paths
from .. import results as results_io
# The notebooks reach everything through this one module: what the compiler made of a kernel
# and the recorded measurements live beside it.
from .compiled import (Compiled, compiled_table, inspect, read_compiled,  # noqa: F401
                       target_arch, tool_version)
from .recorded import (COPY_OF, RECORDED_GPU, fmt_shape, load_ncu,  # noqa: F401
                       load_teach, ncu_view, recorded_sass, teach_path, teach_table)

# ------------------------------------------------------------------------------------------------
# showing things

TOL = 1e-2  #: relative error (norm) a bf16 kernel must stay under against the float64 reference
EPS = 1e-6


def in_notebook() -> bool:
    """True inside a Jupyter kernel (where ``display`` renders), False in a plain script."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


def show(obj) -> None:
    """Display a table (or anything) in Jupyter; print it in a script."""
    if in_notebook():
        from IPython.display import display
        display(obj)
    elif isinstance(obj, (pd.DataFrame, pd.Series)):
        print(obj.to_string())
    else:
        print(obj)


def say(markdown: str) -> None:
    """Markdown in Jupyter, the same text printed in a script."""
    text = markdown.strip("\n")
    if in_notebook():
        from IPython.display import Markdown, display
        display(Markdown(text))
    else:
        print(text)


def reveal(obj, summary: str = "Answer: the measurement") -> None:
    """Evidence a prediction asks for, collapsed until the reader opens it: in Jupyter a table (or
    text) inside a ``<details>`` block; in a script, printed after ``summary``. The text form is
    kept beside the HTML, so what it says is compared and counted as any printed table."""
    text = obj.to_string() if isinstance(obj, (pd.DataFrame, pd.Series)) else str(obj)
    if not in_notebook():
        print(f"{summary}:\n{text}")
        return
    import html
    from IPython.display import display
    body = (obj.to_frame().to_html() if isinstance(obj, pd.Series) else obj.to_html()) \
        if isinstance(obj, (pd.DataFrame, pd.Series)) else f"<pre>{html.escape(text)}</pre>"
    display({"text/html": f"<details><summary><b>{html.escape(summary)}</b> (click to open)"
                          f"</summary>{body}</details>",
             "text/plain": text}, raw=True)


def stated(text_value: float, measured: float, within: float, what: str = "") -> None:
    """The check beside a number the markdown states: ``measured`` (from the data) must lie within
    ``within`` of ``text_value`` (the number as the text writes it). On recorded results, which is
    how CI executes the notebooks, a stale sentence fails here. Live on a GPU the run's own number
    may differ from the recorded run the text was written from: one line says so instead."""
    if abs(measured - text_value) <= within:
        return
    message = (f"{what + ': ' if what else ''}the text says {text_value:g}, the data give "
               f"{measured:.4g}")
    if gpu_available():
        print(f"(this run: {message}; the text was written from the recorded run)")
        return
    raise AssertionError(message)


def show_code(obj, start: Optional[str] = None, end: Optional[str] = None) -> None:
    """Show the code a step runs, as it is in the package: a Python function's source, or, for a
    file path, its lines from the first holding ``start`` up to (not including) the next holding
    ``end`` (C++ sources shown as such)."""
    import inspect as pyinspect
    if isinstance(obj, (str, Path)):
        path = Path(obj)
        lines = path.read_text().splitlines()
        first = next(i for i, line in enumerate(lines) if start in line) if start else 0
        last = next((i for i in range(first + 1, len(lines)) if end in lines[i]), len(lines)) \
            if end else len(lines)
        code, language = "\n".join(lines[first:last]).rstrip(), \
            "cpp" if path.suffix in (".cpp", ".h") else "python"
        where = path.resolve().relative_to(paths.REPO).as_posix()
    else:
        code, language = pyinspect.getsource(obj).rstrip(), "python"
        where = f"{obj.__module__}.{obj.__qualname__}"
    say(f"`{where}`:\n\n```{language}\n{code}\n```")


def pyplot():
    """matplotlib's pyplot, or None (with a note) where matplotlib is not installed."""
    try:
        import matplotlib
        if not in_notebook() and not os.environ.get("MPLBACKEND"):
            matplotlib.use("Agg")  # a script: render to files, never to a window
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed here: figures are skipped")
        return None
    return plt


def show_figure(fig, name: str) -> None:
    """Show ``fig`` once (Jupyter) or save it as ``$LESSON_FIG_DIR/<name>.png`` (script), then
    close it."""
    plt = pyplot()
    if in_notebook():
        from IPython.display import display
        display(fig)
    else:
        where = os.environ.get("LESSON_FIG_DIR")
        if where:
            Path(where).mkdir(parents=True, exist_ok=True)
            fig.savefig(Path(where) / f"{name}.png", dpi=110, bbox_inches="tight")
            print(f"[figure {name}: saved to {where}]")
        else:
            print(f"[figure {name}: drawn; set LESSON_FIG_DIR to keep it]")
    if plt is not None:
        plt.close(fig)


# ------------------------------------------------------------------------------------------------
# where the lesson runs

#: the L2 size assumed when the device does not report one (the H200's)
L2_BYTES_DEFAULT = 50 * 2**20


def gpu_available() -> bool:
    """A CUDA GPU is here: the lesson measures live."""
    import torch
    return torch.cuda.is_available()


def device() -> str:
    return "cuda"


def sync() -> None:
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def free_memory() -> None:
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def l2_bytes() -> int:
    import torch
    if torch.cuda.is_available():
        return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0)
                   or L2_BYTES_DEFAULT)
    return L2_BYTES_DEFAULT


# ------------------------------------------------------------------------------------------------
# measuring live

@dataclasses.dataclass
class Case:
    """One implementation at one shape: how to make an input set, run it, check it."""
    impl: str
    op: str
    M: int
    N: int
    make_set: Callable[[], dict]
    call: Callable[[dict], object]
    check: Optional[Callable[[dict], Dict[str, float]]]  # output -> rel. error; None: a ceiling
    bytes_moved: int


def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64; NaN when ``out`` holds a NaN (a poisoned output the
    kernel did not overwrite)."""
    import torch
    if torch.isnan(out).any():
        return math.nan
    ref = ref.double()
    return float((out.double() - ref).norm() / ref.norm().clamp_min(1e-30))


def ref_backward(dy, x, w, rstd):
    """dx and dw of the library's oracle (``rmsnorm_lab.reference``, llama's rounding) left
    unrounded, from the forward's fp32 rstd: dx in float64; dw of x·rstd rounded to x's dtype
    (the value the forward multiplied by the weight), summed in fp32, in float64 (w's dtype)."""
    dx, _ = reference.rms_norm_backward(dy.double(), x.double(), w.double(), rstd,
                                        casting_mode="llama")
    _, dw = reference.rms_norm_backward(dy, x, w.double(), rstd, casting_mode="llama")
    return dx, dw


def forward_set(M: int, N: int) -> dict:
    """Fresh inputs (x, w near one) and a NaN-poisoned output, on the GPU."""
    import torch
    dev = device()
    x = torch.randn(M, N, device=dev, dtype=torch.bfloat16)
    w = (1 + 0.1 * torch.randn(N, device=dev)).to(torch.bfloat16)
    return {"x": x, "w": w, "y": torch.full_like(x, float("nan"))}


def forward_case(impl: str, fn, M: int, N: int) -> Case:
    """A teaching forward compiled with TVM-FFI: ``fn(x, w, y, eps)``."""
    def check(s):  # the library's oracle in float64, x·rstd rounded where llama rounds it
        x_hat = reference.rms_norm(s["x"].double(), eps=EPS, casting_mode="llama")
        return {"y": rel_err(s["y"], x_hat.to(s["x"].dtype).double() * s["w"].double())}
    return Case(impl, "fwd", M, N, lambda: forward_set(M, N),
                lambda s: fn(s["x"], s["w"], s["y"], EPS), check, 2 * M * N * 2 + N * 2)


def forward_copy_case(M: int, N: int) -> Case:
    """The forward's bytes (read M×N, write M×N) moved by ``torch.neg``: the ceiling at this
    shape."""
    import torch
    return Case(COPY_OF["fwd"], "fwd", M, N, lambda: forward_set(M, N),
                lambda s: torch.neg(s["x"], out=s["y"]), None, 2 * M * N * 2)


def backward_set(M: int, N: int, G: int) -> dict:
    """dy, x, w, the forward's fp32 rstd; dx and G fp32 partial rows of dW poisoned."""
    import torch
    s = forward_set(M, N)
    x = s["x"]
    dy = torch.randn(M, N, device=x.device, dtype=x.dtype)
    rstd = torch.rsqrt(x.float().pow(2).mean(-1) + EPS)
    return {"x": x, "w": s["w"], "dy": dy, "rstd": rstd, "dx": torch.full_like(x, float("nan")),
            "dwp": torch.full((G, N), float("nan"), device=x.device)}


def backward_case(impl: str, fns: Sequence, M: int, N: int, G: int,
                  outputs: Tuple[str, ...], finish_dw: bool) -> Case:
    """Teaching backward kernels ``fn(dy, x, w, rstd, dx, dwp)`` launched in order, then (when
    ``finish_dw``) ``dw = dwp.sum(0)`` in bf16. ``outputs``: what is checked (``dx``, ``dw``)."""
    import torch

    def call(s):
        for fn in fns:
            fn(s["dy"], s["x"], s["w"], s["rstd"], s["dx"], s["dwp"])
        if finish_dw:
            s["dw"] = s["dwp"].sum(0).to(torch.bfloat16)

    def check(s):
        dx_ref, dw_ref = ref_backward(s["dy"], s["x"], s["w"], s["rstd"])
        errs = {}
        if "dx" in outputs:
            errs["dx"] = rel_err(s["dx"], dx_ref)
        if "dw" in outputs:
            errs["dw"] = rel_err(s["dwp"].sum(0).to(torch.bfloat16), dw_ref)
        return errs

    minimum = 3 * M * N * 2 + 4 * M + 2 * N * 2          # the whole backward (BWD.bytes_moved)
    bytes_moved = {"dx": 3 * M * N * 2 + N * 2 + 4 * M,   # read dy, x, w, rstd; write dx
                   "dw": 2 * M * N * 2 + 4 * M + N * 2}   # read dy, x, rstd; write dw
    moved = minimum if len(outputs) == 2 else bytes_moved[outputs[0]]
    return Case(impl, "bwd", M, N, lambda: backward_set(M, N, G), call, check, moved)


def backward_copy_case(M: int, N: int) -> Case:
    """The backward's pattern (read two M×N, write one) moved by ``torch.add``: the ceiling at
    this shape."""
    import torch
    return Case(COPY_OF["bwd"], "bwd", M, N, lambda: backward_set(M, N, 1),
                lambda s: torch.add(s["dy"], s["x"], out=s["dx"]), None, 3 * M * N * 2)


def set_bytes(s: dict) -> int:
    import torch
    return sum(t.numel() * t.element_size() for t in s.values() if isinstance(t, torch.Tensor))


def time_graph(fn: Callable[[], object], calls_multiple: int, replays: int = 20,
               target_ms: float = 2.0):
    """Device µs per call by CUDA-graph replay (``bench.timing.graph_time_us``, as the
    benchmark times every implementation)."""
    from ..bench.timing import graph_time_us
    return graph_time_us(fn, replays=replays, target_ms=target_ms, calls_multiple=calls_multiple)


def provenance() -> dict:
    from ..results.provenance import collect
    return collect()


def _sticky(e: BaseException) -> bool:
    """A CUDA error that leaves the context unusable: nothing later on the GPU can run."""
    text = str(e).lower()
    return any(s in text for s in ("illegal memory access", "illegal address", "unspecified launch",
                                   "misaligned address", "device-side assert", "launch failure"))


class LiveRun:
    """Checks and times cases on the GPU and writes them as ``results/<gpu>/teach-<op>.csv``
    (the results schema; rewritten after every case, so what was measured survives a crash).

    Each case is checked once on fresh inputs with poisoned outputs (relative error against the
    float64 reference below ``TOL``); only then is it timed, by CUDA-graph replay over enough
    input sets to keep every call's inputs out of L2 (``bench.timing.rotation_count``), and
    written as ``time`` (µs) and ``bandwidth`` (GB/s: the case's bytes over the time) rows. A
    failure is reported and recorded in ``failures``; the lesson carries on."""

    def __init__(self, op: str, replays: int = 20):
        self.op, self.replays = op, replays
        self.prov = provenance()
        self.gpu = self.prov["gpu"]
        self.path = teach_path(op, self.gpu)
        self.rows: List[dict] = []
        self.errors: Dict[Tuple[str, int, int], Dict[str, float]] = {}
        self.failures: Dict[Tuple[str, int, int], str] = {}
        self.broken: Optional[str] = None  # a sticky CUDA error: nothing more can run

    def run(self, case: Case) -> Optional[Tuple[float, float, float]]:
        """Check then time ``case``; the (p20, p50, p80) µs, or None when it failed."""
        import torch
        from ..bench.runner import bandwidth, make_row
        from ..bench.timing import rotating, rotation_count

        key = (case.impl, case.M, case.N)
        where = f"{case.impl} at {fmt_shape(case.M, case.N)}"
        if self.broken:
            self.failures[key] = f"not run: an earlier CUDA error ({self.broken})"
            return None
        sets: list = []
        try:
            first = case.make_set()
            sets.append(first)
            if case.check is not None:
                case.call(first)
                sync()
                errs = case.check(first)
                self.errors[key] = errs
                bad = {k: v for k, v in errs.items() if not v < TOL}  # NaN compares False
                if bad:
                    why = ", ".join(f"{k}: " + ("NaN left in the output" if math.isnan(v)
                                                else f"rel. error {v:.2e}")
                                    for k, v in bad.items())
                    raise AssertionError(f"wrong answer ({why}; tolerance {TOL})")
            k = rotation_count(set_bytes(first), l2_bytes())
            sets += [case.make_set() for _ in range(k - 1)]
            q = time_graph(rotating(case.call, sets), calls_multiple=k, replays=self.replays)
        except Exception as e:  # noqa: BLE001 - one kernel failing is a finding, not a crash
            msg = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            self.failures[key] = msg
            print(f"FAILED {where}: {msg}")
            if _sticky(e):
                self.broken = msg
            return None
        finally:
            del sets
            try:
                free_memory()
            except Exception as e:  # noqa: BLE001
                self.broken = self.broken or f"{type(e).__name__}: {e}"
        for metric, v in (("time", q), ("bandwidth", bandwidth(case.bytes_moved, q))):
            self.rows.append(make_row(self.prov, case.op, case.impl, "graph", case.M, case.N,
                                      torch.bfloat16, metric, v))
        self.save()
        return (q.p20, q.p50, q.p80)

    def compiled(self, impl: str, N: int, build: Callable[[], object]):
        """``build()`` (a compilation for the GPU), or None with the failure recorded."""
        if self.broken:
            self.failures[(impl, "-", N)] = f"not compiled: an earlier CUDA error ({self.broken})"
            return None
        try:
            return build()
        except Exception as e:  # noqa: BLE001
            msg = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            self.failures[(impl, "-", N)] = "did not compile: " + msg
            print(f"FAILED {impl} N={N}: did not compile: {msg}")
            return None

    def save(self) -> Optional[Path]:
        if not self.rows:
            return None
        return results_io.write(self.rows, self.path)

    def summary(self) -> pd.DataFrame:
        """What ran: rel. errors of the checks and failures, one row per case."""
        keys = list(dict.fromkeys(list(self.errors) + list(self.failures)))
        rows = []
        for key in sorted(keys, key=lambda k: (k[0], k[2], -1 if k[1] == "-" else k[1])):
            errs = self.errors.get(key, {})
            rows.append({"impl": key[0], "M": key[1], "N": key[2],
                         **{f"rel. error {k}": v for k, v in errs.items()},
                         "status": "FAILED: " + self.failures[key] if key in self.failures
                         else "ok"})
        return pd.DataFrame(rows).set_index(["impl", "M", "N"]) if rows else pd.DataFrame()
