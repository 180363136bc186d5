"""The report's figure captions: what each figure draws and how to read it, with the numbers it
states computed from the results it draws."""

from __future__ import annotations

import math

import pandas as pd

from ..analysis import tables
from ..analysis.host import HOST_SHAPE

#: the eager-vs-graph grid's second title line
EAGER_NOTE = ("eager at small M times the host (the launch path and its noise), not the "
              "kernel: compare kernels by the graph lines")


def eager_caption(df: pd.DataFrame, op: str, gpu: str) -> str:
    """The caveat under the eager-vs-graph grid of ``op``, with the lab's two implementations
    whose kernels take the same time yet read furthest apart eagerly (``tables.eager_pair``),
    where they read more than a quarter apart."""
    text = ("Eager (`do_bench`) at small M is host-bound: it times the launch path and its "
            "noise more than the kernel; read where the eager line leaves the graph line, not "
            "the eager order of the implementations.")
    pair = tables.eager_pair(df, op, gpu)
    if pair is not None and pair["eager"][0] > 1.25 * pair["eager"][1]:
        (a, b), (ga, gb), (ea, eb) = pair["impls"], pair["graph"], pair["eager"]
        same = (f"the same graph time ({ga:.1f} µs)" if f"{ga:.1f}" == f"{gb:.1f}" else
                f"graph times within {tables.SAME_GRAPH:.0%} ({ga:.1f} and {gb:.1f} µs)")
        text += (f" At M={pair['M']}, two kernels with {same}, `{a}` and `{b}`, read "
                 f"{ea:.0f} and {eb:.0f} µs eager (the pair is chosen as the furthest apart "
                 "eagerly among the lab's kernels whose graph times lie within "
                 f"{tables.SAME_GRAPH:.0%} of each other there).")
    return text


#: what the crossover figure's series are (notebook 03, section 5, draws one run of it)
CROSSOVER_CAPTION = (
    "The kernels' device times come from the runs of the sweeps that measured them, one series "
    "a run (solid, hollow markers), as measured rather than joined into one curve. \"The "
    "library's call\" is the default launch path (`cute.auto@tvm_ffi` in the tables); "
    "\"launched from Python\" the same call made from Python (its launch path and autograd "
    "node, `+python_node`) instead of the C++ extension, what a machine without a compiler "
    "runs. Where a kernel's curve crosses a host line (a ring), that call stops being "
    "host-bound. Notebook 03, section 5, draws it for one run.")


def cache_cap_caption(df: pd.DataFrame, gpu: str) -> str:
    """What the cache-cap figure's memory panel draws (each bar: the step's peak counted from its
    start, and stacked on it, hatched, the storage the cache pinned at that start), and why the
    solid part of a bounded cap reads below the cache off (notebook 03, step 2), from
    ``analysis.host.cache_memory_table``."""
    from ..analysis import host as host_tables
    from ..bench.host import LAYERS

    mem = host_tables.cache_memory_table(df, LAYERS, gpu)
    if "0" not in mem.index:
        return ""
    act = host_tables.CACHE_SHAPE[0] * host_tables.CACHE_SHAPE[1] * 2 / 2**20
    capped = mem.drop(index=["0", "unbounded"], errors="ignore").dropna(subset=["peak MiB"])
    text = ("Left panel: peak memory counted from what was allocated when the measured step "
            "began, after one warm-up step (`step_peak_and_time`, "
            "`workbook/rmsnorm_workbook/bench/host.py`), "
            "as the solid part of each bar; stacked on it, hatched, the storage the cache's "
            f"handles held at that start (activation-sized tensors of {act:.0f} MiB each), "
            "which that count leaves out. A bar's top is what the step needs beside "
            "everything else.")
    if not capped.empty:
        off = (capped["below cap 0 (MiB)"] - capped["freed in the step (MiB)"]).abs().max()
        caps = ", ".join(capped.index)
        cap0 = mem.loc["0", "peak with pinned (MiB)"]
        text += (" A bounded cache still holds handles of the warm-up step's last layers when "
                 "the measured step begins ("
                 + ", ".join(f"cap {c}: {int(n)}" for c, n in capped["pinned tensors"].items())
                 + " tensors), and its FIFO frees them during the step: the solid parts of caps "
                 f"{caps} read "
                 + ", ".join(f"{v:,.0f}" for v in capped["below cap 0 (MiB)"])
                 + " MiB below the cache off (cap 0), "
                 + ("exactly what those tensors hold" if off < 1 else
                    f"what those tensors hold to within {off:,.0f} MiB")
                 + ", and their bars reach "
                 + ", ".join(f"{v:,.0f}" for v in capped["peak with pinned (MiB)"])
                 + f" MiB against cap 0's {cap0:,.0f}. They do not need less memory.")
    if "unbounded" in mem.index:
        n = int(mem.loc["unbounded", "pinned tensors"])
        total = mem.loc["unbounded", "peak with pinned (MiB)"]
        text += (f" Unbounded, nothing is evicted: {n} such tensors ({n * act:,.0f} MiB) stay "
                 f"allocated after every step, its bar reaches {total:,.0f} MiB, and each step "
                 "adds as many again, growth that a count from each step's start does not show "
                 "(notebook 03, step 2 of section 3).")
    return text


def cache_steps_caption(df: pd.DataFrame, gpu: str) -> str:
    """What the cache-cap figure's step-time panel draws, with its range over the caps against
    the library's call, from ``analysis.host.cache_table`` and ``step_of``."""
    from ..analysis import host as host_tables

    t = host_tables.cache_table(df, gpu).dropna(subset=["step µs"])
    if t.empty:
        return ""
    default = host_tables.step_of(df, host_tables.DEFAULT_IMPL, gpu).get("time", math.nan)
    text = ("Right panel: the same step's eager time per cap (median; whiskers p20-p80), the "
            "library's call and `triton.row` as lines. The cached path takes "
            f"{t['step µs'].min() / 1e3:.1f} to {t['step µs'].max() / 1e3:.1f} ms")
    if math.isfinite(default):
        text += f" against the library's call's {default / 1e3:.1f} ms"
    return text + (": its every launch goes through the compiled function's generic call "
                   "from Python (notebook 03, step 2).")


#: the backward's fused-vs-split bars (notebook 02)
FUSED_VS_SPLIT_CAPTION = (
    "Each bar: the split backward's median time over the fused one's at that shape (above 1: "
    "the fused kernel is faster); whiskers from p20(split) / p80(fused) to p80(split) / "
    "p20(fused), the ratio's spread over the two sets of replays.")


def timeline_caption(trace) -> str:
    """What the nsys timeline draws, and the share of time the GPU was busy over the whole
    profile (``profiling.trace.steady_state``)."""
    from ..profiling import trace as nsys_trace

    s = nsys_trace.steady_state(trace)
    text = ("Three iterations of `python -m rmsnorm_lab profile` under Nsight Systems, its "
            "rows named by the workload (op and shape). Top: the lab's NVTX ranges, host time "
            "(`iter` an iteration; `launch` and `reduce` a kernel's launch). Then the driver's "
            "calls on the host, and the kernels on the GPU, a thin line joining each launch to "
            "its kernel.")
    if math.isfinite(s.get("busy", math.nan)):
        text += (f" Over the {s['iterations']:.0f} iterations profiled, each iteration's "
                 f"{s['kernels_per_iter']:.0f} kernels run {s['kernel_us']:.1f} µs of its "
                 f"{s['period_us']:.0f}: the GPU is busy {s['busy']:.1%} of the time, and the "
                 "loop runs at the host's pace (notebook 03, section 2).")
    return text


#: notebook 01's thread/value layout, as the report draws it
LAYOUT_CAPTION = (
    "Which thread loads which columns of a 4096-column bf16 row, the first lanes of each line "
    "zoomed in. Top: the row kernel, one CTA a row; bottom: warp-per-row, several rows a CTA. "
    "A cell is one 16-byte copy, coloured by the warp whose thread issues it (notebook 01).")

#: notebook 02's data flow of the two backwards
FLOW_CAPTION = (
    "The split and the fused backward at 16384x4096 bf16, with the partial rows of dW the "
    "library's plans use on 132 SMs: each kernel a box, the tensors it reads on its left and "
    "writes on its right, the activation-sized ones highlighted, as they are what the time is "
    "made of. The title of each panel gives its DRAM bytes (notebook 02).")

#: notebook 04's roofline, its stars included
ROOFLINE_CAPTION = (
    "Attainable FP32 TFLOP/s against FLOP per byte of DRAM traffic, a panel a GPU. The solid "
    "roof is datasheet bandwidth times intensity up to the FP32 peak, the dashed one the "
    "bandwidth a copy reached where one was measured. Circles (forward) and triangles "
    "(backward) are `cute.auto` at 65536x4096: filled where measured, hollow where the model "
    "puts it. Stars are device times reported elsewhere (`results/reported/`), at the shapes "
    "the panel's corner names, coloured forward or backward, one op's stars on one line, drawn "
    "just right of their intensity so they do not hide the circles.")

#: notebook 04's crossover across GPUs
GPUS_CROSSOVER_CAPTION = (
    "Per GPU, the forward at 4096 columns: each implementation's host time per call (a "
    "horizontal line, measured on the H200's host for every panel) and its kernel's time "
    "against the row count (a curve: measured on the H200, modelled on the others). Left of "
    "a ring, where the curve meets its line, the call is host-bound: a faster kernel would "
    "not make it faster.")


def bandwidth_caption(df: pd.DataFrame, op: str, gpu: str, x: str) -> str:
    """What a bandwidth sweep's figure of ``op`` against ``x`` (M or N) draws: the lines it
    picks (``viz.sweeps.highlight``) and, where ``op``'s ceiling was measured, its line."""
    text = ("GB/s: the op's least DRAM traffic over its median CUDA-graph time, a band from p20 "
            f"to p80, against {x}. Drawn: `cute.auto`, the other lab kernel fastest at the most "
            f"values of {x}, and the peers fastest at the most")
    if tables.ceiling_gbps(df, op, gpu) is not None:
        text += (f"; the dotted line is the 1 GiB `{tables.CEILING_OF_OP[op]}` measured in the "
                 "same run, read as a percentage on the right axis")
    return text + ". The table above has every implementation."


#: notebook 03's host time per launch path
HOST_PER_PATH_CAPTION = (
    f"CPU µs per call at {HOST_SHAPE[0]}x{HOST_SHAPE[1]} bf16 (median, whiskers p20-p80, log "
    "scale), every implementation's calls interleaved with the others' on one host, for three "
    "workloads: inference, inputs that need grad (the autograd graph recorded), and the "
    "forward with its backward. The first rows are `cute.auto` reached by each launch path "
    "(the key under the legend); a point off the scale is drawn hollow at the right edge, its "
    "value beside it.")

#: notebook 04's reported-against-modelled figure
REPORTED_CAPTION = (
    "Liger-Kernel's CuTe DSL forward over its Triton one at 4096 columns (below 1: CuTe is "
    "faster), per GPU and row count, parity within 5% shaded: the kernels alone and the call "
    "with its host time as the model gives them, the ratios the pull request reported (stars), "
    "the H200's eager ratio as measured, and the call with the CuTe host cost the pull request "
    "reported (the scenario).")
