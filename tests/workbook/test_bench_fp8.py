"""The fp8 output's benchmark ops (``fwd-fp8``, ``fwd-fp8-static``) on the CPU, with the CUDA
timers replaced by stand-ins (the ``cpu_sweep`` fixture of test_bench_ops.py)."""

import pytest
import torch

from rmsnorm_lab import reference
from rmsnorm_workbook.bench import fp8, impls, runner
from rmsnorm_workbook.legend import CEILINGS
from test_bench_ops import EPS, cpu_sweep  # noqa: F401 (the fixture)


def cpu_inputs(static):
    def make(M, N, dtype):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(M, N, generator=g).to(torch.bfloat16)
        w = (1 + 0.1 * torch.randn(N, generator=g)).to(torch.bfloat16)
        return (x, w, torch.tensor([fp8.STATIC_SCALE])) if static else (x, w)
    return make


@pytest.mark.parametrize("static", [False, True])
def test_sweep_of_the_fp8_output(cpu_sweep, static, monkeypatch):
    """Implementations take (x, w[, scale]) and return (y_q, scales); a wrong scale fails the
    check; the same-shape ceiling and torch's cast read x's 2 bytes and write 1 an element; the
    op's bytes add a fp32 scale a row per token."""
    make, _, _ = cpu_sweep
    opname = "fwd-fp8-static" if static else "fwd-fp8"
    # the Triton ceiling has its own test (interpreted, below); here torch's cast stands in
    monkeypatch.setitem(runner.SAME_SHAPE, "copy.narrow", runner.SAME_SHAPE["copy.fp8"])

    def chain(x, w, s=None):
        return reference.rms_norm_fp8(x, w, EPS, 0.0, "llama", s)

    def wrong_scale(x, w, s=None):
        y_q, scales = chain(x, w, s)
        return y_q, scales * 2

    suffix = "+fp8.static" if static else "+fp8"
    sweep = make(opname, {"torch.native" + suffix: chain, "wrong" + suffix: wrong_scale})
    sweep.op = runner.dataclasses.replace(sweep.op, make_inputs=cpu_inputs(static))
    sweep.shape(32, 64)
    rows = {(r["impl"], r["metric"]): r for r in sweep.out.rows if r["path"] == "graph"}
    assert ("torch.native" + suffix, "time") in rows
    assert any(f"wrong{suffix} at 32x64 not timed" in f for f in sweep.out.failures)
    for copy in ("copy.narrow.shape", "copy.fp8.shape"):
        assert rows[(copy, "bandwidth")]["p50"] == pytest.approx((2 + 1) * 32 * 64 / 5.0 / 1e3)
    expect = 32 * 64 * 3 + 64 * 2 + (0 if static else 4 * 32)
    assert rows[("torch.native" + suffix, "bandwidth")]["p50"] == pytest.approx(
        expect / 5.0 / 1e3)


def test_the_ops_and_their_implementations():
    for name, static in (("fwd-fp8", False), ("fwd-fp8-static", True)):
        op = runner.OPS[name]
        assert op.name == "fwd" and op.same_shape == ("copy.narrow", "copy.fp8")
        assert op.sweep == fp8.SWEEP and (65536, 4096) in op.sweep and (262144, 128) in op.sweep
        suffix = "+fp8.static" if static else "+fp8"
        assert set(impls.lab_impls(name)) == {f"cute.auto{suffix}", f"triton.row{suffix}",
                                              f"cute.auto{suffix}.unfused",
                                              f"cute.auto{suffix}.unfused.inductor"}
        assert all(p.endswith(suffix) for p in op.peers)
    assert "flashinfer+fp8.static" in fp8.STATIC_PEERS
    assert {"copy.narrow.shape", "copy.fp8.shape"} <= set(CEILINGS)


@pytest.mark.interpret
def test_the_narrowing_copy_writes_each_values_high_byte():
    """The ceiling moves the fp8 op's bytes (read 2, write 1 an element) and computes nothing:
    the byte it writes is the high byte of x's bf16 (under the interpreter, on the CPU; a length
    that is not a multiple of its block)."""
    a = torch.randn(3, 4097).to(torch.bfloat16)
    b = torch.full(a.shape, float("nan")).to(torch.float8_e4m3fn)
    fp8.SAME_SHAPE["copy.narrow"][2]()(a, b)
    high = (a.view(torch.int16) >> 8).to(torch.int8)
    assert torch.equal(b.view(torch.int8), high)


def test_the_unfused_chains_are_the_reference_on_the_cpu():
    """The lab's unfused chains (its norm, then torch's quantization, eager or compiled by
    Inductor) return what the reference does; on the CPU its norm is the reference's."""
    x, w = cpu_inputs(False)(8, 64, None)
    chains = impls.lab_impls("fwd-fp8")
    expect = fp8.reference_out((x, w))
    got = chains["cute.auto+fp8.unfused"](x, w)
    assert torch.equal(got[0].view(torch.uint8), expect[0].view(torch.uint8))
    assert torch.equal(got[1], expect[1])
    got = chains["cute.auto+fp8.unfused.inductor"](x, w)
    assert runner.rel_error(got, expect) < runner.OPS["fwd-fp8"].rel_tol


def test_codes_a_step_apart_pass_and_a_wrong_scale_fails():
    """The fp8 ops' tolerance: a tenth of the codes one step off (an fp32 sum or a rounding of y
    taken otherwise) is the same answer; codes of y over twice the scale are not."""
    torch.manual_seed(0)
    y = torch.randn(256, 512)
    codes, scales = reference.quantize_fp8(y)
    bits = codes.view(torch.uint8).clone()
    step = (torch.rand(bits.shape) < 0.1) & ((bits & 0x7F) < 0x7E)  # 0x7F is NaN
    bits[step] ^= 1  # the neighbouring code, in magnitude
    apart = bits.view(torch.float8_e4m3fn)
    tol = runner.OPS["fwd-fp8"].rel_tol
    assert runner.rel_error((apart, scales), (codes, scales)) < tol
    halved, _ = reference.quantize_fp8(y, torch.tensor(2 * scales.max().item()))
    assert runner.rel_error((halved, scales), (codes, scales)) > tol


def test_graph_times_now_reads_back_one_shape_of_its_run(monkeypatch):
    """The notebooks' live path: ``bench`` of one shape into a temporary directory, read back
    as graph-replay medians by implementation (here ``bench`` writes known rows)."""
    from rmsnorm_workbook import results
    from test_results import row

    calls = []

    def fake_bench(op, *, out, tag, shapes):
        calls.append((op, tag, shapes))
        rows = [row(op="fwd", impl=impl, M=M, N=16384, path=path, metric=metric,
                    unit=results.METRIC_UNITS[metric], p20=p50, p50=p50, p80=p50)
                for impl, M, path, metric, p50 in (
                    ("cute.auto+fp8", 16, "graph", "time", 2.5),
                    ("cute.auto+fp8", 16, "eager", "time", 9.0),
                    ("cute.auto+fp8", 32, "graph", "time", 4.0),
                    ("cute.auto+fp8", 16, "graph", "bandwidth", 7.0),
                    ("triton.row+fp8", 16, "graph", "time", 3.5))]
        return runner.Outcome(path=results.write(rows, out / "testgpu" / f"{op}-{tag}.csv"))

    monkeypatch.setattr(runner, "bench", fake_bench)
    got = runner.graph_times_now("fwd-fp8", 16, 16384)
    assert calls == [("fwd-fp8", "live", [(16, 16384)])]
    assert got.to_dict() == {"cute.auto+fp8": 2.5, "triton.row+fp8": 3.5}


def test_the_reports_caption_names_the_run_and_the_copies_its_table_shows():
    """The run's commit and date; the ceiling moves the same bytes (the q/k op's, its head rows'
    alone, and its M is counted); torch's cast is named for what it is; a run without the
    ceiling's rows says nothing of it."""
    import pandas as pd

    from rmsnorm_workbook.cli.report_sections import fusion_caption

    def caption(name, copies):
        t = pd.DataFrame({c: [1.0] for c in ["cute.auto+fp8", *copies]})
        t.attrs["run"] = ("abc123", "2026-12-05")
        return fusion_caption(name, t)

    cast = "; copy.fp8.shape: torch's cast into fp8, the same bytes (not a ceiling)"
    ceiling = ", the ceiling, moves the same bytes with no arithmetic"
    both = caption("fwd-fp8", ["copy.narrow.shape", "copy.fp8.shape"])
    assert "its newest run (commit abc123, 2026-12-05); copy.narrow.shape" + ceiling + cast in both
    assert "(commit abc123, 2026-12-05)" + cast + ";" in caption("fwd-fp8", ["copy.fp8.shape"])
    rope = caption("bwd-qk-rope", ["copy2r1w.shape"])  # its copy moves the head rows alone
    assert "; copy2r1w.shape, the ceiling, moves the head rows' bytes (not cos and sin" in rope
    assert "M counts head rows (tokens × 40 heads)" in rope and "M counts" not in both


def test_the_qk_captions_give_the_tables_share_of_the_bench_bytes():
    """What a q/k caption says its copy leaves out is the bench's own count: cos and sin over the
    rows' read and write (forward), or their two reads and one write (backward)."""
    import re

    from rmsnorm_workbook.bench import qk_rope
    from rmsnorm_workbook.cli.report_sections import ROPE_EXTRA

    M, N = 4 * qk_rope.ROWS_PER_TOKEN, 128
    args = qk_rope.inputs(M, N, torch.bfloat16, device="cpu")
    s = 2  # bf16
    copies = {"fwd-qk-rope": 2 * M * N * s, "bwd-qk-rope": 3 * M * N * s}
    beyond = {"fwd-qk-rope": qk_rope.fwd_bytes(args) - 2 * N * s - copies["fwd-qk-rope"],
              "bwd-qk-rope": qk_rope.bwd_bytes(args) - 4 * N * s - 4 * M - copies["bwd-qk-rope"]}
    for name, copy in copies.items():
        said = float(re.search(r"([0-9.]+)% more", ROPE_EXTRA[name]).group(1))
        assert abs(said - 100 * beyond[name] / copy) < 0.05, name


def test_each_fused_ops_table_shows_the_copies_its_bench_measures():
    """The report's fused-op tables (``tables.FUSIONS``) name, in order, the same-shape copies
    the op's benchmark times (``ops.OPS[name].same_shape``, as ``.shape`` rows)."""
    from rmsnorm_workbook.analysis import tables
    from rmsnorm_workbook.bench.ops import OPS

    for name, (_, _, copies, _) in tables.FUSIONS.items():
        assert copies == tuple(f"{c}.shape" for c in OPS[name].same_shape), name


def test_a_fused_ops_caption_warns_where_another_gpu_holds_a_newer_run_of_other_code():
    """The H200's table from an older commit than the H100's newest run says so and names the
    newer run; the newest, or one of the same commit, says nothing."""
    import pandas as pd

    from rmsnorm_workbook.cli.report_sections import fusion_caption, newer_run

    def table(commit, stamp):
        t = pd.DataFrame({"cute.auto+fp8": [1.0]})
        t.attrs.update(run=(commit, stamp[:10]), timestamp=stamp)
        return t

    fusions = {"h200": {"fwd-fp8": table("old1", "2026-12-01T10:00:00")},
               "h100_sxm": {"fwd-fp8": table("new2", "2026-12-06T10:00:00")}}
    warning = newer_run("fwd-fp8", "h200", fusions)
    # to the minute: runs of one day are told apart
    assert ("This run (2026-12-01 10:00 UTC) is older than the H100 SXM's (new2, 2026-12-06 "
            "10:00)") in warning
    assert warning in fusion_caption("fwd-fp8", fusions["h200"]["fwd-fp8"], warning)
    assert newer_run("fwd-fp8", "h100_sxm", fusions) == ""
    fusions["h100_sxm"]["fwd-fp8"] = table("old1", "2026-12-06T10:00:00")
    assert newer_run("fwd-fp8", "h200", fusions) == ""


def test_the_reports_gemm_section_is_the_newest_run_with_that_runs_error(tmp_path):
    """µs per chain by M from the newest run only; the error sentence only where the error file
    comes from that run."""
    import json

    import pandas as pd

    from rmsnorm_workbook.cli.report_sections import GEMM_CHAINS, gemm_section

    df = pd.DataFrame([dict(gpu="testgpu", impl=impl, path="graph", M=M, N=4096,
                            p50=p50 * slower, commit=commit, timestamp=stamp)
                       for commit, stamp, slower in (("old", "2026-12-01T00:00:00", 2.0),
                                                     ("new", "2026-12-06T00:00:00", 1.0))
                       for M in (16, 8192)
                       for impl, p50 in zip(GEMM_CHAINS, (10.0, 30.0, 20.0))])
    assert gemm_section(df, "othergpu", tmp_path) == []
    err = {"provenance": {"commit": "new"}, "K": 4096, "N": 14336,
           "errors": {GEMM_CHAINS[0]: {"16": {"all": 0.0375, "worst_row": 0.038},
                                       "8192": {"all": 0.0374, "worst_row": 0.0391}}}}
    (tmp_path / "testgpu" / "logs").mkdir(parents=True)
    (tmp_path / "testgpu" / "logs" / "fp8-gemm-error.json").write_text(json.dumps(err))
    md = "\n".join(gemm_section(df, "testgpu", tmp_path))
    assert "(commit new, 2026-12-06)" in md and "| 8192 | 10.0 | 30.0 | 20.0 |" in md
    assert "4096 → 14336" in md and "3.74% from the bf16 chain's at M=8192 (3.91%" in md
    err["provenance"]["commit"] = "old"
    (tmp_path / "testgpu" / "logs" / "fp8-gemm-error.json").write_text(json.dumps(err))
    assert "14336" not in "\n".join(gemm_section(df, "testgpu", tmp_path))
