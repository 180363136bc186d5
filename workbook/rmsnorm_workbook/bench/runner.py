"""The benchmark sweep: every implementation on every shape, checked, timed and written as rows.

An op (``fwd``, ``bwd``, ``full``) is described by ``Op``: how to make one set of inputs and how
to run an implementation on it, plus the oracle and the bytes the op must move. Every
implementation is ``fn(x, w) -> y``, differentiable where the op needs a backward; the op decides
what is timed:

* ``fwd``  ``y = fn(x, w)``;
* ``bwd``  the backward alone: ``Op.prepare`` runs the forward once per input set *outside* the
  timed region, keeping the autograd graph, and the timed call is
  ``torch.autograd.grad(y, (x, w), dy, retain_graph=True)``. Autograd runs each backward kernel on
  the stream its forward ran on, so for such an op the forward, the warm-up, the timers and the
  CUDA-graph capture all run on one dedicated side stream per implementation (a backward node
  tied to the legacy default stream could not be captured);
* ``full`` forward and backward together: ``torch.autograd.grad(fn(x, w), (x, w), dy)``.

The sweep is the same for every op:

1. per shape, check each implementation once against ``reference`` (relative error of the norm
   below the op's ``rel_tol``); a wrong answer is reported and not timed, and an implementation that
   refuses a shape (``NotImplementedError`` / ``ValueError``) is skipped;
2. eager time, graph time (L2-cold: the graph cycles through enough input sets to exceed twice
   the L2), peak memory; bandwidth = bytes moved / time. Each is tried on its own: a CUDA-graph
   capture that fails is reported as a failure and the eager time is still recorded;
3. the same-shape ceiling at that shape: the copy that moves the bytes a kernel of the op must
   move at its size (``copy.shape``: read x, write y, for ``fwd``; ``copy2r1w.shape``: read two,
   write one, for ``bwd``), same rotation, same graph replay, so each kernel is judged against a
   copy of its own size, fixed costs included;
4. host enqueue µs per call at the op's ``host_shape``;
5. the copy ceilings on 1 GiB tensors (``copy``, ``copy2r1w``), in the same run.

Lab implementations come from ``rmsnorm_workbook.bench.impls.lab_impls(op)`` (imported lazily, so this
module imports without it); peers from ``peers``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import re
import tempfile
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from .. import results as results_io
from ..results import provenance
from . import peers as peers_mod
from .fp8 import SAME_SHAPE as _FP8_CEILINGS
from .fused_add import SAME_SHAPE as _ADD_CEILINGS
from .timing import (Quantiles, eager_time_us, graph_time_us, host_time_us, peak_mem_mib,
                     rotating, rotation_count)

from .ops import (BWD, BWD_SWEEP, DTYPE, EPS, FULL_OP, FWD, FWD_SWEEP,  # noqa: F401
                  HOST_SHAPE, LAB_PREFIXES, OPS, QUICK_BWD_SWEEP, QUICK_FWD_SWEEP, REL_TOL,
                  Impl, Op, WrongOutput, _DTYPE_NAMES)


@dataclasses.dataclass(frozen=True)
class Budget:
    """How long each timer runs; ``--quick`` trades precision for time."""
    eager_rep_ms: float
    graph_replays: int
    host_repeats: int


FULL = Budget(eager_rep_ms=100, graph_replays=50, host_repeats=15)
QUICK = Budget(eager_rep_ms=20, graph_replays=10, host_repeats=5)


@dataclasses.dataclass
class Outcome:
    path: Optional[Path] = None
    rows: List[dict] = dataclasses.field(default_factory=list)
    failures: List[str] = dataclasses.field(default_factory=list)  # wrong answers, crashes
    skipped: List[str] = dataclasses.field(default_factory=list)  # shapes an impl refuses


def rel_error(out: object, expected: object) -> float:
    """Largest ``||out - expected|| / ||expected||`` over the outputs, computed in fp32."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    exps = expected if isinstance(expected, (tuple, list)) else (expected,)
    if len(outs) != len(exps):
        raise WrongOutput(f"returned {len(outs)} outputs, expected {len(exps)}")
    worst = 0.0
    for o, e in zip(outs, exps):
        if tuple(o.shape) != tuple(e.shape) or o.dtype != e.dtype:
            raise WrongOutput(f"returned {tuple(o.shape)} {o.dtype}, expected "
                              f"{tuple(e.shape)} {e.dtype}")
        e32 = e.float()
        err = (torch.linalg.vector_norm(o.float() - e32)
               / torch.linalg.vector_norm(e32).clamp_min(1e-30)).item()
        if math.isnan(err):  # max() would drop a NaN; it must fail the check
            return err
        worst = max(worst, err)
    return worst


def check(op: Op, impl: Impl, inputs: tuple, expected: object) -> Tuple[str, str]:
    """``("ok", "")``, ``("skip", why)`` when the impl refuses the shape, or ``("fail", why)``.
    ``inputs`` are ``make_inputs``' tuple; ``op.bind`` runs here too (a forward that refuses the
    shape is a skip)."""
    try:
        out = op.run(impl, op.bind(impl, inputs))
    except (NotImplementedError, ValueError) as e:
        return "skip", f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 - a crashing kernel is a finding, not a bench crash
        return "fail", f"raised {type(e).__name__}: {e}"
    try:
        err = rel_error(out, expected)
    except (WrongOutput, AttributeError) as e:  # AttributeError: not tensors at all
        return "fail", f"wrong output: {e}"
    if not err < op.rel_tol:
        return "fail", f"relative error {err:.3g} >= {op.rel_tol}"
    return "ok", ""


def bandwidth(bytes_moved: int, time_us: Quantiles) -> Quantiles:
    """GB/s from µs: the fastest time gives the highest bandwidth, so the quantiles swap ends."""
    return Quantiles(*(bytes_moved / t / 1e3 for t in (time_us.p80, time_us.p50, time_us.p20)))


def make_row(prov: dict, op: str, impl: str, path: str, M: int, N: int, dtype: torch.dtype,
             metric: str, q: Quantiles) -> dict:
    return {**prov, "op": op, "impl": impl, "path": path, "M": M, "N": N,
            "dtype": _DTYPE_NAMES[dtype], "metric": metric,
            "unit": results_io.METRIC_UNITS[metric], "p20": q.p20, "p50": q.p50, "p80": q.p80}


def lab_implementations(op: str) -> Tuple[Dict[str, Impl], Optional[str]]:
    """``(impls, problem)``: the lab's implementations of ``op``, or ``{}`` and why not."""
    try:
        from rmsnorm_workbook.bench.impls import lab_impls
    except ImportError as e:
        return {}, f"lab kernels unavailable (rmsnorm_workbook.bench.impls.lab_impls: {e})"
    impls = dict(lab_impls(op))
    bad = [name for name in impls if not name.startswith(LAB_PREFIXES)]
    if bad:
        raise ValueError(f"lab_impls({op!r}) returned names {bad}; lab implementations are "
                         f"named {' or '.join(p + '<variant>' for p in LAB_PREFIXES)}")
    return impls, None


def output_path(root: Path, gpu: str, op: str, tag: Optional[str]) -> Path:
    if tag is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", tag):
        raise ValueError(f"tag must be letters, digits, '_', '.' or '-', got {tag!r}")
    return root / gpu / (f"{op}-{tag}.csv" if tag else f"{op}.csv")


@contextlib.contextmanager
def _impl_stream(op: Op) -> Iterator[Optional["torch.cuda.Stream"]]:
    """For an op with a ``prepare`` step (``bwd``): a fresh side stream, current for the
    duration, on which the forwards, the check, the timers and the graph capture all run (the
    backward kernels run on their forward's stream; a fresh one per implementation also keeps
    a failed capture from leaking into the next). Otherwise nothing changes (``None``)."""
    if op.prepare is None:
        yield None
        return
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(stream):
            yield stream
    finally:
        torch.cuda.current_stream().wait_stream(stream)
        try:
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001 - the failure was already recorded where it happened
            pass


def _recover() -> None:
    """After a failed capture: drain the device so the next implementation starts clean."""
    try:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001
        pass


#: same-shape ceiling name -> (tensors read, tensors written, factory of the kernel[, the dtype
#: it writes, where not the benchmark's])
SAME_SHAPE = {
    "copy": (1, 1, lambda: lambda a, b: torch.neg(a, out=b)),
    "copy2r1w": (2, 1, lambda: lambda a, b, c: torch.add(a, b, out=c)),
    **_ADD_CEILINGS,
    **_FP8_CEILINGS,
}


class _Sweep:
    """One run of the sweep; collects rows, failures and skips as it goes."""

    def __init__(self, op: Op, impls: Dict[str, Impl], budget: Budget, prov: dict, bar):
        self.op, self.impls, self.budget, self.prov, self.bar = op, impls, budget, prov, bar
        self.out = Outcome()
        self.l2_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size

    def fail(self, text: str) -> None:
        self.out.failures.append(text)
        self.bar.write("WARNING: " + text)

    def skip(self, text: str) -> None:
        self.out.skipped.append(text)
        self.bar.write("skip: " + text)

    def _row(self, impl, path, M, N, metric, q) -> None:
        self.out.rows.append(make_row(self.prov, self.op.name, impl, path, M, N, DTYPE, metric, q))

    def _checked(self, name: str, impl: Impl, M: int, N: int, inputs, expected) -> bool:
        status, why = check(self.op, impl, inputs, expected)
        if status == "skip":
            self.skip(f"{name} at {M}x{N}: {why}")
        elif status == "fail":
            self.fail(f"{name} at {M}x{N} not timed: {why}")
        return status == "ok"

    def shape(self, M: int, N: int) -> None:
        op = self.op
        first = op.make_inputs(M, N, DTYPE)
        expected = op.reference(first)
        set_bytes = sum(t.numel() * t.element_size() for t in first
                        if isinstance(t, torch.Tensor))
        k = rotation_count(set_bytes, self.l2_bytes)
        sets = [first] + [op.make_inputs(M, N, DTYPE) for _ in range(k - 1)]
        moved = op.bytes_moved(first)
        for name, impl in self.impls.items():
            self.bar.set_postfix_str(f"{name} {M}x{N}")
            with _impl_stream(op) as stream:
                if self._checked(name, impl, M, N, first, expected):
                    self._time(name, impl, M, N, sets, k, moved, stream)
            self.bar.update()
        device = next(t.device for t in first if isinstance(t, torch.Tensor))
        del sets, first, expected
        for ceiling in op.same_shape:
            self.ceiling_at_shape(M, N, ceiling, device)
        torch.cuda.empty_cache()

    def ceiling_at_shape(self, M: int, N: int, ceiling: str, device: torch.device) -> None:
        """``ceiling`` at an (M, N) shape (``<name>.shape``): its tensors rotated past the L2 as
        the kernels' inputs are, by graph replay: what any kernel moving those bytes at that
        size costs, launch and tail included."""
        reads, writes, kernel, *written = SAME_SHAPE[ceiling]
        out_dtype = written[0] if written else DTYPE
        call = kernel()
        name = ceiling + ".shape"
        moved = M * N * (reads * DTYPE.itemsize + writes * out_dtype.itemsize)
        k = rotation_count(moved, self.l2_bytes)
        try:
            sets = [[torch.randn(M, N, dtype=DTYPE, device=device) for _ in range(reads)]
                    + [torch.empty(M, N, dtype=out_dtype, device=device) for _ in range(writes)]
                    for _ in range(k)]
            t = graph_time_us(rotating(lambda s: call(*s), sets),
                              replays=self.budget.graph_replays, calls_multiple=k)
        except Exception as e:  # noqa: BLE001
            self.fail(f"ceiling {name} at {M}x{N}: raised {type(e).__name__}: {e}")
            return
        self._row(name, "graph", M, N, "time", t)
        self._row(name, "graph", M, N, "bandwidth", bandwidth(moved, t))

    def _time(self, name: str, impl: Impl, M: int, N: int, sets, k: int, moved: int,
              stream) -> None:
        """Eager, graph and peak memory, each on its own: one failing does not lose the
        others."""
        op = self.op
        try:
            bound = [op.bind(impl, s) for s in sets]  # untimed (bwd: the forwards)
        except Exception as e:  # noqa: BLE001
            self.fail(f"{name} at {M}x{N}: preparing the inputs raised {type(e).__name__}: {e}")
            return
        one = functools.partial(op.run, impl, bound[0])
        try:
            eager = eager_time_us(one, rep_ms=self.budget.eager_rep_ms)
        except Exception as e:  # noqa: BLE001
            self.fail(f"{name} at {M}x{N}: eager timing raised {type(e).__name__}: {e}")
        else:
            self._row(name, "eager", M, N, "time", eager)
            self._row(name, "eager", M, N, "bandwidth", bandwidth(moved, eager))
        try:
            graph = graph_time_us(rotating(functools.partial(op.run, impl), bound), stream=stream,
                                  replays=self.budget.graph_replays, calls_multiple=k)
        except Exception as e:  # noqa: BLE001 - e.g. a kernel that cannot be captured
            self.fail(f"{name} at {M}x{N}: CUDA-graph capture/replay raised "
                      f"{type(e).__name__}: {e}")
            _recover()
        else:
            self._row(name, "graph", M, N, "time", graph)
            self._row(name, "graph", M, N, "bandwidth", bandwidth(moved, graph))
        try:
            mem = peak_mem_mib(one)
        except Exception as e:  # noqa: BLE001
            self.fail(f"{name} at {M}x{N}: peak memory raised {type(e).__name__}: {e}")
        else:
            self._row(name, "eager", M, N, "peak_mem", mem)
        del bound, one

    def host(self, M: int, N: int) -> None:
        inputs = self.op.make_inputs(M, N, DTYPE)
        expected = self.op.reference(inputs)
        for name, impl in self.impls.items():
            self.bar.set_postfix_str(f"{name} host {M}x{N}")
            with _impl_stream(self.op):
                if self._checked(name, impl, M, N, inputs, expected):
                    try:
                        bound = self.op.bind(impl, inputs)
                        q = host_time_us(functools.partial(self.op.run, impl, bound),
                                         repeats=self.budget.host_repeats)
                    except Exception as e:  # noqa: BLE001
                        self.fail(f"{name} host at {M}x{N}: raised {type(e).__name__}: {e}")
                    else:
                        self._row(name, "host", M, N, "host", q)
            self.bar.update()

    def ceiling(self, name: str) -> None:
        self.bar.set_postfix_str(name)
        try:
            c = peers_mod.ceiling(name, DTYPE)
            t = graph_time_us(c.fn, replays=self.budget.graph_replays)
        except Exception as e:  # noqa: BLE001
            self.fail(f"ceiling {name}: raised {type(e).__name__}: {e}")
        else:
            self._row(name, "graph", c.M, c.N, "time", t)
            self._row(name, "graph", c.M, c.N, "bandwidth", bandwidth(c.bytes_moved, t))
            del c
        torch.cuda.empty_cache()
        self.bar.update()


def _checkpoint(rows: List[dict], path: Path) -> None:
    """Write the rows measured so far (replaced by the complete file at the end), so that a run
    killed part-way (a time limit on the GPU host) keeps the shapes it finished. Every row is a
    complete measurement of this run; only the file may lack shapes."""
    if rows:
        try:
            results_io.write(rows, path)
        except Exception as e:  # noqa: BLE001 - the final write reports real problems
            print(f"note: could not write a checkpoint of {path}: {e}")


def bench(op: str = "fwd", *, quick: bool = False, out: Optional[Path] = None,
          tag: Optional[str] = None,
          shapes: Optional[Sequence[Tuple[int, int]]] = None) -> Outcome:
    """Run the sweep of ``op`` on the current CUDA device and write
    ``<out>/<gpu>/<op>[-<tag>].csv`` (``out`` defaults to the repository's ``results/``;
    ``quick`` runs fewer shapes for less time each and defaults the tag to ``quick`` so a quick
    run never replaces a full one; ``shapes``, (M, N) pairs, replace the sweep's and need a tag
    for the same reason). The file is rewritten after every shape, so a run stopped part-way
    leaves the shapes it finished."""
    from tqdm.auto import tqdm

    if shapes and not tag:
        raise ValueError("a run of chosen shapes needs a tag: it must not replace the full "
                         "sweep's file")
    if not torch.cuda.is_available():
        raise RuntimeError("the benchmark needs a CUDA GPU")
    spec = OPS[op]
    tag = tag if tag is not None else ("quick" if quick else None)
    prov = provenance.collect()
    path = output_path(Path(out) if out is not None else results_io.results_dir(), prov["gpu"],
                       op, tag)
    lab, problem = lab_implementations(op)
    peers = {name: make(EPS) for name, make in spec.peers.items()}
    missing = [name for name, fn in peers.items() if fn is None]
    impls = {**lab, **{name: fn for name, fn in peers.items() if fn is not None}}
    shapes = list(shapes or (spec.quick_sweep if quick else spec.sweep))
    budget = QUICK if quick else FULL
    print(f"bench {op} on {torch.cuda.get_device_name()} ({prov['gpu']}, "
          f"{prov['sm_count']} SMs): {len(impls)} implementations x {len(shapes)} shapes")
    if missing:
        print("peers not importable here: " + ", ".join(missing))
    torch.manual_seed(0)  # the same inputs in every run, so reruns measure the same work
    total = len(impls) * (len(shapes) + 1) + len(peers_mod.CEILING_READS)
    with tqdm(total=total, desc=f"bench {op}") as bar:
        sweep = _Sweep(spec, impls, budget, prov, bar)
        if problem:
            sweep.fail(problem)
        for M, N in shapes:
            sweep.shape(M, N)
            _checkpoint(sweep.out.rows, path)
        sweep.host(*spec.host_shape)
        for name in peers_mod.CEILING_READS:
            sweep.ceiling(name)
    outcome = sweep.out
    outcome.path = results_io.write(outcome.rows, path)
    return outcome


def graph_times_now(op: str, M: int, N: int):
    """µs a call, CUDA-graph replay medians, of every implementation of ``op`` at (M, N) on
    this GPU, now, by impl: ``bench`` of that one shape into a temporary directory (a
    notebook's live path)."""
    df = results_io.load(bench(op, out=Path(tempfile.mkdtemp()), tag="live",
                               shapes=[(M, N)]).path)
    at = df[(df["path"] == "graph") & (df["metric"] == "time") & (df["M"] == M)
            & (df["N"] == N)]
    return at.set_index("impl")["p50"]
