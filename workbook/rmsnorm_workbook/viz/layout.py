"""A picture of how a CuTe forward plan maps threads and 16-byte copies onto its CTA tile.

The mapping (``rmsnorm_lab/cute/plan/forward.py``): thread ``(c, r)`` of a CTA works on row ``r`` of the
tile, and its ``k``-th copy moves the ``vec`` contiguous elements starting at column
``(k * threads_per_row + c) * vec``. ``draw_row_layout`` draws one line per (row, column block k)
and one cell per copy, coloured by the warp of the thread that issues it: thread ``c`` owns the
``c``-th cell of every line, so each thread is a vertical stripe and a warp's 32 neighbouring
stripes make one coalesced 512-byte access per line. Cells past N (predicated off) are left
blank and hatched. A tile row of many column blocks shows its first and last blocks, the ones
between summarised in one labelled band.
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


#: column blocks per tile row drawn in full before the rest are summarised in one band (the
#: last block is drawn too, so the band reads as "and so on up to here")
DETAIL_BLOCKS = 2


def shown_blocks(K: int, detail: int = DETAIL_BLOCKS) -> list:
    """The column blocks of one tile row to draw, as ``(k_lo, k_hi)``: one block each (``k_lo ==
    k_hi``) for the first ``detail`` and the last, one band for those between, when there are
    more than one of them; else every block on its own."""
    if K <= detail + 2:
        return [(k, k) for k in range(K)]
    return [(k, k) for k in range(detail)] + [(detail, K - 2), (K - 1, K - 1)]


def draw_row_layout(plan, ax=None, lanes: Optional[int] = None, label_threads: int = 16,
                    chunk: int = 0):
    """Draw the thread/value layout of one CTA tile of ``plan`` (a ``ForwardPlan``).

    One line per (tile row, column block), one cell per copy of ``plan.vec`` elements,
    coloured by the warp of the thread that issues it (``WARP_COLOURS``), warp boundaries as
    white lines. Where a tile row has many column blocks, its first ``DETAIL_BLOCKS`` and its
    last are drawn and the ones between summarised in one labelled band (``shown_blocks``).
    With few lanes in view (``lanes`` zooms onto the first lanes of every line) each cell is
    labelled with its thread (and its columns when the lines are few), up to ``label_threads``
    threads, and a key beside the axes names each warp's colour; with many lanes, each warp's
    first line names the warp and its threads. Returns ``ax``.
    """
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    lay = row_layout(plan, lanes, chunk)
    L = lay.thread.shape[1]
    K = plan.vecs_per_thread
    entries = [(r, lo, hi) for r in range(plan.rows_per_cta) for lo, hi in shown_blocks(K)]
    if ax is None:
        ax = plt.subplots(figsize=(9, max(1.6, min(7.0, 0.9 + 0.28 * len(entries)))))[1]

    n = len(WARP_COLOURS)
    warp = np.ma.masked_all((len(entries), L), dtype=int)
    for y, (r, lo, hi) in enumerate(entries):
        line = r * K + lo
        if lo == hi:  # a band is drawn by _band, over a blank line
            warp[y] = np.ma.masked_where(~lay.active[line], (lay.thread[line] // 32) % n)
    cmap = ListedColormap(WARP_COLOURS).with_extremes(bad="white")
    ax.imshow(warp, cmap=cmap, vmin=-0.5, vmax=n - 0.5, aspect="auto",
              interpolation="nearest", extent=(-0.5, L - 0.5, len(entries) - 0.5, -0.5))
    for w in range(32, L, 32):                     # warp boundaries within a row
        ax.axvline(w - 0.5, color="white", linewidth=2)
    per_row = len(shown_blocks(K))
    for b in range(per_row, len(entries), per_row):  # tile-row boundaries (warp variant)
        ax.axhline(b - 0.5, color="black", linewidth=1.5)
    for y, (r, lo, hi) in enumerate(entries):
        if lo == hi:
            _cells(ax, plan, lay, r * K + lo, y, L <= 16, len(entries) <= 8, label_threads)
        else:
            _band(ax, plan, lay, r, lo, hi, y)
    if L > 16:
        _warp_names(ax, lay, plan, per_row)
    else:
        _warp_key(ax, lay)
    _axis_labels(ax, plan, lay, entries)
    return ax


def _cells(ax, plan, lay, line: int, y: int, labelled: bool, tall: bool, label_threads: int):
    """One line's copies: hatched where predicated off; with few lanes, each cell outlined and
    labelled with its thread (and, when ``tall``, its columns)."""
    from matplotlib.patches import Rectangle

    L = lay.thread.shape[1]
    for j in range(L):
        if not lay.active[line, j]:  # predicated-off copies
            ax.add_patch(Rectangle((j - 0.5, y - 0.5), 1, 1, fill=False, hatch="//",
                                   edgecolor="0.6", linewidth=0))
        elif labelled and j < label_threads:
            ax.add_patch(Rectangle((j - 0.5, y - 0.5), 1, 1, fill=False, edgecolor="white",
                                   linewidth=1))
            a = int(lay.col_start[line, j])
            cols = f"{a}–{a + plan.vec - 1}" if plan.vec > 1 else f"{a}"
            t = int(lay.thread[line, j])
            gap = "\n" if len(cols) > 7 else " "  # a long range gets a line of its own
            ax.text(j, y, f"t{t}" + (f"\ncols{gap}{cols}" if tall else ""), ha="center",
                    va="center", fontsize=8, color=_ink(WARP_COLOURS[(t // 32) % 8]))


def _band(ax, plan, lay, r: int, lo: int, hi: int, y: int) -> None:
    """Column blocks ``lo..hi`` of tile row ``r`` as one pale band in the row's warp colours,
    with a label saying what it stands for."""
    from matplotlib.patches import Rectangle

    K, L = plan.vecs_per_thread, lay.thread.shape[1]
    for j in range(L):
        colour = WARP_COLOURS[(int(lay.thread[r * K + lo, j]) // 32) % len(WARP_COLOURS)]
        ax.add_patch(Rectangle((j - 0.5, y - 0.5), 1, 1, facecolor=colour, alpha=0.3,
                               edgecolor="none"))
    first, last = _cols(plan, lay, r * K + lo), _cols(plan, lay, r * K + hi)
    step = plan.threads_per_row * plan.vec
    ax.text((L - 1) / 2, y, f"k = {lo} … {hi}: {hi - lo + 1} more copies per thread, each "
            f"{step} columns further on (cols {first[0]}–{last[1]}), the same lanes and warps",
            ha="center", va="center", fontsize=8, color="black")


def _cols(plan, lay, line: int):
    """(first, last) column the copies of ``line`` cover, over every lane of the row."""
    a = int(lay.col_start[line, 0])
    return a, min(a + plan.threads_per_row * plan.vec, plan.N) - 1


def _warp_names(ax, lay, plan, per_row: int) -> None:
    """With many lanes in view: each warp named once, on its tile row's first line."""
    L, n = lay.thread.shape[1], len(WARP_COLOURS)
    for r in range(plan.rows_per_cta):
        for w0 in range(0, L, 32):
            t0 = int(lay.thread[r * plan.vecs_per_thread, w0])
            width = min(32, L - w0)
            ax.text(w0 + width / 2 - 0.5, r * per_row, f"warp {t0 // 32}\nt{t0}–{t0 + width - 1}",
                    ha="center", va="center", fontsize=8,
                    color=_ink(WARP_COLOURS[(t0 // 32) % n]))


def _warp_key(ax, lay) -> None:
    """A key beside the axes naming the colour of every warp in view (with few lanes, the
    cells name threads, not warps)."""
    from matplotlib.patches import Patch

    n = len(WARP_COLOURS)
    warps = sorted(set((lay.thread[lay.active] // 32).tolist()))
    handles = [Patch(facecolor=WARP_COLOURS[w % n], label=f"warp {w} (t{32 * w}–{32 * w + 31})")
               for w in warps[:n]]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
              frameon=False, title="colour: warp", title_fontsize=8)


def _axis_labels(ax, plan, lay, entries) -> None:
    """Which row and columns each line covers (y), the lanes (x), and the title."""
    K, T, L = plan.vecs_per_thread, plan.threads_per_row, lay.thread.shape[1]
    labels = []
    for r, lo, hi in entries:
        where = f"row {r}, " if plan.rows_per_cta > 1 else ""
        a, b = _cols(plan, lay, r * K + lo)
        labels.append(f"{where}k={lo}…{hi}" if lo != hi else
                      f"{where}k={lo}: cols {a}–{b}" if a < plan.N else f"{where}k={lo}: past N")
    yt = list(range(len(entries)))
    # as many labels as fit the axes' height (11 points each), every line where they all do
    room = ax.get_position().height * ax.figure.get_figheight() * 72 / 11
    step = max(1, -(-len(entries) // max(1, int(room))))
    ax.set_yticks(yt[::step], labels[::step], fontsize=8)
    xt = list(range(L)) if L <= 16 else sorted(set(range(0, L, 32)) | {L - 1})
    ax.set_xticks(xt, [str(t) for t in xt], fontsize=8)
    ax.set_xlabel("thread c of the row's threads" + (f" (the first {L} of {T})" if L < T else ""))
    warps = sorted(set((lay.thread[lay.active] // 32).tolist()))
    zoom = f"; the first {L} threads" if L < T else ""
    colour = (f"colour: warp (all threads shown are in warp {warps[0]})" if len(warps) == 1
              else "colour: warp")
    chunked = (f", column chunk {chunk_of(plan, lay) + 1} of {plan.chunks}"
               if plan.chunks > 1 else "")
    ax.set_title(f"{plan.variant}: N={plan.N} {_dtype_name(plan.x_dtype)}, "
                 f"{plan.rows_per_cta} row(s) × {T} threads × {K} copies of {plan.vec} "
                 f"elements{chunked}{zoom}; {colour}", fontsize=9)


def chunk_of(plan, lay) -> int:
    """The column chunk ``lay`` was drawn for (its first copy's chunk)."""
    return int(lay.col_start[0, 0]) // plan.cols_per_tile
