"""``bench --op model``: what a faster norm is worth inside a model step.

Two transformers models (``model_build``: Llama and Qwen3, 8 layers, hidden 4096, random weights,
bf16, SDPA attention), each with every norm choice (``shipped``, ``torch``, ``lab``,
``lab+carry``, ``liger``; Qwen3 also ``lab+qk``), each checked against ``shipped`` on the same
tokens (logits within ``model_build.AGREE_REL``; a choice that disagrees is a failure and is not
timed), then three workloads (``model_steps``: ``train``, ``prefill``, ``decode``). Then, in the
full run (``--no-compile`` leaves it out, ``--quick`` too unless ``--compile``), each model under
``torch.compile`` (default mode), prefill and train, with ``model_build.COMPILE_CHOICES``: torch's
norms, the lab's ops as ``torch.library`` nodes opaque to Inductor (``lab``, ``lab+qk``), and the
lab stepping aside as it does by default (``lab@decompose``, ``lab+qk@decompose``: Inductor gets
the math). Each model is freed before the next is built.

Rows (``results/<gpu>/model.csv``): impl ``<arch>.<choice>`` (``llama.lab+carry``) or
``<arch>.compile.<choice>``; op ``full`` (train) or ``fwd`` (prefill, decode); M the tokens of one
step, N the hidden size; per workload:

* ``eager``/``time``: CUDA events around one step at a time (``timing.eager_time_us``,
  ``triton.testing.do_bench``: L2 flushed before each step, negligible next to a model's weights).
  The events are on the GPU's clock, so this is the time from the GPU reaching the step to it
  finishing the step's last kernel: device time, plus any time the GPU waits for the host's
  launches inside the step (a host-bound decode step shows its host time here), minus the host
  time before the first launch.
* ``eager``/``wall``: ``perf_counter`` around K steps back to back and one synchronize (several
  samples), µs per step: what a training or serving loop sees, host and device overlapping
  across steps, so about the larger of the two per step.
* ``host``/``host``: CPU µs to enqueue one step, the GPU drained before it (``timing.host_time_us``
  with one step per sample): Python, transformers, the dispatcher and every launch (the
  backward's too: ``backward()`` returns once autograd has enqueued it). Where it exceeds the
  device time, the step is host-bound and a faster kernel buys nothing.
* ``eager``/``peak_mem`` (train): MiB allocated at the step's peak above the model's weights.
* ``graph``/``time`` (decode): the step captured once in a CUDA graph and replayed: the device
  time with the host taken out.

Decode's wall, host and graph timers compare steps that differ by tens of microseconds on a host
whose cost per step drifts by more than that between minutes
(docs/design-record.md, 'Measurement: interleaved timers'). So each
choice's decode step is kept (its model and its graph with it) until every choice of the
architecture has run; then each of the three timers takes its samples in interleaved rounds, one
sample of every choice per round (``timing.interleaved_host_time_us``,
``timing.interleaved_graph_time_us``), and drift reaches every choice alike. (The decode step's
CUDA events are taken with its choice's other timers.)

The timers are a ``Timers`` argument (``CUDA_TIMERS`` here), so the whole loop also runs on the
CPU with stand-ins (tests/workbook/test_bench_model.py). ``python -m rmsnorm_workbook.bench.model --capture
llama.lab:train`` runs one model's steps in NVTX ranges for Nsight Systems
(``profiling.model_share`` reads the norm kernels' share of each step from its export).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import time
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

import torch

from .. import results as results_io
from ..results import provenance
from . import model_build as mb
from .model_steps import FULL, QUICK, WORKLOADS, Sizes, Step, make_step
from .runner import Outcome, make_row, output_path
from .timing import (HostTask, Quantiles, capture_graph, eager_time_us, host_time_us,
                     interleaved_graph_time_us, interleaved_host_time_us, peak_mem_mib,
                     quantiles)

COMPILE_WORKLOADS = ("prefill", "train")
NSYS_LINE = ("nsys profile -t cuda,nvtx --cuda-graph-trace=node --capture-range=cudaProfilerApi "
             "--capture-range-end=stop --export sqlite --force-overwrite true -o {name} "
             "python -m rmsnorm_workbook.bench.model --capture {spec}")


class Timers(NamedTuple):
    """The clocks of a run: the CUDA ones, or CPU stand-ins in the tests."""
    sync: Callable[[], None]
    eager: Callable[..., Quantiles]   # eager_time_us(fn, warmup_ms=, rep_ms=)
    host: Callable[..., Quantiles]    # host_time_us(fn, n=, repeats=, warmup=)
    peak: Callable[..., Quantiles]    # peak_mem_mib(fn)
    capture: Callable[..., object]    # capture_graph(fn)
    graphs: Callable[..., dict]       # interleaved_graph_time_us(graphs, rounds=, replays=)
    hosts: Callable[..., dict]        # interleaved_host_time_us(tasks, repeats=, warmup=)


CUDA_TIMERS = Timers(torch.cuda.synchronize, eager_time_us, host_time_us, peak_mem_mib,
                     capture_graph, interleaved_graph_time_us, interleaved_host_time_us)


@dataclasses.dataclass(frozen=True)
class Budget:
    """How many samples each timer takes; steps last 1-300 ms, so counts follow the step."""
    event_samples: int     # do_bench repetitions (after its own 5-step estimate)
    event_min_ms: float    # ...or this many ms of them, for short steps
    wall_samples: int
    wall_sample_ms: float  # K steps per wall sample: at least 2, about this long
    host_ms: float         # host samples (one step each): 3 to 25, about this long
    decode_rounds: int     # interleaved rounds over an architecture's decode steps
    graph_replays: int     # timed replays of each decode graph per round


FULL_BUDGET = Budget(event_samples=3, event_min_ms=100, wall_samples=3, wall_sample_ms=250,
                     host_ms=500, decode_rounds=8, graph_replays=25)
QUICK_BUDGET = Budget(event_samples=2, event_min_ms=50, wall_samples=2, wall_sample_ms=100,
                      host_ms=200, decode_rounds=2, graph_replays=10)


def step_ms(fn: Callable[[], object], sync: Callable[[], None]) -> float:
    """ms of one step, synchronized (after the warm-up): what the sample counts follow."""
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - t0) * 1e3


def _wall_sample(fn: Callable[[], object], steps: int, sync: Callable[[], None]) -> float:
    """µs per step of ``steps`` steps back to back and one synchronize."""
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    sync()
    return (time.perf_counter() - t0) * 1e6 / steps


def wall_time_us(fn: Callable[[], object], steps: int, samples: int,
                 sync: Callable[[], None]) -> Quantiles:
    """µs per step of ``steps`` steps back to back and one synchronize, ``samples`` times."""
    return quantiles([_wall_sample(fn, steps, sync) for _ in range(samples)])


def interleaved_wall_time_us(loops: Dict[str, Tuple[Callable[[], object], int]], rounds: int,
                             sync: Callable[[], None]) -> Dict[str, Quantiles]:
    """``wall_time_us`` of several ``(fn, steps)`` loops, one sample of each per round."""
    samples: Dict[str, list] = {key: [] for key in loops}
    for _ in range(rounds):
        for key, (fn, steps) in loops.items():
            samples[key].append(_wall_sample(fn, steps, sync))
    return {key: quantiles(s) for key, s in samples.items()}


#: what ``_Run.attempt`` returns for a call that raised
FAILED = object()


class _Run:
    """One run's rows, failures and skips, and the timing of one step."""

    def __init__(self, sizes: Sizes, budget: Budget, timers: Timers, prov: dict):
        self.sizes, self.budget, self.timers, self.prov = sizes, budget, timers, prov
        self.out = Outcome()
        #: impl -> (its decode step, N, ms a step, its graph or None), until ``time_decode``
        self.decode: dict = {}

    def row(self, step: Step, impl: str, path: str, N: int, metric: str, q: Quantiles) -> None:
        self.out.rows.append(make_row(self.prov, step.op, impl, path, step.M, N, mb.DTYPE,
                                      metric, q))

    def attempt(self, what: str, fn: Callable[[], object]) -> object:
        """``fn()``, or ``FAILED`` with the failure recorded (a crash is a finding, not the
        end of the run)."""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001
            self.out.failures.append(f"{what}: {type(e).__name__}: {e}")
            _recover()
            return FAILED

    def time(self, step: Step, impl: str, N: int) -> None:
        """Every timer of one workload (see the module docstring), each tried on its own; the
        decode step's wall, host and graph timers wait for ``time_decode``."""
        t, b, what = self.timers, self.budget, f"{impl} {step.workload}"
        ms = self.attempt(f"{what} warm-up", lambda: (step.fn(), step.fn(),
                                                       step_ms(step.fn, t.sync))[-1])
        if ms is FAILED:
            return
        found = {}
        metrics = {("eager", "time"): lambda: t.eager(step.fn, warmup_ms=ms, rep_ms=max(
            (b.event_samples + 0.5) * ms, b.event_min_ms))}
        if step.workload != "decode":
            metrics[("eager", "wall")] = lambda: wall_time_us(
                step.fn, _wall_steps(b, ms), b.wall_samples, t.sync)
            metrics[("host", "host")] = lambda: t.host(step.fn, n=1, warmup=1,
                                                       repeats=_host_repeats(b, ms))
        if step.workload == "train":
            metrics[("eager", "peak_mem")] = lambda: t.peak(step.fn)
        for (path, metric), measure in metrics.items():
            q = self.attempt(f"{what} {path} {metric}", measure)
            if q is not FAILED:
                self.row(step, impl, path, N, metric, q)
                found[metric] = q
        if step.workload == "decode":
            captured = self.attempt(f"{what} graph capture", lambda: t.capture(step.fn))
            self.decode[impl] = (step, N, ms, None if captured is FAILED else captured)
        print(f"  {what}: M={step.M}, one step {ms:.1f} ms; "
              + ", ".join(f"{k} {_fmt(k, q.p50)}" for k, q in found.items()), flush=True)

    def time_decode(self) -> None:
        """The kept decode steps' wall, host and graph rows, each timer's samples in
        interleaved rounds (module docstring); then the steps, their graphs and the models they
        hold are let go."""
        kept, self.decode = self.decode, {}
        if not kept:
            return
        t, b = self.timers, self.budget
        slowest = max(ms for _, _, ms, _ in kept.values())
        graphs = {impl: g for impl, (_, _, _, g) in kept.items() if g is not None}
        timers = {
            ("eager", "wall"): lambda: interleaved_wall_time_us(
                {impl: (step.fn, _wall_steps(b, ms)) for impl, (step, _, ms, _) in kept.items()},
                b.decode_rounds, t.sync),
            ("host", "host"): lambda: t.hosts(
                {impl: HostTask(step.fn, 1, contextlib.nullcontext)
                 for impl, (step, _, _, _) in kept.items()},
                repeats=_host_repeats(b, slowest), warmup=1),
            ("graph", "time"): lambda: t.graphs(graphs, rounds=b.decode_rounds,
                                                replays=b.graph_replays),
        }
        for (path, metric), measure in timers.items():
            if path == "graph" and not graphs:
                continue
            found = self.attempt(f"decode {path} {metric}", measure)
            if found is FAILED:
                continue
            for impl, q in found.items():
                step, N, _, _ = kept[impl]
                self.row(step, impl, path, N, metric, q)
            print(f"  decode {path if path == 'graph' else metric}, interleaved: "
                  + ", ".join(f"{impl} {_fmt(metric, q.p50)}" for impl, q in found.items()),
                  flush=True)


def _wall_steps(b: Budget, ms: float) -> int:
    """Steps of one wall-clock sample: at least 2, about ``b.wall_sample_ms``."""
    return max(2, math.ceil(b.wall_sample_ms / ms))


def _host_repeats(b: Budget, ms: float) -> int:
    """Host samples (one step each): 3 to 25, about ``b.host_ms`` of steps of ``ms``."""
    return min(25, max(3, int(b.host_ms / ms)))


def _fmt(metric: str, value: float) -> str:
    return f"{value / 1024:.1f} GiB" if metric == "peak_mem" else f"{value / 1e3:.2f} ms"


def _recover() -> None:
    """After a failure: drain the device and return its cached memory, so the next measurement
    starts clean."""
    try:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001 - the failure was already recorded
        pass


@dataclasses.dataclass
class Reference:
    """What ``shipped`` computed, for the other choices of its architecture to be checked
    against: logits on ``model_build.check_ids``, and the prefill workload's last-position
    logits (the compiled choices are checked on those: another shape would compile again)."""
    check: torch.Tensor
    prefill: torch.Tensor


def run_choice(run: _Run, arch: str, choice: str, reference: Optional[Reference],
               device: str = "cuda", **sizes) -> Optional[Reference]:
    """Build ``arch`` with ``choice``'s norms, check it against ``reference`` and time every
    workload. ``shipped`` is not checked: it returns the reference (None where it failed).
    ``sizes`` overrides the model's (the tests build tiny ones)."""
    impl = mb.impl_name(arch, choice)
    if reference is None and choice != "shipped":
        run.out.failures.append(f"{impl}: not checked ({arch}.shipped computed no reference)")
        return None
    model = _built(run, impl, arch, choice, device, sizes)
    if model is None:
        return None
    ids = mb.check_ids(model.config.vocab_size, model.device)
    logits = run.attempt(f"{impl} check", lambda: mb.prefill_logits(model, ids))
    if logits is FAILED:
        return None
    made = None
    if reference is None:
        prefill = run.attempt(f"{impl} check", lambda: make_step(
            "prefill", model, run.sizes).fn().clone())
        made = None if prefill is FAILED else Reference(logits, prefill)
    elif not _agrees(run, impl, mb.agreement(logits, reference.check,
                                             against=mb.impl_name(arch, "shipped"))):
        return None
    for workload in WORKLOADS:
        step = run.attempt(f"{impl} {workload} inputs",
                           lambda w=workload: make_step(w, model, run.sizes))
        if step is not FAILED:
            run.time(step, impl, model.config.hidden_size)
        del step
    return made


def _agrees(run: _Run, impl: str, agreed: mb.Agreement) -> bool:
    print(f"{impl}: {agreed}", flush=True)
    if not agreed.ok:
        run.out.failures.append(f"{impl}: disagrees with {agreed.against}, not timed: {agreed}")
    return agreed.ok


def _built(run: _Run, impl: str, arch: str, choice: str, device: str, sizes: dict):
    """A fresh model of ``arch`` with ``choice``'s norms, or None (skipped or failed: recorded)."""
    model = run.attempt(f"{impl} build", lambda: mb.build_model(
        arch, run.sizes.layers, device=device, **sizes))
    if model is FAILED:
        return None
    try:
        note = mb.apply_choice(model, choice)
    except mb.ChoiceSkipped as e:
        run.out.skipped.append(f"{impl}: {e}")
        print(f"{impl}: skipped ({e})", flush=True)
        return None
    except Exception as e:  # noqa: BLE001
        run.out.failures.append(f"{impl} apply: {type(e).__name__}: {e}")
        return None
    print(f"{impl}: {note}", flush=True)
    return model


def run_compiled(run: _Run, arch: str, choice: str, reference: Optional[Reference],
                 device: str = "cuda", **sizes) -> None:
    """``_run_compiled`` under the settings ``choice`` runs under (``model_build.under_compile``:
    the lab's ops as graph nodes of their own, or, ``@decompose``, their math for Inductor)."""
    with mb.under_compile(choice):
        _run_compiled(run, arch, choice, reference, device, **sizes)


def _run_compiled(run: _Run, arch: str, choice: str, reference: Optional[Reference],
                  device: str, **sizes) -> None:
    """``arch`` with ``choice``'s norms under ``torch.compile``: the prefill compiled by its
    first call (time printed) and its last-position logits checked against ``shipped``'s on the
    same tokens, then timed; then the same for the train step."""
    impl = mb.impl_name(arch, choice, compiled=True)
    if reference is None:
        run.out.failures.append(f"{impl}: not checked ({arch}.shipped computed no reference)")
        return
    model = _built(run, impl, arch, choice, device, sizes)
    if model is None:
        return
    compiled = torch.compile(model)
    try:
        for workload in COMPILE_WORKLOADS:
            step = make_step(workload, model, run.sizes, call=compiled)
            t0 = time.perf_counter()
            out = run.attempt(f"{impl} {workload} compile", step.fn)
            if out is FAILED:
                return
            print(f"{impl} {workload}: compiled in {time.perf_counter() - t0:.0f} s", flush=True)
            if workload == "prefill" and not _agrees(run, impl, mb.agreement(
                    out, reference.prefill, against=mb.impl_name(arch, "shipped"),
                    rel=mb.COMPILED_AGREE_REL)):
                return
            del out
            run.time(step, impl, model.config.hidden_size)
    finally:
        torch._dynamo.reset()  # its compiled graphs hold the model


def _checkpoint(rows: List[dict], path: Path) -> None:
    """The rows so far (replaced by the complete file at the end): a run stopped part-way keeps
    the models it finished."""
    if rows:
        try:
            results_io.write(rows, path)
        except Exception as e:  # noqa: BLE001 - the final write reports real problems
            print(f"note: could not write a checkpoint of {path}: {e}")


def run_models(run: _Run, path: Path, with_compile: bool, device: str = "cuda",
               only_compiled: bool = False, **sizes) -> None:
    """Every architecture x norm choice, then the compiled ones; the file is rewritten after
    each model. ``only_compiled``: the compiled ones and the reference they are checked against
    (``shipped``), nothing else. ``sizes`` overrides the models' (the tests build tiny ones on
    the CPU)."""
    references = {}
    for arch in mb.ARCHS:
        for choice in (("shipped",) if only_compiled else mb.CHOICES):
            made = run_choice(run, arch, choice, references.get(arch), device, **sizes)
            if choice == "shipped":
                references[arch] = made
            del made
            mb.free()
            _checkpoint(run.out.rows, path)
        run.time_decode()
        mb.free()
        _checkpoint(run.out.rows, path)
    if with_compile:
        for arch in mb.ARCHS:  # compiling takes under a minute a workload
            for choice in mb.COMPILE_CHOICES:
                run_compiled(run, arch, choice, references.get(arch), device, **sizes)
                mb.free()
                _checkpoint(run.out.rows, path)


def bench_model(out: Optional[Path] = None, tag: Optional[str] = None, quick: bool = False,
                with_compile: Optional[bool] = None, only_compiled: bool = False) -> Outcome:
    """The whole run (module docstring) into ``<out>/<gpu>/model[-<tag>].csv``. ``quick``: 2
    layers, fewer tokens and samples, tag ``quick`` unless given. ``with_compile`` (the
    torch.compile part) defaults to on in the full run and off in the quick one."""
    if not torch.cuda.is_available():
        raise RuntimeError("the model benchmark needs a CUDA GPU")
    sizes, budget = (QUICK, QUICK_BUDGET) if quick else (FULL, FULL_BUDGET)
    with_compile = (not quick) if with_compile is None else with_compile
    prov = provenance.collect()
    path = output_path(Path(out) if out is not None else results_io.results_dir(), prov["gpu"],
                       "model", tag if tag is not None else ("quick" if quick else None))
    print(f"bench model on {torch.cuda.get_device_name()}: {', '.join(mb.ARCHS)} x "
          f"{len(mb.CHOICES)} norm choices, {sizes.layers} layers, train/prefill "
          f"{sizes.batch}x{sizes.seq} tokens, decode {sizes.decode_batch} at "
          f"{sizes.decode_at}/{sizes.cache_len}"
          + ("; then each under torch.compile" if with_compile else ""),
          flush=True)
    run = _Run(sizes, budget, CUDA_TIMERS, prov)
    run_models(run, path, with_compile or only_compiled, only_compiled=only_compiled)
    run.out.path = results_io.write(run.out.rows, path)
    return run.out


def capture(spec: str, quick: bool, warmup: int, steps: int) -> None:
    """``<arch>.<choice>:<workload>`` (workload: train, prefill, decode, or decode-graph, the
    decode step replayed from a CUDA graph): ``warmup`` steps, then ``steps`` steps between
    cudaProfilerStart and Stop, each in an NVTX range ``step`` that ends with a synchronize, so
    every kernel of a step runs inside its range (``profiling.model_share`` attributes kernels
    to steps by time)."""
    impl, _, workload = spec.partition(":")
    arch, choice, compiled = mb.parse_impl(impl)
    if workload not in WORKLOADS + ("decode-graph",):
        raise ValueError(f"{spec!r}: workload one of {WORKLOADS + ('decode-graph',)}")
    with mb.under_compile(choice):
        _capture(impl, arch, choice, compiled, workload, QUICK if quick else FULL, warmup, steps)


def _capture(impl, arch, choice, compiled, workload, sizes, warmup, steps) -> None:
    graph = workload == "decode-graph"
    model = mb.build_model(arch, sizes.layers)
    print(f"{impl}: {mb.apply_choice(model, choice)}", flush=True)
    step = make_step("decode" if graph else workload, model, sizes,
                     call=torch.compile(model) if compiled else None)
    fn = capture_graph(step.fn, calls=1).graph.replay if graph else step.fn
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for _ in range(steps):
        torch.cuda.nvtx.range_push("step")
        fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"{impl} {workload}: {steps} steps in NVTX ranges 'step' after {warmup} warm-up",
          flush=True)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rmsnorm_workbook.bench.model",
        description="One model step in NVTX ranges, for Nsight Systems; the whole benchmark is "
                    "python -m rmsnorm_lab bench --op model.",
        epilog="capture and read, e.g.:\n  " + NSYS_LINE.format(
            name="model-llama.lab-train", spec="llama.lab:train")
        + "\n  python -m rmsnorm_workbook.profiling.model_share model-llama.lab-train.sqlite",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capture", required=True, metavar="ARCH.CHOICE:WORKLOAD",
                        help=f"arch {'|'.join(mb.ARCHS)}; choice {'|'.join(mb.CHOICES)} or "
                             f"compile.{'|compile.'.join(mb.COMPILE_CHOICES)}; workload "
                             f"{'|'.join(WORKLOADS)}|decode-graph")
    parser.add_argument("--quick", action="store_true", help="the quick run's sizes")
    parser.add_argument("--warmup", type=int, default=3, help="steps before the capture")
    parser.add_argument("--steps", type=int, default=5, help="captured steps")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: the capture needs a CUDA GPU", flush=True)
        return 2
    try:
        capture(args.capture, args.quick, args.warmup, args.steps)
    except (ValueError, mb.ChoiceSkipped) as e:
        print(f"error: {e}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
