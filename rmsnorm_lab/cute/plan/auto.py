"""Which forward variant ``auto`` launches for a shape: the row width and dtype, the alignment,
and of the row count only its class (``row_class``). Plain Python, like plan/forward.py."""

from __future__ import annotations

import torch

from .forward import COPY_BYTES, ELEM_BYTES
from .quant import FP8_COPIES_PER_THREAD

# Rows of at most this many bytes go to warp-per-row under `auto` at many rows: warp-per-row wins
# at N=1024 bf16, CTA-per-row from N=2048
# (docs/design-record.md, 'Forward: warp-per-row for short rows').
AUTO_WARP_MAX_ROW_BYTES = 2048
# `auto` sees M only as a class of row counts (``row_class``): many rows (0), few (1: at most
# AUTO_FEW_ROWS_MAX) or fewest (2: at most AUTO_FEWEST_ROWS_MAX). At few rows a row that fits the
# registers takes the row variant launched with PDL at any CTA size, in class 1 with
# FEW_ROWS_COPIES_PER_THREAD copies a thread (fewer threads a row than the usual tile), in class 2
# with the usual tile: four copies a thread win from 512 rows to 3072, the usual tile at 128 rows,
# and PDL lets each call's CTAs start while the previous call drains. The boundaries are one for
# every width: a boundary per width costs the call memo's key more than it gains
# (docs/design-record.md, 'Forward: few rows').
AUTO_FEW_ROWS_MAX = 3072
AUTO_FEWEST_ROWS_MAX = 511
# fp8 output without the residual: a row that fills a warp of the fp8 epilogue's tile (its copies
# a thread) takes the row variant's one-row CTA rather than warp-per-row's eight rows: at 1024 bf16
# columns faster with either scale, most per token (docs/design-record.md, 'Forward: fp8 output').
FP8_ROW_MIN_BYTES = 32 * FP8_COPIES_PER_THREAD * COPY_BYTES


def row_class(M: int) -> int:
    """0 many rows, 1 few, 2 the fewest: all that ``auto``'s plans read of the row count."""
    return int(M <= AUTO_FEW_ROWS_MAX) + int(M <= AUTO_FEWEST_ROWS_MAX)


def auto_variant(N: int, aligned: bool, x_dtype: torch.dtype, M: int,
                 residual: bool = False, quant: str = "") -> str:
    """The variant ``auto`` launches for M rows of N (the caller plans it with ``row_class(M)``):
    the row variant at few rows, else warp-per-row for rows of at most AUTO_WARP_MAX_ROW_BYTES,
    else the row variant, in column chunks where the row is wider than the registers. Never the
    persistent grid, the cluster or the staged ring, which lost to these at the shapes they were
    meant for (docs/design-record.md, 'Forward: variants auto does not launch'). ``residual``:
    the fused add keeps warp-per-row at few rows too. ``quant``: fp8 output (``static`` or
    ``token``) takes the row variant from FP8_ROW_MIN_BYTES, without the residual."""
    elem = ELEM_BYTES[x_dtype]
    if not aligned or N % (COPY_BYTES // elem):
        return "fallback"
    if row_class(M) and not residual:
        return "row"
    if quant in ("static", "token") and not residual and N * elem >= FP8_ROW_MIN_BYTES:
        return "row"
    return "warp" if N * elem <= AUTO_WARP_MAX_ROW_BYTES else "row"
