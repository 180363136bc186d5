"""Where a training call's host microseconds go: the default path taken apart, layer by layer,
next to torch's ``F.rms_norm``, all timed interleaved (``interleaved_host_time_us``) at 128x4096
bf16 on one GPU. Prints JSON lines: the run's provenance, then (task, p20, p50, p80) in µs per
call.

    python -m rmsnorm_workbook.bench.host_parts > host-parts.jsonl

Tasks, outermost first: ``lab fwd+autograd`` (``rms_norm`` on inputs that require grad) ->
``fast_call`` (the extension's call memo: the key read off the arguments in C++, the Launch
found, the native call) -> ``ext.apply`` (the native node alone: allocation, launch, tape) ->
``tvm_ffi kernel call`` (the compiled forward called from Python on preallocated outputs).
``native_launch.rms_norm`` (``rmsnorm_lab/native/launch.py``) is the path a call takes when the
gate is closed (the memo probed from Python); ``fast_call inference`` the memo serving an inference
call (``lab fwd``); ``launch.forward`` is the kernels called with no autograd (``rmsnorm_lab.lab.kernel_forward``).
``empty_like`` and ``torch.add`` give the scale of one allocation and of one small torch op on
the same host.
"""

from __future__ import annotations

import json

import torch

from rmsnorm_lab import rms_norm, settings
from rmsnorm_lab.lab import forward_entry, kernel_forward, memo_call, native_node

from .timing import HostTask, interleaved_host_time_us

M, N = 128, 4096
EPS = 1e-6


def tasks() -> dict:
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    dy = torch.randn_like(x)
    torch_rms = torch.nn.functional.rms_norm

    def lab(a, b):
        return rms_norm(a, b, EPS, casting_mode="llama", backend="cute")
    lab(xg, wg)
    lab(x, w)
    native, fast_call = native_node(), memo_call()
    if native is None or fast_call is None:
        raise RuntimeError("the native node is not available here (see "
                           "rmsnorm_lab.native.build) or the settings route training calls "
                           "elsewhere")
    extension, native_launch = native
    launch = native_launch.memo(extension).find(xg, wg, EPS, 0.0, "llama")
    entry = forward_entry(x, w, "llama", False, "auto", True)
    kernel = entry.ffi_kernel
    y, rstd = torch.empty_like(x), entry.empty_rstd
    return {
        "torch fwd": lambda: torch_rms(x, (N,), w, EPS),
        "torch fwd+autograd": lambda: torch_rms(xg, (N,), wg, EPS),
        "lab fwd": lambda: lab(x, w),
        "lab fwd+autograd": lambda: lab(xg, wg),
        "fast_call": lambda: fast_call(xg, wg, EPS, 0.0, "llama"),
        "fast_call inference": lambda: fast_call(x, w, EPS, 0.0, "llama"),
        "native_launch.rms_norm": lambda: native_launch.rms_norm(extension, xg, wg, EPS, 0.0,
                                                                 "llama"),
        "ext.apply": lambda: extension.apply(xg, wg, launch),
        "ext.apply no grad inputs": lambda: extension.apply(x, w, launch),
        "launch.forward": lambda: kernel_forward(x, w, EPS, 0.0, "llama", "cute", False),
        "tvm_ffi kernel call": lambda: kernel(x, w, y, rstd, 1, EPS, 0.0),
        "empty_like": lambda: torch.empty_like(x),
        "torch.add": lambda: torch.add(x, x),
        "torch full": lambda: torch_rms(xg, (N,), wg, EPS).backward(dy),
        "lab full": lambda: lab(xg, wg).backward(dy),
    }


def main() -> None:
    from ..results import provenance
    print(json.dumps({"provenance": provenance.collect()}, default=str))
    timed = interleaved_host_time_us(
        {name: HostTask(fn, 200, settings.override) for name, fn in tasks().items()},
        repeats=15)
    for name, q in timed.items():
        print(json.dumps({"task": name, "p20": round(q.p20, 2), "p50": round(q.p50, 2),
                          "p80": round(q.p80, 2)}))


if __name__ == "__main__":
    main()
