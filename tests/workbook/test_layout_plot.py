"""The thread/value layout picture: the arrays it draws follow plan.py's mapping, and it draws
every variant (zoomed, predicated, chunked) without error on a headless backend."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from rmsnorm_lab.cute.plan.forward import plan_forward  # noqa: E402
from rmsnorm_workbook.viz.layout import draw_row_layout, row_layout  # noqa: E402

BF16, F32 = torch.bfloat16, torch.float32


def plan(variant, N, dtype=BF16):
    return plan_forward(variant, N, dtype, dtype, "llama", True, True)


def test_row_variant_4096_bf16_is_256_threads_by_2_copies_of_8():
    p = plan("row", 4096)
    lay = row_layout(p)
    assert lay.thread.shape == (2, 256)
    assert lay.active.all()
    # thread c's copies start at c*8 and 2048 + c*8: neighbouring threads, neighbouring chunks
    assert list(lay.col_start[:, 0]) == [0, 2048]
    assert list(lay.col_start[0, :3]) == [0, 8, 16]
    assert (lay.thread[0] == np.arange(256)).all() and (lay.thread[1] == np.arange(256)).all()


def test_every_element_is_covered_once():
    for p in (plan("row", 4096), plan("warp", 1024), plan("warp", 2048, F32),
              plan("fallback", 1000), plan("row", 3072)):
        lay = row_layout(p)
        R, K = p.rows_per_cta, p.vecs_per_thread
        for r in range(R):
            starts = lay.col_start[r * K:(r + 1) * K][lay.active[r * K:(r + 1) * K]]
            cols = np.sort((starts[:, None] + np.arange(p.vec)[None, :]).ravel())
            assert (cols == np.arange(min(p.N, p.cols_per_tile))).all(), p


def test_warp_variant_gives_each_row_its_own_warp():
    p = plan("warp", 4096)
    lay = row_layout(p)
    K = p.vecs_per_thread
    assert p.threads_per_row == 32 and p.rows_per_cta >= 2
    for r in range(p.rows_per_cta):
        assert set(np.unique(lay.thread[r * K:(r + 1) * K])) == set(range(32 * r, 32 * r + 32))


def test_predicated_copies_past_N_are_inactive():
    lay = row_layout(plan("row", 3072))  # 384 copies on 256 threads x 2 blocks
    assert lay.active.sum() == 384
    assert not lay.active[1, 128:].any()


def test_zoom_and_chunk_arguments():
    p = plan("row", 262144)
    assert p.chunks > 1
    lay = row_layout(p, lanes=4, chunk=1)
    assert lay.thread.shape == (p.vecs_per_thread, 4)
    assert lay.col_start[0, 0] == p.cols_per_tile
    with pytest.raises(ValueError):
        row_layout(p, lanes=0)
    with pytest.raises(ValueError):
        row_layout(p, chunk=p.chunks)


@pytest.mark.parametrize("variant,N,kw", [("row", 4096, {}), ("row", 4096, {"lanes": 8}),
                                          ("warp", 4096, {}), ("persistent", 8192, {}),
                                          ("fallback", 1000, {"lanes": 8}),
                                          ("row", 262144, {"chunk": 1})])
def test_draws_on_given_or_new_axes(variant, N, kw):
    p = plan(variant, N)
    ax = draw_row_layout(p, **kw)
    assert ax.get_title().startswith(variant)
    assert len(ax.images) == 1
    fig, own = plt.subplots()
    assert draw_row_layout(p, ax=own, **kw) is own
    plt.close("all")


def test_cells_are_coloured_by_warp_and_labelled_where_they_fit():
    from rmsnorm_workbook.viz.layout import WARP_COLOURS

    p = plan("row", 4096)
    fig, (full, zoom) = plt.subplots(2, 1)
    draw_row_layout(p, ax=full)
    draw_row_layout(p, ax=zoom, lanes=8)
    grid = full.images[0].get_array()
    assert grid[0, 0] == 0 and grid[0, 32] == 1 and grid[1, 255] == 7  # warp of each lane
    assert "#F0E442" not in WARP_COLOURS  # no yellow on white
    names = [t.get_text() for t in full.texts]
    assert names[0] == "warp 0\nt0–31" and len(names) == 8
    cells = [t.get_text() for t in zoom.texts]
    assert len(cells) == 16 and cells[1] == "t1\ncols 8–15"
    plt.close("all")


def test_many_column_blocks_are_drawn_in_part_and_the_rest_named_in_a_band():
    from rmsnorm_workbook.viz.layout import shown_blocks

    assert shown_blocks(2) == [(0, 0), (1, 1)]
    assert shown_blocks(16) == [(0, 0), (1, 1), (2, 14), (15, 15)]
    p = plan("warp", 4096)  # 2 rows x 16 blocks
    fig, ax = plt.subplots()
    draw_row_layout(p, ax=ax, lanes=8)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["row 0, k=0: cols 0–255", "row 0, k=1: cols 256–511", "row 0, k=2…14",
                      "row 0, k=15: cols 3840–4095", "row 1, k=0: cols 0–255",
                      "row 1, k=1: cols 256–511", "row 1, k=2…14", "row 1, k=15: cols 3840–4095"]
    bands = [t.get_text() for t in ax.texts if t.get_text().startswith("k = 2 … 14")]
    assert len(bands) == 2 and "cols 512–3839" in bands[0]
    cells = [t.get_text() for t in ax.texts if t.get_text().startswith("t")]
    assert len(cells) == 2 * 3 * 8  # every drawn block of both rows labelled
    key = [t.get_text() for t in ax.get_legend().get_texts()]
    assert key == ["warp 0 (t0–31)", "warp 1 (t32–63)"]  # one colour per warp, named
    plt.close(fig)


def test_a_zoom_inside_one_warp_says_so():
    fig, ax = plt.subplots()
    draw_row_layout(plan("row", 4096), ax=ax, lanes=8)
    assert "all threads shown are in warp 0" in ax.get_title()
    plt.close(fig)


def test_long_column_ranges_take_a_line_of_their_own():
    p = plan("row", 4096)  # 256 threads x 2 blocks: the second block starts at column 2048
    fig, ax = plt.subplots()
    draw_row_layout(p, ax=ax, lanes=8)
    cells = [t.get_text() for t in ax.texts if t.get_text().startswith("t")]
    plt.close(fig)
    assert "t1\ncols 8–15" in cells and "t0\ncols\n2048–2055" in cells
