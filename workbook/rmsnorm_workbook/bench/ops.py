"""The benchmark's ops (``fwd``, ``bwd``, ``full``): how to make one set of inputs, how to run
an implementation on it, the oracle, the bytes the op must move, its peers and its sweep.

Every implementation is ``fn(x, w) -> y``, differentiable where the op needs a backward; the op
decides what is timed:

* ``fwd``  ``y = fn(x, w)``;
* ``bwd``  the backward alone: ``Op.prepare`` runs the forward once per input set *outside* the
  timed region, keeping the autograd graph, and the timed call is
  ``torch.autograd.grad(y, (x, w), dy, retain_graph=True)``;
* ``full`` forward and backward together: ``torch.autograd.grad(fn(x, w), (x, w), dy)``.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from rmsnorm_lab import reference
from . import fp8, fused_add, qk_rope
from .fused_add import PER_HEAD_SHAPES
from . import peers as peers_mod

EPS = 1e-6
DTYPE = torch.bfloat16
REL_TOL = 1e-2
HOST_SHAPE = (128, 4096)
LAB_PREFIXES = ("cute.", "triton.")

#: the sweep's shapes: N=4096 over M, then M=16384 over N, and per-head rows
SWEEP: List[Tuple[int, int]] = (
    [(M, 4096) for M in (1024, 4096, 8192, 16384, 32768, 65536)]
    + [(16384, N) for N in (1024, 2048, 8192, 16384)]
    + PER_HEAD_SHAPES
)
#: rows too wide for one CTA's registers (the cluster variant's, against column chunks)
WIDE_SHAPES: List[Tuple[int, int]] = [(4096, 32768), (16384, 32768)]
FWD_SWEEP: List[Tuple[int, int]] = SWEEP + WIDE_SHAPES
QUICK_FWD_SWEEP: List[Tuple[int, int]] = [(1024, 4096), (16384, 4096)]
#: the backward and forward+backward sweeps
BWD_SWEEP: List[Tuple[int, int]] = list(SWEEP)
QUICK_BWD_SWEEP: List[Tuple[int, int]] = list(QUICK_FWD_SWEEP)

_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
Impl = Callable[..., object]


class WrongOutput(Exception):
    """An implementation returned outputs of the wrong number, shape or dtype."""


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
    #: the ceilings measured at each swept shape (``runner.SAME_SHAPE``)
    same_shape: Tuple[str, ...] = ()
    #: per implementation and input set, untimed: turns ``make_inputs``' tuple into what ``run``
    #: takes (``bwd``: runs the forward and keeps its graph). None: ``run`` takes the inputs.
    prepare: Optional[Callable[[Impl, tuple], tuple]] = None
    #: where host time per call is measured
    host_shape: Tuple[int, int] = HOST_SHAPE
    #: the largest ``||out - expected|| / ||expected||`` that still counts as the same answer
    rel_tol: float = REL_TOL

    def bind(self, impl: Impl, inputs: tuple) -> tuple:
        """What ``run`` takes for ``impl`` on ``inputs`` (``prepare``, when the op has one)."""
        return self.prepare(impl, inputs) if self.prepare is not None else inputs


def _fwd_inputs(M: int, N: int, dtype: torch.dtype) -> tuple:
    x = torch.randn(M, N, dtype=dtype, device="cuda")
    w = (1 + 0.1 * torch.randn(N, device="cuda")).to(dtype)  # near one, like a trained norm
    return x, w


def _fwd_bytes(inputs: tuple) -> int:
    x, w = inputs  # x read, y written, w read
    return 2 * x.numel() * x.element_size() + w.numel() * w.element_size()


FWD = Op(
    name="fwd",
    same_shape=("copy",),
    make_inputs=_fwd_inputs,
    run=lambda impl, inputs: impl(*inputs),
    reference=lambda inputs: reference.rms_norm(inputs[0], inputs[1], EPS, 0.0, "llama"),
    bytes_moved=_fwd_bytes,
    peers=peers_mod.FORWARD_PEERS,
    sweep=FWD_SWEEP,
    quick_sweep=QUICK_FWD_SWEEP,
)


def _bwd_inputs(M: int, N: int, dtype: torch.dtype) -> tuple:
    """``(x, w, dy)``: x and w require grad (leaves), dy is the incoming gradient."""
    x, w = _fwd_inputs(M, N, dtype)
    dy = torch.randn(M, N, dtype=dtype, device=x.device)
    return x.requires_grad_(), w.requires_grad_(), dy


def _bwd_reference(inputs: tuple) -> tuple:
    """``(dx, dw)`` from ``reference.rms_norm_backward`` with the forward's fp32 rstd (llama)."""
    x, w, dy = (t.detach() for t in inputs[:3])
    rstd = reference.rstd_of(x, EPS)
    return reference.rms_norm_backward(dy, x, w, rstd, 0.0, "llama")


def _bwd_bytes(inputs: tuple) -> int:
    """Minimum DRAM traffic of one backward call::

        read dY + read X + write dX + read rstd + read W + write dW
        = 3*M*N*s + 4*M + 2*N*s_w          (bf16: 3*M*N*2 + M*4 + 2*N*2)

    with ``s`` x's element size and ``s_w`` the weight's; rstd is the forward's saved fp32 per
    row. dW's fp32 partials (strips x N, written then re-read) are not counted: they are an
    implementation's overhead, not the op's minimum."""
    x, w = inputs[0], inputs[1]
    M = x.numel() // x.shape[-1]
    return 3 * x.numel() * x.element_size() + 4 * M + 2 * w.numel() * w.element_size()


def _full_bytes(inputs: tuple) -> int:
    """Forward bytes + backward bytes: ``(2*M*N*s + N*s_w) + (3*M*N*s + 4*M + 2*N*s_w)``
    (bf16: ``5*M*N*2 + M*4 + 3*N*2``). The forward's rstd write (4*M, only when training) is
    not counted, as in ``fwd``."""
    return _fwd_bytes(inputs[:2]) + _bwd_bytes(inputs)


def _differentiable(impl: Impl, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    with torch.enable_grad():
        y = impl(x, w)
    if not isinstance(y, torch.Tensor) or y.grad_fn is None:
        raise WrongOutput("the forward returned no differentiable tensor (no autograd support)")
    return y


def _bwd_prepare(impl: Impl, inputs: tuple) -> tuple:
    """Forward once, outside the timed region, graph kept: ``(y, x, w, dy)``."""
    x, w, dy = inputs
    return _differentiable(impl, x, w), x, w, dy


def _bwd_run(impl: Impl, bound: tuple) -> tuple:
    y, x, w, dy = bound
    return torch.autograd.grad(y, (x, w), dy, retain_graph=True)


def _full_run(impl: Impl, inputs: tuple) -> tuple:
    x, w, dy = inputs
    return torch.autograd.grad(_differentiable(impl, x, w), (x, w), dy)


# bwd and full take the same inputs, check against the same gradients, over the same sweep
_GRADIENT_OP = dict(make_inputs=_bwd_inputs, reference=_bwd_reference,
                    peers=peers_mod.BACKWARD_PEERS, sweep=BWD_SWEEP, quick_sweep=QUICK_BWD_SWEEP)

BWD = Op(name="bwd", run=_bwd_run, bytes_moved=_bwd_bytes, prepare=_bwd_prepare,
         same_shape=("copy2r1w",), **_GRADIENT_OP)

FULL_OP = Op(name="full", run=_full_run, bytes_moved=_full_bytes, **_GRADIENT_OP)

# the fused residual add (fused_add.py): op fwd and bwd, rows in fwd-add.csv and bwd-add.csv
FWD_ADD = Op(name="fwd", make_inputs=fused_add.inputs, run=fused_add.fwd_run,
             reference=fused_add.fwd_reference, bytes_moved=fused_add.fwd_bytes,
             peers=fused_add.FORWARD_PEERS, sweep=fused_add.ADD_SWEEP,
             quick_sweep=fused_add.QUICK_ADD_SWEEP, same_shape=("copy2r2w",))
BWD_ADD = Op(name="bwd", make_inputs=fused_add.grad_inputs, run=fused_add.bwd_run,
             reference=fused_add.bwd_reference, bytes_moved=fused_add.bwd_bytes,
             peers=fused_add.BACKWARD_PEERS, sweep=fused_add.ADD_SWEEP,
             quick_sweep=fused_add.QUICK_ADD_SWEEP, same_shape=("copy3r1w",),
             prepare=fused_add.bwd_prepare)

# the fp8 output (fp8.py): op fwd, rows in fwd-fp8.csv and fwd-fp8-static.csv
FWD_FP8 = Op(name="fwd", make_inputs=fp8.inputs, run=fp8.run, reference=fp8.reference_out,
             bytes_moved=fp8.bytes_moved, peers=fp8.PEERS, sweep=fp8.SWEEP,
             quick_sweep=fp8.QUICK_SWEEP, same_shape=tuple(fp8.SAME_SHAPE), rel_tol=fp8.REL_TOL)
FWD_FP8_STATIC = dataclasses.replace(FWD_FP8, make_inputs=fp8.static_inputs,
                                     peers=fp8.STATIC_PEERS)

# q/k norms + RoPE (qk_rope.py): op fwd and bwd, rows in fwd-qk-rope.csv and bwd-qk-rope.csv
FWD_QK_ROPE = Op(name="fwd", make_inputs=qk_rope.inputs, run=qk_rope.fwd_run,
                 reference=qk_rope.fwd_reference, bytes_moved=qk_rope.fwd_bytes,
                 peers=qk_rope.PEERS, sweep=qk_rope.SWEEP, quick_sweep=qk_rope.QUICK_SWEEP,
                 same_shape=("copy",), host_shape=qk_rope.HOST_SHAPE)
BWD_QK_ROPE = dataclasses.replace(FWD_QK_ROPE, name="bwd", make_inputs=qk_rope.grad_inputs,
                                  run=qk_rope.bwd_run, reference=qk_rope.bwd_reference,
                                  bytes_moved=qk_rope.bwd_bytes, same_shape=("copy2r1w",),
                                  prepare=qk_rope.bwd_prepare)

#: by the name ``bench --op`` takes (and its results file's)
OPS: Dict[str, Op] = {"fwd": FWD, "bwd": BWD, "full": FULL_OP, "fwd-add": FWD_ADD,
                      "bwd-add": BWD_ADD, "fwd-fp8": FWD_FP8, "fwd-fp8-static": FWD_FP8_STATIC,
                      "fwd-qk-rope": FWD_QK_ROPE, "bwd-qk-rope": BWD_QK_ROPE}
