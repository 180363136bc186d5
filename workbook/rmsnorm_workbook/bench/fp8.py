"""The fp8 output's benchmark ops: the norm written as float8_e4m3fn for the GEMM after it
(``rms_norm_fp8``), with a scale a row (``fwd-fp8``) or one static scale (``fwd-fp8-static``),
against the unfused chain and the peers that fuse it.

Implementations are ``fn(x, w) -> (y_q, scales)`` per token and ``fn(x, w, scale) -> (y_q,
scale)`` with the static scale. Rows go to ``results/<gpu>/fwd-fp8.csv`` and
``fwd-fp8-static.csv`` with op ``fwd`` and impl names ending in ``+fp8`` and ``+fp8.static``:
``cute.auto+fp8`` (the lab's CuTe kernel), ``triton.row+fp8`` (its Triton kernel),
``cute.auto+fp8.unfused`` (the lab's bf16 norm, then the quantization in torch's eager ops),
``cute.auto+fp8.unfused.inductor`` (the same norm, then the quantization as one Inductor kernel),
``torch.compile+fp8`` (Inductor on the reference's norm and quantization) and, static only,
``flashinfer+fp8.static`` (FlashInfer's ``rmsnorm_quant``; its arithmetic differs in the last
step, docs/design-record.md, 'Forward: fp8 output').

Bytes: x read, y_q written (one byte an element), w read, and per token a fp32 scale a row:
``M·N·(s + 1) + N·s_w (+ 4·M)``. Measured beside them at each shape: the ceiling ``copy.narrow``,
which reads x's 2 bytes and writes 1 an element with no arithmetic (a Triton kernel that keeps
each value's high byte), and ``copy.fp8``, torch's converting copy of x into fp8, the same bytes
with a conversion: a point of comparison, not a ceiling (it converts in software).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import torch

from rmsnorm_lab import reference, rms_norm, rms_norm_fp8

from .fused_add import PER_HEAD_SHAPES

EPS = 1e-6
MODE = "llama"
#: fp8 codes a step apart (1/16 to 1/8 of a value) where an implementation sums or rounds y
#: otherwise before quantizing (the reference rounds y to bf16 first): 1-2% by the norm; a wrong
#: scale or row is tens of percent
REL_TOL = 5e-2
#: the static op's scale: about the largest |y| of the sweep's rows over 448, so few saturate
STATIC_SCALE = 0.0125
SWEEP: List[Tuple[int, int]] = (
    [(M, 4096) for M in (1024, 4096, 8192, 16384, 32768, 65536)]
    + [(16384, N) for N in (1024, 2048, 8192, 16384)]
    + PER_HEAD_SHAPES
)
QUICK_SWEEP: List[Tuple[int, int]] = [(1024, 4096), (16384, 4096)]


def inputs(M: int, N: int, dtype: torch.dtype) -> tuple:
    x = torch.randn(M, N, dtype=dtype, device="cuda")
    w = (1 + 0.1 * torch.randn(N, device="cuda")).to(dtype)
    return x, w


def static_inputs(M: int, N: int, dtype: torch.dtype) -> tuple:
    return inputs(M, N, dtype) + (torch.tensor([STATIC_SCALE], device="cuda"),)


def reference_out(args: tuple) -> tuple:
    """``(y_q, scales)`` of the reference (``(y_q, scale)`` with a static scale)."""
    x, w = args[:2]
    scale = args[2] if len(args) > 2 else None
    return reference.rms_norm_fp8(x, w, EPS, 0.0, MODE, scale)


def run(impl: Callable, args: tuple):
    return impl(*args)


def bytes_moved(args: tuple) -> int:
    x, w = args[:2]
    M = x.numel() // x.shape[-1]
    scales = 0 if len(args) > 2 else 4 * M
    return x.numel() * (x.element_size() + 1) + w.numel() * w.element_size() + scales


# ------------------------------------------------------------------------- the lab's and peers

def lab_impls(static: bool) -> Dict[str, Callable]:
    """The lab's kernels and its unfused chains: its bf16 norm, then the quantization in torch's
    eager ops (``.unfused``) or as one Inductor kernel (``.unfused.inductor``: y read once, the
    bytes an unfused pipeline cannot avoid)."""
    suffix = "+fp8.static" if static else "+fp8"
    quantize = None

    def fused(backend: str) -> Callable:
        if static:
            return lambda x, w, s: rms_norm_fp8(x, w, EPS, scale=s, casting_mode=MODE,
                                                backend=backend)
        return lambda x, w: rms_norm_fp8(x, w, EPS, casting_mode=MODE, backend=backend)

    def unfused(x, w, s=None):  # the default backend: the CuTe kernel on CUDA
        y = rms_norm(x, w, EPS, casting_mode=MODE)
        return reference.quantize_fp8(y, s)

    def unfused_inductor(x, w, s=None):
        nonlocal quantize
        if quantize is None:  # compiled on first use: building the table compiles nothing
            quantize = torch.compile(reference.quantize_fp8, dynamic=False)
        return quantize(rms_norm(x, w, EPS, casting_mode=MODE), s)

    return {f"cute.auto{suffix}": fused("cute"), f"triton.row{suffix}": fused("triton"),
            f"cute.auto{suffix}.unfused": unfused,
            f"cute.auto{suffix}.unfused.inductor": unfused_inductor}


def torch_compile(eps: float) -> Optional[Callable]:
    """Inductor on the reference's norm and quantization (one compile per shape)."""
    from .peers import torch_compile as compiled_norm
    compiled_norm(eps)  # the same dynamo settings as the plain norm's peer
    chain = torch.compile(reference.rms_norm_fp8, dynamic=False)
    return lambda x, w, s=None: chain(x, w, eps, 0.0, MODE, s)


def flashinfer_static(eps: float) -> Optional[Callable]:
    """FlashInfer's ``rmsnorm_quant``: a static scale, y written into an fp8 tensor."""
    try:
        from flashinfer.norm import rmsnorm_quant
    except Exception:  # noqa: BLE001 - not installed, or broken here: not a peer
        return None

    def run_it(x, w, s):
        out = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
        rmsnorm_quant(out, x, w, s, eps)
        return out, s
    return run_it


PEERS: Dict[str, Callable[[float], Optional[Callable]]] = {"torch.compile+fp8": torch_compile}
STATIC_PEERS: Dict[str, Callable[[float], Optional[Callable]]] = {
    "flashinfer+fp8.static": flashinfer_static,
    "torch.compile+fp8.static": torch_compile,
}


def _narrowing_copy():
    import triton
    import triton.language as tl

    @triton.jit
    def copy_high_bytes(A, B, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(B + offs, (tl.load(A + offs, mask=mask) >> 8).to(tl.int8), mask=mask)

    def run(a, b):  # 16 elements a thread: two 16-byte loads, one 16-byte store
        n = a.numel()
        copy_high_bytes[(triton.cdiv(n, 4096),)](a.view(torch.int16), b.view(torch.int8), n,
                                                 BLOCK=4096, num_warps=8)
    return run


def _copy_to_fp8():
    return lambda a, b: b.copy_(a)


#: the copies the fp8 ops measure at each shape, the ceiling first, then torch's cast: name ->
#: (tensors read, tensors written, the kernel's factory, the dtype written)
SAME_SHAPE = {"copy.narrow": (1, 1, _narrowing_copy, torch.float8_e4m3fn),
              "copy.fp8": (1, 1, _copy_to_fp8, torch.float8_e4m3fn)}
