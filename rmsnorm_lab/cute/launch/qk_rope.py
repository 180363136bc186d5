"""Launching the CuTe q/k-norm + RoPE forward (kernels/qk_rope.py): its plan, its compile cache,
one launch for q's and k's head rows.

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

from ..dtypes import TORCH_TO_CUTE
from ..kernels.qk_rope import RMSNormQkRopeForward
from ..plan.forward import ForwardPlan, NotEligible, check_int32_addressable, plan_forward
from .compile import assumed_align, compile_tvm_ffi, fake_rows, fake_rstd, fake_vector, target_arch

_COMPILED: Dict[Tuple, object] = {}
_PLANS: Dict[Tuple, ForwardPlan] = {}


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


def compile_qk_rope(plan: ForwardPlan, arch: str, keep_ptx_dir: Optional[str] = None):
    """The TVM-FFI compilation of ``plan`` for ``arch`` (cached)."""
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


def qk_norm_rope_forward(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor,
                         k_weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         eps: float, casting_mode: str, pdl: bool, sms: int):
    """``(q_out, k_out, q_rstd, k_rstd)`` of q (..., Hq, D) and k (..., Hk, D), checked by the
    caller, with cos and sin (..., D) one row a token: outputs contiguous in q's and k's shapes,
    rstd fp32 (..., H). ``NotEligible`` where the kernel cannot take them."""
    D, heads_q, heads_k = q.shape[-1], q.shape[-2], k.shape[-2]
    q2, k2 = _head_rows("q", q, D), _head_rows("k", k, D)
    cos2, sin2 = (t.reshape(-1, D) for t in (cos, sin))
    cos2, sin2 = (t if t.stride(1) == 1 else t.contiguous() for t in (cos2, sin2))
    for t in (q2, k2, cos2, sin2):
        check_int32_addressable(t.shape[0], t.stride(0), D)
    if k_weight.dtype != q_weight.dtype or q_weight.stride(0) != 1 or k_weight.stride(0) != 1:
        raise NotEligible("the weights are not contiguous vectors of one dtype")
    aligned = (_aligned(q2, k2, cos2, sin2)
               and (q_weight.data_ptr() | k_weight.data_ptr()) % 16 == 0)
    key = (D, q.dtype, q_weight.dtype, casting_mode, aligned, q.get_device(), pdl)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = qk_rope_plan(D, q.dtype, q_weight.dtype, casting_mode, aligned,
                                          target_arch(q.device), pdl)
    kernel = compile_qk_rope(plan, target_arch(q.device))
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    q_rstd = q.new_empty(q.shape[:-1], dtype=torch.float32)
    k_rstd = k.new_empty(k.shape[:-1], dtype=torch.float32)
    if q2.shape[0]:
        rule = plan.grid(sms)
        q_ctas = rule.of(q2.shape[0])
        kernel(q2, k2, q_weight, k_weight, cos2, sin2, q_out.view(-1, D), k_out.view(-1, D),
               q_rstd.view(-1), k_rstd.view(-1), heads_q, heads_k, q_ctas,
               q_ctas + rule.of(k2.shape[0]), eps)
    return q_out, k_out, q_rstd, k_rstd
