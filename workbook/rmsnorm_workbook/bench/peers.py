"""What the lab's kernels are measured against: other RMSNorm implementations ("peers") and the
memory-bandwidth ceilings of the GPU itself.

Peers are optional: each factory returns ``callable(x, w) -> y`` when its package imports here and
``None`` otherwise, so the benchmark runs with whatever is installed. All compute the lab's
default forward: ``eps`` as given, ``offset=0``, Llama casting where the peer has a choice.

``BACKWARD_PEERS`` (ops ``bwd`` and ``full``) are the same callables where they are differentiable
through autograd: the benchmark calls ``torch.autograd.grad(fn(x, w), (x, w), dy)``. Liger's
Functions default to ``in_place=True``, which writes dX into dY's storage; the backward peers pass
``in_place=False`` so every call of a timed loop reads the same dY and the check sees an intact
one (a fresh dX buffer per call, as every other implementation allocates).

Ceilings are SM kernels streaming tensors of at least 1 GiB (far beyond L2), timed by CUDA-graph
replay in the same run as the kernels they bound:
``copy`` reads one tensor and writes one (the forward's pattern), ``copy2r1w`` reads two and writes
one (the backward's). A graph memcpy node is not used: on the H200 it ran well below what SM
kernels reached, so it would understate the ceiling.
"""

from __future__ import annotations

from typing import Callable, Dict, NamedTuple, Optional

import torch

ForwardFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def liger_triton(eps: float, in_place: bool = True) -> Optional[ForwardFn]:
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except Exception:  # noqa: BLE001 - not installed, or broken here: either way not a peer
        return None
    apply = LigerRMSNormFunction.apply
    # forward(X, W, eps, offset=0.0, casting_mode="llama", in_place=True, row_mode=None);
    # positional because autograd.Function.apply takes no keywords on every torch version.
    # in_place only changes the backward (dX written over dY).
    if in_place:
        return lambda x, w: apply(x, w, eps, 0.0, "llama")
    return lambda x, w: apply(x, w, eps, 0.0, "llama", False)


def liger_cutedsl(eps: float, in_place: bool = True) -> Optional[ForwardFn]:
    try:
        from liger_kernel.ops.cutedsl.ops.rms_norm import LigerRMSNormFunction
    except Exception:  # noqa: BLE001
        return None
    apply = LigerRMSNormFunction.apply  # same signature as the Triton one (liger-kernel 0.8.5)
    if in_place:
        return lambda x, w: apply(x, w, eps, 0.0, "llama")
    return lambda x, w: apply(x, w, eps, 0.0, "llama", False)


def liger_triton_bwd(eps: float) -> Optional[ForwardFn]:
    """Liger's Triton RMSNorm for ``bwd``/``full``: ``in_place=False`` (dY stays intact)."""
    return liger_triton(eps, in_place=False)


def liger_cutedsl_bwd(eps: float) -> Optional[ForwardFn]:
    """Liger's CuTe DSL RMSNorm for ``bwd``/``full``: ``in_place=False``."""
    return liger_cutedsl(eps, in_place=False)


def quack(eps: float) -> Optional[ForwardFn]:
    # quack-kernels 0.6.5: ``rmsnorm`` is ``RMSNormFunction.apply`` (autograd: its backward is
    # ``rmsnorm_bwd``), so the same callable serves the backward ops.
    try:
        from quack.rmsnorm import rmsnorm
    except Exception:  # noqa: BLE001
        return None
    return lambda x, w: rmsnorm(x, w, eps=eps)


def flashinfer(eps: float) -> Optional[ForwardFn]:
    """FlashInfer's ``rmsnorm`` (an inference kernel: no backward, so a forward peer only);
    FlashInfer computes in fp32 and rounds once, at the store."""
    try:
        from flashinfer.norm import rmsnorm
    except Exception:  # noqa: BLE001
        return None
    return lambda x, w: rmsnorm(x, w, eps)


def torch_native(eps: float) -> Optional[ForwardFn]:
    # differentiable: autograd's own RMSNorm backward
    rms_norm = torch.nn.functional.rms_norm
    return lambda x, w: rms_norm(x, (x.shape[-1],), w, eps)


def torch_compile(eps: float) -> Optional[ForwardFn]:
    from rmsnorm_lab import reference

    # One specialised compile per shape (dynamic=False), and a sweep has more shapes than
    # dynamo's default recompile limit (8): past it dynamo silently falls back to eager, which
    # would be measured as "torch.compile". Raise the limit for this process.
    cfg = torch._dynamo.config
    limit = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    setattr(cfg, limit, max(getattr(cfg, limit), 64))
    # A new compiled function per call of this factory. With inputs that require grad,
    # AOTAutograd compiles the backward too (lazily, on the first backward: in the check).
    # The backward benchmark calls autograd.grad(..., retain_graph=True) repeatedly; AOTAutograd's
    # donated buffers forbid that (it raised at 128x4096 on the H200), so they are off.
    import torch._functorch.config as functorch_config
    functorch_config.donated_buffer = False
    compiled = torch.compile(reference.rms_norm, dynamic=False)
    return lambda x, w: compiled(x, w, eps, 0.0, "llama")


#: name (the ``impl`` column) -> factory
FORWARD_PEERS: Dict[str, Callable[[float], Optional[ForwardFn]]] = {
    "liger.triton": liger_triton,
    "liger.cutedsl": liger_cutedsl,
    "quack": quack,
    "flashinfer": flashinfer,
    "torch.native": torch_native,
    "torch.compile": torch_compile,
}


#: the peers of ``bwd`` and ``full``: name -> factory of a differentiable ``fn(x, w) -> y``
BACKWARD_PEERS: Dict[str, Callable[[float], Optional[ForwardFn]]] = {
    "liger.triton": liger_triton_bwd,
    "liger.cutedsl": liger_cutedsl_bwd,
    "quack": quack,
    "torch.native": torch_native,
    "torch.compile": torch_compile,
}


def forward_only() -> frozenset:
    """The peers without a backward (FlashInfer's norm)."""
    return frozenset(FORWARD_PEERS) - frozenset(BACKWARD_PEERS)


def forward_peers(eps: float) -> Dict[str, ForwardFn]:
    """The forward peers available here, by name."""
    found = {name: make(eps) for name, make in FORWARD_PEERS.items()}
    return {name: fn for name, fn in found.items() if fn is not None}


class Ceiling(NamedTuple):
    name: str
    fn: Callable[[], object]
    bytes_moved: int
    M: int
    N: int


#: ceiling name -> number of tensors read (each ceiling writes one)
CEILING_READS = {"copy": 1, "copy2r1w": 2}


def ceiling(name: str, dtype: torch.dtype = torch.bfloat16, N: int = 4096,
            min_bytes: int = 2**30) -> Ceiling:
    """The kernel of ceiling ``name`` on freshly allocated ``(M, N)`` tensors of at least
    ``min_bytes`` each. The tensors live as long as the returned ``fn``."""
    reads = CEILING_READS[name]
    elem = torch.empty((), dtype=dtype).element_size()
    M = -(-min_bytes // (N * elem))
    ins = [torch.randn(M, N, dtype=dtype, device="cuda") for _ in range(reads)]
    out = torch.empty(M, N, dtype=dtype, device="cuda")
    if reads == 1:
        fn = lambda: torch.neg(ins[0], out=out)  # noqa: E731
    else:
        fn = lambda: torch.add(ins[0], ins[1], out=out)  # noqa: E731
    return Ceiling(name, fn, (reads + 1) * M * N * elem, M, N)
