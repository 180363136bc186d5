"""Which forward plans may write y quantized for the GEMM that reads it (``plan.quant``), in
plain Python like forward.py: fp8 with a static scale or a scale a row, NVFP4 on Blackwell."""

from __future__ import annotations

from typing import Optional

QUANT_MODES = ("static", "token", "nvfp4")
# The kernels that write fp8: the row kernels of auto's choice. A per-token scale needs the whole
# row's amax before the first element is stored, which the row and warp tiles get from their
# registers (or, in column chunks, from one more pass over the chunks).
QUANT_VARIANTS = ("row", "warp", "fallback")
# NVFP4 (e2m1 values, an e4m3 scale a block of 16): Blackwell's convert and GEMM. A block's two
# halves are two neighbouring lanes' 16-byte copies, so the vector path of 2-byte x only.
NVFP4_ARCHS = ("sm_100a", "sm_103a")
NVFP4_VARIANTS = ("row", "warp")
# The fp8 epilogue's one-row tile: copies a thread. Its amax, division and converts keep a CTA of
# two copies a thread issue-bound; four, half the threads a row, is the fastest of seven tiles
# measured at 4096 bf16 columns (docs/design-record.md, 'Forward: fp8 output').
FP8_COPIES_PER_THREAD = 4
# ... or two, where four leave a CTA under PDL_MIN_THREADS and two fill it (2048 bf16 columns:
# 128 threads): it then launches with PDL, which pays there with either scale; a smaller CTA
# loses with PDL (docs/design-record.md, 'Forward: fp8 output').
FP8_PDL_COPIES_PER_THREAD = 2
# A static scale's tile of 128 threads of four copies (4096 bf16 columns, many rows or few), no
# offset: left to itself ptxas takes 66 registers there, seven CTAs an SM, so 1024 rows take two
# waves; bound to eight CTAs it takes 64 and spills none. No other fp8 tile takes a bound: the
# 256-thread tiles take fewer registers without one (docs/design-record.md, 'Forward: fp8 output').
FP8_STATIC_BOUNDS = {(128, 4): 8}  # (threads, copies a thread) -> CTAs an SM


def fp8_launch_bound(quant: str, offset: bool, threads: int, vecs_per_thread: int) -> int:
    """``min_ctas_per_sm`` of an fp8 plan's one-row tile (0: no bound)."""
    if quant != "static" or offset:
        return 0
    return FP8_STATIC_BOUNDS.get((threads, vecs_per_thread), 0)


def quant_problem(quant: str, scale_ub: bool, variant: str, N: int, x_bytes: Optional[int],
                  store_rstd: bool, arch: Optional[str]) -> Optional[str]:
    """Why a plan of ``variant`` cannot write y as ``quant`` ("" writes x's dtype), or None
    when it can; a ``quant`` or ``scale_ub`` no plan takes is a ValueError."""
    if scale_ub and quant != "token":
        raise ValueError("scale_ub bounds per-token scales")
    if not quant:
        return None
    if quant not in QUANT_MODES:
        raise ValueError(f"quant must be one of {QUANT_MODES}, got {quant!r}")
    if variant not in QUANT_VARIANTS:
        return (f"fp8 output is written by the {', '.join(QUANT_VARIANTS)} kernels, not "
                f"{variant}")
    if store_rstd:
        return "the fp8 output keeps no rstd (inference only)"
    if quant != "nvfp4":
        return None
    if arch is not None and arch not in NVFP4_ARCHS:
        return f"NVFP4 needs Blackwell's e2m1 convert ({', '.join(NVFP4_ARCHS)}), not {arch}"
    if variant not in NVFP4_VARIANTS:
        return f"NVFP4 is written by the {', '.join(NVFP4_VARIANTS)} kernels, not {variant}"
    if x_bytes != 2:
        return "NVFP4 takes bfloat16 or float16 x"
    if N % 16:
        return f"NVFP4 takes rows of a multiple of 16 elements, not {N}"
    return None
