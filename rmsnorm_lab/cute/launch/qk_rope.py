"""Launching the CuTe q/k-norm + RoPE kernels (kernels/qk_rope.py): their plan, their compile
cache, one launch for q's and k's head rows each way (and, backward, the partial rows of both
weights' dW, side by side, summed by one ``dw_reduce`` launch).

The plan is the forward's per-head tile (``plan_forward("warp", D, ...)``, rstd kept for the
backward); ``qk_rope_plan`` raises ``NotEligible`` where the kernel cannot take the rows (a
misaligned row, a head wider than a warp's registers, halves that do not fall on whole copies or
on one thread's copies), and the caller runs the Triton kernel there.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import cutlass
import torch
from cutlass.cute.runtime import make_fake_stream

from ...common.rows import INT32_LIMIT
from ..dtypes import TORCH_TO_CUTE
from ..kernels.qk_rope import RMSNormQkRopeBackward, RMSNormQkRopeForward, backward_ctas_per_sm
from ..plan.forward import ForwardPlan, NotEligible, check_int32_addressable, plan_forward
from .backward import compile_dw_reduce
from .compile import assumed_align, compile_tvm_ffi, fake_rows, fake_rstd, fake_vector, target_arch

_COMPILED: Dict[Tuple, object] = {}
_LAUNCHES: Dict[Tuple, "QkRopeLaunch"] = {}


def qk_rope_plan(D: int, x_dtype: torch.dtype, w_dtype: torch.dtype, casting_mode: str,
                 aligned: bool, arch: Optional[str], pdl: bool) -> ForwardPlan:
    """The plan of the fused forward for head rows of ``D``; ``NotEligible`` with the reason
    where the kernel cannot take them."""
    if not aligned:
        raise NotEligible("q, k, cos or sin rows are not 16-byte aligned")
    plan = plan_forward("warp", D, x_dtype, w_dtype, casting_mode, True, True, arch=arch,
                        pdl=pdl)
    half = D // (2 * plan.vec) if D % (2 * plan.vec) == 0 else 0
    if not half:
        raise NotEligible(f"half a head of {D} is not whole 16-byte copies")
    if plan.vecs_per_thread > 1 and half % plan.threads_per_row:
        raise NotEligible(f"a head of {D}: its halves fall in different lanes' second copies")
    return plan


def fake_args(plan: ForwardPlan):
    """Typed stand-ins for ``cute.compile``: q, k, their outputs, cos and sin as rows with a
    symbolic count and stride, the weights (D,), rstd (rows,)."""
    x_type = TORCH_TO_CUTE[plan.x_dtype]
    align = assumed_align(plan.vec, plan.x_dtype)
    rows = [fake_rows(x_type, m, ld, align, plan.N)
            for m, ld in (("Mq", "ldq"), ("Mk", "ldk"))]
    w = [fake_vector(TORCH_TO_CUTE[plan.w_dtype], "Nw", assumed_align(plan.vec, plan.w_dtype))
         for _ in range(2)]
    tables = [fake_rows(x_type, "T", ld, align, plan.N) for ld in ("ldc", "lds")]
    outs = [fake_rows(x_type, m, ld, align, plan.N) for m, ld in (("Mq", "ldqo"), ("Mk", "ldko"))]
    return (*rows, *w, *tables, *outs, fake_rstd(), fake_rstd(), cutlass.Int32(1),
            cutlass.Int32(1), cutlass.Int32(1), cutlass.Int32(1), cutlass.Float32(1e-6),
            make_fake_stream(use_tvm_ffi_env_stream=True))


def fake_backward_args(plan: ForwardPlan):
    """Typed stand-ins for the backward: the outputs' gradients, q and k, the weights, cos and
    sin, rstd, the inputs' gradients, the (G, 2D) partials, the heads and the grid."""
    x_type = TORCH_TO_CUTE[plan.x_dtype]
    align = assumed_align(plan.vec, plan.x_dtype)
    rows = [fake_rows(x_type, m, ld, align, plan.N)
            for m, ld in (("Mq", "ld1"), ("Mk", "ld2"), ("Mq", "ld3"), ("Mk", "ld4"))]
    w = [fake_vector(TORCH_TO_CUTE[plan.w_dtype], "Nw", assumed_align(plan.vec, plan.w_dtype))
         for _ in range(2)]
    tables = [fake_rows(x_type, "T", ld, align, plan.N) for ld in ("ldc", "lds")]
    grads = [fake_rows(x_type, m, ld, align, plan.N) for m, ld in (("Mq", "ld5"), ("Mk", "ld6"))]
    partials = fake_rows(cutlass.Float32, "G", "ldp", 16, 2 * plan.N)
    return (*rows, *w, *tables, fake_rstd(), fake_rstd(), *grads, partials, cutlass.Int32(1),
            cutlass.Int32(1), cutlass.Int32(1), make_fake_stream(use_tvm_ffi_env_stream=True))


def compile_qk_rope(plan: ForwardPlan, arch: str, keep_ptx_dir: Optional[str] = None,
                    backward: bool = False):
    """The TVM-FFI compilation of ``plan``'s forward (or ``backward``) for ``arch`` (cached)."""
    if backward:
        return compile_tvm_ffi(_COMPILED, (plan, arch, "backward"), arch, "qk_rope_backward",
                               lambda: (RMSNormQkRopeBackward(plan), fake_backward_args(plan)),
                               keep_ptx_dir)
    return compile_tvm_ffi(_COMPILED, (plan, arch), arch, "qk_rope",
                           lambda: (RMSNormQkRopeForward(plan), fake_args(plan)), keep_ptx_dir)


def _aligned(*ts: torch.Tensor) -> bool:
    return all(t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0
               for t in ts)


def _head_rows(name: str, t: torch.Tensor, D: int) -> torch.Tensor:
    """(..., H, D) as (rows, D) head rows without a copy, or ``NotEligible``."""
    try:
        rows = t.view(-1, D)
    except RuntimeError:
        raise NotEligible(f"{name}'s heads are not rows of one stride (a view of a fused "
                          "projection)") from None
    if rows.stride(1) != 1:
        raise NotEligible(f"{name}'s head dimension is not contiguous")
    return rows


def _tables(cos: torch.Tensor, sin: torch.Tensor, D: int):
    """cos and sin as (T, D) rows of unit column stride (a copy where broadcast)."""
    rows = (t.reshape(-1, D) for t in (cos, sin))
    return tuple(t if t.stride(1) == 1 else t.contiguous() for t in rows)


class QkRopeLaunch:
    """What launching one configuration needs, found with one dict probe a call (as the norm's
    ``ForwardLaunch``; docs/design-record.md, 'Host: one dict probe per call'): the plan, the
    forward's grid as a rule of rows for this device's SMs, the backward's persistent grid
    (capped by the tokens at each call), and the kernels, each compiled on its first call
    (``forward_kernel``, ``backward_kernels``)."""
    __slots__ = ("plan", "arch", "grid", "backward_grid", "forward", "backward", "reduce")

    def __init__(self, plan: ForwardPlan, arch: str, sms: int):
        self.plan, self.arch, self.grid = plan, arch, plan.grid(sms)
        self.backward_grid = sms * backward_ctas_per_sm(plan)
        self.forward = self.backward = self.reduce = None

    def forward_kernel(self):
        if self.forward is None:
            self.forward = compile_qk_rope(self.plan, self.arch)
        return self.forward

    def backward_kernels(self):
        """The backward and the reduction of both weights' partial rows (``DwReducePair``)."""
        if self.backward is None:
            p = self.plan
            self.reduce = compile_dw_reduce(p.N, p.w_dtype, self.arch, pdl=p.pdl, pair=True)
            self.backward = compile_qk_rope(p, self.arch, backward=True)
        return self.backward, self.reduce


def _launch(q2, k2, q_weight, k_weight, cos2, sin2, casting_mode: str, pdl: bool,
            sms: int) -> QkRopeLaunch:
    """The launch of these rows (cached by what decides it), or ``NotEligible``."""
    D = q2.shape[1]
    for t in (q2, k2, cos2, sin2):
        if t.shape[0] * max(t.stride(0), D) >= INT32_LIMIT:  # the plain test inline: hot path
            check_int32_addressable(t.shape[0], t.stride(0), D)
    if k_weight.dtype != q_weight.dtype or q_weight.stride(0) != 1 or k_weight.stride(0) != 1:
        raise NotEligible("the weights are not contiguous vectors of one dtype")
    aligned = (_aligned(q2, k2, cos2, sin2)
               and (q_weight.data_ptr() | k_weight.data_ptr()) % 16 == 0)
    key = (D, q2.dtype, q_weight.dtype, casting_mode, aligned, q2.get_device(), pdl, sms)
    launch = _LAUNCHES.get(key)
    if launch is None:
        arch = target_arch(q2.device)
        plan = qk_rope_plan(D, q2.dtype, q_weight.dtype, casting_mode, aligned, arch, pdl)
        launch = _LAUNCHES[key] = QkRopeLaunch(plan, arch, sms)
    return launch


def qk_norm_rope_forward(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor,
                         k_weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         eps: float, casting_mode: str, pdl: bool, sms: int):
    """``(q_out, k_out, q_rstd, k_rstd)`` of q (..., Hq, D) and k (..., Hk, D), checked by the
    caller, with cos and sin (..., D) one row a token: outputs contiguous in q's and k's shapes,
    rstd fp32 (..., H). ``NotEligible`` where the kernel cannot take them."""
    D, heads_q, heads_k = q.shape[-1], q.shape[-2], k.shape[-2]
    q2, k2 = _head_rows("q", q, D), _head_rows("k", k, D)
    cos2, sin2 = _tables(cos, sin, D)
    launch = _launch(q2, k2, q_weight, k_weight, cos2, sin2, casting_mode, pdl, sms)
    kernel = launch.forward_kernel()
    q_out = torch.empty_like(q, memory_format=torch.contiguous_format)
    k_out = torch.empty_like(k, memory_format=torch.contiguous_format)
    q_rstd = q.new_empty(q.shape[:-1], dtype=torch.float32)
    k_rstd = k.new_empty(k.shape[:-1], dtype=torch.float32)
    if q2.shape[0]:
        rule = launch.grid
        q_ctas = rule.of(q2.shape[0])
        kernel(q2, k2, q_weight, k_weight, cos2, sin2, q_out.view(-1, D), k_out.view(-1, D),
               q_rstd.view(-1), k_rstd.view(-1), heads_q, heads_k, q_ctas,
               q_ctas + rule.of(k2.shape[0]), eps)
    return q_out, k_out, q_rstd, k_rstd


def qk_norm_rope_backward(dq_out: torch.Tensor, dk_out: torch.Tensor, q: torch.Tensor,
                          k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                          cos: torch.Tensor, sin: torch.Tensor, q_rstd: torch.Tensor,
                          k_rstd: torch.Tensor, casting_mode: str, pdl: bool, sms: int):
    """``(dq, dk, dq_weight, dk_weight)`` (reference.qk_norm_rope_backward) of the forward's
    saved tensors and the outputs' gradients (contiguous, q's and k's shapes): dq and dk in q's
    and k's shapes, the weights' gradients in their dtype, deterministic. ``NotEligible`` where
    the kernel cannot take the rows."""
    D = q.shape[-1]
    q2, k2 = _head_rows("q", q, D), _head_rows("k", k, D)
    dq2, dk2 = _head_rows("dq", dq_out, D), _head_rows("dk", dk_out, D)
    cos2, sin2 = _tables(cos, sin, D)
    launch = _launch(q2, k2, q_weight, k_weight, cos2, sin2, casting_mode, pdl, sms)
    if not _aligned(dq2, dk2):
        raise NotEligible("the outputs' gradients are not 16-byte aligned rows")
    kernel, reduce = launch.backward_kernels()
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    T = cos2.shape[0]
    grid = max(1, min(T, launch.backward_grid))
    # q's partial row and k's side by side, (grid, 2D): one reduction launch sums both
    partials = q.new_empty((grid, 2 * D), dtype=torch.float32)
    if T:
        kernel(dq2, dk2, q2, k2, q_weight, k_weight, cos2, sin2, q_rstd.view(-1),
               k_rstd.view(-1), dq.view(-1, D), dk.view(-1, D), partials, q.shape[-2],
               k.shape[-2], grid)
    else:
        partials.zero_()
    dwq, dwk = torch.empty_like(q_weight), torch.empty_like(k_weight)
    reduce(partials, dwq, dwk)
    return dq, dk, dwq, dwk
