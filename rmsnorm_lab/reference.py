"""The oracle: RMSNorm forward and backward in plain PyTorch, for every casting mode.

Every kernel in the lab is tested against these functions, so the rounding points are written
down here once.

Forward, for rows ``x`` of width N::

    rstd = 1 / sqrt(mean(x**2) + eps)          # accumulated in fp32, saved in fp32
    y    = (x * rstd) * (offset + w)

Casting modes: where the products are rounded to x's dtype. The names ``llama``, ``gemma`` and
``none`` are Liger-Kernel's (kept for compatibility); ``torch`` names the rounding by what it
matches:

``torch``  the default: ``torch.nn.RMSNorm`` and ``torch.nn.functional.rms_norm``'s rounding,
           bit for bit: everything in fp32, only ``y`` is rounded to x's dtype. The same
           arithmetic as ``gemma`` (an alias: ``check_casting_mode`` resolves it, so the kernels
           and their compile keys only ever see ``gemma``).
``llama``  ``x_hat = x * rstd`` is computed in fp32 and rounded to x's dtype; then
           ``y = x_hat * (offset + w)`` is computed in fp32 and rounded to x's dtype: what
           transformers' Llama, Mistral and Qwen norms do (``weight * x_hat.to(dtype)``).
           ``offset + w`` stays in fp32 (no extra rounding of the shifted weight). In bf16 and
           fp16 about a quarter of the outputs differ from ``torch``'s by one ulp.
``gemma``  everything in fp32; only ``y`` is rounded to x's dtype (transformers' Gemma norms,
           with ``offset=1``).
``none``   works in x's dtype: ``rstd`` (fp32 sum) is rounded to x's dtype, and each product
           ``x * rstd``, ``offset + w`` and ``x_hat * (offset + w)`` is rounded to x's dtype.

"fp32" above is the compute type: fp32 for fp32, bf16 and fp16 inputs, fp64 for float64 inputs
(which only this reference, the ``torch`` backend, takes: the kernels refuse them). ``eps=None``
is torch's default: the machine epsilon of that compute type.

Backward, with ``m = dy * (offset + w)`` and ``x_hat = x * rstd``::

    dx = rstd * (m - x_hat * mean(m * x_hat))   # fp32 inside, rounded to x's dtype
    dw = sum_rows(dy * x_hat)                   # fp32 accumulation, rounded to w's dtype

Rounding points in the backward: ``gemma`` (``torch``) uses fp32 throughout. ``llama`` uses the
rounded ``x_hat`` (the value the forward multiplied by the weight) for ``dw``. ``none``
additionally rounds ``m`` to x's dtype, as its forward did every product in that dtype. For fp32
inputs the modes agree to fp32 rounding.

The fused residual add (``rms_norm(x, w, residual=r)``, a decoder block's ``h = x + r; y =
norm(h)``)::

    h  = x + r                                  # fp32 sum rounded to x's dtype: the model's add
    y  = norm(h)                                # as above, of the rounded h
    dx = dr = dh + dx_norm                      # fp32 sum rounded to x's dtype

where ``dh`` is the gradient arriving at the returned ``h`` (the next block's residual) and
``dx_norm`` the norm's dx before its rounding; dW as above, of h.

The norm written as float8_e4m3fn for the next GEMM (``rms_norm_fp8``, inference only), vLLM's
quantization on this norm (vLLM's kernels round y as two modes do: ``rms_norm_static_fp8_quant``
as "gemma", the default's, ``rms_norm_dynamic_per_token_quant`` as "llama")::

    y     = norm(x)                             # x's dtype, any casting mode; then all fp32
    q(v)  = fp8(clamp(v, -448, 448))            # NaN -> +448, +-inf -> +-448, nearest even
    static:    y_q = q(y * fp32(1 / scale))     # scale: one fp32 element, given
    per token: amax = max |y| over the row      # NaN skipped; an all-NaN row gives 0
               amax = min(amax, scale_ub)       # when a bound is given
               s    = max(amax / 448, 1 / (448 * 512))
               y_q  = q(y / s)                  # a division, not a multiply by 1/s

so the fused op is the norm in x's dtype followed by ``quantize_fp8``, bit for bit. With a
residual, y is the norm of ``h = x + residual`` rounded to x's dtype, as the fused add's (and
vLLM's static kernel; its per-token kernel normalizes the sum before rounding it).

``y`` has x's dtype; ``dw`` has w's dtype. Without a weight, ``w`` is taken as ones and there is no
``dw``. ``offset`` (e.g. 1.0 for Gemma, whose checkpoints store ``w - 1``) applies only with a
weight.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

#: the casting modes the kernels implement (and their compile keys name)
CASTING_MODES = ("llama", "gemma", "none")
#: other names accepted wherever a casting mode is, and the mode each one is
CASTING_MODE_ALIASES = {"torch": "gemma"}
#: every name ``casting_mode`` accepts
CASTING_MODE_NAMES = CASTING_MODES + tuple(CASTING_MODE_ALIASES)
#: the default of ``rms_norm``, ``RMSNorm`` and this module: torch's rounding
DEFAULT_CASTING_MODE = "torch"


def check_casting_mode(casting_mode: str) -> str:
    """The mode ``casting_mode`` names (an alias resolved: ``"torch"`` is ``"gemma"``); a
    ValueError listing the accepted names for anything else."""
    if isinstance(casting_mode, str):
        if casting_mode in CASTING_MODES:
            return casting_mode
        if casting_mode in CASTING_MODE_ALIASES:
            return CASTING_MODE_ALIASES[casting_mode]
    raise ValueError(f"casting_mode must be one of {CASTING_MODE_NAMES} ('torch' is "
                     f"torch.nn.RMSNorm's rounding, the same as 'gemma'), got {casting_mode!r}")


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The type the statistics and products are computed in (torch's "opmath" type): fp64 for
    fp64 inputs, fp32 for everything else."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def default_eps(dtype: torch.dtype) -> float:
    """What ``eps=None`` means, as in torch: the machine epsilon of the compute type (fp32's for
    fp32, bf16 and fp16; fp64's for fp64)."""
    return torch.finfo(compute_dtype(dtype)).eps


def _shifted_weight(weight: Optional[torch.Tensor], offset: float, n: int, like: torch.Tensor):
    """``offset + w`` in the compute type of ``like`` (ones when there is no weight)."""
    acc = compute_dtype(like.dtype)
    if weight is None:
        return torch.ones(n, dtype=acc, device=like.device)
    return weight.to(acc) + offset


def rstd_of(x: torch.Tensor, eps: Optional[float] = None) -> torch.Tensor:
    """``1/sqrt(mean(x^2) + eps)`` per row in the compute type (fp32; fp64 for fp64 x): shape
    ``x.shape[:-1]``."""
    xf = x.to(compute_dtype(x.dtype))
    if eps is None:
        eps = default_eps(x.dtype)
    return torch.rsqrt(xf.pow(2).mean(dim=-1) + eps)


def rms_norm_forward(
    x: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    eps: Optional[float] = None,
    offset: float = 0.0,
    casting_mode: str = DEFAULT_CASTING_MODE,
    *,
    rstd: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(y, rstd)``: y in x's dtype, rstd in the compute type (fp32; fp64 for fp64 x)
    with shape ``x.shape[:-1]``. ``eps=None``: the compute type's machine epsilon, as torch.
    ``rstd``: the rows' rstd to apply (a kernel's, to check its products alone) instead of
    computing it."""
    casting_mode = check_casting_mode(casting_mode)
    dtype, acc = x.dtype, compute_dtype(x.dtype)
    n = x.shape[-1]
    rstd = rstd_of(x, eps) if rstd is None else rstd.to(acc)
    r = rstd.unsqueeze(-1)
    ws = _shifted_weight(weight, offset, n, x)
    xa = x.to(acc)
    if casting_mode == "gemma":
        y = (xa * r * ws).to(dtype)
    elif casting_mode == "llama":
        x_hat = (xa * r).to(dtype)
        y = (x_hat.to(acc) * ws).to(dtype)
    else:  # none: every product rounded to x's dtype
        x_hat = (xa * r.to(dtype).to(acc)).to(dtype)
        y = (x_hat.to(acc) * ws.to(dtype).to(acc)).to(dtype)
    return y, rstd


def rms_norm_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: Optional[torch.Tensor],
    rstd: torch.Tensor,
    offset: float = 0.0,
    casting_mode: str = DEFAULT_CASTING_MODE,
    dh: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Returns ``(dx, dw)``: dx in x's dtype, dw in w's dtype (None without a weight). With
    ``dh`` (the fused add's: see the module's docstring) dx is ``dh + dx`` before the rounding."""
    casting_mode = check_casting_mode(casting_mode)
    dtype, acc = x.dtype, compute_dtype(x.dtype)
    n = x.shape[-1]
    r = rstd.to(acc).unsqueeze(-1)
    ws = _shifted_weight(weight, offset, n, x)
    xf, dyf = x.to(acc), dy.to(acc)
    x_hat = xf * r
    if casting_mode == "none":
        m = (dyf * ws.to(dtype).to(acc)).to(dtype).to(acc)
    else:
        m = dyf * ws
    dx = r * (m - x_hat * (m * x_hat).mean(dim=-1, keepdim=True))
    if dh is not None:
        dx = dx + dh.to(acc)
    dx = dx.to(dtype)
    dw = None
    if weight is not None:
        x_hat_w = x_hat if casting_mode == "gemma" else x_hat.to(dtype).to(acc)
        dw = (dyf * x_hat_w).reshape(-1, n).sum(dim=0).to(weight.dtype)
    return dx, dw


def rms_norm(x, weight=None, eps=None, offset=0.0, casting_mode=DEFAULT_CASTING_MODE
             ) -> torch.Tensor:
    """Forward only: ``y``."""
    return rms_norm_forward(x, weight, eps, offset, casting_mode)[0]


def add_residual(x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``h = x + residual``, summed in fp32 and rounded to x's dtype (what ``x + residual``
    gives in torch for two tensors of one floating dtype)."""
    acc = compute_dtype(x.dtype)
    return (x.to(acc) + residual.to(acc)).to(x.dtype)


def fused_add_rms_norm_forward(x, residual, weight=None, eps=None, offset=0.0,
                               casting_mode=DEFAULT_CASTING_MODE):
    """``(y, h, rstd)`` of the fused residual add: ``h = x + residual``, ``y = norm(h)``."""
    h = add_residual(x, residual)
    y, rstd = rms_norm_forward(h, weight, eps, offset, casting_mode)
    return y, h, rstd


# ----------------------------------------------------------------------------- fp8 output

#: the largest finite float8_e4m3fn: quantized values saturate there
FP8_MAX = 448.0
#: vLLM's smallest per-token scale: a row of zeros gets it and quantizes to zeros
FP8_MIN_SCALE = 1.0 / (FP8_MAX * 512.0)
FP8_DTYPE = torch.float8_e4m3fn


def fp8_order(q: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn codes as int16 in the order of their values (+0 and -0 both 0), so the
    difference of two is how many fp8 steps apart they are."""
    b = q.view(torch.uint8).to(torch.int16)
    return torch.where(b >= 0x80, -(b & 0x7F), b & 0x7F)


def saturate_fp8(v: torch.Tensor) -> torch.Tensor:
    """fp32 ``v`` as float8_e4m3fn the way vLLM converts: NaN to +448 (its ``fminf``/``fmaxf``
    clamp keeps the bound), ``clamp(-448, 448)`` (infinities included), then round to nearest
    even."""
    v = torch.where(v.isnan(), torch.full_like(v, FP8_MAX), v)
    return v.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def _one_element(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float32).reshape(())


def quantize_fp8(y: torch.Tensor, scale: Optional[torch.Tensor] = None,
                 scale_ub: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(y_q, scales)``: ``y`` (any float dtype, taken as fp32) quantized to float8_e4m3fn, with
    ``y ~ y_q * scales``. ``scale`` (one fp32 element): the static per-tensor scale, returned as
    given; None: per-token scales, fp32 of shape ``y.shape[:-1]``, each row's amax first bounded
    above by ``scale_ub`` (one fp32 element) when given, so a scale is at most ``scale_ub / 448``. The module's docstring has the arithmetic."""
    yf = y.to(torch.float32)
    if scale is not None:
        inv = torch.reciprocal(_one_element(scale))  # fp32 1/scale, once
        return saturate_fp8(yf * inv), scale
    a = yf.abs()
    if y.shape[-1] == 0:
        amax = a.new_zeros(y.shape[:-1])
    else:
        amax = torch.where(a.isnan(), torch.zeros_like(a), a).amax(dim=-1)
    if scale_ub is not None:
        amax = torch.fmin(amax, _one_element(scale_ub))
    # amax over a tensor, not a Python float: on CUDA torch divides by a scalar as a product
    # with its reciprocal, which is not the division (an ulp off for some amax); full_like, not
    # new_tensor, so no host-to-device copy breaks a CUDA-graph capture
    scales = (amax / torch.full_like(amax, FP8_MAX)).clamp_min(FP8_MIN_SCALE)
    return saturate_fp8(yf / scales.unsqueeze(-1)), scales


def rms_norm_fp8(x, weight=None, eps=None, offset=0.0, casting_mode=DEFAULT_CASTING_MODE,
                 scale=None, residual=None, scale_ub=None):
    """The norm quantized to float8_e4m3fn: ``(y_q, scales)``, or ``(y_q, scales, h)`` with a
    residual (``h = x + residual`` in x's dtype, y the norm of h); see ``quantize_fp8``."""
    h = add_residual(x, residual) if residual is not None else x
    y = rms_norm(h, weight, eps, offset, casting_mode)
    y_q, scales = quantize_fp8(y, scale, scale_ub)
    return (y_q, scales) if residual is None else (y_q, scales, h)


# ------------------------------------------------------------------- NVFP4 output (Blackwell)
# The layout a Blackwell block-scaled GEMM reads, in FlashInfer's convention
# (``rmsnorm_fp4quant``, ``is_sf_swizzled_layout=True``): y's rows in blocks of NVFP4_BLOCK
# elements, each block's values as e2m1 (two a byte, the first in the low nibble) and one
# float8_e4m3fn scale a block, the scales of 128 rows x 4 blocks stored as one 512-byte tile.

NVFP4_BLOCK = 16
#: the largest e2m1 value
FP4_MAX = 6.0
#: e2m1's non-negative values, by code 0..7 (code | 8: the negative)
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def round_e2m1(v: torch.Tensor) -> torch.Tensor:
    """fp32 ``v`` to e2m1 codes (uint8, 0..15), as ``cvt.rn.satfinite.e2m1x2.f32`` rounds:
    to nearest, ties to the even code, magnitudes past 6 to 6; NaN to +6 (as the fp8 output
    sends NaN to its largest value)."""
    v = torch.where(v.isnan(), torch.full_like(v, FP4_MAX), v.float())
    a = v.abs()
    # the midpoints between neighbours, each tie going to the even code: 0.25 -> 0, 0.75 -> 1.0,
    # 1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2.0, 3.5 -> 4.0, 5 -> 4.0
    code = ((a > 0.25).to(torch.uint8) + (a >= 0.75) + (a > 1.25) + (a >= 1.75) + (a > 2.5)
            + (a >= 3.5) + (a > 5.0))
    return code | ((v < 0) | ((v == 0) & (torch.signbit(v)))).to(torch.uint8) << 3


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """The fp32 values of e2m1 codes."""
    table = torch.tensor(FP4_VALUES + tuple(-x for x in FP4_VALUES), dtype=torch.float32,
                         device=codes.device)
    return table[codes.long()]


def nvfp4_scale_offset(row: torch.Tensor, block: torch.Tensor, blocks_per_row: int
                       ) -> torch.Tensor:
    """Where the scale of (``row``, ``block``) lives in the swizzled layout: tiles of 128 rows x 4
    blocks, 512 bytes each, row-major over (row tile, block tile); inside a tile
    ``(row % 32) * 16 + (row % 128) // 32 * 4 + block % 4``."""
    k_tiles = -(-blocks_per_row // 4)
    return ((row // 128) * k_tiles + block // 4) * 512 + (row % 32) * 16 \
        + (row % 128) // 32 * 4 + block % 4


def nvfp4_scales_size(M: int, N: int) -> int:
    """Bytes of the swizzled scales of (M, N): rows padded to 128, blocks to 4 a row."""
    return -(-M // 128) * 128 * -(-(N // NVFP4_BLOCK) // 4) * 4


def quantize_nvfp4(y: torch.Tensor, global_scale: torch.Tensor
                   ) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(q, scales)``: (M, N) ``y`` (any float dtype, taken as fp32) as NVFP4. ``q``: uint8
    (M, N/2), two e2m1 codes a byte; ``scales``: float8_e4m3fn, the swizzled layout
    (``nvfp4_scales_size`` bytes, padding zero). ``global_scale`` (one fp32 element) lifts the
    block scales into e4m3's range (448 * 6 / amax(y) fills it); y is about
    ``e2m1(q) * scale / global_scale``. In fp32, step by step as the kernel:
    ``s = e4m3(min(global_scale * amax(|block|) * fp32(1/6), 448))`` (NaN passed over), then each
    value ``e2m1(y * (global_scale / s))``, and a block whose scale is 0 gives zeros."""
    M, N = y.shape
    if N % NVFP4_BLOCK:
        raise ValueError(f"NVFP4 takes rows of a multiple of {NVFP4_BLOCK} elements, got {N}")
    g = _one_element(global_scale)
    yf = y.float().reshape(M, N // NVFP4_BLOCK, NVFP4_BLOCK)
    mag = yf.abs()
    amax = torch.where(mag.isnan(), torch.zeros_like(mag), mag).amax(-1)
    third = torch.tensor(1.0 / FP4_MAX, dtype=torch.float32)  # fp32(1/6), a multiplier
    s = torch.clamp(g * amax * third, max=FP8_MAX).to(FP8_DTYPE)
    sf = s.float()
    inv = torch.where(sf == 0, torch.zeros_like(sf), g / sf)
    codes = round_e2m1(yf * inv.unsqueeze(-1)).reshape(M, N)
    q = codes[:, 0::2] | (codes[:, 1::2] << 4)
    scales = torch.zeros(nvfp4_scales_size(M, N), dtype=torch.uint8)
    rows = torch.arange(M).unsqueeze(1).expand(M, N // NVFP4_BLOCK)
    blocks = torch.arange(N // NVFP4_BLOCK).unsqueeze(0).expand(M, N // NVFP4_BLOCK)
    scales[nvfp4_scale_offset(rows, blocks, N // NVFP4_BLOCK).reshape(-1)] = \
        s.view(torch.uint8).reshape(-1).cpu()
    return q, scales.to(y.device).view(FP8_DTYPE)


def dequantize_nvfp4(q: torch.Tensor, scales: torch.Tensor, global_scale: torch.Tensor,
                     N: int) -> torch.Tensor:
    """fp32 (M, N) from ``quantize_nvfp4``'s output."""
    M = q.shape[0]
    codes = torch.stack((q & 0xF, q >> 4), dim=-1).reshape(M, N)
    rows = torch.arange(M).unsqueeze(1).expand(M, N // NVFP4_BLOCK)
    blocks = torch.arange(N // NVFP4_BLOCK).unsqueeze(0).expand(M, N // NVFP4_BLOCK)
    s = scales.cpu().float()[nvfp4_scale_offset(rows, blocks, N // NVFP4_BLOCK)]
    values = e2m1_values(codes.cpu()).reshape(M, N // NVFP4_BLOCK, NVFP4_BLOCK)
    return (values * s.unsqueeze(-1) / _one_element(global_scale).cpu()).reshape(M, N)


# ------------------------------------------------------------------ q/k norms with RoPE
# Qwen3's attention prologue: each head of q and of k normalized over its head dimension with
# its own weight, then the rotary embedding of transformers' ``apply_rotary_pos_emb`` (the
# half-rotation layout: ``rotate_half(x) = cat(-x[D/2:], x[:D/2])``), cos and sin one row of D a
# token, shared by the heads.

def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` as transformers computes it: in x's dtype, each
    product and the sum rounded (cos and sin taken in x's dtype, as the model casts them)."""
    return x * cos.to(x.dtype) + rotate_half(x) * sin.to(x.dtype)


def rope_backward(dy: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The gradient at rope's input, in fp32 (fp64 for fp64 ``dy``): ``dy * cos`` plus the
    transpose of rotate_half applied to ``dy * sin`` (``[b, -a]`` of ``[a, b]``)."""
    acc = compute_dtype(dy.dtype)
    dyf = dy.to(acc)
    g = dyf * sin.to(dy.dtype).to(acc)
    half = g.shape[-1] // 2
    return dyf * cos.to(dy.dtype).to(acc) + torch.cat((g[..., half:], -g[..., :half]), dim=-1)


def qk_norm_rope_forward(q, k, q_weight, k_weight, cos, sin, eps=None,
                         casting_mode: str = "llama"):
    """``(q_out, k_out, q_rstd, k_rstd)``: q (..., Hq, D) and k (..., Hk, D) normalized per head
    (``rms_norm_forward``, each with its weight), then ``rope`` with cos and sin (..., D), one
    row a token, broadcast over the heads. The default rounding is transformers' Qwen3 norms'
    (``llama``)."""
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
    qn, q_rstd = rms_norm_forward(q, q_weight, eps, 0.0, casting_mode)
    kn, k_rstd = rms_norm_forward(k, k_weight, eps, 0.0, casting_mode)
    return rope(qn, c, s), rope(kn, c, s), q_rstd, k_rstd


def qk_norm_rope(q, k, q_weight, k_weight, cos, sin, eps=None, casting_mode: str = "llama"):
    """Forward only: ``(q_out, k_out)``."""
    return qk_norm_rope_forward(q, k, q_weight, k_weight, cos, sin, eps, casting_mode)[:2]


def qk_norm_rope_backward(dq_out, dk_out, q, k, q_weight, k_weight, cos, sin, q_rstd, k_rstd,
                          casting_mode: str = "llama"):
    """``(dq, dk, dq_weight, dk_weight)``: rope's transpose (``rope_backward``), then each norm's
    backward (``rms_norm_backward``, its weight's gradient summed over every token and head)."""
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
    dq, dwq = rms_norm_backward(rope_backward(dq_out, c, s), q, q_weight, q_rstd, 0.0,
                                casting_mode)
    dk, dwk = rms_norm_backward(rope_backward(dk_out, c, s), k, k_weight, k_rstd, 0.0,
                                casting_mode)
    return dq, dk, dwq, dwk
