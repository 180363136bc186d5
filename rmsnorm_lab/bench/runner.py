"""The benchmark sweep: every implementation on every shape, checked, timed and written as rows.

An op (``fwd`` now; ``bwd`` and ``full`` slot in beside it) is described by ``Op``: how to make
one set of inputs and how to run an implementation on it, plus the oracle and the bytes the op
must move. The sweep is the same for every op:

1. per shape, check each implementation once against ``reference`` (relative error of the norm
   below ``REL_TOL``); a wrong answer is reported and not timed, and an implementation that
   refuses a shape (``NotImplementedError`` / ``ValueError``) is skipped;
2. eager time, graph time (L2-cold: the graph cycles through enough input sets to exceed twice
   the L2), peak memory; bandwidth = bytes moved / time;
3. host enqueue µs per call at ``HOST_SHAPE``;
4. the copy ceilings, in the same run.

Lab implementations come from ``rmsnorm_lab.launch.lab_impls(op)`` (imported lazily, so this
module imports without it); peers from ``peers``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .. import provenance, reference
from .. import results as results_io
from . import peers as peers_mod
from .timing import (Quantiles, eager_time_us, graph_time_us, host_time_us, peak_mem_mib,
                     rotating, rotation_count)

EPS = 1e-6
DTYPE = torch.bfloat16
REL_TOL = 1e-2
HOST_SHAPE = (128, 4096)
LAB_PREFIXES = ("cute.", "triton.")

#: the forward sweep: N=4096 over M, then M=16384 over N
FWD_SWEEP: List[Tuple[int, int]] = (
    [(M, 4096) for M in (1024, 4096, 8192, 16384, 32768, 65536)]
    + [(16384, N) for N in (1024, 2048, 8192, 16384)]
)
QUICK_FWD_SWEEP: List[Tuple[int, int]] = [(1024, 4096), (16384, 4096)]

_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
Impl = Callable[..., object]


@dataclasses.dataclass(frozen=True)
class Op:
    name: str  # the ``op`` column
    make_inputs: Callable[[int, int, torch.dtype], tuple]  # fresh random inputs on CUDA
    run: Callable[[Impl, tuple], object]  # one call of an implementation on one input set
    reference: Callable[[tuple], object]  # what ``run`` must return
    bytes_moved: Callable[[tuple], int]  # the minimum DRAM traffic of one call
    peers: Dict[str, Callable[[float], Optional[Impl]]]  # name -> factory(eps), None if absent
    sweep: Sequence[Tuple[int, int]]
    quick_sweep: Sequence[Tuple[int, int]]


def _fwd_inputs(M: int, N: int, dtype: torch.dtype) -> tuple:
    x = torch.randn(M, N, dtype=dtype, device="cuda")
    w = (1 + 0.1 * torch.randn(N, device="cuda")).to(dtype)  # near one, like a trained norm
    return x, w


def _fwd_bytes(inputs: tuple) -> int:
    x, w = inputs  # x read, y written, w read
    return 2 * x.numel() * x.element_size() + w.numel() * w.element_size()


FWD = Op(
    name="fwd",
    make_inputs=_fwd_inputs,
    run=lambda impl, inputs: impl(*inputs),
    reference=lambda inputs: reference.rms_norm(inputs[0], inputs[1], EPS),
    bytes_moved=_fwd_bytes,
    peers=peers_mod.FORWARD_PEERS,
    sweep=FWD_SWEEP,
    quick_sweep=QUICK_FWD_SWEEP,
)

OPS: Dict[str, Op] = {"fwd": FWD}


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


class WrongOutput(Exception):
    """An implementation returned outputs of the wrong number, shape or dtype."""


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
    """``("ok", "")``, ``("skip", why)`` when the impl refuses the shape, or ``("fail", why)``."""
    try:
        out = op.run(impl, inputs)
    except (NotImplementedError, ValueError) as e:
        return "skip", f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 - a crashing kernel is a finding, not a bench crash
        return "fail", f"raised {type(e).__name__}: {e}"
    try:
        err = rel_error(out, expected)
    except (WrongOutput, AttributeError) as e:  # AttributeError: not tensors at all
        return "fail", f"wrong output: {e}"
    if not err < REL_TOL:
        return "fail", f"relative error {err:.3g} >= {REL_TOL}"
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
        from rmsnorm_lab.launch import lab_impls
    except ImportError as e:
        return {}, f"lab kernels unavailable (rmsnorm_lab.launch.lab_impls: {e})"
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
            if self._checked(name, impl, M, N, first, expected):
                try:
                    one = functools.partial(op.run, impl, first)
                    eager = eager_time_us(one, rep_ms=self.budget.eager_rep_ms)
                    graph = graph_time_us(rotating(functools.partial(op.run, impl), sets),
                                          replays=self.budget.graph_replays, calls_multiple=k)
                    mem = peak_mem_mib(one)
                except Exception as e:  # noqa: BLE001
                    self.fail(f"{name} at {M}x{N}: timing raised {type(e).__name__}: {e}")
                else:
                    for path, t in (("eager", eager), ("graph", graph)):
                        self._row(name, path, M, N, "time", t)
                        self._row(name, path, M, N, "bandwidth", bandwidth(moved, t))
                    self._row(name, "eager", M, N, "peak_mem", mem)
            self.bar.update()
        del sets, first, expected
        torch.cuda.empty_cache()

    def host(self, M: int, N: int) -> None:
        inputs = self.op.make_inputs(M, N, DTYPE)
        expected = self.op.reference(inputs)
        for name, impl in self.impls.items():
            self.bar.set_postfix_str(f"{name} host {M}x{N}")
            if self._checked(name, impl, M, N, inputs, expected):
                try:
                    q = host_time_us(functools.partial(self.op.run, impl, inputs),
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


def bench(op: str = "fwd", *, quick: bool = False, out: Optional[Path] = None,
          tag: Optional[str] = None) -> Outcome:
    """Run the sweep of ``op`` on the current CUDA device and write
    ``<out>/<gpu>/<op>[-<tag>].csv`` (``out`` defaults to the repository's ``results/``;
    ``quick`` runs fewer shapes for less time each and defaults the tag to ``quick`` so a quick
    run never replaces a full one)."""
    from tqdm.auto import tqdm

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
    shapes = list(spec.quick_sweep if quick else spec.sweep)
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
        sweep.host(*HOST_SHAPE)
        for name in peers_mod.CEILING_READS:
            sweep.ceiling(name)
    outcome = sweep.out
    outcome.path = results_io.write(outcome.rows, path)
    return outcome
