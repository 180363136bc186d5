"""A picture of how a CuTe forward plan maps threads and 16-byte copies onto its CTA tile.

The mapping (``rmsnorm_lab/cute/plan.py``): thread ``(c, r)`` of a CTA works on row ``r`` of the
tile, and its ``k``-th copy moves the ``vec`` contiguous elements starting at column
``(k * threads_per_row + c) * vec``. ``draw_row_layout`` draws one line per (row, column block k)
and one cell per copy, coloured by the thread that issues it: thread ``c`` owns the ``c``-th cell
of every line, so each thread is a vertical stripe and a warp's 32 neighbouring stripes make one
coalesced 512-byte access per line. Cells past N (predicated off) are left blank and hatched.
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


#: one colour per thread when few are in view (Okabe and Ito's palette, grey for the eighth)
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442",
             "#999999")


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def draw_row_layout(plan, ax=None, lanes: Optional[int] = None, label_threads: int = 4,
                    chunk: int = 0):
    """Draw the thread/value layout of one CTA tile of ``plan`` (a ``ForwardPlan``).

    One line per (tile row, column block), one cell per copy of ``plan.vec`` elements,
    coloured by thread (Okabe and Ito's palette when at most eight threads are in view, else the
    viridis ramp with a colour bar). ``lanes`` zooms onto the first lanes of every line; the
    cells of the first ``label_threads`` threads of each row are outlined, and labelled with
    their column range when the cells are wide enough. Warp boundaries are drawn as white
    lines. Returns ``ax``.
    """
    import matplotlib.pyplot as plt
    from matplotlib import patheffects
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Rectangle

    lay = row_layout(plan, lanes, chunk)
    lines, L = lay.thread.shape
    T, K = plan.threads_per_row, plan.vecs_per_thread
    if ax is None:
        ax = plt.subplots(figsize=(9, max(1.6, min(7.0, 0.9 + 0.28 * lines))))[1]

    grid = np.ma.masked_where(~lay.active, lay.thread)
    first, last = int(lay.thread.min()), int(lay.thread.max())
    few = last - first < len(OKABE_ITO)  # few threads in view: one distinct colour each
    if few:
        cmap = ListedColormap(OKABE_ITO[:last - first + 1]).with_extremes(bad="white")
        vmin, vmax = first - 0.5, last + 0.5
    else:  # a perceptually uniform ramp, readable under colour-vision deficiencies
        cmap = plt.get_cmap("viridis").with_extremes(bad="white")
        vmin, vmax = 0, max(plan.threads - 1, 1)
    im = ax.imshow(grid, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto",
                   interpolation="nearest", extent=(-0.5, L - 0.5, lines - 0.5, -0.5))
    for i, j in zip(*np.nonzero(~lay.active)):  # predicated-off copies
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="//",
                               edgecolor="0.6", linewidth=0))
    for w in range(32, L, 32):                     # warp boundaries within a row
        ax.axvline(w - 0.5, color="white", linewidth=1.5)
    for b in range(K, lines, K):                   # tile-row boundaries (warp variant)
        ax.axhline(b - 0.5, color="black", linewidth=1.5)

    wide = L <= 16  # room for a column range inside a cell
    shown = min(label_threads, L)
    for i in range(lines):
        for j in range(shown):
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black",
                                   linewidth=1.2))
            if wide and lay.active[i, j]:
                a = int(lay.col_start[i, j])
                cols = f"{a}–{a + plan.vec - 1}" if plan.vec > 1 else f"{a}"
                ax.text(j, i, f"t{lay.thread[i, j]}\n{cols}", ha="center",
                        va="center", fontsize=7, color="white", fontweight="bold",
                        path_effects=[patheffects.withStroke(linewidth=2, foreground="black")])

    # y: which row and which columns each line covers
    yt = list(range(lines))
    labels = []
    for i in yt:
        r, k = divmod(i, K)
        lo = int(lay.col_start[i, 0])
        hi = min(lo + T * plan.vec, plan.N) - 1
        labels.append(f"row {r}, k={k}: cols {lo}–{hi}" if lo < plan.N
                      else f"row {r}, k={k}: past N")
    step = max(1, -(-lines // 16))  # at most ~16 labels
    ax.set_yticks(yt[::step], labels[::step], fontsize=7)
    if L <= 16:
        xt = list(range(L))
    elif L <= 64:
        xt = sorted(set(range(0, L, 4)) | {L - 1})
    else:
        xt = sorted({0, L - 1} | set(range(31, L, 32)))
    ax.set_xticks(xt, [str(t) for t in xt], fontsize=7)
    ax.set_xlabel("lane within the row = thread c"
                  + (f" (first {L} of {T} shown)" if L < T else ""))
    zoom = f", first {L} lanes" if L < T else ""
    chunked = f", column chunk {chunk + 1} of {plan.chunks}" if plan.chunks > 1 else ""
    ax.set_title(f"{plan.variant}: N={plan.N} {_dtype_name(plan.x_dtype)}, "
                 f"{plan.rows_per_cta} row(s) x {T} threads x {K} copies of {plan.vec} "
                 f"elements{chunked}{zoom}", fontsize=9)
    if not few:
        cb = ax.figure.colorbar(im, ax=ax, pad=0.01, fraction=0.04)
        cb.set_label("thread in the CTA", fontsize=8)
        cb.ax.tick_params(labelsize=7)
    return ax
