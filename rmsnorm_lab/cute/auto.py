"""Which forward variant ``auto`` launches for a shape: the row width and dtype, the alignment,
and of the row count only its class (``row_class``). Plain Python, like plan.py."""

from __future__ import annotations

import torch

from .plan import COPY_BYTES, ELEM_BYTES

# Rows of at most this many bytes go to warp-per-row under `auto`: in the H200 forward sweep
# (results/h200/fwd.csv) warp-per-row won at N=1024 bf16, CTA-per-row at N=2048, and from N=4096
# up CTA-per-row was fastest or as fast.
AUTO_WARP_MAX_ROW_BYTES = 2048
# `auto` sees M only as a class of row counts (``row_class``): many rows (0), few (1: at most
# AUTO_FEW_ROWS_MAX) or fewest (2: at most AUTO_FEWEST_ROWS_MAX). At few rows a row that fits the
# registers takes the row variant launched with PDL at any CTA size, in class 1 with
# FEW_ROWS_COPIES_PER_THREAD copies a thread (fewer threads a row than the usual tile), in class 2
# with the usual tile. On the H200 (bf16, N=1024-8192; graph replay of back-to-back calls, where
# each call's CTAs start while the previous one drains) four copies beat two from 512 rows up
# (1024×4096: 5.02 against 5.62 µs; at 3072 rows too, at every width) and two beat four at 128
# rows (128×4096: 2.09 against 2.33; the probe has no row count between 128 and 512); the
# persistent grid with the next row in flight won at 1024×8192 (8.93 against 9.28) and tied at
# 2048×1024; at 4096 rows the usual tiles were as fast or faster but at N=4096
# (results/h200/logs/fwd-small-m-copies-probe-1da54f2b1a02.jsonl, medians of two passes).
AUTO_FEW_ROWS_MAX = 3072
AUTO_FEWEST_ROWS_MAX = 511


def row_class(M: int) -> int:
    """0 many rows, 1 few, 2 the fewest: all that ``auto``'s plans read of the row count."""
    return int(M <= AUTO_FEW_ROWS_MAX) + int(M <= AUTO_FEWEST_ROWS_MAX)


def auto_variant(N: int, aligned: bool, x_dtype: torch.dtype, M: int,
                 residual: bool = False) -> str:
    """The variant ``auto`` launches for M rows of N (the caller plans it with ``row_class(M)``):
    the row variant at few rows, else warp-per-row for rows of at most AUTO_WARP_MAX_ROW_BYTES,
    else the row variant, in column chunks where the row is wider than the registers. Never the
    persistent grid (behind CTA-per-row from 3072 rows, results/h200/logs/fwd-persistent-sweep-
    6261604.jsonl, and behind the few-rows tiles above but at one shape) nor the cluster
    (behind the chunked row at every width measured, WIDE_THREADS). ``residual``: the fused
    add keeps warp-per-row at few rows too."""
    elem = ELEM_BYTES[x_dtype]
    if not aligned or N % (COPY_BYTES // elem):
        return "fallback"
    if row_class(M) and not residual:
        return "row"
    return "warp" if N * elem <= AUTO_WARP_MAX_ROW_BYTES else "row"
