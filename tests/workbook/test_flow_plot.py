"""The backward's data-flow figure (viz/flow.py): the bytes it adds up and whose kernels its title
names (the library's plans and notebook 02's teaching kernels have different partial rows)."""

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402

from rmsnorm_workbook.viz import flow  # noqa: E402


def test_the_title_names_whose_kernels_and_their_total():
    flows, sizes = flow.backward_flows(16384, 4096, 132)
    ax = Figure().subplots()
    total = flow.draw_flow(ax, "split: 16384×4096 bf16", flows["split"], sizes)
    assert total == sum(sizes[n] for _, r, w in flows["split"] for n in r + w)
    assert ax.get_title(loc="left") == (f"split: 16384×4096 bf16, library kernels: "
                                        f"{total / 1e6:,.0f} MB of DRAM traffic")
    flows, sizes = flow.backward_flows(16384, 4096, 132, g_split=64, g_fused=64)
    ax = Figure().subplots()
    flow.draw_flow(ax, "split", flows["split"], sizes, kernels="teaching")
    assert ax.get_title(loc="left").startswith("split, teaching kernels: ")
