"""The functional entry point: ``rms_norm(x, weight, eps, *, offset, casting_mode, backend)``,
which also takes ``torch.nn.functional.rms_norm``'s call, ``rms_norm(x, normalized_shape,
weight, eps)``.

A call is validated once, here (``validate``), so every backend sees well-formed arguments and a
user sees an error that names the argument at fault; the arguments are normalised there too
(torch's call shape, ``eps=None``, a casting mode's alias), so the backends, the kernels and the
call memo see one spelling of each call. The validated call, with the settings as one snapshot,
is a ``route.Call``; ``route.choose_path`` decides which of the library's paths serves it and
``route.PATHS`` runs it. A call the native node has planned before skips all of that: the
extension's call memo (``dispatch.fast_call``) only holds keys filed after this validation
passed for the same key.

``rms_norm_fp8`` is the norm written as float8_e4m3fn for a GEMM (inference only): validated
the same way, then one of ``route.FP8_PATHS``.
"""

from __future__ import annotations

import math
import numbers
from typing import Dict, Optional, Tuple

import torch

from . import dispatch, reference
from .common.rows import rows_without_copy, same_layout
from .registry import BACKENDS
from .route import (FP8_PATHS, PATHS, QK_PATHS, Call, Fp8Call, QkCall, choose_path,
                    torch_machinery)
from .settings import settings, snapshot

#: what the kernels take; the ``torch`` backend (CPU tensors, or ``backend="torch"``) takes
#: float64 too
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TORCH_DTYPES = FLOAT_DTYPES + (torch.float64,)
#: ``eps=None`` for every dtype the kernels take (their statistics are computed in fp32, as
#: torch's are: ``reference.default_eps``); float64 inputs get fp64's
FP32_EPS = torch.finfo(torch.float32).eps
_ALIASES = reference.CASTING_MODE_ALIASES

def _dtype_error(name: str, dtype: torch.dtype, backend: str) -> TypeError:
    if dtype == torch.float64:
        return TypeError(f"{name} is float64, which backend={backend!r} does not take (its "
                         "kernels compute float32, bfloat16 and float16); float64 runs on "
                         "backend='torch', the default for CPU tensors")
    kinds = "float32, bfloat16, float16 or float64" if backend == "torch" else \
        "float32, bfloat16 or float16"
    return TypeError(f"{name} must be {kinds}, got {dtype}")


def default_backend(x) -> str:
    """The backend of a call that names none: ``settings.backend`` for CUDA (and meta) tensors;
    off CUDA, torch's math, as torch.nn.RMSNorm computes there."""
    if isinstance(x, torch.Tensor) and x.device.type != "cuda" and not x.is_meta:
        return "torch"
    return settings.backend


def validate(x: torch.Tensor, weight: Optional[torch.Tensor], casting_mode: str,
             backend: str, eps: float = 0.0) -> str:
    """Checks a call's arguments, naming the one at fault; returns the casting mode the kernels
    see (an alias resolved: ``reference.check_casting_mode``)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    for name, t in (("x", x), ("weight", weight)):
        if isinstance(t, torch.Tensor) and (t.layout != torch.strided or t.is_nested):
            kind = "nested" if t.is_nested else str(t.layout)
            raise TypeError(f"{name} must be a dense (strided) tensor, got a {kind} tensor; "
                            f"convert it with .to_dense() or .to_padded_tensor()")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    dtypes = TORCH_DTYPES if backend == "torch" else FLOAT_DTYPES
    if x.dtype not in dtypes:
        raise _dtype_error("x", x.dtype, backend)
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (the normalized width)")
    if weight is not None:
        if not isinstance(weight, torch.Tensor):
            raise TypeError(f"weight must be a torch.Tensor or None, got {type(weight).__name__} "
                            "(torch's call shape, rms_norm(x, normalized_shape, weight, eps), "
                            "takes a tuple, list, torch.Size or int second)")
        if weight.dtype not in dtypes:
            raise _dtype_error("weight", weight.dtype, backend)
        if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
            raise ValueError(f"weight must have shape ({x.shape[-1]},) to match x's last "
                             f"dimension, got {tuple(weight.shape)}")
        if weight.get_device() != x.get_device():  # ints: no torch.device objects per call
            raise ValueError(f"weight is on {weight.device} but x is on {x.device}")
    if not isinstance(eps, numbers.Real) or isinstance(eps, bool):
        raise TypeError(f"eps must be a float or None, got {type(eps).__name__}")
    casting_mode = reference.check_casting_mode(casting_mode)
    if backend != "torch" and not (x.is_cuda or x.is_meta):
        raise ValueError(f"backend={backend!r} needs CUDA tensors, but x is on {x.device}; "
                         "use backend='torch' on the CPU")
    return casting_mode


def _is_int(arg) -> bool:
    return isinstance(arg, numbers.Integral) and not isinstance(arg, bool)


def _is_shape(arg) -> bool:
    """A ``normalized_shape`` as torch takes it: a tuple, list, ``torch.Size`` or int."""
    return isinstance(arg, (tuple, list)) or _is_int(arg)


def _one_width(shape) -> Optional[int]:
    """The width a one-dimensional ``normalized_shape`` names (None for any other)."""
    if _is_int(shape):
        return int(shape)
    if isinstance(shape, (tuple, list)) and len(shape) == 1 and _is_int(shape[0]):
        return int(shape[0])
    return None


def torch_call_shape(x, second, third, rest: Tuple, normalized_shape):
    """``(weight, eps)`` of a call made as ``torch.nn.functional.rms_norm(input,
    normalized_shape, weight=None, eps=None)``: ``rms_norm(x, (N,), weight, eps)`` arrives as
    ``weight=(N,)``, ``eps=weight`` and ``rest=(eps,)``; ``rms_norm(x, (N,), eps=1e-5)`` as
    ``weight=(N,)``, ``eps=1e-5``; ``rms_norm(x, normalized_shape=(N,), weight=w, eps=e)`` by
    keyword. ``normalized_shape`` must be ``(x.shape[-1],)``: the lab normalizes the last
    dimension only."""
    if _is_shape(second):
        if normalized_shape is not None:
            raise TypeError("rms_norm got normalized_shape twice (second and by keyword)")
        normalized_shape = second
        if isinstance(third, torch.Tensor) or third is None:
            weight, eps = third, None
        else:  # rms_norm(x, shape, eps=1e-5): torch's third positional is a tensor or None
            weight, eps = None, third
        if rest:
            if len(rest) > 1 or eps is not None:
                raise TypeError("rms_norm takes at most 4 positional arguments, as torch's "
                                "rms_norm(input, normalized_shape, weight, eps)")
            eps = rest[0]
    else:
        if rest:
            raise TypeError(
                "rms_norm takes 3 positional arguments (x, weight, eps), or torch's 4 "
                "(x, normalized_shape, weight, eps) with a tuple, list, torch.Size or int "
                f"second; got {3 + len(rest)} with a {type(second).__name__} second")
        weight, eps = second, third
    if normalized_shape is not None and isinstance(x, torch.Tensor) and x.dim():  # else validate
        width = x.shape[-1]
        if _one_width(normalized_shape) != width:
            raise ValueError(
                f"normalized_shape must be (x.shape[-1],) = ({width},): rmsnorm_lab normalizes "
                f"the last dimension only; got {normalized_shape!r}. Reshape x so that the "
                "normalized dimensions are one (e.g. x.flatten(-k)) and pass their product")
    return weight, eps


_AUTOCAST_UPCASTS: Dict[str, bool] = {}


def autocast_upcasts(device_type: str) -> bool:
    """Does torch's own ``rms_norm`` compute in fp32 under autocast on ``device_type`` (its
    autocast fp32 list names rms_norm from torch 2.12 on CUDA)? Asked of torch once, with a tiny
    call, so the lab follows whatever the installed torch does."""
    found = _AUTOCAST_UPCASTS.get(device_type)
    if found is None:
        probe = torch.ones(1, 2, dtype=torch.bfloat16, device=device_type)
        with torch.autocast(device_type, dtype=torch.bfloat16):
            out = torch.nn.functional.rms_norm(probe, (2,))
        found = _AUTOCAST_UPCASTS[device_type] = out.dtype == torch.float32
    return found


def validate_residual(x: torch.Tensor, residual: torch.Tensor, in_place: bool) -> None:
    if not isinstance(residual, torch.Tensor):
        raise TypeError(f"residual must be a torch.Tensor or None, got {type(residual).__name__}")
    if residual.shape != x.shape or residual.dtype != x.dtype or residual.device != x.device:
        raise ValueError(f"residual must match x ({tuple(x.shape)} {x.dtype} on {x.device}), got "
                         f"{tuple(residual.shape)} {residual.dtype} on {residual.device}")
    if residual.layout != torch.strided or residual.is_nested:
        raise TypeError("residual must be a dense (strided) tensor")
    if in_place:
        raise ValueError("in_place=True is not available with a residual (x and the residual "
                         "share one gradient, which the fused add returns for both)")


def rms_norm(x: torch.Tensor, weight: Optional[torch.Tensor] = None,
             eps: Optional[float] = None, *torch_eps: float,
             residual: Optional[torch.Tensor] = None, offset: float = 0.0,
             casting_mode: str = reference.DEFAULT_CASTING_MODE, backend: Optional[str] = None,
             in_place: bool = False, normalized_shape=None):
    """RMSNorm over the last dimension of ``x`` (any leading shape), rounded as
    ``torch.nn.functional.rms_norm`` unless ``casting_mode`` says otherwise.

    ``rms_norm(x, weight=None, eps=None, *, residual, offset, casting_mode, backend, in_place)``;
    torch's call, ``rms_norm(x, normalized_shape, weight, eps)`` (``normalized_shape`` a tuple,
    list, ``torch.Size`` or int second, or ``normalized_shape=`` by keyword), is taken too, with
    ``normalized_shape`` required to be ``(x.shape[-1],)``: the last dimension is the one
    normalized, and anything else is a ValueError. (In torch's call, ``weight`` and ``eps``
    follow the shape positionally, or ``eps=`` by keyword: Python binds a second positional
    argument to ``weight``, so ``rms_norm(x, (N,), weight=w)`` cannot be told apart from two
    weights; write ``rms_norm(x, (N,), w)``.)

    ``eps``: None is torch's default, the machine epsilon of the type the statistics are
    computed in: ``torch.finfo(torch.float32).eps`` for float32, bfloat16 and float16 (fp64's
    for float64).

    ``casting_mode`` (``reference`` gives the exact rounding of each): ``"torch"`` (the default)
    rounds as ``torch.nn.RMSNorm``/``F.rms_norm``, bit for bit: fp32 throughout, one cast of y.
    ``"llama"`` rounds ``x * rstd`` to x's dtype before the weight multiply, as transformers'
    Llama, Mistral and Qwen norms do (about a quarter of bf16/fp16 outputs then differ from
    torch's by one ulp); ``"gemma"`` is torch's arithmetic under Liger-Kernel's name (with
    ``offset=1.0``: transformers' Gemma norms); ``"none"`` rounds every product to x's dtype.
    ``offset``: the scale is ``offset + weight`` (1.0 for Gemma checkpoints, which store
    ``w - 1``). ``backend``: ``"cute"``, ``"triton"`` or ``"torch"`` (the reference math);
    None is ``settings.backend`` for CUDA tensors and ``"torch"`` for any other, so a CPU tensor
    computes as torch does. float64 is taken by the ``torch`` backend only (the kernels compute
    float32, bfloat16 and float16), so ``torch.autograd.gradcheck`` runs on the CPU.

    With ``residual`` (a tensor like x) it is the fused residual add of a decoder block: it
    returns ``(y, h)`` with ``h = x + residual`` (rounded to x's dtype, as the model's own add)
    and ``y`` the RMSNorm of h, in one kernel that reads x and the residual once and writes h and
    y; the backward gives x and the residual one gradient, h's incoming gradient plus the norm's.

    Differentiable: when grad mode is on and ``x`` or ``weight`` requires grad, the call is
    recorded for autograd (``rstd`` is saved, fp32); otherwise nothing beyond ``y`` is kept.
    Under ``torch.compile`` it goes through the ``rmsnorm_lab::rms_norm_fwd``/``_bwd`` custom ops
    (see ``rmsnorm_lab.autograd``), so ``fullgraph=True`` traces it.

    On the default path (CuTe through the native node) the first call of each key (shape,
    strides, dtypes, alignment, casting mode, eps, offset, settings) is validated and planned in
    Python; later calls with the same key run from the extension's call memo without Python.
    ``eps=None`` and the mode ``"torch"`` are resolved before the memo is asked (two
    comparisons); torch's call shape is normalised after the memo misses it, and the memo is
    then asked again, so a repeated call of that shape still runs from it.

    ``in_place=True`` makes the backward write dx into the incoming gradient's storage and return
    that tensor as x's gradient, saving one activation-sized buffer. Only safe when nothing else
    reads that gradient (``y`` feeds one op whose backward makes a fresh gradient, e.g. a linear
    layer; not ``y + r``, whose backward hands the same tensor to both branches). The backward
    raises ValueError when the gradient is not a contiguous tensor of x's shape and dtype.
    Without autograd it has no effect. There is no double backward (``create_graph=True``
    raises).
    """
    eps_given = eps
    if eps is None:  # torch's default (float64's epsilon for float64 x: below)
        eps = FP32_EPS
    if casting_mode in _ALIASES:  # names the memo's keys and the kernels never see
        casting_mode = _ALIASES[casting_mode]
    compiling = torch.compiler.is_compiling()
    fast = backend in (None, "cute") and not in_place and not compiling
    if fast:  # a call planned before: all in C++ (the raw arguments, as the memo keys them)
        if residual is None:
            fast_call = dispatch.fast_call
            if fast_call is not None:
                y = fast_call(x, weight, eps, offset, casting_mode)
                if y is not None:
                    return y
        elif dispatch.fast_add_call is not None:
            out = dispatch.fast_add_call(x, residual, weight, eps, offset, casting_mode)
            if out is not None:
                return out
    if torch_eps or normalized_shape is not None or not (
            weight is None or isinstance(weight, torch.Tensor)):
        weight, eps_given = torch_call_shape(x, weight, eps_given, torch_eps, normalized_shape)
        eps = FP32_EPS if eps_given is None else eps_given
        if fast:  # the normalised call: a repeated call of torch's shape runs from the memo
            out = _fast(x, weight, eps, offset, casting_mode, residual)
            if out is not None:
                return out
    if backend is None:
        backend = default_backend(x)
    casting_mode = validate(x, weight, casting_mode, backend, eps)
    if eps_given is None and x.dtype == torch.float64:
        eps = reference.default_eps(x.dtype)
    if residual is not None:
        validate_residual(x, residual, in_place)
    x, weight, residual = _as_torch_would_compute(x, weight, residual)
    machinery = None if compiling else (torch_machinery(x, weight)
                                        or (residual is not None
                                            and torch_machinery(residual, None)) or None)
    training = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, weight, residual))
    snap = snapshot()
    native = (not compiling and machinery is None and not in_place and x.numel() > 0
              and (residual is None or same_layout(x, residual))
              and dispatch.routed_to_native(backend, snap) and dispatch.native_node() is not None)
    path = choose_path(compiling=compiling, machinery=machinery, native=native,
                       training=training, empty=x.numel() == 0, decompose=_decompose(compiling))
    return PATHS[path](Call(x, weight, residual, eps, offset, casting_mode, backend, in_place,
                            snap))


def _decompose(compiling: bool) -> bool:
    """Under torch.compile, whether the op steps aside for its math as torch ops
    (``settings.under_compile == "decompose"``), which Inductor fuses with its neighbours."""
    return compiling and settings.under_compile == "decompose"


def _fast(x, weight, eps, offset, casting_mode, residual):
    """The call from the extension's memo (all in C++), or None when the memo does not know it
    or the settings route calls elsewhere."""
    if residual is None:
        fast = dispatch.fast_call
        return fast(x, weight, eps, offset, casting_mode) if fast is not None else None
    fast_add = dispatch.fast_add_call
    return (fast_add(x, residual, weight, eps, offset, casting_mode) if fast_add is not None
            else None)


def _as_torch_would_compute(x: torch.Tensor, weight: Optional[torch.Tensor],
                            residual: Optional[torch.Tensor] = None, autocast: bool = True):
    """The inputs the kernels take, derived the way torch would: under an autocast that
    upcasts rms_norm (unless ``autocast`` is off), fp32 copies (recorded by autograd like any
    cast); a last dimension that is not unit-stride, or leading dimensions that cannot be seen
    as rows, a contiguous copy (row strides alone need none); a strided weight, a contiguous
    one."""
    if (autocast and x.dtype in (torch.bfloat16, torch.float16) and x.device.type == "cuda"
            and torch.is_autocast_enabled("cuda") and autocast_upcasts("cuda")):
        x = x.float()
        weight = weight.float() if weight is not None else None
        residual = residual.float() if residual is not None else None
    if x.dim() and not rows_without_copy(x):
        x = x.contiguous()
    if residual is not None and residual.dim() and not rows_without_copy(residual):
        residual = residual.contiguous()
    if weight is not None and weight.dim() == 1 and weight.shape[0] > 1 and weight.stride(0) != 1:
        weight = weight.contiguous()
    return x, weight, residual


# ----------------------------------------------------------------------------- fp8 output

def _one_float32(name: str, value, x: torch.Tensor) -> torch.Tensor:
    """A scale argument as the one-element fp32 tensor on x's device the kernels read. A float
    is converted, and must be positive and finite; a tensor's value is not read (that would
    synchronize with the GPU)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        value = float(value)
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be positive and finite, got {value!r}")
        return torch.full((), value, dtype=torch.float32, device=x.device)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a float32 tensor of one element, or a float; got "
                        f"{type(value).__name__}")
    if value.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got {value.dtype}")
    if value.dim() > 1 or value.numel() != 1:
        raise ValueError(f"{name} must be one element, of shape () or (1,); got shape "
                         f"{tuple(value.shape)}")
    if value.device != x.device:
        raise ValueError(f"{name} is on {value.device} but x is on {x.device}")
    return value


def rms_norm_fp8(x: torch.Tensor, weight: Optional[torch.Tensor] = None,
                 eps: Optional[float] = None, *, scale=None,
                 residual: Optional[torch.Tensor] = None, scale_ub=None, offset: float = 0.0,
                 casting_mode: str = reference.DEFAULT_CASTING_MODE,
                 backend: Optional[str] = None):
    """RMSNorm over the last dimension of ``x``, written as ``torch.float8_e4m3fn`` for the GEMM
    that reads it; inference only. vLLM's quantization on the lab's norm: y is ``rms_norm(x,
    weight, eps, offset=offset, casting_mode=casting_mode)`` in x's dtype, then quantized in fp32
    with saturation at +-448 (NaN to +448) and round-to-nearest-even; ``reference.quantize_fp8`` is
    the arithmetic, so the result equals that norm followed by that function, bit for bit. vLLM's
    own kernels round y as the default mode (``"torch"``, i.e. ``"gemma"``) does for a static
    scale, as ``"llama"`` for per-token scales (with a residual, its per-token kernel normalizes
    the unrounded sum: no mode here).

    Returns ``(y_q, scales)``, or ``(y_q, scales, h)`` with a ``residual``; ``y ~ y_q * scales``:

    * ``y_q``: float8_e4m3fn, x's shape, contiguous.
    * ``scales``: with ``scale`` (the static per-tensor scale: a float32 tensor of one element,
      shape () or (1,), on x's device; a positive float is taken and put there), that scale
      itself, and ``y_q = q(y * (1 / scale))``. With ``scale=None``, per-token scales: fp32 of
      shape ``x.shape[:-1]``, ``max(amax / 448, 1 / (448 * 512))`` with amax the row's largest
      ``|y|`` (NaN skipped), first bounded by ``scale_ub`` (one float32 element) when given, and
      ``y_q = q(y / scales)``; ``scales.unsqueeze(-1)`` is the (M, 1) row scale of a scaled GEMM.
    * ``h``: with ``residual`` (a tensor like x), ``h = x + residual`` rounded to x's dtype and
      y the norm of h, as ``rms_norm(x, weight, residual=residual)``; h is a tensor of its own
      (the residual is not written in place).

    ``eps``, ``offset`` and ``casting_mode`` (its aliases too) are ``rms_norm``'s. x is float32,
    bfloat16 or float16 and the weight (or None) one of those; autocast does not change the
    arithmetic (y stays in x's dtype). ``backend``: ``"torch"`` (the reference, the default for
    CPU tensors), ``"triton"``, or ``"cute"`` (``settings.backend``, the default for CUDA
    tensors): the CuTe forward's row, warp-per-row or fallback tile, as ``auto`` picks it for
    ``rms_norm``, with an fp8 epilogue (a ``settings.forward_variant`` without one is refused:
    persistent, cluster, staged). Under ``torch.compile``, or for fake tensors and dispatch
    modes, the call is the custom op ``rmsnorm_lab::rms_norm_fp8``. There is no gradient through the quantization: with grad
    mode on, an input that requires grad is a RuntimeError (use ``torch.no_grad()`` or
    ``torch.inference_mode()``).
    """
    if eps is None:
        eps = FP32_EPS
    if backend is None:
        backend = default_backend(x)
    for name, t in (("x", x), ("weight", weight)):
        if isinstance(t, torch.Tensor) and t.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must be float32, bfloat16 or float16 for rms_norm_fp8, "
                            f"got {t.dtype}")
    casting_mode = validate(x, weight, casting_mode, backend, eps)
    if residual is not None:
        validate_residual(x, residual, in_place=False)
    if scale is not None:
        scale = _one_float32("scale", scale, x)
    if scale_ub is not None:
        if scale is not None:
            raise ValueError("scale_ub bounds the per-token scales (scale=None); a static "
                             "scale takes none")
        scale_ub = _one_float32("scale_ub", scale_ub, x)
    if torch.is_grad_enabled():
        for name, t in (("x", x), ("weight", weight), ("residual", residual),
                        ("scale", scale), ("scale_ub", scale_ub)):
            if t is not None and t.requires_grad:
                raise RuntimeError(
                    f"rms_norm_fp8 is inference only (no gradient flows through the fp8 "
                    f"quantization), but {name} requires grad; call it under torch.no_grad() "
                    f"or torch.inference_mode(), or pass {name}.detach()")
    x, weight, residual = _as_torch_would_compute(x, weight, residual, autocast=False)
    compiling = torch.compiler.is_compiling()
    machinery = None if compiling else (
        torch_machinery(x, weight) or torch_machinery(scale, scale_ub)
        or (residual is not None and torch_machinery(residual, None)) or None)
    path = choose_path(compiling=compiling, machinery=machinery, native=False, training=False,
                       empty=x.numel() == 0, decompose=_decompose(compiling))
    y_q, scales, h = FP8_PATHS[path](Fp8Call(x, weight, residual, scale, scale_ub, eps, offset,
                                             casting_mode, backend, snapshot()))
    if scales is None:
        scales = scale
    return (y_q, scales) if residual is None else (y_q, scales, h)


# ----------------------------------------------------------------- q/k norms with RoPE

def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor,
                 k_weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 eps: Optional[float] = None, *, casting_mode: str = "llama",
                 backend: Optional[str] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Qwen3's attention prologue in one op: every head of ``q`` (..., Hq, D) and ``k``
    (..., Hk, D) RMS-normalized over D with its weight (``q_weight``, ``k_weight``: (D,)), then
    rotated by the rotary embedding in transformers' half-rotation layout, ``x * cos +
    rotate_half(x) * sin`` with ``cos``, ``sin`` (..., D): one row a token (or rows that
    broadcast to them), shared by the heads (the model's ``position_embeddings``, before the
    heads are moved ahead of the tokens).
    Returns ``(q_out, k_out)`` in q's and k's shapes and dtype, contiguous; cos and sin are
    taken in q's dtype, as the model casts them. The default rounding is transformers'
    (``casting_mode="llama"``, RoPE in x's dtype as eager torch rounds it), so with weights in
    q's dtype the outputs equal ``Qwen3RMSNorm`` then ``apply_rotary_pos_emb`` bit for bit where
    the sums of squares agree. ``eps=None`` is torch's default (fp32's machine epsilon, as
    ``rms_norm``); Qwen3 passes its config's ``rms_norm_eps``. Differentiable once in q, k and
    both weights (dW deterministic; no double backward), not in cos and sin (their gradient is
    None). ``backend``: ``"torch"`` (the reference, the default off CUDA), ``"triton"``, or
    ``"cute"`` (the default on CUDA): the CuTe kernels where they take the rows (q's and k's
    heads rows of one stride, 16-byte aligned; else the Triton kernels). Its paths:
    ``route.QK_PATHS``."""
    backend = backend if backend is not None else default_backend(q)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    casting_mode = reference.check_casting_mode(casting_mode)
    for name, t in (("q", q), ("k", k), ("q_weight", q_weight), ("k_weight", k_weight),
                    ("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in (torch.float32, torch.bfloat16, torch.float16) and not (
                backend == "torch" and t.dtype == torch.float64):
            raise _dtype_error(name, t.dtype, backend)
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    if q.dim() < 3 or k.dim() < 3:
        raise ValueError(f"q and k must be (tokens..., heads, head_dim), at least 3-D, got "
                         f"{tuple(q.shape)} and {tuple(k.shape)}")
    if backend != "torch" and not (q.is_cuda or q.is_meta):
        raise ValueError(f"backend={backend!r} needs CUDA tensors, but q is on {q.device}; "
                         "use backend='torch' on the CPU")
    if k.dim() != q.dim() or q.shape[:-2] != k.shape[:-2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must be (..., heads, head_dim) with the same tokens and "
                         f"head_dim, got {tuple(q.shape)} and {tuple(k.shape)}")
    D = q.shape[-1]
    if D % 2:
        raise ValueError(f"the rotary embedding rotates halves of the head: head_dim must be "
                         f"even, got {D}")
    if q_weight.shape != (D,) or k_weight.shape != (D,):
        raise ValueError(f"q_weight and k_weight must have shape ({D},), got "
                         f"{tuple(q_weight.shape)} and {tuple(k_weight.shape)}")
    if k.dtype != q.dtype:
        raise TypeError(f"k must have q's dtype {q.dtype}, got {k.dtype}")
    tokens = q.shape[:-2] + (D,)
    try:  # one row a token, or rows that broadcast to them (a batch of one: (1, S, D))
        if cos.shape != tokens or sin.shape != tokens:
            cos, sin = cos.expand(tokens), sin.expand(tokens)
    except RuntimeError:
        raise ValueError(f"cos and sin must be {tuple(tokens)} (one row a token) or broadcast "
                         f"to it, got {tuple(cos.shape)} and {tuple(sin.shape)}") from None
    eps = float(eps) if eps is not None else reference.default_eps(q.dtype)
    compiling = torch.compiler.is_compiling()
    machinery = None if compiling else torch_machinery(q, k, cos, sin, q_weight, k_weight)
    training = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad
                                            or q_weight.requires_grad or k_weight.requires_grad)
    path = choose_path(compiling=compiling, machinery=machinery, native=False, training=training,
                       empty=False, decompose=_decompose(compiling))
    return QK_PATHS[path](QkCall(q, k, q_weight, k_weight, cos, sin, eps, casting_mode, backend))
