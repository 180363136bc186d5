"""The command line and the CPU-testable parts of the benchmark runner.

The CLI runs in a subprocess with ``CUDA_VISIBLE_DEVICES=""`` so that it behaves as on a machine
without a GPU wherever the tests run. Results are synthetic and live under tmp_path only.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rmsnorm_lab import reference
from rmsnorm_workbook import results
from rmsnorm_workbook.bench import peers, runner, timing
from test_results import SYNTHETIC_GPU, row, synthetic_rows

REPO = Path(__file__).resolve().parents[2]


def cli(*args, timeout=120, module="rmsnorm_lab", env=None):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           **(env or {})}
    env.pop("MPLBACKEND", None)
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(p, *, status=2, given=(), says=()):
    """A user's mistake: exit ``status``, one line on stderr (``error: ...``), no traceback, the
    words ``says`` in it, and every absolute path it names either given on the command line or
    present on this machine (never one of the lab's own machines, e.g. /tmp/gpu/...)."""
    assert p.returncode == status, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("error: "), p.stderr
    assert "Traceback" not in p.stderr + p.stdout and "/tmp/gpu" not in p.stderr + p.stdout
    for word in says:
        assert word in lines[0], lines[0]
    for path in re.findall(r"(?<![\w.])(/[\w.@+-]+(?:/[\w.@+-]+)*)", lines[0]):
        assert any(path.startswith(str(g)) for g in given) or Path(path).exists(), \
            f"{path!r} in {lines[0]!r} is neither given nor present here"
    return lines[0]


# --- CLI -----------------------------------------------------------------------------------

def test_bench_without_cuda_exits_2_with_a_message(tmp_path):
    p = cli("bench", "--op", "fwd", "--out", str(tmp_path))
    assert p.returncode == 2, p.stderr
    assert "needs a CUDA GPU" in p.stderr and "report --no-bench" in p.stderr
    assert not any(tmp_path.iterdir())  # nothing written


def test_report_renders_markdown_and_figures(tmp_path):
    res, out = tmp_path / "results", tmp_path / "report"
    results.write(synthetic_rows(), res / SYNTHETIC_GPU / "fwd.csv")
    p = cli("report", "--no-bench", "--tables", "--results", str(res), "--out", str(out))
    assert p.returncode == 0, p.stderr
    # progress on stderr, one line per group of figures, numbered
    progress = [ln for ln in p.stderr.splitlines() if ln.startswith("report: [")]
    assert progress == [
        "report: [1/5] testgpu fwd: tables, bandwidth and eager-vs-graph figures",
        "report: [2/5] testgpu: the fused ops' tables; backward and host figures where "
        "recorded (notebooks 02 and 03)",
        "report: [3/5] how the kernels work: thread layout and backward data flow "
        "(notebooks 01 and 02)",
        "report: [4/5] across GPUs: roofline, crossover, reported vs modelled (notebook 04)",
        "report: [5/5] in a model: the model step against torch's norm (notebook 05)"]
    assert f"reading the results in {res}" in p.stderr
    # ... and on stdout (--tables), every file it wrote, report.md first, then the summary
    listed = p.stdout.split(f"files to {out} in ")[1].split("\n\n")[0].splitlines()[1:]
    assert listed[0] == f"  {out / 'report.md'}"
    assert p.stdout.rstrip().endswith("every file written: report --tables")
    assert sorted(listed) == sorted(f"  {f}" for f in out.iterdir())
    md = (out / "report.md").read_text()
    pngs = sorted(f.name for f in out.glob(f"{SYNTHETIC_GPU}-*.png"))
    assert pngs == [f"{SYNTHETIC_GPU}-fwd-{name}.png"
                    for name in ("bandwidth-vs-M", "bandwidth-vs-N", "eager-vs-graph")]
    # the pictures that need no measurements come with every report
    explainers = ["backward-data-flow-16384x4096-bf16.png", "layout-row-and-warp-4096-bf16.png"]
    assert all((out / name).exists() for name in explainers)
    pngs += explainers
    for name in pngs:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"![{name}]({name})" in md
    assert f"## {SYNTHETIC_GPU.upper()}" in md and "commit: synthetic" in md
    assert "| M | N | cute.row | triton.row | torch.native |" in md
    assert "| 16384 | 4096 | 1168 | 1268 | 1368 |" in md  # GB/s, rounded
    assert "| 16384 | 4096 | 29.2 | 31.7 | 34.2 |" in md  # % of copy (4000 GB/s)
    # host µs without a host benchmark run: the sweep's own rows, each with its run's commit;
    # of the lab's only its default (cute.auto, absent here), not the pinned variants
    assert "| torch.native | 128 | 4096 | 14.0 | 15.0 | 16.0 | synthet |" in md
    assert "| cute.row | 128 | 4096 |" not in md
    assert "fwd, host µs per call, from the sweeps' own host rows" in md
    # each % of copy row against its own run's copy, the run named
    assert "% of copy (each row against the copy measured in its own run: synthet 4000 GB/s)" in md
    # the results folder is named as given when outside the repository
    assert f"results read from `{res}`" in md
    # the headline table is printed too
    assert "TESTGPU fwd (GB/s, graph, median)" in p.stdout and "1268" in p.stdout


def test_report_prints_a_short_summary_by_default(tmp_path):
    """What was read, the headline row, where report.md is: a few lines, none over 100
    characters; the tables only with --tables."""
    res, out = tmp_path / "results", tmp_path / "report"
    results.write(synthetic_rows(), res / SYNTHETIC_GPU / "fwd.csv")
    p = cli("report", "--no-bench", "--results", str(res), "--out", str(out))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) <= 8, p.stdout
    assert all(len(ln) <= 100 for ln in lines if str(out) not in ln), p.stdout
    assert lines[0] == "read 64 measurements from 1 file; TESTGPU: 1 run, 2000-01-01"
    # the headline row: the lab's first kernel at 16384x4096 against the fastest peer there
    row = next(ln for ln in lines if ln.lstrip().startswith("TESTGPU fwd"))
    assert row.split() == ["TESTGPU", "fwd", "cute.row", "1168", "GB/s", "(29%", "of", "copy)",
                           "torch.native", "1368", "GB/s", "fastest", "in", "0/5", "shapes"]
    assert "wrote report.md and 5 figures in " in p.stdout and f"{out / 'report.md'}" in p.stdout
    assert "(GB/s, graph, median)" not in p.stdout and "  " + str(out / "report.md") not in lines
    # report.md opens with the same summary, above the sections
    md = (out / "report.md").read_text()
    assert md.index("## Summary") < md.index("## How it was measured") < md.index("## TESTGPU")
    assert ("| TESTGPU | fwd | 16384x4096 | `cute.row` | 1168 GB/s (29% of copy) | torch.native "
            "1368 GB/s | fastest in 0 of 5 shapes |") in md
    assert "runs: TESTGPU: 1 run, 2000-01-01." in md


def test_report_without_results_is_an_error_and_writes_nothing(tmp_path):
    out, empty = tmp_path / "report", tmp_path / "empty"
    empty.mkdir()
    p = cli("report", "--no-bench", "--results", str(empty), "--out", str(out))
    assert_one_line_error(p, given=[empty], says=["--results", str(empty), "no results"])
    assert not out.exists()
    # files that hold no measurement (a header alone) are no results either
    results.write([], empty / SYNTHETIC_GPU / "fwd.csv")
    p = cli("report", "--no-bench", "--results", str(empty), "--out", str(out))
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.splitlines()[-1].startswith(f"error: --results {empty}: no results")
    assert p.stdout == ""


def test_report_on_a_cpu_renders_without_no_bench(tmp_path):
    res, out = tmp_path / "results", tmp_path / "report"
    results.write(synthetic_rows(), res / SYNTHETIC_GPU / "fwd.csv")
    p = cli("report", "--results", str(res), "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert "no CUDA GPU here" in p.stdout
    assert (out / "report.md").exists()


def test_report_on_malformed_results_exits_1_naming_the_file(tmp_path):
    bad = tmp_path / "results" / SYNTHETIC_GPU / "fwd.csv"
    results.write([row()], bad)
    bad.write_text(bad.read_text().replace(",fwd,", ",forward,"))
    p = cli("report", "--no-bench", "--results", str(tmp_path / "results"),
            "--out", str(tmp_path / "report"))
    assert p.returncode == 1
    assert "fwd.csv:2: column 'op'" in p.stderr


def test_an_unknown_option_is_reported_with_its_command_usage():
    p = cli("report", "--bogus")
    assert p.returncode == 2
    assert "usage: python -m rmsnorm_lab report" in p.stderr and "--bogus" in p.stderr


def test_an_unknown_option_before_any_command_is_named():
    p = cli("--bogus")
    assert p.returncode == 2 and "unrecognized arguments: --bogus" in p.stderr


def test_unknown_op_is_refused_by_argparse():
    p = cli("bench", "--op", "sideways")
    assert p.returncode == 2 and "invalid choice" in p.stderr


def test_report_on_the_recorded_results_without_a_gpu(tmp_path):
    """The README's main command, on the results/ of this repository."""
    out = tmp_path / "report"
    (out).mkdir()
    (out / "old-notes.txt").write_text("not written by this run\n")
    p = cli("report", "--tables", "--out", str(out), timeout=300)
    assert p.returncode == 0, p.stderr
    assert "no CUDA GPU here: rendering the recorded results" in p.stdout
    assert "H200 fwd (GB/s, graph, median)" in p.stdout
    md = (out / "report.md").read_text()
    assert "## H200" in md and "## In a model (notebook 05)" in md
    assert "H200 llama in a model, lab / torch: train" in p.stdout
    pngs = {f.name for f in out.glob("*.png")}
    assert {"h200-fwd-bandwidth-vs-M.png", "h200-bwd-eager-vs-graph.png",
            "gpus-roofline.png", "h200-model-vs-torch.png"} <= pngs
    assert all(f"![{name}]({name})" in md for name in pngs)
    assert f"wrote {len(pngs) + 1} files to {out}" in p.stdout  # not old-notes.txt
    assert "old-notes.txt" not in p.stdout
    # the summary, last: the headline rows, the model step, the verdict, at most 100 wide
    summary = p.stdout.split("\n\n")[-1].splitlines()
    assert summary[0].startswith("read ") and len(summary) <= 12, summary
    assert all(len(ln) <= 100 for ln in summary if str(out) not in ln), summary
    rows = [ln.split()[:3] for ln in summary if ln.startswith("  H200 ")]
    assert rows[:3] == [["H200", "fwd", "cute.auto"], ["H200", "bwd", "cute.auto"],
                        ["H200", "full", "cute.auto"]], summary
    assert "qwen3" in next(ln for ln in summary if ln.startswith("  H200  llama "))
    assert any(ln.startswith("across GPUs (modelled): ") for ln in summary)
    assert f"wrote report.md and {len(pngs)} figures in " in p.stdout
    top = md.split("## How it was measured")[0]
    assert "## Summary" in top and "| H200 | fwd | 16384x4096 | `cute.auto` |" in top
    assert "| H200 | llama |" in top and "Across GPUs (modelled" in top
    assert "report: [1/" in p.stderr and "Traceback" not in p.stderr
    # inside the repository the results folder is named relative to it: report.md travels
    assert "results read from `results`" in md and str(REPO) not in md
    # the backward's host table (no host benchmark run times it) keeps the lab's default rows
    bwd_host = md.split("bwd, host µs per call")[1].split("![")[0]
    assert "| cute.auto | 128 | 4096 |" in bwd_host and "| cute.auto+add | 128 | 4096 |" in bwd_host
    assert "| cute.fused | 128 | 4096 |" not in bwd_host
    # the host benchmark's tables say how it times and why the sweeps' host rows differ
    fwd_host = md.split("fwd, host µs per call")[1].split("|")[0]
    assert "interleaved rounds" in fwd_host and "settings.override" in fwd_host
    # the cross-GPU verdicts come with the check on the calibration GPU itself
    caveat = "On the H200 itself the model's call ratio for the same pair is"
    assert caveat in md and "  caveat: on the H200 itself" in p.stdout
    # captions under the figures that need one, and the eager decode ratios' caveat
    for fig, says in (("h200-bwd-eager-vs-graph.png", "Eager (`do_bench`) at small M"),
                      ("h200-host-cache-cap.png", "Left panel: peak memory counted from"),
                      ("h200-bwd-fused-vs-split.png", "Each bar: the split backward's"),
                      ("h200-nsys-timeline.png", "Three iterations of"),
                      ("layout-row-and-warp-4096-bf16.png", "Which thread loads"),
                      ("backward-data-flow-16384x4096-bf16.png", "The split and the fused"),
                      ("gpus-roofline.png", "Attainable FP32 TFLOP/s"),
                      ("gpus-crossover.png", "Per GPU, the forward at 4096 columns")):
        assert md.split(f"![{fig}]({fig})")[1].lstrip().startswith(says), fig
    assert "Right panel: the same step's eager time per cap" in md
    # a sweep's caption names the ceiling line where the figure draws one (full has none)
    caption = lambda fig: md.split(f"![{fig}]({fig})")[1].lstrip().split("\n")[0]  # noqa: E731
    assert "the dotted line is the 1 GiB `copy`" in caption("h200-fwd-bandwidth-vs-M.png")
    assert "the dotted line is the 1 GiB `copy2r1w`" in caption("h200-bwd-bandwidth-vs-N.png")
    assert "dotted" not in caption("h200-full-bandwidth-vs-N.png")
    # every name in the tables is in the list of names, the summary names its ceilings so
    names = md.split("### Names in the tables")[1].split("\n## ")[0]
    assert "| `cute.auto` |" in names and "| `copy2r1w` |" in names
    assert "| H200 | bwd | 16384x4096 | `cute.auto` |" in top and "% of copy2r1w)" in top
    assert "Eager decode (`decode wall`) is paced by the host" in md
    assert "  caveat: eager decode" in p.stdout
    cross = md.split("Crossover M (")[1].split("Reported device times")[0]
    assert "| cute.auto@tvm_ffi |" in cross and "| cute.row |" not in cross


# --- what the command line says when it is given something it cannot use --------------------

def test_report_results_that_do_not_exist(tmp_path):
    missing = tmp_path / "nonexistent"
    p = cli("report", "--results", str(missing), "--out", str(tmp_path / "report"))
    assert_one_line_error(p, given=[missing], says=["--results", str(missing), "no such folder"])
    assert not (tmp_path / "report").exists()  # nothing done before the check


def test_report_results_that_is_a_file(tmp_path):
    f = tmp_path / "results.csv"
    f.write_text("x\n")
    p = cli("report", "--no-bench", "--results", str(f), "--out", str(tmp_path / "report"))
    assert_one_line_error(p, given=[f], says=["--results", "not a folder"])


@pytest.mark.parametrize("where", ["under a file", "in /proc", "a file"])
def test_report_out_that_cannot_be_written(tmp_path, where):
    blocker = tmp_path / "a-file"
    blocker.write_text("x\n")
    out = {"under a file": blocker / "report", "in /proc": Path("/proc/rmsnorm-lab-report"),
           "a file": blocker}[where]
    p = cli("report", "--no-bench", "--out", str(out))
    line = assert_one_line_error(p, given=[out], says=["--out", str(out)])
    assert any(why in line for why in ("cannot create that folder", "not a folder"))


def test_report_out_in_a_read_only_folder(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if os.access(ro, os.W_OK):  # root writes anyway
            pytest.skip("this user can write into a read-only folder (root)")
        p = cli("report", "--no-bench", "--out", str(ro / "report"))
        assert_one_line_error(p, given=[ro], says=["cannot write there", "Permission denied"])
    finally:
        ro.chmod(0o755)


def test_a_write_that_fails_midway_is_one_line(tmp_path, monkeypatch, capsys):
    from rmsnorm_workbook import __main__ as cli_main
    from rmsnorm_workbook.cli import report as cli_report

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device", str(tmp_path / "report" / "x.png"))
    monkeypatch.setattr(cli_report, "write_report", full)
    res = tmp_path / "results"
    results.write(synthetic_rows(), res / SYNTHETIC_GPU / "fwd.csv")
    status = cli_main.main(["report", "--no-bench", "--results", str(res),
                            "--out", str(tmp_path / "report")])
    err = capsys.readouterr().err
    assert status == 2
    assert err.strip().splitlines()[-1] == (f"error: could not write {tmp_path}/report/x.png "
                                            "(No space left on device)")


def test_nsys_summary_on_a_missing_report_says_so_not_that_nsys_is_missing(tmp_path):
    missing = tmp_path / "profile-fwd.nsys-rep"
    p = cli("nsys-summary", str(missing))  # no nsys on PATH here either
    line = assert_one_line_error(p, given=[missing], says=[str(missing), "no such file"])
    assert "PATH" not in line


@pytest.mark.parametrize("name, content, says", [
    ("notes.txt", "not a report\n", "is not an Nsight Systems report"),
    ("fwd_nvtx_sum.csv", "Time (%),Total Time (ns)\n", "use --csv-dir"),
    ("fake.nsys-rep", "Time (%),Total Time (ns)\n1,2\n", "this one is a text file"),
    ("export.sqlite", "plain text\n", "is not an SQLite file"),
])
def test_nsys_summary_on_a_file_that_is_not_a_report(tmp_path, name, content, says):
    f = tmp_path / name
    f.write_text(content)
    p = cli("nsys-summary", str(f))
    assert_one_line_error(p, given=[f], says=[str(f), says])


def test_nsys_summary_on_a_folder_or_a_missing_csv_dir(tmp_path):
    assert_one_line_error(cli("nsys-summary", str(tmp_path)), given=[tmp_path],
                          says=["a folder", "--csv-dir"])
    missing = tmp_path / "csvs"
    assert_one_line_error(cli("nsys-summary", "--csv-dir", str(missing)), given=[missing],
                          says=["--csv-dir", "no such folder"])
    assert_one_line_error(cli("nsys-summary"), says=["name a report"])


def test_nsys_stats_failing_is_one_line_naming_the_reason(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    nsys = bin_dir / "nsys"
    nsys.write_text("#!/bin/sh\necho 'Processing...'\n"
                    "echo 'ERROR: the file is not a valid report' >&2\nexit 1\n")
    nsys.chmod(0o755)
    rep = tmp_path / "broken.nsys-rep"
    rep.write_bytes(b"\x00\x01binary")
    env_path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    p = subprocess.run([sys.executable, "-m", "rmsnorm_lab", "nsys-summary", str(rep)],
                       cwd=REPO, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "PATH": env_path})
    assert_one_line_error(p, status=1, given=[rep],
                          says=["nsys stats exited with 1", "not a valid report"])


# --- runner logic on the CPU ---------------------------------------------------------------

def test_fwd_sweep_is_the_design():
    assert runner.FWD_SWEEP == [(1024, 4096), (4096, 4096), (8192, 4096), (16384, 4096),
                                (32768, 4096), (65536, 4096), (16384, 1024), (16384, 2048),
                                (16384, 8192), (16384, 16384), (65536, 128), (262144, 128),
                                (4096, 32768), (16384, 32768)]
    assert runner.BWD_SWEEP == runner.FWD_SWEEP[:-2]  # the wide rows: the forward's alone
    assert set(runner.OPS) == {"fwd", "bwd", "full", "fwd-add", "bwd-add", "fwd-fp8",
                               "fwd-fp8-static", "fwd-qk-rope", "bwd-qk-rope"}


def test_a_run_of_chosen_shapes_must_be_tagged():
    with pytest.raises(ValueError, match="needs a tag"):
        runner.bench("fwd", shapes=[(65536, 128)])


def cpu_inputs(M=64, N=256):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(M, N, generator=g).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(N, generator=g)).to(torch.bfloat16)
    return x, w


def run_check(impl):
    inputs = cpu_inputs()
    return runner.check(runner.FWD, impl, inputs, runner.FWD.reference(inputs))


def refuse(x, w):
    raise NotImplementedError("N too small for this variant")


def crash(x, w):
    raise RuntimeError("illegal instruction")


@pytest.mark.parametrize("impl, status, why", [
    (lambda x, w: reference.rms_norm(x, w, runner.EPS), "ok", ""),
    (lambda x, w: reference.rms_norm(x, w, runner.EPS, casting_mode="gemma"), "ok", ""),
    (lambda x, w: x.clone(), "fail", "relative error"),
    (lambda x, w: torch.full_like(x, float("nan")), "fail", "nan"),
    (lambda x, w: reference.rms_norm(x, w, runner.EPS).float(), "fail", "torch.float32"),
    (refuse, "skip", "NotImplementedError: N too small"),
    (crash, "fail", "RuntimeError: illegal instruction"),
])
def test_check_tells_right_from_wrong(impl, status, why):
    got, reason = run_check(impl)
    assert got == status
    assert why in reason


def test_torch_native_peer_matches_the_reference():
    available = peers.forward_peers(runner.EPS)
    assert "torch.native" in available
    assert run_check(available["torch.native"]) == ("ok", "")
    assert set(available) <= set(peers.FORWARD_PEERS)


def test_fwd_bytes_moved():
    x, w = cpu_inputs(64, 256)
    assert runner.FWD.bytes_moved((x, w)) == 2 * 64 * 256 * 2 + 256 * 2


def test_bandwidth_swaps_the_quantile_ends():
    bw = runner.bandwidth(10_000, timing.Quantiles(1.0, 2.0, 4.0))  # 10 kB in 1..4 µs
    assert bw == pytest.approx((2.5, 5.0, 10.0))


def test_rows_from_the_runner_are_valid_results(tmp_path):
    prov = {c: row()[c] for c in results.PROVENANCE_COLUMNS}
    q = timing.Quantiles(1.0, 2.0, 3.0)
    rows = [runner.make_row(prov, "fwd", "cute.row", "graph", 8, 16, torch.bfloat16, "time", q),
            runner.make_row(prov, "fwd", "cute.row", "graph", 8, 16, torch.bfloat16, "bandwidth",
                            runner.bandwidth(1000, q)),
            runner.make_row(prov, "fwd", "cute.row", "eager", 8, 16, torch.bfloat16, "peak_mem",
                            q)]
    df = results.load(results.write(rows, tmp_path / "fwd.csv"))
    assert df["unit"].tolist() == ["us", "GBps", "MiB"] and set(df["dtype"]) == {"bf16"}


def test_output_path_and_tag(tmp_path):
    assert runner.output_path(tmp_path, "h200", "fwd", None) == tmp_path / "h200" / "fwd.csv"
    assert runner.output_path(tmp_path, "h200", "fwd", "quick") == \
        tmp_path / "h200" / "fwd-quick.csv"
    with pytest.raises(ValueError, match="tag"):
        runner.output_path(tmp_path, "h200", "fwd", "../escape")


def test_rotation_exceeds_twice_the_l2():
    l2 = 60 * 2**20
    assert timing.rotation_count(8 * 2**20, l2) == 15  # 15 x 8 MiB >= 120 MiB
    assert timing.rotation_count(512 * 2**20, l2) == 1
    seen = []
    step = timing.rotating(seen.append, ["a", "b", "c"])
    for _ in range(7):
        step()
    assert seen == ["a", "b", "c", "a", "b", "c", "a"]


def test_quantiles_are_ordered():
    q = timing.quantiles([5.0, 1.0, 3.0, 2.0, 4.0])
    assert q.p20 <= q.p50 <= q.p80 and q.p50 == 3.0


def test_lab_names_must_carry_a_lab_prefix(monkeypatch):
    import types

    fake = types.ModuleType("rmsnorm_workbook.bench.impls")
    fake.lab_impls = lambda op: {"cute.row": None, "fastest": None}
    monkeypatch.setitem(sys.modules, "rmsnorm_workbook.bench.impls", fake)
    with pytest.raises(ValueError, match="fastest"):
        runner.lab_implementations("fwd")
    fake.lab_impls = lambda op: {"cute.row": len, "triton.row": len}
    assert runner.lab_implementations("fwd") == ({"cute.row": len, "triton.row": len}, None)


def test_agreement_without_cuda_exits_2_with_a_message(capsys):
    from rmsnorm_workbook.bench import agreement
    assert agreement.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out


def test_shapes_parse_and_refuse_what_is_not_m_by_n():
    import argparse as ap

    from rmsnorm_workbook.cli.bench import parse_shapes
    assert parse_shapes("65536x128, 262144X128") == [(65536, 128), (262144, 128)]
    for bad in ("65536", "64x", "ax4"):
        with pytest.raises(ap.ArgumentTypeError, match="not MxN"):
            parse_shapes(bad)
    with pytest.raises(ap.ArgumentTypeError, match="must be positive"):
        parse_shapes("0x128")


@pytest.mark.parametrize("argv", [["bench", "--op", "fwd", "--shapes", "64x128"],
                                  ["bench", "--op", "fwd", "--only-compiled", "--tag", "t"],
                                  ["bench", "--op", "bwd", "--compile"]])
def test_bench_usage_errors_come_before_the_gpu_check(argv, capsys):
    from rmsnorm_workbook.__main__ import main
    from rmsnorm_workbook.cli.common import EXIT_USAGE
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert ("needs" in err or "apply to" in err) and "GPU" not in err
