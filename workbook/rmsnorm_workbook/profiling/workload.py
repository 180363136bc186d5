"""The ``profile`` workload: one shape's calls in a loop that Nsight Systems captures.

Builds one shape's inputs on the GPU, turns ``settings.nvtx`` on, warms up outside the capture
(so each ``compile`` range appears once, before it, unless ``include_compile``), then brackets the
timed loop with ``cudaProfilerStart``/``cudaProfilerStop``. Each iteration sits in an outer range
``iter`` of the ``rmsnorm_lab`` domain, so under ``NSYS_PROFILE`` the report holds exactly
``iters`` instances of ``iter`` and the lab's own ranges inside them.

With ``graph`` (``profile --graph``) the same ``iters`` iterations are captured into one CUDA
graph instead, on a side stream and after the warm-up (both outside the capture range, each
captured iteration in its ``iter`` range as in the eager loop); the graph is replayed once before
the capture range (the first replay uploads it) and once inside it, in a ``replay`` range. The
report then holds one ``cudaGraphLaunch`` and the ``iters`` iterations' kernels back to back: the
same work as the eager loop with the host path taken out. NVTX ranges are host events and are not
part of a graph, so inside the capture range the iterations are told apart by their kernels
(``profiling.trace.kernel_iterations``).
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from typing import Callable, Optional

from rmsnorm_lab.lab import NVTX_DOMAIN as DOMAIN
from .nsys import NSYS_PROFILE, ProfileError

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@dataclasses.dataclass
class ProfileConfig:
    op: str = "fwd"  # fwd | full
    backend: Optional[str] = None  # None: settings.backend
    launch_path: Optional[str] = None  # None: the library's own (bench.instruments)
    forward_variant: Optional[str] = None
    backward: Optional[str] = None
    M: int = 128
    N: int = 4096
    dtype: str = "bf16"
    iters: int = 200
    warmup: int = 20
    include_compile: bool = False
    eps: float = 1e-6
    graph: bool = False  # capture the iterations in a CUDA graph and replay it in the capture

    def cli_args(self) -> str:
        """The ``profile`` arguments that reproduce this configuration."""
        parts = ["--op", self.op]
        for flag, value in (("--backend", self.backend), ("--launch-path", self.launch_path),
                            ("--variant", self.forward_variant), ("--backward", self.backward)):
            if value is not None:
                parts += [flag, value]
        parts += ["--M", str(self.M), "--N", str(self.N), "--dtype", self.dtype,
                  "--iters", str(self.iters), "--warmup", str(self.warmup)]
        if self.include_compile:
            parts.append("--include-compile")
        if self.graph:
            parts.append("--graph")
        return " " + shlex.join(parts)

    def report_name(self, backend: str) -> str:
        return (f"rmsnorm-{self.op}-{backend}-{self.M}x{self.N}-{self.dtype}"
                + ("-graph" if self.graph else ""))


def nsys_profile_line(cfg: ProfileConfig, backend: str) -> str:
    return NSYS_PROFILE.format(out=cfg.report_name(backend), args=cfg.cli_args())


@dataclasses.dataclass
class Hooks:
    """What the loop calls around the capture; the CLI passes CUDA's, tests pass recorders."""
    start: Callable[[], None]
    stop: Callable[[], None]
    sync: Callable[[], None]
    iter_range: Callable[[], object]  # a fresh context manager per call
    warmup_range: Callable[[], object]
    #: ``capture(body) -> replay``: ``body()`` (every captured iteration) recorded into a CUDA
    #: graph on a side stream, after a warm-up of one iteration there; ``replay()`` launches it.
    #: Only the ``graph`` mode calls it.
    capture: Optional[Callable[[Callable[[], None], Callable[[], None]], Callable[[], None]]] = None
    replay_range: Optional[Callable[[], object]] = None


def cuda_graph_capture(body: Callable[[], None],
                       warm: Callable[[], None]) -> Callable[[], None]:
    """``body`` captured into a CUDA graph on a side stream, as capture requires, after
    ``warm()`` ran there (allocations and lazy initialisation outside the capture); the
    returned function replays the graph on the current stream."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        warm()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            body()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    def replay() -> None:
        graph.replay()
    replay.graph = graph  # keeps the graph (and its memory pool) alive with the function
    return replay


def cuda_hooks() -> Hooks:
    import nvtx
    import torch

    cudart = torch.cuda.cudart()
    return Hooks(start=cudart.cudaProfilerStart, stop=cudart.cudaProfilerStop,
                 sync=torch.cuda.synchronize,
                 iter_range=lambda: nvtx.annotate("iter", color="white", domain=DOMAIN),
                 warmup_range=lambda: nvtx.annotate("warmup", color="gray", domain=DOMAIN),
                 capture=cuda_graph_capture,
                 replay_range=lambda: nvtx.annotate("replay", color="black", domain=DOMAIN))


@dataclasses.dataclass
class ProfileResult:
    backend: str
    iters: int
    seconds: float  # the captured loop (or the graph's replay), synchronized at its end
    graph: bool = False

    @property
    def us_per_iter(self) -> float:
        return self.seconds / self.iters * 1e6


def run_profile(cfg: ProfileConfig, device: str = "cuda", hooks: Optional[Hooks] = None,
                rms_norm: Optional[Callable] = None) -> ProfileResult:
    """Warm up, then run ``cfg.iters`` iterations between ``hooks.start`` and ``hooks.stop``,
    each inside ``hooks.iter_range()``, with ``settings.nvtx`` on and the chosen toggles set
    (the library's settings, and the launch path: ``bench.instruments.use``).
    With ``cfg.graph`` the iterations are captured into a CUDA graph after the warm-up
    (``hooks.capture``) and the graph is replayed between start and stop, inside
    ``hooks.replay_range()``, after one replay before the start."""
    import torch

    from rmsnorm_lab import settings
    from ..bench.instruments import use

    if cfg.op not in ("fwd", "full"):
        raise ProfileError(f"op must be 'fwd' or 'full', got {cfg.op!r}")
    if cfg.iters < 1 or cfg.warmup < 0 or cfg.M < 1 or cfg.N < 1:
        raise ProfileError("--iters, --M and --N must be positive and --warmup not negative")
    if cfg.warmup == 0 and not cfg.include_compile:
        raise ProfileError("--warmup 0 would compile inside the capture: warm up at least once, "
                           "or say --include-compile")
    if cfg.graph and cfg.include_compile:
        raise ProfileError("--graph captures the iterations after the warm-up: compilation "
                           "cannot be inside its capture range (drop --include-compile)")
    if cfg.graph and cfg.warmup == 0:
        raise ProfileError("--graph needs --warmup of at least 1: a CUDA graph cannot capture "
                           "a first call (it compiles and allocates)")
    if rms_norm is None:
        from rmsnorm_lab import rms_norm
    hooks = hooks or cuda_hooks()
    changes = {"nvtx": True}
    for key in ("backend", "launch_path", "forward_variant", "backward"):
        if getattr(cfg, key) is not None:
            changes[key] = getattr(cfg, key)

    with use(**changes):
        backend = settings.backend
        dtype = getattr(torch, DTYPES[cfg.dtype])
        g = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(cfg.M, cfg.N, device=device, dtype=torch.float32, generator=g).to(dtype)
        w = (1 + 0.1 * torch.randn(cfg.N, device=device, generator=g)).to(dtype)
        full = cfg.op == "full"
        if full:
            x.requires_grad_(True)
            w.requires_grad_(True)
            dy = torch.randn(cfg.M, cfg.N, device=device, dtype=torch.float32,
                             generator=g).to(dtype)

        def call():
            try:
                return rms_norm(x, w, cfg.eps, casting_mode="llama", backend=backend)
            except NotImplementedError as e:
                raise ProfileError(f"rms_norm(backend={backend!r}) cannot run {cfg.M}x{cfg.N} "
                                   f"{cfg.dtype} with these settings: {e}") from e

        def step_fwd():
            call()

        def step_full():
            x.grad = None
            w.grad = None
            call().backward(dy)

        def first_full():  # the first step checks that the backend is differentiable
            x.grad = None
            w.grad = None
            y = call()
            if y.grad_fn is None:
                raise ProfileError(
                    f"--op full needs autograd, and rms_norm(backend={backend!r}) returned a "
                    "tensor without a backward (no grad_fn): the backward is not available for "
                    "this backend yet. Profile the forward with --op fwd, or pick a backend "
                    "with a backward.")
            try:
                y.backward(dy)
            except NotImplementedError as e:
                raise ProfileError(f"--op full: the backward of backend={backend!r} is not "
                                   f"available: {e}") from e

        step = step_full if full else step_fwd
        first = [first_full if full else step_fwd]

        def run_step():
            if first:
                first.pop()()
            else:
                step()

        started = False

        def start():
            nonlocal started
            hooks.sync()
            hooks.start()
            started = True

        def loop():
            for _ in range(cfg.iters):
                with hooks.iter_range():
                    run_step()

        try:
            if cfg.include_compile:
                start()
            for _ in range(cfg.warmup):
                with hooks.warmup_range():
                    run_step()
            if cfg.graph:
                if hooks.capture is None or hooks.replay_range is None:
                    raise ProfileError("these hooks cannot capture a CUDA graph")
                replay = hooks.capture(loop, step)
                replay()  # the first replay uploads the graph: outside the capture range
                hooks.sync()
                start()
                t0 = time.perf_counter()
                with hooks.replay_range():
                    replay()
                hooks.sync()
                seconds = time.perf_counter() - t0
            else:
                if not cfg.include_compile:
                    start()
                t0 = time.perf_counter()
                loop()
                hooks.sync()
                seconds = time.perf_counter() - t0
        finally:
            if started:
                hooks.stop()
    return ProfileResult(backend, cfg.iters, seconds, cfg.graph)
