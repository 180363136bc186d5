"""Host-enqueue measurements: what one call costs the CPU on each launch path, where the GPU's
time overtakes it, and what the tensor-handle cache costs in memory.

Rows (``results/<gpu>/host.csv``), impl names carry the launch path after ``@``:

* ``path=host``: µs per call at HOST_SHAPE (samples interleaved across implementations, the
  garbage collector off inside each) for ``cute.auto@<launch path>``, ``triton.row`` and
  every installed peer; op ``fwd`` (inference), op ``fwd`` with impl suffix ``+autograd`` (inputs
  require grad, so the autograd graph is built), op ``full`` (forward + backward).
  ``cute.auto@tvm_ffi+nvtx`` is the default path with NVTX ranges on, ``+settings_per_call``
  the default call with the environment parsed before it (``instruments.per_call``),
  ``+python_node`` with the Python launch path and autograd node instead of the C++ extension
  (the other launch paths always take those). The launch paths and the cache cap are the
  workbook's instruments (``bench.instruments``, ``bench.launch_paths``).
* ``path=host`` with impl suffix ``+varying_m``: the same per-call host µs when every call has
  another row count, M drawn from 1..VARYING_M_MAX (a fixed seeded sequence; the rows of one
  preallocated tensor, as packed batches or a server's varying lengths give), op ``fwd`` and
  ``full``, for the default path and torch's ``F.rms_norm``; the row's M is VARYING_M_MAX.
* ``path=graph``: device µs of ``cute.auto@tvm_ffi`` (L2-warm) for the CROSSOVER_M sweep, to find
  the M at which device time overtakes each path's host time.
* op ``full`` at CACHE_SHAPE with impl ``cute.auto@cached:<cap>`` (``:unbounded`` for no cap),
  the default ``cute.auto@tvm_ffi`` and ``triton.row``: peak memory (MiB above the step's
  inputs) and eager time of a training-like step over LAYERS fresh activations.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch

from .. import results as results_io
from ..results import provenance
from . import peers as peers_mod
from .instruments import LAUNCH_PATHS, clear_caches, timed_call, use
from .runner import EPS, Outcome, make_row, output_path
from .timing import (HostTask, Quantiles, eager_time_us, graph_time_us,
                     interleaved_host_time_us)

DTYPE = torch.bfloat16
HOST_SHAPE = (128, 4096)
CROSSOVER_M = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
CACHE_SHAPE = (16384, 4096)
CACHE_CAPS = (0, 4, 8, 16, -1)
LAYERS = 12
VARYING_M_MAX = 8192
VARYING_M_CALLS = 3000
#: the implementations timed with a row count that changes every call
VARYING_M_IMPLS = ("cute.auto@tvm_ffi", "torch.native")


def lab_call(backend: str) -> Callable:
    from rmsnorm_lab import rms_norm
    return lambda x, w: rms_norm(x, w, EPS, casting_mode="llama", backend=backend)


def host_impls() -> Dict[str, tuple]:
    """name -> (fn(x, w), instruments and settings to hold while it is timed: keys of
    ``instruments.use``). They are entered once, outside the timed loop, so their own cost is
    not measured."""
    impls = {f"cute.auto@{p}": (lab_call("cute"), {"launch_path": p}) for p in LAUNCH_PATHS}
    # one saving at a time, each against the default path
    impls["cute.auto@tvm_ffi+nvtx"] = (lab_call("cute"), {"nvtx": True})
    impls["cute.auto@tvm_ffi+settings_per_call"] = (lab_call("cute"), {"settings_per_call": True})
    # the default path on the Python launch path and autograd node instead of the C++ extension
    impls["cute.auto@tvm_ffi+python_node"] = (lab_call("cute"), {"autograd_node": "python"})
    impls["triton.row"] = (lab_call("triton"), {})
    impls.update({name: (fn, {}) for name, fn in peers_mod.forward_peers(EPS).items()})
    return impls


def _calls(fn: Callable, M: int, N: int):
    """The three host workloads of one implementation: inference, forward with autograd,
    forward + backward."""
    x = torch.randn(M, N, device="cuda", dtype=DTYPE)
    w = torch.randn(N, device="cuda", dtype=DTYPE)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    dy = torch.randn_like(x)

    def full():
        fn(xg, wg).backward(dy)
    return {("fwd", ""): lambda: fn(x, w), ("fwd", "+autograd"): lambda: fn(xg, wg),
            ("full", ""): full}


def varying_m_sequence(calls: int = VARYING_M_CALLS, most: int = VARYING_M_MAX) -> List[int]:
    """The row counts of the varying-M workload: ``calls`` draws from 1..most, seeded, so every
    implementation and every run sees the same sequence."""
    g = torch.Generator().manual_seed(0)
    return torch.randint(1, most + 1, (calls,), generator=g).tolist()


def _varying_m_calls(fn: Callable, N: int):
    """The varying-M workloads of one implementation: each call takes the next row count of
    ``varying_m_sequence`` (cycling), x being the first M rows of one preallocated tensor.
    Every row count is called once here, so whatever a first call of a shape costs (a plan)
    is paid before the timing."""
    Ms = varying_m_sequence(VARYING_M_CALLS, VARYING_M_MAX)
    x = torch.randn(VARYING_M_MAX, N, device="cuda", dtype=DTYPE)
    w = torch.randn(N, device="cuda", dtype=DTYPE)
    wg = w.clone().requires_grad_()
    dy = torch.randn_like(x)
    at = [0]

    def next_m() -> int:
        at[0] = (at[0] + 1) % len(Ms)
        return Ms[at[0]]

    def fwd():
        return fn(x[:next_m()], w)

    def full():
        # the rows as a leaf of their own, as an activation reaches a norm: a slice of one
        # leaf would add its own backward (a zero-filled full-size gradient and a copy into it)
        # to every call, the same for every implementation
        m = next_m()
        fn(x[:m].detach().requires_grad_(), wg).backward(dy[:m])
    for _ in Ms:
        fwd()
        full()
    return {("fwd", "+varying_m"): fwd, ("full", "+varying_m"): full}


def training_step(fn: Callable, M: int, N: int, layers: int = LAYERS) -> Callable:
    """A training-like step: ``layers`` fresh activations normalized, kept for backward (as
    autograd keeps them), then back-propagated."""
    w = torch.randn(N, device="cuda", dtype=DTYPE, requires_grad=True)

    def step():
        outs = []
        for _ in range(layers):
            x = torch.randn(M, N, device="cuda", dtype=DTYPE, requires_grad=True)
            outs.append(fn(x, w))
        for y in reversed(outs):
            y.backward(torch.ones_like(y))
    return step


def _calls_per_sample(call: Callable, calls: int) -> int:
    """``calls`` per sample for the µs-scale paths, but about 50 ms per sample for the ``jit``
    path, whose calls take tens of milliseconds.

    Sized from the fastest of three calls after three warm-up calls: the first call compiles,
    and the second of a ``full`` task is the first to *accumulate* into ``x.grad``, which can
    load that kernel lazily (milliseconds). Sized from the second call alone, the first
    implementation timed got 2-call samples dominated by per-sample overhead, and its ``full`` row
    read far above the same code path under neutral toggles."""
    import time
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    per_call = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        call()
        torch.cuda.synchronize()
        per_call = min(per_call, time.perf_counter() - t0)
    return calls if per_call < 1e-3 else max(2, int(0.05 / per_call))


def host_tasks(impls: Dict[str, tuple], calls: int = 200,
               on_task: Optional[Callable[[], None]] = None,
               forward_only: frozenset = frozenset()
               ) -> Tuple[Dict[Tuple[str, str], HostTask], List[str]]:
    """Every implementation x workload of ``impls`` (``host_impls()``) at HOST_SHAPE as a task for
    ``interleaved_host_time_us``, keyed ``(op, impl)``, each timed under its overrides
    (``instruments.use``; ``instruments.timed_call``), each called six times here
    (compilation, warm-up, and the size of its samples: ``_calls_per_sample``); and the
    failures, named (an implementation whose backward fails is a finding, not an error). The
    names in ``forward_only`` (peers without a backward) get the inference workload only: inputs
    that require grad build no autograd graph through them. ``on_task`` is called after each
    (a progress bar)."""
    tasks, failures = {}, []
    for name, (fn, overrides) in impls.items():
        fn = timed_call(fn, overrides)
        workloads = dict(_calls(fn, *HOST_SHAPE))
        if name in forward_only:
            workloads = {("fwd", ""): workloads[("fwd", "")]}
        if name in VARYING_M_IMPLS:
            with use(**overrides):
                workloads.update(_varying_m_calls(fn, HOST_SHAPE[1]))
        for (op, suffix), call in workloads.items():
            context = functools.partial(use, **overrides)
            try:
                with context():
                    n = _calls_per_sample(call, calls)
            except Exception as e:  # noqa: BLE001 - see the docstring
                failures.append(f"{name}{suffix} {op}: {type(e).__name__}: {e}")
            else:
                tasks[(op, name + suffix)] = HostTask(call, n, context)
            if on_task is not None:
                on_task()
    return tasks, failures


def bench_host(out: Optional[Path] = None, tag: Optional[str] = None,
               repeats: int = 15) -> Outcome:
    from tqdm.auto import tqdm

    prov = provenance.collect()
    outcome = Outcome()
    rows: List[dict] = outcome.rows

    def row(op, impl, path, M, N, metric, q: Quantiles):
        rows.append(make_row(prov, op, impl, path, M, N, DTYPE, metric, q))

    impls = host_impls()
    steps = len(impls) * 3 + 2 * len(VARYING_M_IMPLS) + len(CROSSOVER_M) + len(CACHE_CAPS) + 1
    with tqdm(total=steps, desc="bench host") as bar:
        # every implementation x workload sampled once per round, rounds interleaved (see
        # interleaved_host_time_us: the host's speed drifts between a sequential run's rows)
        forward_only = peers_mod.forward_only() & set(impls)
        tasks, failures = host_tasks(impls, on_task=bar.update, forward_only=forward_only)
        bar.update(2 * len(forward_only))  # their autograd workloads, not run
        outcome.failures += failures
        outcome.skipped += [f"{name} +autograd, full: forward only"
                            for name in sorted(forward_only)]
        bar.set_postfix_str(f"{repeats} interleaved rounds")
        timed = interleaved_host_time_us(tasks, repeats=repeats)
        for (op, impl), q in timed.items():
            M = VARYING_M_MAX if impl.endswith("+varying_m") else HOST_SHAPE[0]
            row(op, impl, "host", M, HOST_SHAPE[1], "host", q)
        default = lab_call("cute")
        for M in CROSSOVER_M:
            x = torch.randn(M, HOST_SHAPE[1], device="cuda", dtype=DTYPE)
            w = torch.randn(HOST_SHAPE[1], device="cuda", dtype=DTYPE)
            # named with the path so these L2-warm rows never stand in for fwd.csv's L2-cold ones
            row("fwd", "cute.auto@tvm_ffi", "graph", M, HOST_SHAPE[1], "time",
                graph_time_us(lambda: default(x, w)))
            bar.update()
        for cap in CACHE_CAPS:
            label = "unbounded" if cap < 0 else str(cap)
            clear_caches()
            with use(launch_path="cached", tensor_cache_cap=cap):
                _measure_step(row, f"cute.auto@cached:{label}", lab_call("cute"), outcome)
            clear_caches()
            bar.update()
        with use(launch_path="tvm_ffi"):
            _measure_step(row, "cute.auto@tvm_ffi", lab_call("cute"), outcome)
        _measure_step(row, "triton.row", lab_call("triton"), outcome)
        bar.update()
    outcome.path = results_io.write(rows, output_path(
        Path(out) if out is not None else results_io.results_dir(), prov["gpu"], "host", tag))
    return outcome


def step_peak_and_time(step: Callable[[], object], rep_ms: int) -> Tuple[Quantiles, Quantiles]:
    """``(peak MiB above what was allocated before it, eager µs)`` of one training-like step,
    after a first call that compiles and warms the allocator."""
    step()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    mib = (torch.cuda.max_memory_allocated() - base) / 2**20
    return Quantiles(mib, mib, mib), eager_time_us(step, rep_ms=rep_ms)


def _measure_step(row, name: str, fn: Callable, outcome: Outcome) -> None:
    M, N = CACHE_SHAPE
    try:
        peak, time_us = step_peak_and_time(training_step(fn, M, N), rep_ms=200)
        row("full", name, "eager", M, N, "peak_mem", peak)
        row("full", name, "eager", M, N, "time", time_us)
    except Exception as e:  # noqa: BLE001
        outcome.failures.append(f"{name} step: {type(e).__name__}: {e}")
