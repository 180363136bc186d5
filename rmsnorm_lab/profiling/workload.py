"""The ``profile`` workload: one shape's calls in a loop that Nsight Systems captures.

Builds one shape's inputs on the GPU, turns ``settings.nvtx`` on, warms up outside the capture
(so each ``compile`` range appears once, before it, unless ``include_compile``), then brackets the
timed loop with ``cudaProfilerStart``/``cudaProfilerStop``. Each iteration sits in an outer range
``iter`` of the ``rmsnorm_lab`` domain, so under ``NSYS_PROFILE`` the report holds exactly
``iters`` instances of ``iter`` and the lab's own ranges inside them.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from typing import Callable, Optional

from ..common.nvtx import DOMAIN
from .nsys import NSYS_PROFILE, ProfileError

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@dataclasses.dataclass
class ProfileConfig:
    op: str = "fwd"  # fwd | full
    backend: Optional[str] = None  # None: settings.backend
    launch_path: Optional[str] = None
    forward_variant: Optional[str] = None
    backward: Optional[str] = None
    M: int = 128
    N: int = 4096
    dtype: str = "bf16"
    iters: int = 200
    warmup: int = 20
    include_compile: bool = False
    eps: float = 1e-6

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
        return " " + shlex.join(parts)

    def report_name(self, backend: str) -> str:
        return f"rmsnorm-{self.op}-{backend}-{self.M}x{self.N}-{self.dtype}"


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


def cuda_hooks() -> Hooks:
    import nvtx
    import torch

    cudart = torch.cuda.cudart()
    return Hooks(start=cudart.cudaProfilerStart, stop=cudart.cudaProfilerStop,
                 sync=torch.cuda.synchronize,
                 iter_range=lambda: nvtx.annotate("iter", color="white", domain=DOMAIN),
                 warmup_range=lambda: nvtx.annotate("warmup", color="gray", domain=DOMAIN))


@dataclasses.dataclass
class ProfileResult:
    backend: str
    iters: int
    seconds: float  # the captured loop, synchronized at its end

    @property
    def us_per_iter(self) -> float:
        return self.seconds / self.iters * 1e6


def run_profile(cfg: ProfileConfig, device: str = "cuda", hooks: Optional[Hooks] = None,
                rms_norm: Optional[Callable] = None) -> ProfileResult:
    """Warm up, then run ``cfg.iters`` iterations between ``hooks.start`` and ``hooks.stop``,
    each inside ``hooks.iter_range()``, with ``settings.nvtx`` on and the chosen toggles set."""
    import torch

    from ..settings import settings

    if cfg.op not in ("fwd", "full"):
        raise ProfileError(f"op must be 'fwd' or 'full', got {cfg.op!r}")
    if cfg.iters < 1 or cfg.warmup < 0 or cfg.M < 1 or cfg.N < 1:
        raise ProfileError("--iters, --M and --N must be positive and --warmup not negative")
    if cfg.warmup == 0 and not cfg.include_compile:
        raise ProfileError("--warmup 0 would compile inside the capture: warm up at least once, "
                           "or say --include-compile")
    if rms_norm is None:
        from ..api import rms_norm
    hooks = hooks or cuda_hooks()
    changes = {"nvtx": True}
    for key in ("backend", "launch_path", "forward_variant", "backward"):
        if getattr(cfg, key) is not None:
            changes[key] = getattr(cfg, key)

    with settings.override(**changes):
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
                return rms_norm(x, w, cfg.eps, backend=backend)
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

        try:
            if cfg.include_compile:
                start()
            for _ in range(cfg.warmup):
                with hooks.warmup_range():
                    run_step()
            if not cfg.include_compile:
                start()
            t0 = time.perf_counter()
            for _ in range(cfg.iters):
                with hooks.iter_range():
                    run_step()
            hooks.sync()
            seconds = time.perf_counter() - t0
        finally:
            if started:
                hooks.stop()
    return ProfileResult(backend, cfg.iters, seconds)
