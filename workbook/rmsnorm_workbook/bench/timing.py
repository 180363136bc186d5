"""Timers: device time by CUDA-graph replay, eager time, host enqueue time, peak memory.

Every timer returns ``Quantiles`` (p20, p50, p80) in microseconds (MiB for memory): a median
alone hides the spread that tells a stable kernel from a noisy one.

The three times answer different questions:

* ``graph_time_us`` -- what the kernel costs on the GPU. Many calls are captured in one CUDA graph
  and the graph is replayed, so launch gaps and Python are gone; ``interleaved_graph_time_us``
  for several captured graphs compared in one run.
* ``eager_time_us`` -- what a caller sees launching one call at a time (``triton.testing.do_bench``,
  which also flushes L2 before every call). When the host is slower than the kernel, the launch
  gap shows up here and not in the graph time.
* ``host_time_us`` -- what one call costs the CPU: enqueue time, with the GPU never waited on;
  ``interleaved_host_time_us`` for several functions compared on one drifting host.
"""

from __future__ import annotations

import gc
import itertools
import math
import time
from typing import (Callable, ContextManager, Dict, Hashable, NamedTuple, Optional,
                    Sequence)

import numpy as np
import torch


class Quantiles(NamedTuple):
    p20: float
    p50: float
    p80: float


def quantiles(samples: Sequence[float]) -> Quantiles:
    q = np.quantile(np.asarray(samples, dtype=np.float64), [0.2, 0.5, 0.8])
    return Quantiles(*(float(v) for v in q))


def _warm_up(fn: Callable[[], object], calls: int,
             stream: Optional[torch.cuda.Stream] = None) -> None:
    # On a side stream, as graph capture requires: lazy initialisation (compilation, autotuning,
    # workspace allocation) must happen before the capture, not inside it.
    side = stream if stream is not None else torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(calls):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()


def graph_time_us(fn: Callable[[], object], *, replays: int = 50, target_ms: float = 2.0,
                  calls_multiple: int = 1, max_calls: int = 2000,
                  stream: Optional[torch.cuda.Stream] = None) -> Quantiles:
    """Device µs per call of ``fn`` by CUDA-graph replay.

    ``fn`` is captured ``k`` times in one graph, ``k`` chosen so that one replay lasts about
    ``target_ms`` (long enough that the event timer's ~µs resolution does not matter) and rounded
    up to a multiple of ``calls_multiple`` (the number of rotating input sets, so every replay
    walks the sets in the same order). Each replay gives one sample, ``elapsed / k``.

    With ``stream``, the warm-up, the estimate and the capture all run on that stream: the
    backward benchmark passes the stream its forwards ran on, because autograd runs each backward
    kernel on its forward's stream and a capture must see them all on the capturing stream.
    """
    if stream is not None:
        with torch.cuda.stream(stream):
            return _graph_time(fn, replays, target_ms, calls_multiple, max_calls, stream)
    return _graph_time(fn, replays, target_ms, calls_multiple, max_calls, None)


def _graph_time(fn, replays, target_ms, calls_multiple, max_calls, stream) -> Quantiles:
    graph = capture_graph(fn, target_ms=target_ms, calls_multiple=calls_multiple,
                          max_calls=max_calls, stream=stream)
    return quantiles(_replay_samples(graph, replays))


class CapturedGraph(NamedTuple):
    """``calls`` calls of a function captured in one CUDA graph, uploaded (replayed once)."""
    graph: torch.cuda.CUDAGraph
    calls: int


def capture_graph(fn: Callable[[], object], *, calls: Optional[int] = None,
                  target_ms: float = 2.0, calls_multiple: int = 1, max_calls: int = 2000,
                  stream: Optional[torch.cuda.Stream] = None) -> CapturedGraph:
    """``fn`` warmed up and captured ``calls`` times in one graph, or, without ``calls``, ``k``
    times as ``graph_time_us`` says; on ``stream`` if given."""
    _warm_up(fn, max(3, calls_multiple), stream)
    if calls is None:
        # Estimate the per-call time from a few eager calls: it includes launch gaps, so it is
        # an overestimate and k errs on the short side of target_ms.
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            fn()
        end.record()
        torch.cuda.synchronize()
        per_call_ms = max(start.elapsed_time(end) / 10, 1e-4)
        calls = min(max(1, math.ceil(target_ms / per_call_ms)), max_calls)
        calls = math.ceil(calls / calls_multiple) * calls_multiple

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(calls):
            fn()
    graph.replay()  # the first replay uploads the graph; keep it out of the samples
    torch.cuda.synchronize()
    return CapturedGraph(graph, calls)


def _replay_samples(captured: CapturedGraph, replays: int) -> list:
    """µs per call of ``replays`` replays back to back, each between its own events."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    for s, e in zip(starts, ends):
        s.record()
        captured.graph.replay()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e3 / captured.calls for s, e in zip(starts, ends)]


def interleaved_graph_time_us(graphs: Dict[Hashable, CapturedGraph], *, rounds: int = 8,
                              replays: int = 25) -> Dict[Hashable, Quantiles]:
    """``graph_time_us`` for several captured graphs, their samples interleaved: in each round
    every graph is replayed once untimed, then ``replays`` times timed, back to back. Each
    graph's quantiles are over all its rounds' samples. The untimed replay absorbs what
    switching costs: on an H200 a model's decode step replayed right after another model's took
    a median 0.7-2.5% longer than the replays that followed it, and a
    server's loop replays one graph. Interleaving exposes every graph to the same drift of the
    device, as ``interleaved_host_time_us`` does for the host."""
    samples: Dict[Hashable, list] = {key: [] for key in graphs}
    for _ in range(rounds):
        for key, captured in graphs.items():
            captured.graph.replay()
            samples[key] += _replay_samples(captured, replays)
    return {key: quantiles(s) for key, s in samples.items()}


def eager_time_us(fn: Callable[[], object], *, warmup_ms: float = 25,
                  rep_ms: float = 100) -> Quantiles:
    """µs per call, one launch at a time, L2 flushed before each (``triton.testing.do_bench``;
    its ``warmup``/``rep`` arguments are milliseconds of running, not counts)."""
    from triton.testing import do_bench  # imported here: triton's import is slow and CUDA-only

    ms = do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=[0.2, 0.5, 0.8])
    return Quantiles(*(float(v) * 1e3 for v in ms))


def host_time_us(fn: Callable[[], object], *, n: int = 200, repeats: int = 15,
                 warmup: int = 20) -> Quantiles:
    """Host µs per call to enqueue ``fn``: ``n`` calls back to back, no synchronisation between
    them, timed with ``perf_counter``; one sample per repeat.

    ``n`` stays moderate so the GPU's launch queue (about a thousand entries) never fills: a full
    queue would block the CPU and measure the GPU instead. The GPU is drained before each repeat.
    """
    for _ in range(warmup):
        fn()
    samples = [_host_sample(fn, n) for _ in range(repeats)]
    torch.cuda.synchronize()
    return quantiles(samples)


def _host_sample(fn: Callable[[], object], n: int) -> float:
    """µs per call over ``n`` calls, with Python's garbage collector off while they run (as
    ``timeit`` does): a training call allocates enough Python objects to trigger collections,
    and a collection lands on whichever function is timed when it falls due. (Collecting before
    every sample instead was slow with the peers' modules loaded, ~0.7 s a collection: the
    benchmark ran past its time limit.)"""
    torch.cuda.synchronize()
    enabled = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) * 1e6 / n
    finally:
        if enabled:
            gc.enable()


class HostTask(NamedTuple):
    """One function for ``interleaved_host_time_us``: ``n`` calls per sample, made inside
    ``context()`` (entered and left outside the timed loop)."""
    fn: Callable[[], object]
    n: int
    context: Callable[[], ContextManager]


def interleaved_host_time_us(tasks: Dict[Hashable, HostTask], *, repeats: int = 15,
                             warmup: int = 20,
                             on_round: Optional[Callable[[int], None]] = None
                             ) -> Dict[Hashable, Quantiles]:
    """``host_time_us`` for several functions, their samples interleaved: round r takes one
    sample of each. A shared host's speed drifts by tens of percent within a minute
    (docs/design-record.md, 'Measurement: interleaved timers'); interleaving exposes every
    function to the same drift, so their ratios
    hold where the absolute numbers move."""
    for task in tasks.values():
        with task.context():
            for _ in range(warmup if task.n > 2 else 1):
                task.fn()
    samples: Dict[Hashable, list] = {key: [] for key in tasks}
    for r in range(repeats):
        for key, task in tasks.items():
            with task.context():
                samples[key].append(_host_sample(task.fn, task.n))
        if on_round is not None:
            on_round(r)
    torch.cuda.synchronize()
    return {key: quantiles(s) for key, s in samples.items()}


def peak_mem_mib(fn: Callable[[], object]) -> Quantiles:
    """MiB that one call of ``fn`` allocates at its peak above what was allocated before it
    (its output, workspaces and anything it caches), from the caching allocator's statistics.
    One call is deterministic, so the three quantiles are equal."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    mib = (torch.cuda.max_memory_allocated() - base) / 2**20
    del out
    return Quantiles(mib, mib, mib)


def rotation_count(set_bytes: int, l2_bytes: int) -> int:
    """How many distinct input sets to cycle through so that the data touched between two uses of
    one set exceeds twice the L2 (``l2_bytes``): each call then reads its inputs from HBM."""
    return max(1, math.ceil(2 * l2_bytes / max(set_bytes, 1)))


def rotating(call: Callable[[object], object], sets: Sequence[object]) -> Callable[[], object]:
    """A zero-argument function calling ``call(s)`` for the next ``s`` of ``sets``, cyclically."""
    cycle = itertools.cycle(sets)
    return lambda: call(next(cycle))
