"""The command line and the CPU-testable parts of the benchmark runner.

The CLI runs in a subprocess with ``CUDA_VISIBLE_DEVICES=""`` so that it behaves as on a machine
without a GPU wherever the tests run. Results are synthetic and live under tmp_path only.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rmsnorm_lab import reference, results
from rmsnorm_lab.bench import peers, runner, timing
from test_results import SYNTHETIC_GPU, row, synthetic_rows

REPO = Path(__file__).resolve().parent.parent


def cli(*args, timeout=120):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("MPLBACKEND", None)
    return subprocess.run([sys.executable, "-m", "rmsnorm_lab", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


# --- CLI -----------------------------------------------------------------------------------

def test_bench_without_cuda_exits_2_with_a_message(tmp_path):
    p = cli("bench", "--op", "fwd", "--out", str(tmp_path))
    assert p.returncode == 2, p.stderr
    assert "needs a CUDA GPU" in p.stderr and "report --no-bench" in p.stderr
    assert not any(tmp_path.iterdir())  # nothing written


def test_report_renders_markdown_and_figures(tmp_path):
    res, out = tmp_path / "results", tmp_path / "report"
    results.write(synthetic_rows(), res / SYNTHETIC_GPU / "fwd.csv")
    p = cli("report", "--no-bench", "--results", str(res), "--out", str(out))
    assert p.returncode == 0, p.stderr
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
    assert f"## {SYNTHETIC_GPU}" in md and "commit: synthetic" in md
    assert "| M | N | cute.row | triton.row | torch.native |" in md
    assert "| 16384 | 4096 | 1168 | 1268 | 1368 |" in md  # GB/s, rounded
    assert "| 16384 | 4096 | 29.2 | 31.7 | 34.2 |" in md  # % of copy (4000 GB/s)
    assert "| cute.row | 128 | 4096 | 12.0 | 13.0 | 14.0 |" in md  # host µs
    # the headline table is printed too
    assert "testgpu fwd (GB/s, graph, median)" in p.stdout and "1268" in p.stdout


def test_report_without_results_says_so_and_renders_nothing_else(tmp_path):
    out = tmp_path / "report"
    p = cli("report", "--no-bench", "--results", str(tmp_path / "none"), "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert "no results" in p.stdout
    assert sorted(f.name for f in out.iterdir()) == ["report.md"]
    assert "There are no results" in (out / "report.md").read_text()


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


def test_unknown_op_is_refused_by_argparse():
    p = cli("bench", "--op", "sideways")
    assert p.returncode == 2 and "invalid choice" in p.stderr


# --- runner logic on the CPU ---------------------------------------------------------------

def test_fwd_sweep_is_the_design():
    assert runner.FWD_SWEEP == [(1024, 4096), (4096, 4096), (8192, 4096), (16384, 4096),
                                (32768, 4096), (65536, 4096), (16384, 1024), (16384, 2048),
                                (16384, 8192), (16384, 16384)]
    assert set(runner.OPS) == {"fwd", "bwd", "full"}


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

    fake = types.ModuleType("rmsnorm_lab.bench.impls")
    fake.lab_impls = lambda op: {"cute.row": None, "fastest": None}
    monkeypatch.setitem(sys.modules, "rmsnorm_lab.bench.impls", fake)
    with pytest.raises(ValueError, match="fastest"):
        runner.lab_implementations("fwd")
    fake.lab_impls = lambda op: {"cute.row": len, "triton.row": len}
    assert runner.lab_implementations("fwd") == ({"cute.row": len, "triton.row": len}, None)


def test_agreement_without_cuda_exits_2_with_a_message(capsys):
    from rmsnorm_lab.bench import agreement
    assert agreement.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().out
