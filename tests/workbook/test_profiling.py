"""Profiling: the nsys CSV parsers, the summary, the nsys-summary/profile commands, and the
profile loop's ordering (on the CPU with the torch backend and recording hooks).

The CSVs in tests/workbook/data/nsys/ are a real capture on an H200 (see the README there): 50 iterations
of ``python -m rmsnorm_lab profile --op fwd --M 128 --N 4096`` on the default launch path.
"""

import contextlib
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rmsnorm_workbook.profiling import nsys, workload
from rmsnorm_workbook.profiling.nsys import (KernelTime, RangeKernel, RangeTime, normalize_range,
                                        parse_kern_sum, parse_nvtx_kern_sum, parse_nvtx_sum,
                                        summarize)

REPO = Path(__file__).resolve().parents[2]


def cli(*args, env_extra=None, timeout=120):
    """As in test_cli: the CLI in a subprocess that sees no GPU; ``env_extra`` e.g. sets PATH."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "rmsnorm_lab", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)

DATA = REPO / "tests" / "workbook" / "data" / "nsys"
NVTX_SUM = DATA / "fixture_nvtx_sum.csv"
KERN_SUM = DATA / "fixture_cuda_gpu_kern_sum.csv"
NVTX_KERN_SUM = DATA / "fixture_nvtx_kern_sum.csv"

# --- FIXTURE: the numbers in tests/workbook/data/nsys/ (the H200 capture) ---------------------------------
FIXTURE = {
    "kernel": ("kernel_cutlass_kernel_rmsnorm_labcuteforwardRMSNormForward_o"
               "bject_at__tensorptrbf16gmemalign16o4096i64div81_tensorptrbf16gmemalign16o1409601_"
               "tensorptrbf16gmemalign16o4096i64div81_None___0"),
    "iters": 50,
    # range: (instances, wall total ns, kernel instances, kernel total ns)
    "ranges": {"iter": (50, 3_371_290, 50, 86_400),
               "launch row 128x4096": (50, 903_378, 50, 86_400)},
}


# --- parsers ---------------------------------------------------------------------------------

def test_parse_nvtx_sum_reads_every_column_in_ns():
    rows = parse_nvtx_sum(NVTX_SUM)
    assert [r.range for r in rows] == ["rmsnorm_lab:iter", "rmsnorm_lab:launch row 128x4096"]
    launch = rows[1]
    assert launch == RangeTime("rmsnorm_lab:launch row 128x4096", "PushPop", 50, 903_378.0,
                               18_067.6, 14_799.0, 12_953.0, 128_545.0)


def test_parse_kern_sum():
    (k,) = parse_kern_sum(KERN_SUM)
    assert k == KernelTime(FIXTURE["kernel"], 50, 86_400.0, 1_728.0, 1_728.0, 1_696.0, 1_856.0)


def test_parse_nvtx_kern_sum():
    rows = parse_nvtx_kern_sum(NVTX_KERN_SUM)
    assert len(rows) == 2
    assert rows[1] == RangeKernel("rmsnorm_lab:launch row 128x4096", "PushPop", 1120, 1120,
                                  50, 50, 86_400.0, 1_728.0, FIXTURE["kernel"])


def test_parsers_take_other_time_units_and_a_preamble(tmp_path):
    """`--timeunit us` renames the columns; `--output -` puts status lines before the header."""
    text = NVTX_SUM.read_text().replace("(ns)", "(us)")
    p = tmp_path / "x_nvtx_sum.csv"
    p.write_text("Processing [fixture.sqlite] with [nvtx_sum.py]...\n\n" + text)
    rows = parse_nvtx_sum(p)
    assert rows[0].total_ns == 3_371_290 * 1e3 and rows[0].instances == 50


def test_parser_names_the_file_when_the_report_is_wrong():
    with pytest.raises(nsys.NsysError, match="fixture_cuda_gpu_kern_sum.csv.*NVTX Range"):
        parse_nvtx_kern_sum(KERN_SUM)


@pytest.mark.parametrize("raw, lab", [
    ("rmsnorm_lab:launch row 128x4096", "launch row 128x4096"),
    (":launch row 128x4096", "launch row 128x4096"),       # domain left out
    ("launch row 128x4096", "launch row 128x4096"),
    ("  rmsnorm_lab:iter ", "iter"),
    ("rmsnorm_lab:anything else", "anything else"),        # our domain: kept whatever the text
    ("cuBLAS:cublasCreate_v2", None),                      # another domain
    ("other:launch row 1x1", None),
    (":aten::add", None),                                  # default domain, not a lab stage
    ("Profile_Loop", None),
])
def test_normalize_range(raw, lab):
    assert normalize_range(raw) == lab


# --- summary ---------------------------------------------------------------------------------

def test_summarize_the_fixture():
    rows = summarize(parse_nvtx_sum(NVTX_SUM), parse_nvtx_kern_sum(NVTX_KERN_SUM))
    assert [r.range for r in rows] == list(FIXTURE["ranges"])  # stage order: iter, launch
    for r in rows:
        inst, wall, kinst, ktotal = FIXTURE["ranges"][r.range]
        assert (r.instances, r.wall_total_ns, r.kernel_instances, r.kernel_total_ns) == \
            (inst, wall, kinst, ktotal)
        assert r.wall_avg_ns == pytest.approx(wall / inst)
        assert r.kernel_avg_ns == pytest.approx(ktotal / inst)
        assert r.overhead_ns == pytest.approx(wall / inst - ktotal / inst)
    launch = rows[1]
    assert launch.overhead_ns == pytest.approx(16_339.56)  # 18.07 µs wall - 1.73 µs kernel
    assert launch.kernels == (FIXTURE["kernel"],) and launch.kernels_per_instance == 1.0


def test_summarize_merges_name_variants_threads_and_kernels_and_drops_other_domains():
    ranges = [RangeTime(":launch split 64x8192", "PushPop", 10, 100_000.0, 0, 0, 0, 0),
              RangeTime("rmsnorm_lab:launch split 64x8192", "PushPop", 30, 500_000.0, 0, 0, 0, 0),
              RangeTime("cuBLAS:cublasCreate_v2", "PushPop", 1, 9e6, 0, 0, 0, 0)]
    kernels = [RangeKernel("rmsnorm_lab:launch split 64x8192", "PushPop", 1, 1, 30, 30, 90_000.0,
                           3_000.0, "dx_kernel"),
               RangeKernel(":launch split 64x8192", "PushPop", 1, 2, 10, 10, 30_000.0, 3_000.0,
                           "dx_kernel"),
               RangeKernel("rmsnorm_lab:launch split 64x8192", "PushPop", 1, 1, 40, 40, 40_000.0,
                           1_000.0, "dw_reduce"),
               RangeKernel("cuBLAS:cublasCreate_v2", "PushPop", 1, 1, 1, 1, 1.0, 1.0, "x")]
    (row,) = summarize(ranges, kernels)
    assert row.range == "launch split 64x8192"
    assert (row.instances, row.wall_total_ns, row.wall_avg_ns) == (40, 600_000.0, 15_000.0)
    assert (row.kernel_instances, row.kernel_total_ns) == (80, 160_000.0)
    assert row.kernels == ("dx_kernel", "dw_reduce") and row.kernels_per_instance == 2.0
    assert row.overhead_ns == pytest.approx(15_000.0 - 4_000.0)


def test_summarize_keeps_kernel_only_ranges_without_wall():
    (row,) = summarize([], [RangeKernel(":reduce split", "PushPop", 1, 1, 5, 5, 500.0, 100.0,
                                        "k")])
    assert (row.range, row.instances, row.wall_avg_ns, row.overhead_ns) == \
        ("reduce split", 5, None, None)
    assert "-" in nsys.format_table([row]).splitlines()[-1]


# --- finding and producing the CSVs ------------------------------------------------------------

def test_find_csvs_by_report_suffix(tmp_path):
    found = nsys.find_csvs(DATA)
    assert found == {"nvtx_sum": NVTX_SUM, "cuda_gpu_kern_sum": KERN_SUM,
                     "nvtx_kern_sum": NVTX_KERN_SUM}
    assert nsys.find_csvs(DATA, "fixture") == found
    with pytest.raises(nsys.NsysError, match="no other_nvtx_sum.csv"):
        nsys.find_csvs(DATA, "other")
    for f in found.values():  # a second capture in the same folder: ambiguous without a name
        (tmp_path / f.name).write_bytes(f.read_bytes())
        (tmp_path / f.name.replace("fixture", "run2")).write_bytes(f.read_bytes())
    with pytest.raises(nsys.NsysError, match="several nvtx_sum CSVs"):
        nsys.find_csvs(tmp_path)
    assert nsys.find_csvs(tmp_path, "run2")["nvtx_kern_sum"].name == "run2_nvtx_kern_sum.csv"


FAKE_NSYS = """#!{python}
# a stand-in for `nsys stats`: checks the arguments, writes <prefix>_<report>.csv like nsys
import shutil, sys
args = sys.argv[1:]
assert args[0] == "stats", args
opt = dict(zip(args[1:-1:2], args[2:-1:2]))
assert opt["--format"] == "csv" and args[-1].endswith(".nsys-rep"), args
for report in opt["--report"].split(","):
    shutil.copy("{data}/fixture_" + report + ".csv", opt["--output"] + "_" + report + ".csv")
print("Processing", args[-1])
"""


def fake_nsys(folder: Path) -> Path:
    folder.mkdir()
    exe = folder / "nsys"
    exe.write_text(FAKE_NSYS.format(python=sys.executable, data=DATA))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return folder


def test_nsys_summary_runs_nsys_stats_and_prints_the_table(tmp_path):
    bin_dir = fake_nsys(tmp_path / "bin")
    rep = tmp_path / "cap.nsys-rep"
    rep.write_bytes(b"")
    env_path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    p = cli("nsys-summary", str(rep), env_extra={"PATH": env_path})
    assert p.returncode == 0, p.stderr
    assert ("nsys stats --report nvtx_sum,cuda_gpu_kern_sum,nvtx_kern_sum --format csv --output "
            f"{tmp_path / 'cap'}") in p.stdout
    assert sorted(f.name for f in tmp_path.glob("cap_*.csv")) == [
        "cap_cuda_gpu_kern_sum.csv", "cap_nvtx_kern_sum.csv", "cap_nvtx_sum.csv"]
    assert_fixture_table(p.stdout)


def assert_fixture_table(out: str):
    lines = {ln.split("  ")[0].strip(): ln.split() for ln in out.splitlines() if "  " in ln}
    # range, inst, wall total, wall avg, kern/inst, kern total, kern avg, wall-kern (µs)
    assert lines["launch row 128x4096"][-7:] == ["50", "903.38", "18.07", "1.00", "86.40",
                                                 "1.73", "16.34"]
    assert lines["iter"][-7:] == ["50", "3,371.29", "67.43", "1.00", "86.40", "1.73", "65.70"]
    assert "all kernels in the capture: 50 launches, 86.40 µs = 1.73 µs per iter" in out
    assert FIXTURE["kernel"][:60] in out  # the table shortens long kernel names


def test_nsys_summary_from_a_csv_dir():
    p = cli("nsys-summary", "--csv-dir", str(DATA))
    assert p.returncode == 0, p.stderr
    assert_fixture_table(p.stdout)


def test_nsys_summary_without_nsys_exits_2_saying_how_to_get_it(tmp_path):
    rep = tmp_path / "cap.nsys-rep"
    rep.write_bytes(b"")
    p = cli("nsys-summary", str(rep), env_extra={"PATH": str(tmp_path)})
    assert p.returncode == 2
    assert "nsys" in p.stderr and "not on PATH" in p.stderr and "--csv-dir" in p.stderr
    assert "developer.nvidia.com/nsight-systems" in p.stderr


def test_nsys_summary_on_a_folder_without_csvs_exits_1(tmp_path):
    p = cli("nsys-summary", "--csv-dir", str(tmp_path))
    assert p.returncode == 1 and "nvtx_sum" in p.stderr


# --- profile ---------------------------------------------------------------------------------

NSYS_LINE = ("nsys profile -t cuda,nvtx --cuda-graph-trace=node "
             "--capture-range=cudaProfilerApi --capture-range-end=stop")


def test_profile_without_cuda_exits_2_and_prints_the_nsys_line():
    p = cli("profile", "--op", "full", "--backend", "triton", "--M", "64")
    assert p.returncode == 2
    assert "needs a CUDA GPU" in p.stderr and NSYS_LINE in p.stderr
    assert "profile --op full --backend triton --M 64 --N 4096" in p.stderr


def test_profile_help_shows_the_nsys_lines():
    p = cli("profile", "--help")
    assert p.returncode == 0
    assert NSYS_LINE in p.stdout and "python3 -m rmsnorm_lab profile --op fwd" in p.stdout
    assert "nsys-summary rmsnorm-fwd-cute-128x4096-bf16.nsys-rep" in p.stdout


class Recorder:
    """Hooks that log the order of events instead of talking to CUDA and NVTX."""

    def __init__(self):
        self.log = []

    def hooks(self):
        @contextlib.contextmanager
        def rng(name):
            self.log.append(name)
            yield

        return workload.Hooks(start=lambda: self.log.append("START"),
                               stop=lambda: self.log.append("STOP"),
                               sync=lambda: None, iter_range=lambda: rng("iter"),
                               warmup_range=lambda: rng("warmup"))


def spy_rms_norm(calls, grads):
    from rmsnorm_lab.api import rms_norm
    from rmsnorm_lab.settings import settings
    from rmsnorm_workbook.bench import instruments

    def f(x, w, eps, backend, casting_mode):
        calls.append((settings.nvtx, instruments.state().launch_path, backend,
                      x.requires_grad, casting_mode))
        y = rms_norm(x, w, eps, backend=backend, casting_mode=casting_mode)
        if x.requires_grad:
            y.register_hook(lambda g: grads.append(g.shape))
        return y
    return f


@pytest.mark.parametrize("op", ["fwd", "full"])
def test_profile_loop_warms_up_outside_the_capture(op):
    rec, calls, grads = Recorder(), [], []
    cfg = workload.ProfileConfig(op=op, backend="torch", launch_path="cached", M=8, N=64,
                                  dtype="fp32", iters=5, warmup=3)
    result = workload.run_profile(cfg, device="cpu", hooks=rec.hooks(),
                                   rms_norm=spy_rms_norm(calls, grads))
    assert rec.log == ["warmup"] * 3 + ["START"] + ["iter"] * 5 + ["STOP"]
    # NVTX on, toggles applied, the profiled configuration's rounding (Llama's) named
    assert calls == [(True, "cached", "torch", op == "full", "llama")] * 8
    assert len(grads) == (8 if op == "full" else 0)
    assert result.iters == 5 and result.backend == "torch" and result.us_per_iter > 0
    from rmsnorm_lab.settings import settings
    assert settings.nvtx is False  # restored


def test_profile_include_compile_starts_before_the_warmup():
    rec = Recorder()
    cfg = workload.ProfileConfig(backend="torch", M=4, N=32, dtype="fp32", iters=2, warmup=1,
                                  include_compile=True)
    workload.run_profile(cfg, device="cpu", hooks=rec.hooks())
    assert rec.log == ["START", "warmup", "iter", "iter", "STOP"]


def test_profile_full_without_autograd_fails_clearly():
    rec = Recorder()

    def no_autograd(x, w, eps, backend, casting_mode):
        with torch.no_grad():
            return x * 2

    cfg = workload.ProfileConfig(op="full", backend="triton", M=4, N=32, dtype="fp32", iters=2,
                                  warmup=2)
    with pytest.raises(workload.ProfileError, match="backend='triton'.*no grad_fn.*--op fwd"):
        workload.run_profile(cfg, device="cpu", hooks=rec.hooks(), rms_norm=no_autograd)
    assert "START" not in rec.log and "STOP" not in rec.log


def test_profile_refuses_to_compile_inside_the_capture_by_accident():
    cfg = workload.ProfileConfig(backend="torch", warmup=0)
    with pytest.raises(workload.ProfileError, match="--include-compile"):
        workload.run_profile(cfg, device="cpu", hooks=Recorder().hooks())


class GraphRecorder(Recorder):
    """Recorder hooks that also 'capture': the body runs once at capture time (as a CUDA graph
    capture runs the Python code once) and each replay is logged."""

    def hooks(self):
        h = super().hooks()

        @contextlib.contextmanager
        def replay_range():
            self.log.append("replay-range")
            yield

        def capture(body, warm):
            self.log.append("WARM")
            warm()
            self.log.append("CAPTURE")
            body()
            return lambda: self.log.append("REPLAY")

        h.capture, h.replay_range = capture, replay_range
        return h


@pytest.mark.parametrize("op", ["fwd", "full"])
def test_profile_graph_captures_after_the_warmup_and_replays_inside_the_capture(op):
    rec, calls, grads = GraphRecorder(), [], []
    cfg = workload.ProfileConfig(op=op, backend="torch", M=8, N=64, dtype="fp32", iters=4,
                                  warmup=2, graph=True)
    result = workload.run_profile(cfg, device="cpu", hooks=rec.hooks(),
                                   rms_norm=spy_rms_norm(calls, grads))
    assert rec.log == (["warmup"] * 2 + ["WARM", "CAPTURE"] + ["iter"] * 4
                       + ["REPLAY", "START", "replay-range", "REPLAY", "STOP"])
    assert len(calls) == 2 + 1 + 4  # warm-up, the side stream's warm-up, the captured loop
    assert result.graph and result.iters == 4


def test_profile_graph_refuses_what_cannot_be_captured():
    for bad, match in ((dict(include_compile=True), "--include-compile"),
                       (dict(warmup=0, include_compile=False), "--warmup")):
        cfg = workload.ProfileConfig(backend="torch", graph=True, **bad)
        with pytest.raises(workload.ProfileError, match=match):
            workload.run_profile(cfg, device="cpu", hooks=GraphRecorder().hooks())
    cfg = workload.ProfileConfig(backend="torch", M=4, N=32, dtype="fp32", iters=2, warmup=1,
                                  graph=True)
    with pytest.raises(workload.ProfileError, match="cannot capture"):
        workload.run_profile(cfg, device="cpu", hooks=Recorder().hooks())


def test_profile_graph_names_its_report_and_prints_its_nsys_line():
    cfg = workload.ProfileConfig(op="fwd", M=128, N=4096, iters=50, graph=True)
    assert cfg.report_name("cute").endswith("-graph")
    assert workload.nsys_profile_line(cfg, "cute").endswith("--warmup 20 --graph")
    p = cli("profile", "--graph", "--M", "64")
    assert p.returncode == 2 and "--M 64 --N 4096" in p.stderr and "--graph" in p.stderr
    assert "--graph" in cli("profile", "--help").stdout
