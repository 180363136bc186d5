"""The backward's data flow as a picture: which tensors each kernel of the split and the fused
backward reads and writes, and the DRAM bytes of each (notebooks/02_backward.ipynb, the report)."""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from rmsnorm_lab.lab import (dw_row_groups, fused_strips, plan_backward, plan_split,
                             with_dw_cluster)

MB = 1e6
Step = Tuple[str, List[str], List[str]]  # (kernel, tensors read, tensors written)


def backward_flows(M: int, N: int, sms: int, dtype: torch.dtype = torch.bfloat16,
                   g_split: Optional[int] = None, g_fused: Optional[int] = None,
                   arch: str = "sm_90a") -> Tuple[Dict[str, List[Step]], Dict[str, int]]:
    """``(flows, sizes)``: per mode ("split", "fused") the kernels in order, and the bytes of
    every tensor they name. The fp32 dW partials have ``g_split`` and ``g_fused`` rows; by
    default the row groups and partial rows the library's plans would use on ``sms`` SMs of
    ``arch`` (the recorded H200's by default)."""
    elem = torch.empty((), dtype=dtype).element_size()
    if g_split is None:
        _, dw_plan = plan_split(N, dtype, dtype, "llama", aligned=True)
        g_split = dw_row_groups(M, dw_plan, sms)
    if g_fused is None:
        fused = plan_backward("fused", N, dtype, dtype, "llama", aligned=True)
        g_fused = fused_strips(M, sms, with_dw_cluster(fused, arch))
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


def _mb(b: int) -> str:
    v = b / MB
    return f"{v:,.0f} MB" if v >= 100 else (f"{v:.1f} MB" if v >= 1 else f"{v:.2f} MB")


def draw_flow(ax, title: str, steps: List[Step], sizes: Dict[str, int],
              slots: Optional[int] = None, kernels: str = "library") -> int:
    """Boxes for the kernels, tensors read on the left and written on the right (the
    activation-sized ones highlighted: they are what the time is made of), an arrow from each
    tensor to its kernel; returns the total DRAM bytes of the flow. ``slots``: the number of
    kernels the axes have room for (give two panels the same, and they share a scale).
    ``kernels`` names whose kernels the flow is (``"library"``: the library's plans,
    ``backward_flows``' default; ``"teaching"``: notebook 02's), in the title: their partial
    rows differ, and so do the totals."""
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    big = max(sizes.values())
    rows = max(max(len(r), len(w)) for _, r, w in steps)
    pitch = max(1.3, 0.42 * rows + 0.2)
    slots = max(slots or len(steps), len(steps))
    ax.set_xlim(0, 10)
    ax.set_ylim(-pitch * (slots - 1) - pitch / 2 - 0.3, pitch / 2)
    ax.axis("off")
    total = 0
    for k, (kernel, reads, writes) in enumerate(steps):
        y0 = -pitch * k
        ax.add_patch(FancyBboxPatch((3.9, y0 - 0.3), 2.2, 0.6, boxstyle="round,pad=0.05",
                                    fc="#dbe9f6", ec="#0072B2"))
        ax.text(5.0, y0, kernel, ha="center", va="center", fontsize="medium", weight="bold")
        for side, names in (("in", reads), ("out", writes)):
            span = 0.36 * (len(names) - 1)
            for j, name in enumerate(names):
                yy = y0 + span / 2 - 0.36 * j
                b = sizes[name]
                total += b
                heavy = b >= big
                if side == "in":
                    ax.text(3.0, yy, f"{name}  {_mb(b)}", ha="right", va="center",
                            fontsize="small", weight="bold" if heavy else "normal",
                            bbox=dict(boxstyle="round,pad=0.2",
                                      fc="#f8cbad" if heavy else "#eeeeee", ec="none"))
                    ends = ((3.1, yy), (3.85, y0))
                else:
                    ax.text(7.0, yy, f"{name}  {_mb(b)}", ha="left", va="center",
                            fontsize="small", weight="bold" if heavy else "normal",
                            bbox=dict(boxstyle="round,pad=0.2",
                                      fc="#f8cbad" if heavy else "#eeeeee", ec="none"))
                    ends = ((6.15, y0), (6.9, yy))
                ax.add_patch(FancyArrowPatch(*ends, arrowstyle="-|>", mutation_scale=9,
                                             color="#555555", lw=0.8))
    ax.set_title(f"{title}, {kernels} kernels: {_mb(total)} of DRAM traffic", fontsize="large",
                 loc="left")
    return total
