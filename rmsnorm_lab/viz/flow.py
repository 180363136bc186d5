"""The backward's data flow as a picture: which tensors each kernel of the split and the fused
backward reads and writes, and the DRAM bytes of each (notebooks/02_backward.ipynb, the report)."""

from __future__ import annotations

from typing import Dict, List, Tuple

import torch
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from ..cute.backward_plan import dw_row_groups, fused_strips, plan_backward, plan_split

MB = 1e6
Step = Tuple[str, List[str], List[str]]  # (kernel, tensors read, tensors written)


def backward_flows(M: int, N: int, sms: int, dtype: torch.dtype = torch.bfloat16
                   ) -> Tuple[Dict[str, List[Step]], Dict[str, int]]:
    """``(flows, sizes)``: per mode ("split", "fused") the kernels in order, and the bytes of
    every tensor they name (the fp32 dW partials sized by the strips the plans would use)."""
    elem = torch.empty((), dtype=dtype).element_size()
    _, dw_plan = plan_split(N, dtype, dtype, "llama", aligned=True)
    fused = plan_backward("fused", N, dtype, dtype, "llama", aligned=True)
    g_split, g_fused = dw_row_groups(M, dw_plan, sms), fused_strips(M, sms, fused)
    act = M * N * elem
    sizes = {"X": act, "dY": act, "dX": act, "W": N * elem, "rstd": M * 4, "dW": N * elem}
    p_split, p_fused = f"partials ({g_split}×N fp32)", f"partials ({g_fused}×N fp32)"
    sizes[p_split], sizes[p_fused] = g_split * N * 4, g_fused * N * 4
    flows = {
        "split": [("dx kernel", ["X", "dY", "W", "rstd"], ["dX"]),
                  ("dW kernel", ["X", "dY", "rstd"], [p_split]),
                  ("dW reduce", [p_split], ["dW"])],
        "fused": [("fused kernel", ["X", "dY", "W", "rstd"], ["dX", p_fused]),
                  ("dW reduce", [p_fused], ["dW"])],
    }
    return flows, sizes


def draw_flow(ax, title: str, steps: List[Step], sizes: Dict[str, int]) -> int:
    """Boxes for the kernels, tensors read on the left and written on the right (activation-
    sized ones highlighted), arrows between; returns the total DRAM bytes of the flow."""
    big = max(sizes.values())
    ax.set_xlim(0, 10)
    ax.set_ylim(-0.6 * len(steps) * 2 - 0.4, 0.6)
    ax.axis("off")
    ax.set_title(title, fontsize="large", loc="left")
    total = 0
    for k, (kernel, reads, writes) in enumerate(steps):
        y0 = -1.3 * k
        ax.add_patch(FancyBboxPatch((3.9, y0 - 0.35), 2.2, 0.7, boxstyle="round,pad=0.05",
                                    fc="#dbe9f6", ec="#1f4e79"))
        ax.text(5.0, y0, kernel, ha="center", va="center", fontsize="medium", weight="bold")
        for side, names, x_box in (("in", reads, 0.1), ("out", writes, 7.2)):
            for j, name in enumerate(names):
                if len(names) > 1:
                    yy = y0 + 0.45 - j * 0.9 / (len(names) - 1)
                else:
                    yy = y0
                b = sizes[name]
                total += b
                ax.text(x_box + 1.3, yy, f"{name}  {b / MB:,.2f} MB", ha="center",
                        va="center", fontsize="small",
                        bbox=dict(boxstyle="round,pad=0.2",
                                  fc="#f8cbad" if b >= big else "#eeeeee", ec="none"))
                ends = ((x_box + 2.65, yy), (3.85, y0)) if side == "in" else \
                    ((6.15, y0), (x_box - 0.05, yy))
                ax.add_patch(FancyArrowPatch(*ends, arrowstyle="-|>", mutation_scale=10,
                                             color="#555555", lw=0.8))
    ax.text(0.1, -1.3 * len(steps) + 0.3, f"DRAM traffic: {total / MB:,.1f} MB",
            fontsize="large", weight="bold")
    return total
