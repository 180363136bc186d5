"""A picture of how a CuTe forward plan maps threads and 16-byte copies onto its CTA tile.

The mapping (``rmsnorm_lab/cute/plan.py``): thread ``(c, r)`` of a CTA works on row ``r`` of the
tile, and its ``k``-th copy moves the ``vec`` contiguous elements starting at column
``(k * threads_per_row + c) * vec``. ``draw_row_layout`` draws one line per (row, column block k)
and one cell per copy, coloured by the warp of the thread that issues it: thread ``c`` owns the
``c``-th cell of every line, so each thread is a vertical stripe and a warp's 32 neighbouring
stripes make one coalesced 512-byte access per line. Cells past N (predicated off) are left
blank and hatched.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np


class RowLayout(NamedTuple):
    """One CTA tile (one column chunk) of a plan, as arrays of shape (lines, lanes), where line
    ``r * vecs_per_thread + k`` is column block ``k`` of tile row ``r`` and lane ``c`` is the
    ``c``-th thread of that row."""
    thread: np.ndarray     # thread index within the CTA that issues the copy
    col_start: np.ndarray  # first element column (within the row) the copy moves
    active: np.ndarray     # False where the copy starts at or past N (predicated off)


def row_layout(plan, lanes: Optional[int] = None, chunk: int = 0) -> RowLayout:
    """The arrays ``draw_row_layout`` draws, for column chunk ``chunk`` of ``plan``; ``lanes``
    keeps only the first lanes of each line (a zoom)."""
    T, R, K, vec = plan.threads_per_row, plan.rows_per_cta, plan.vecs_per_thread, plan.vec
    if not 0 <= chunk < plan.chunks:
        raise ValueError(f"chunk must be in [0, {plan.chunks}), got {chunk}")
    L = T if lanes is None else lanes
    if not 1 <= L <= T:
        raise ValueError(f"lanes must be in [1, {T}], got {lanes}")
    r = np.repeat(np.arange(R), K)[:, None]          # tile row of each line
    k = np.tile(np.arange(K), R)[:, None]            # column block of each line
    c = np.arange(L)[None, :]                         # lane = thread within the row
    thread = np.broadcast_to(r * T + c, (R * K, L)).copy()
    col_start = (k * T + c) * vec + chunk * plan.cols_per_tile
    col_start = np.broadcast_to(col_start, (R * K, L)).copy()
    return RowLayout(thread, col_start, col_start < plan.N)


#: one colour per warp (Okabe and Ito's palette without its yellow, which does not read on
#: white, and with a darker grey): warps 8 apart share a colour
WARP_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#666666",
                "#000000")


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _ink(colour: str) -> str:
    """Black or white, whichever reads on ``colour``."""
    r, g, b = (int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "white"


def draw_row_layout(plan, ax=None, lanes: Optional[int] = None, label_threads: int = 16,
                    chunk: int = 0):
    """Draw the thread/value layout of one CTA tile of ``plan`` (a ``ForwardPlan``).

    One line per (tile row, column block), one cell per copy of ``plan.vec`` elements,
    coloured by the warp of the thread that issues it (``WARP_COLOURS``), warp boundaries as
    white lines. With few lanes in view (``lanes`` zooms onto the first lanes of every line)
    each cell is labelled with its thread and its columns (with many lines, the first line of
    each tile row with its thread only), up to ``label_threads`` threads;
    with many, each warp's first line names the warp and its threads. Returns ``ax``.
    """
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Rectangle

    lay = row_layout(plan, lanes, chunk)
    lines, L = lay.thread.shape
    T, K = plan.threads_per_row, plan.vecs_per_thread
    if ax is None:
        ax = plt.subplots(figsize=(9, max(1.6, min(7.0, 0.9 + 0.28 * lines))))[1]

    n = len(WARP_COLOURS)
    warp = np.ma.masked_where(~lay.active, (lay.thread // 32) % n)
    cmap = ListedColormap(WARP_COLOURS).with_extremes(bad="white")
    ax.imshow(warp, cmap=cmap, vmin=-0.5, vmax=n - 0.5, aspect="auto",
              interpolation="nearest", extent=(-0.5, L - 0.5, lines - 0.5, -0.5))
    for i, j in zip(*np.nonzero(~lay.active)):  # predicated-off copies
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="//",
                               edgecolor="0.6", linewidth=0))
    for w in range(32, L, 32):                     # warp boundaries within a row
        ax.axvline(w - 0.5, color="white", linewidth=2)
    for b in range(K, lines, K):                   # tile-row boundaries (warp variant)
        ax.axhline(b - 0.5, color="black", linewidth=1.5)

    if L <= 16:  # room for a thread in every cell, and its columns when the lines are few
        tall = lines <= 8
        for i in range(lines) if tall else range(0, lines, K):
            for j in range(min(label_threads, L)):
                if not lay.active[i, j]:
                    continue
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False,
                                       edgecolor="white", linewidth=1))
                a = int(lay.col_start[i, j])
                cols = f"{a}–{a + plan.vec - 1}" if plan.vec > 1 else f"{a}"
                colour = WARP_COLOURS[int(warp[i, j])]
                ax.text(j, i, f"t{lay.thread[i, j]}" + (f"\ncols {cols}" if tall else ""),
                        ha="center", va="center", fontsize=8, color=_ink(colour))
    else:  # name each warp once, on its first line
        for r in range(plan.rows_per_cta):
            for w0 in range(0, L, 32):
                t0 = int(lay.thread[r * K, w0])
                colour = WARP_COLOURS[(t0 // 32) % n]
                ax.text(w0 + min(32, L - w0) / 2 - 0.5, r * K, f"warp {t0 // 32}\n"
                        f"t{t0}–{t0 + min(32, L - w0) - 1}", ha="center", va="center",
                        fontsize=8, color=_ink(colour))

    # y: which row and which columns each line covers
    yt = list(range(lines))
    labels = []
    for i in yt:
        r, k = divmod(i, K)
        lo = int(lay.col_start[i, 0])
        hi = min(lo + T * plan.vec, plan.N) - 1
        where = f"row {r}, " if plan.rows_per_cta > 1 else ""
        labels.append(f"{where}k={k}: cols {lo}–{hi}" if lo < plan.N else f"{where}k={k}: past N")
    step = max(1, -(-lines // 16))  # at most ~16 labels
    ax.set_yticks(yt[::step], labels[::step], fontsize=8)
    xt = list(range(L)) if L <= 16 else sorted(set(range(0, L, 32)) | {L - 1})
    ax.set_xticks(xt, [str(t) for t in xt], fontsize=8)
    ax.set_xlabel("lane within the row = thread c"
                  + (f" (the first {L} of {T})" if L < T else ""))
    zoom = f"; the first {L} lanes" if L < T else ""
    chunked = f", column chunk {chunk + 1} of {plan.chunks}" if plan.chunks > 1 else ""
    ax.set_title(f"{plan.variant}: N={plan.N} {_dtype_name(plan.x_dtype)}, "
                 f"{plan.rows_per_cta} row(s) × {T} threads × {K} copies of {plan.vec} "
                 f"elements{chunked}; colour: warp{zoom}", fontsize=9)
    return ax
