"""The sections of ``python -m rmsnorm_lab report`` that follow notebooks 04 and 05: across GPUs
(figures as PNGs and a short markdown summary) and in a model (the model step against torch's
norm). Reads committed results only; never compiles (the compiled-code table comes from its
cache, ``compiled/ptx_table.csv``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import pandas as pd

from ..viz import gpus as figures
from ..results.provenance import gpu_title
from ..analysis import MODELLED, compiled, model, model_step, speed
from ..analysis import tables
from ..analysis.tables import markdown_table
from ..bench.fp8_gemm import CHAINS as GEMM_CHAINS, error_log
from ..bench.qk_rope import ROWS_PER_TOKEN
from ..legend import glossary, impl
from ..analysis.reported import load_reported, pr_era_host
from ..analysis.specs import SPECS, bandwidth_table
from .report_captions import GPUS_CROSSOVER_CAPTION, REPORTED_CAPTION, ROOFLINE_CAPTION

if TYPE_CHECKING:
    from .report_summary import Findings


#: what the eager decode column can and cannot say (its step is paced by the host)
DECODE_CAVEAT = ("Eager decode (`decode wall`) is paced by the host: a step waits on its launches, "
                 "so its ratios rank the launch paths' host cost in this run, which moves between "
                 "runs by more than the norms' own difference; `decode graph` leaves the host out.")

def calibration_caveat(check: pd.DataFrame) -> str:
    """Two sentences from ``model.calibration_check``: how far the model's call ratio is from the
    eager ratio measured on the calibration GPU itself, the GPU whose host costs every verdict
    puts in (empty when nothing was measured there)."""
    if check.empty:
        return ""
    off = check["off by"]
    factor = float(max(off.max(), 1 / off.min()))  # either way from 1
    rows = " and ".join(f"{r['call ratio (modelled)']:.2f} at {int(r['M'])} rows"
                        for _, r in check.iterrows())
    measured = " and ".join(f"{v:.2f}" for v in check["measured eager ratio"])
    gpu = model.CALIBRATION_GPU.upper()
    return (f"On the {gpu} itself the model's call ratio for the same pair is {rows}, where "
            f"`do_bench` measured {measured}: off by up to {factor:.1f}×. The "
            f"verdicts are statements about the model with the host costs measured on the "
            f"{gpu}'s host, not measurements of those GPUs.")


#: what a q/k op moves beyond its copy's head rows, by the bench's bytes (``bench.qk_rope``):
#: cos and sin, 2·T·N·s, against the copy's 2·M·N·s (forward) or 3·M·N·s (backward),
#: M = T·heads
ROPE_EXTRA = {"fwd-qk-rope": f"cos and sin, {100 / ROWS_PER_TOKEN:.1f}% more",
              "bwd-qk-rope": f"cos and sin, {200 / (3 * ROWS_PER_TOKEN):.1f}% more, nor rstd"}

#: what a fused op's ``lab / best peer`` column compares
PEER_RATIO = ("lab / best peer: the lab's fused kernel's time over the fastest peer's, a peer "
              "being any implementation not named `cute.*` or `triton.*` (the lab's) (below 1: "
              "the lab is faster)")


def names_section(df: pd.DataFrame) -> List[str]:
    """What each implementation named in the tables is, and each part a name adds to it
    (``legend.glossary``); the lessons' teaching kernels (``teach.*``) are their notebooks'."""
    rows = glossary(n for n in df["impl"].unique() if not n.startswith("teach."))
    if not rows:
        return []
    return (["### Names in the tables", "",
             "A name is an implementation and the parts added to it: `cute.auto@cached+autograd` "
             "is `cute.auto`, launched by `@cached`, with `+autograd`.", "",
             "| name | what it is |", "|---|---|"]
            + [f"| `{name}` | {about} |" for name, about in rows] + [""])


def newer_run(name: str, gpu: str, fusions: Dict[str, Dict[str, pd.DataFrame]]) -> str:
    """A warning where another GPU holds a newer run of the fused op ``name`` from another
    commit than ``gpu``'s table: the kernel may have changed between the two; else ''."""
    mine = fusions[gpu][name]
    newer = [(t.attrs["timestamp"], other) for other, ts in fusions.items() if other != gpu
             for t in [ts.get(name)] if t is not None
             and t.attrs["timestamp"] > mine.attrs["timestamp"]
             and t.attrs["run"][0] != mine.attrs["run"][0]]
    if not newer:
        return ""
    stamp, other = max(newer)
    commit, _ = fusions[other][name].attrs["run"]
    when = lambda ts: str(ts)[:16].replace("T", " ")  # noqa: E731  to the minute, UTC
    return (f" This run ({when(mine.attrs['timestamp'])} UTC) is older than the "
            f"{gpu_title(other)}'s ({commit}, {when(stamp)}): the kernels may have changed in "
            "between, so compare the two GPUs' rows with care.")


def fusion_caption(name: str, t: pd.DataFrame, warning: str = "") -> str:
    """The caption of a fused op's table (``tables.fusion_table``): its run, the same-shape
    copies it shows (``FUSIONS``' order, the ceiling first, any other copy with what it is:
    ``copy.fp8.shape``, torch's cast), what ``lab / best peer`` compares, then ``warning``
    (``newer_run``)."""
    commit, day = t.attrs["run"]
    ceiling, *others = tables.FUSIONS[name][2]
    rope = name.endswith("qk-rope")  # its copies move the head rows, not cos and sin
    what = f"the head rows' bytes (not {ROPE_EXTRA[name]})" if rope else "the same bytes"
    copies = "".join(f"; {c}, the ceiling, moves {what} with no arithmetic"
                     if c == ceiling else f"; {c}: {impl(c).label or c}"
                     for c in (ceiling, *others) if c in t)
    rows = f"; M counts head rows (tokens × {ROWS_PER_TOKEN} heads)" if rope else ""
    if rope and "liger.rope" in t:
        rows += ("; `liger.rope` is the lab's norms then Liger-Kernel's RoPE, so against it the "
                 "ratio weighs the fusion alone")
    if name.startswith("fwd-fp8"):
        rows += ("; vLLM's fp8 norms, whose conventions these follow, are compared code for code "
                 "(docs/benchmarks.md), not timed: vLLM pins a torch of its own")
    return (f"`bench --op {name}`: µs per call, CUDA-graph replay, median, its newest run "
            f"(commit {commit}, {day}){copies}{rows}; {PEER_RATIO}. The copy is a kernel too, "
            "not a bound: a kernel with its bytes in flight sooner can finish under it, most of "
            "all at ten µs a call or less, where launch and the last wave of CTAs weigh as much "
            f"as bytes.{warning}")


def fusion_figure(fusions: Dict[str, pd.DataFrame], gpu: str, out: Path) -> List[str]:
    """The markdown of the figure of one GPU's fused ops against their fastest peers
    (``viz.fusions``), drawn into ``out``; nothing where no table has that ratio."""
    from matplotlib.figure import Figure

    from ..viz.fusions import LEVEL, plot_fusions_vs_peer

    rows = max((len(t) for t in fusions.values()), default=0)
    fig = Figure(figsize=(3.2 * len(fusions), 1.4 + 0.28 * rows), layout="constrained")
    if not plot_fusions_vs_peer(fusions, gpu, fig):
        return []
    name = save_figure(fig, out / f"{gpu}-fusions-vs-peer.png")
    kernels = ", ".join(dict.fromkeys(f"`{tables.FUSIONS[n][3]}`" for n in fusions))
    lone = "".join(f" {n}'s only peer is `{t.attrs['peers'][0]}`." for n, t in fusions.items()
                   if len(t.attrs.get("peers", ())) == 1)  # a bar against one chain, not a field
    return [f"The fused ops' tables above ({', '.join(fusions)}), their last column drawn: the "
            f"lab's fused kernel ({kernels}) over the fastest peer, blue where the lab's is "
            f"faster, vermillion where a peer is, grey within {LEVEL:.1%}.{lone}", "",
            f"![{name}]({name})", ""]


def gemm_section(df: pd.DataFrame, gpu: str, root: Path) -> List[str]:
    """The fp8 output feeding a projection (``python -m rmsnorm_workbook.bench.fp8_gemm``):
    µs of each chain by token count from the newest run, and the fp8 chains' output error
    against the bf16 chain's from the same run's ``logs/fp8-gemm-error.json``; nothing where
    the results hold no such run."""
    d = df[(df["gpu"] == gpu) & df["impl"].isin(GEMM_CHAINS) & (df["path"] == "graph")]
    if d.empty:
        return []
    run = d[d["timestamp"] == d["timestamp"].max()]
    t = run.pivot_table(index="M", columns="impl", values="p50", aggfunc="last")
    t = t.reindex(columns=[c for c in GEMM_CHAINS if c in t.columns])
    commit = str(run["commit"].iloc[0])
    md = ["### fp8 into the next GEMM", "",
          "`python -m rmsnorm_workbook.bench.fp8_gemm`: µs per call, CUDA-graph replay, median, "
          f"its newest run (commit {commit}, {str(run['timestamp'].iloc[0])[:10]}): x (M, "
          f"{int(run['N'].iloc[0])}) bf16 through the norm into a projection by `_scaled_mm` "
          "(fp8, row-wise scales) or a bf16 GEMM; `fp8.unfused` quantizes after the bf16 norm "
          "in torch's eager ops:", "", markdown_table(t, 1, right_align=True), ""]
    path = error_log(root, gpu)
    err = json.loads(path.read_text()) if path.is_file() else None
    if err is not None and err.get("provenance", {}).get("commit") == commit:
        M = max(int(m) for m in err["errors"][GEMM_CHAINS[0]])
        e = err["errors"][GEMM_CHAINS[0]][str(M)]
        md += [f"The projection is {err['K']} → {err['N']}. The fused chain's output is "
               f"{e['all']:.2%} from the bf16 chain's at M={M} ({e['worst_row']:.2%} in its "
               "worst row).", ""]
    return md


def _title(key: str) -> str:
    """A verdict's key as the text names it: a GPU's slug as its name, ``overall`` as is."""
    return gpu_title(key) if key in SPECS else key


def _named(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with the GPUs named as the text names them: the ``gpu`` column's slugs and
    the columns named after a GPU (``h100_sxm (modelled)`` -> ``H100 SXM (modelled)``)."""
    table = table.copy()
    if "gpu" in table.columns:
        table["gpu"] = table["gpu"].map(gpu_title)
    if table.index.name == "gpu":
        table.index = table.index.map(gpu_title)

    def column(name):
        gpu, _, kind = str(name).partition(" ")
        return f"{gpu_title(gpu)} {kind}" if gpu in SPECS and kind.startswith("(") else name
    return table.rename(columns=column)


def save_figure(fig, path: Path) -> str:
    """``fig`` as a PNG at ``path``, cropped to what it draws (legends outside the axes
    included); returns the file name."""
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path.name


def figure_lines(figures: List[Tuple[str, str]]) -> List[str]:
    """Markdown for figures ``(file name, caption)``, each caption under its figure."""
    md: List[str] = []
    for name, caption in figures:
        md += [f"![{name}]({name})", ""] + ([caption, ""] if caption else [])
    return md


def gpu_section(df: pd.DataFrame, out: Path, root: Path, findings: Optional["Findings"] = None
                ) -> Tuple[List[str], List[str]]:
    """Render the roofline (attainable TFLOP/s against arithmetic intensity, per GPU), the
    crossover and the reported-vs-modelled figures into ``out``; return (markdown lines,
    headline lines for stdout). The verdict goes into ``findings`` too, for the summary."""
    from matplotlib.figure import Figure

    reported = load_reported(root)
    cal = model.calibrate(df)
    md = ["## Across GPUs: measured, modelled, reported", "",
          "Measured: this lab's benchmark (`results/<gpu>/`). Modelled: device time = t0 + bytes "
          "/ (efficiency x datasheet bandwidth), fitted on the H200's CUDA-graph times, host time "
          "as measured on the H200's host; per call as `triton.testing.do_bench` sees it "
          "(device + host time beyond its 256 MiB L2 flush). Reported: quoted from elsewhere "
          "with its source (`results/reported/`). The model: `notebooks/04_gpus.ipynb`; the "
          "verdicts on reported claims below are this section's own.", ""]
    headline: List[str] = []
    if cal.empty:
        md += ["No CUDA-graph measurements to calibrate the model on: nothing to model.", ""]
        return md, headline
    md += ["Bandwidth, datasheet vs measured copy; each GPU's copy as measured in the run "
           "named (of its forward runs, the one that measured the most rows; where the GPU "
           "has a forward sweep, the copy its `% of copy` cells are divided by):", "",
           markdown_table(_named(bandwidth_table(df).drop(columns="kind")), 0), ""]
    hosts = model.host_costs(df)
    pr = model.pr_comparison(df, reported, cal=cal, hosts=hosts)
    era = pr_era_host(reported)
    pr_era = (model.pr_comparison(df, reported, cal=cal,
                                  hosts=model.with_host(hosts, "liger.cutedsl", era))
              if math.isfinite(era) else None)
    names = []
    gpus = model.MODEL_GPUS
    fig = Figure(figsize=(4.6 * len(gpus) + 2.4, 4.2), layout="constrained")
    figures.plot_speed_of_light(speed.sol_points(df, reported, cal), gpus, df=df,
                                axes=fig.subplots(1, len(gpus), sharey=True))
    names.append((save_figure(fig, out / "gpus-roofline.png"), ROOFLINE_CAPTION))
    if not hosts.empty:
        fig = Figure(figsize=(4.2 * len(gpus) + 2.4, 4.0), layout="constrained")
        figures.plot_crossover(df, cal=cal, hosts=hosts,
                               axes=fig.subplots(1, len(gpus), sharey=True))
        names.append((save_figure(fig, out / "gpus-crossover.png"), GPUS_CROSSOVER_CAPTION))
        fig = Figure(figsize=(11, 4.6), layout="constrained")
        liger = pr["pair"].str.startswith("liger")
        scenario = (pr_era[pr_era["pair"].str.startswith("liger")]
                    if pr_era is not None else None)
        figures.plot_reported_vs_modelled(
            pr[liger], scenario, f"per call, CuTe host {era:.0f} µs as reported "
            f"({MODELLED} scenario)", ax=fig.subplots())
        names.append((save_figure(fig, out / "gpus-reported-vs-modelled.png"),
                      REPORTED_CAPTION))
        verdict = model.finding(pr)
        if findings is not None:
            findings.verdict = dict(verdict)
        md += ["Liger-Kernel PR #1336's finding (its CuTe DSL RMSNorm against its Triton one: "
               "on the B200 CuTe faster because the host dominates; on the H100 parity), "
               "computed by the model at M=8192, N=4096, with the host costs measured on the "
               "H200's host:", ""]
        md += [f"- {_title(k)}: {v}" for k, v in verdict.items()]
        caveat = calibration_caveat(model.calibration_check(pr))
        if caveat:
            md += ["", caveat]
        if pr_era is not None:
            v2 = model.finding(pr_era)
            md += ["", f"With Liger's CuTe host cost of {era:.0f} µs reported before TVM-FFI "
                   "(a scenario, mixing a reported input into the model):", ""]
            md += [f"- {_title(k)}: {v}" for k, v in v2.items()]
        cols = ["pair", "gpu", "M", "device ratio (modelled)", "measured device ratio",
                "call ratio (modelled)", "reported ratio", "measured eager ratio"]
        md += ["", "CuTe / Triton time per call (device ratio: the kernels alone, modelled and, "
               f"on the {model.CALIBRATION_GPU.upper()}, measured by CUDA-graph replay; call "
               "ratio: with the host term; measured eager ratio: `do_bench`):", "",
               markdown_table(_named(pr[cols])), ""]
        shown = model.shown_hosts(hosts)
        if shown.empty:
            md += ["Crossover M: no host benchmark run (`bench --op host`) to take host costs "
                   "from.", ""]
        else:
            cross = model.crossover_table(df, cal=cal, hosts=shown)
            md += ["Crossover M (device time reaches host time; below it a call is "
                   "host-bound), N=4096 bf16 forward. Host µs from the host benchmark "
                   "(`bench --op host`, every implementation interleaved on one host), the "
                   "lab's default launch path and the peers; the sweeps' own host rows do not "
                   "compare with these and are left out:", "", markdown_table(_named(cross), 0), ""]
        headline += ["across GPUs (modelled, N=4096 fwd): " + verdict["overall"],
                     *(f"  {_title(k)}: {v}" for k, v in verdict.items() if k != "overall"),
                     *([f"  caveat: {caveat[0].lower()}{caveat[1:]}"] if caveat else []), ""]
    rvm = model.reported_vs_modelled(reported, cal)
    if not rvm.empty:
        md += ["Reported device times vs the model:", "",
               markdown_table(_named(rvm.dropna(subset=["modelled_us"])
                                     .drop(columns="source"))), ""]
    ptx = compiled.table(root)
    if ptx.empty:
        md += ["Compiled-code table: no cache (`python -m rmsnorm_workbook.analysis.compiled` "
               "writes `compiled/ptx_table.csv`).", ""]
    else:
        keep = ["kernel", "arch", "registers", "spill_bytes", "ld.global 16B", "st.global 16B",
                "shuffles", "barriers", "instructions", "fma", "mul", "packed f32x2"]
        md += ["Compiled code, sm_90a vs sm_100a (from the cached PTX table; compiler output, "
               "not a measurement). Each kernel is bf16 at 4096 columns unless its N is named: "
               "`fwd.<variant>` the forward's variants (`cute.<variant>` in the tables), "
               "`fwd.fallback` the one for any width, one element a copy; `bwd.fused` the fused "
               "backward, `bwd.dx` and `bwd.dw` the split one's two kernels; chunked, a row too "
               "wide for the registers walked in chunks:", "",
               markdown_table(ptx[[c for c in keep if c in ptx.columns]], 0),
               ""]
    return md + figure_lines(names), headline


#: the model-step columns the report shows, and those it compares with torch's norm
MODEL_COLUMNS = ["train wall", "prefill wall", "decode wall", "decode events", "decode graph"]
MODEL_RATIOS = ["train wall", "prefill wall", "decode wall", "decode graph"]


def model_section(steps: pd.DataFrame, out: Path, findings: Optional["Findings"] = None
                  ) -> Tuple[List[str], List[str]]:
    """Notebook 05's step table per GPU: the newest run of ``bench --op model`` (every norm
    choice, ms, p50), each choice over torch's norm in the same model and run (also as a figure),
    with what its eager decode column measures, and the torch.compile run; (markdown lines,
    headline lines for stdout). The lab's ratios go into ``findings`` too, for the summary."""
    from matplotlib.figure import Figure

    from ..viz import model_step as step_figures

    md = ["## In a model (notebook 05)", "",
          "`bench --op model`: transformers' Llama and Qwen3 architectures (8 layers, hidden "
          "4096, random weights), a training step and a prefill of 8×2048 tokens and a decode "
          "step of batch 8, per norm choice: `shipped` (transformers' own), `torch` "
          "(`torch.nn.RMSNorm`), `lab` (`rmsnorm_lab.patch`), `lab+carry` (the residual add "
          "fused into the next norm), `lab+qk` (also Qwen3's q/k norms and RoPE as one op, "
          "`fuse_qk_rope`), `liger`. ms per step, median; `wall` a back-to-back loop, "
          "`events` CUDA events around `triton.testing.do_bench`'s loop (for the eager decode "
          "step, which the host paces, they time the host's enqueue, not the GPU: notebook 05), "
          "`graph` replayed from a CUDA graph. Ratios are against "
          "`torch` in the same model and run.", ""]
    headline: List[str] = []
    if steps.empty:
        return md + ["No model-step results.", ""], headline
    for gpu in sorted(steps["gpu"].unique()):
        g = steps[steps["gpu"] == gpu]
        # the newest run of both models, else of Qwen3 alone (a run of its prologue's choices)
        run = model_step.one_run(g, "llama.lab")
        run = run if not run.empty else model_step.one_run(g, "qwen3.lab")
        if run.empty:
            continue
        table = model_step.step_table(run)
        ratios = model_step.versus(table)
        when = ""
        if "commit" in run.columns:  # every recorded row names one; a test's rows may not
            when = f" (commit {run['commit'].iloc[0]}, {str(run['timestamp'].iloc[0])[:10]})"
        md += [f"### {gpu_title(gpu)}", "", f"ms per step{when}:", "",
               markdown_table(table[[c for c in MODEL_COLUMNS if c in table.columns]]
                              .reset_index(), 2), "",
               "time over torch's norm's:", "",
               markdown_table(ratios[MODEL_RATIOS].reset_index(), 3), ""]
        caveat = DECODE_CAVEAT if "decode wall" in table.columns else ""
        md += [caveat, ""] if caveat else []
        archs = sorted(ratios.index.get_level_values("arch").unique())
        # eager decode, paced by the host, on a range of its own: nothing cut, nothing squeezed
        groups = [[c for c in MODEL_RATIOS if c != "decode wall"], ["decode wall"]]
        fig = Figure(figsize=(6.6 * len(archs), 1.6 + 0.75 * sum(len(c) + 1 for c in groups)),
                     layout="constrained")
        step_figures.plot_step_ratios(ratios, archs, groups, gpu=gpu, fig=fig,
                                      notes=["eager decode, wall clock (the host's pace; "
                                             "a range of its own)"],
                                      spread=model_step.versus_spread(run))
        name = save_figure(fig, out / f"{gpu}-model-vs-torch.png")
        md += [f"![{name}]({name})", ""]
        compiled_runs = [model_step.one_run(g, "llama.compile.lab")]
        if compiled_runs[0].empty:
            compiled_runs = [model_step.one_run(g, "qwen3.compile.lab")]
        fused = model_step.one_run(g, "qwen3.compile.lab+qk")  # a run of its own, if newer
        if not fused.empty and not fused["timestamp"].isin(compiled_runs[0]["timestamp"]).all():
            compiled_runs.append(fused)
        for n, compiled_run in enumerate(r for r in compiled_runs if not r.empty):
            ct = model_step.step_table(compiled_run, {
                "train wall": ("train", "eager", "wall"),
                "prefill wall": ("prefill", "eager", "wall")})
            over = model_step.versus(ct, baseline="compile.torch")
            ct = ct.join(over.rename(columns=lambda c: c.replace(" wall", " / torch"))
                         .apply(lambda col: col.map("{:.3f}".format)))  # tenths of % apart
            md += (["Under `torch.compile` (its own run), ms a step and over `compile.torch` (the "
                    "model with torch's norms compiled): `compile.lab` has the lab's norms as "
                    "graph nodes, opaque to Inductor; `@decompose`, the lab stepping aside as it "
                    "does by default (Inductor compiles its math); `+qk`, Qwen3's q/k norms and "
                    "RoPE as one op; `shipped`, transformers' model as built, not compiled, for "
                    "scale:"] if n == 0 else
                   ["The fused prologue as a graph node (`compile.lab+qk`)"
                    + (" and decomposed (`compile.lab+qk@decompose`)"
                       if ("qwen3", "compile.lab+qk@decompose") in ct.index else "")
                    + " against torch's compiled norms, in a run of its own:"]) + [
                "", markdown_table(ct.reset_index(), 2), ""]
        for arch in archs:
            if (arch, "lab") in ratios.index:
                r = ratios.loc[(arch, "lab")]
                if findings is not None:
                    findings.model.append((gpu, arch, float(r["train wall"]),
                                           float(r["decode wall"]), float(r["decode graph"])))
                headline.append(f"{gpu_title(gpu)} {arch} in a model, lab / torch: train "
                                f"{r['train wall']:.3f}, decode {r['decode wall']:.3f} eager, "
                                f"{r['decode graph']:.3f} from a graph")
        if caveat:
            headline.append(f"  caveat: {caveat[0].lower()}{caveat[1:]}")
    return md, headline + [""]
