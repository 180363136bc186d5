"""The lesson notebooks' shared module (workbook/rmsnorm_workbook/viz/lesson.py) on the CPU: reading compiled
code, the live harness with CPU stand-ins for the kernels and the timer, and reading the rows
back. All data here is synthetic and written only under pytest's tmp_path (gpu ``testgpu``)."""

import ast
import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from rmsnorm_workbook import results
from rmsnorm_workbook.bench.timing import Quantiles
from rmsnorm_workbook.profiling import ncu_teach
from rmsnorm_workbook.viz import lesson, recorded

REPO = Path(__file__).resolve().parents[2]
BF16 = torch.bfloat16

SASS = "\n".join(f"        /*{a:04x}*/                   {ins} ;   /* 0x0000000408047981 */"
                 for a, ins in enumerate(["LDG.E.128 R4, desc[UR4][R8.64]",
                                          "STL [R1+0x110], R4",
                                          "LDL.LU R4, [R1+0x110]",
                                          "SHFL.BFLY PT, R4, R13, 0x10, 0x1f",
                                          "LDG.E.U16 R3, desc[UR4][R4.64]",
                                          "STG.E.128 desc[UR4][R2.64], R4"]))


def test_compiled_reads_sass_counts_spills_and_excerpts():
    c = lesson.Compiled("k", 4096, "sm_90a", ptx="", sass=SASS, registers=128, stack_bytes=16)
    assert c.sass_counts() == {"LDG.E.128": 1, "LDG.E.U16": 1, "LDL.LU": 1, "STG.E.128": 1,
                               "STL": 1}
    assert c.spills() == 2
    row = c.row()
    assert row["SASS LDG.E.128"] == 1 and row["SASS narrower LDG"] == 1
    assert row["spill STL+LDL"] == 2 and row["registers"] == 128
    text = c.excerpt(("STL", "LDL"))
    assert text.splitlines() == ["    STL [R1+0x110], R4", "    LDL.LU R4, [R1+0x110]"]
    assert "more" in c.excerpt(("LDG", "STG", "STL", "LDL"), limit=2)
    empty = lesson.Compiled("k", 4096, "sm_90a", ptx="", sass="")
    assert empty.spills() is None and "no SASS" in empty.excerpt()
    table = lesson.compiled_table([c, empty])
    assert list(table.index) == [("k", 4096), ("k", 4096)]


def test_read_compiled_counts_every_narrower_ptx_load(tmp_path):
    ptx = (".version 8.8\n.target sm_90a\n"
           "ld.global.v4.b32 {%r1, %r2, %r3, %r4}, [%rd1];\n"
           "ld.global.v2.b32 {%r5, %r6}, [%rd2];\n"
           "ld.global.u16 %rs1, [%rd3];\n"
           "st.global.v4.b32 [%rd4], {%r1, %r2, %r3, %r4};\n")
    (tmp_path / "k.sm_90a.ptx").write_text(ptx)
    c = lesson.read_compiled(str(tmp_path), "k", 4096, "sm_90a")
    assert (c.ptx_ld16, c.ptx_ld_narrow, c.ptx_st16) == (1, 2, 1)


def _rows(op, impls, shapes, gpu="testgpu", us=None):
    from rmsnorm_workbook.bench.runner import bandwidth, make_row
    prov = {"gpu": gpu, "sm_count": 132, "driver": "0", "torch": "0", "triton": "0",
            "cutlass_dsl": "0", "commit": "synthetic", "timestamp": "2000-01-01T00:00:00+00:00"}
    out = []
    for k, impl in enumerate(impls):
        for M, N in shapes:
            t = (us or {}).get(impl, 10.0 + k)
            q = Quantiles(0.9 * t, t, 1.1 * t)
            out.append(make_row(prov, op, impl, "graph", M, N, BF16, "time", q))
            out.append(make_row(prov, op, impl, "graph", M, N, BF16, "bandwidth",
                                bandwidth(2 * M * N * 2, q)))
    return out


def test_teach_table_is_percent_of_the_same_shape_copy(tmp_path):
    rows = _rows("fwd", ["teach.copy", "teach.cta_row", "teach.scalar"],
                 [(1024, 4096), (16384, 4096)],
                 us={"teach.copy": 10.0, "teach.cta_row": 12.5, "teach.scalar": 40.0})
    results.write(rows, tmp_path / "testgpu" / "teach-fwd.csv")
    df = lesson.load_teach("fwd", "testgpu", tmp_path)
    t = lesson.teach_table(df, "fwd")
    assert t.loc[("teach.cta_row", 16384, 4096), "% of copy"] == pytest.approx(80.0)
    assert t.loc[("teach.scalar", 1024, 4096), "% of copy"] == pytest.approx(25.0)
    assert t.loc[("teach.copy", 1024, 4096), "% of copy"] == pytest.approx(100.0)
    assert lesson.load_teach("bwd", "testgpu", tmp_path) is None


def test_ncu_view_picks_metrics_scales_units_and_sums_spills():
    rows = [("teach.a", "gpu__time_duration.sum", "ns", 65432.0),
            ("teach.a", "dram__bytes_read.sum", "byte", 2.0e9),
            ("teach.a", "Occupancy/Achieved Occupancy", "%", 47.0),
            ("teach.a", "sm__warps_active.avg.pct_of_peak_sustained_active", "%", 45.0),
            ("teach.a", "smsp__sass_inst_executed_op_local_ld.sum", "inst", 3.0),
            ("teach.a", "smsp__sass_inst_executed_op_local_st.sum", "inst", 4.0),
            ("teach.b", "LaunchStats/Registers Per Thread", "register/thread", 32.0)]
    ncu = pd.DataFrame(rows, columns=["kernel", "metric", "unit", "value"])
    v = lesson.ncu_view(ncu, ["teach.a", "teach.b", "teach.absent"])
    assert list(v.index) == ["teach.a", "teach.b"]
    assert v.loc["teach.a", "duration µs"] == pytest.approx(65.432)
    assert v.loc["teach.a", "DRAM GB read"] == pytest.approx(2.0)
    assert v.loc["teach.a", "achieved occupancy %"] == 45.0   # the raw metric comes first
    assert v.loc["teach.a", "local (spill) ld+st instructions"] == 7.0
    assert v.loc["teach.b", "registers / thread"] == 32.0
    assert math.isnan(v.loc["teach.b", "duration µs"])


def test_recorded_sass_finds_a_kernel_section(tmp_path):
    (tmp_path / "testgpu" / "ncu").mkdir(parents=True)
    (tmp_path / "testgpu" / "ncu" / "sass-teach.txt").write_text(
        "# header\n== teach.a (sm_90a, N=4096) ==\nregisters 32\n    LDG.E.128 R4\n"
        "== teach.b (sm_90a, N=4096) ==\n    STL [R1]\n")
    assert lesson.recorded_sass("teach.a", "testgpu", tmp_path) == "registers 32\n    LDG.E.128 R4"
    assert lesson.recorded_sass("teach.b", "testgpu", tmp_path) == "    STL [R1]"
    assert lesson.recorded_sass("teach.c", "testgpu", tmp_path) is None


# --- the live harness, with CPU stand-ins ------------------------------------------------------

def _emulated_forward(x, w, y, eps):
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y.copy_(((xf * rstd).to(BF16).float() * w.float()).to(BF16))


@pytest.fixture
def cpu_live(monkeypatch, tmp_path):
    """LiveRun on the CPU: tensors on the CPU, rows under tmp_path, a timer that runs the call
    and returns a fixed (made-up) time, a small L2 so few input sets rotate."""
    from rmsnorm_workbook.results import provenance
    prov = {**provenance.collect(), "gpu": "testgpu", "sm_count": 132}
    calls = []

    def timer(fn, calls_multiple, replays=20, target_ms=2.0):
        for _ in range(calls_multiple):
            fn()
        calls.append(calls_multiple)
        return Quantiles(9.0, 10.0, 11.0)

    monkeypatch.setattr(lesson, "device", lambda: "cpu")
    monkeypatch.setattr(recorded, "RESULTS_ROOT", tmp_path)
    monkeypatch.setattr(lesson, "provenance", lambda: prov)
    monkeypatch.setattr(lesson, "time_graph", timer)
    monkeypatch.setattr(lesson, "l2_bytes", lambda: 2**14)
    return calls


def test_live_run_checks_times_and_writes_the_results_schema(cpu_live, tmp_path):
    run = lesson.LiveRun("fwd")
    assert run.run(lesson.forward_case("teach.good", _emulated_forward, 64, 256)) \
        == (9.0, 10.0, 11.0)
    assert run.run(lesson.forward_copy_case(64, 256)) is not None
    assert cpu_live == [1, 1]  # a 64x256 set is bigger than twice the (stand-in) L2
    df = results.load(tmp_path / "testgpu" / "teach-fwd.csv")
    assert set(df["impl"]) == {"teach.good", "teach.copy"}
    assert set(df["metric"]) == {"time", "bandwidth"} and set(df["path"]) == {"graph"}
    bw = df[(df["impl"] == "teach.good") & (df["metric"] == "bandwidth")]["p50"].iloc[0]
    assert bw == pytest.approx((2 * 64 * 256 * 2 + 256 * 2) / 10.0 / 1e3)
    assert run.errors[("teach.good", 64, 256)]["y"] < lesson.TOL
    assert run.summary().loc[("teach.good", 64, 256), "status"] == "ok"


def test_live_run_reports_wrong_answers_nan_and_compile_failures(cpu_live, tmp_path, capsys):
    def wrong(x, w, y, eps):
        _emulated_forward(x, w, y, eps)
        y[0] = 0

    def leaves_nan(x, w, y, eps):
        _emulated_forward(x, w, y, eps)
        y[-1] = float("nan")

    def build():
        raise RuntimeError("no such kernel")

    run = lesson.LiveRun("fwd")
    assert run.run(lesson.forward_case("teach.wrong", wrong, 16, 256)) is None
    assert run.run(lesson.forward_case("teach.nan", leaves_nan, 16, 256)) is None
    assert run.compiled("teach.broken", 256, build) is None
    out = capsys.readouterr().out
    assert "FAILED teach.wrong at 16×256: AssertionError: wrong answer (y: rel. error" in out
    assert "NaN left in the output" in out and "did not compile" in out
    assert cpu_live == []  # nothing failing was timed
    assert not (tmp_path / "testgpu" / "teach-fwd.csv").exists()
    status = run.summary()["status"]
    assert status.str.startswith("FAILED").all() and len(status) == 3


def test_a_sticky_cuda_error_stops_the_rest(cpu_live):
    def crash(x, w, y, eps):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    run = lesson.LiveRun("fwd")
    assert run.run(lesson.forward_case("teach.crash", crash, 16, 256)) is None
    assert run.broken
    assert run.run(lesson.forward_case("teach.good", _emulated_forward, 16, 256)) is None
    assert "earlier CUDA error" in run.failures[("teach.good", 16, 256)]


def test_backward_cases_check_dx_and_dw(cpu_live, tmp_path):
    def dx_kernel(dy, x, w, rstd, dx, dwp):
        r = rstd[:, None]
        xh, m = x.float() * r, dy.float() * w.float()
        dx.copy_((r * (m - xh * (m * xh).mean(-1, keepdim=True))).to(BF16))

    def dw_kernel(dy, x, w, rstd, dx, dwp):
        prod = dy.float() * (x.float() * rstd[:, None]).to(BF16).float()
        per = -(-x.shape[0] // dwp.shape[0])
        for g in range(dwp.shape[0]):
            dwp[g] = prod[g * per:(g + 1) * per].sum(0)

    run = lesson.LiveRun("bwd")
    assert run.run(lesson.backward_case("teach.split", [dx_kernel, dw_kernel], 64, 256, 4,
                                        ("dx", "dw"), finish_dw=True)) is not None
    assert run.run(lesson.backward_case("teach.split_dx", [dx_kernel], 64, 256, 1, ("dx",),
                                        finish_dw=False)) is not None
    # a dw kernel that leaves a partial row unwritten (NaN) fails
    assert run.run(lesson.backward_case("teach.lazy", [dx_kernel], 64, 256, 4, ("dx", "dw"),
                                        finish_dw=True)) is None
    assert run.run(lesson.backward_copy_case(64, 256)) is not None
    errs = run.errors[("teach.split", 64, 256)]
    assert set(errs) == {"dx", "dw"} and max(errs.values()) < lesson.TOL
    df = results.load(tmp_path / "testgpu" / "teach-bwd.csv")
    assert set(df["impl"]) == {"teach.split", "teach.split_dx", "teach.copy2r1w"}


def test_the_backward_reference_is_float64_with_llamas_rounded_x_hat_in_dw():
    g = torch.Generator().manual_seed(0)
    x, dy = (torch.randn(64, 256, generator=g).to(BF16) for _ in range(2))
    w = (1 + 0.1 * torch.randn(256, generator=g)).to(BF16)
    rstd = torch.rsqrt(x.float().pow(2).mean(-1) + lesson.EPS)
    dx, dw = lesson.ref_backward(dy, x, w, rstd)
    assert dx.dtype == dw.dtype == torch.float64
    x_hat = x.double() * rstd.double()[:, None]
    m = dy.double() * w.double()
    assert torch.allclose(dx, rstd.double()[:, None] * (m - x_hat * (m * x_hat).mean(-1,
                                                                                 keepdim=True)))
    rounded = (x.float() * rstd[:, None]).to(BF16).double()  # what llama multiplies w by
    assert lesson.rel_err(dw, (dy.double() * rounded).sum(0)) < 1e-6
    assert lesson.rel_err(dw, (dy.double() * x_hat).sum(0)) > 1e-4


# --- the notebooks hold the kernels the profiling script runs ----------------------------------

@pytest.mark.parametrize("op,names", [("fwd", ncu_teach.FWD_KERNELS),
                                      ("bwd", ncu_teach.BWD_KERNELS)])
def test_kernel_cells_define_every_teaching_kernel(op, names):
    src = ncu_teach.kernel_source(ncu_teach.NOTEBOOKS[op])
    defined = {n.name for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef)}
    assert set(names) <= defined
    assert {f"{n}_kernel" for n in names} <= defined
    assert "compile_for" in defined and ("fake_bwd_args" if op == "bwd" else "fake_fwd_args") \
        in defined
    assert "lesson" not in src  # the kernel cells stand alone (torch and cutlass only)


def test_notebooks_carry_no_history_words():
    """No lesson's markdown or printed text names a probe log, a commit, a NOTES section, a
    library tuning constant or the project's history: that belongs in git and the design record."""
    import re
    words = ("used to", "NOTES", "§", "MISSED", "met/", "issue #", "commit ", "probe")
    constants = set()
    for path in (REPO / "rmsnorm_lab").rglob("*.py"):  # the library's module-level constants
        constants |= set(re.findall(r"^([A-Z][A-Z0-9_]{3,}) *[:=]", path.read_text(), re.M))
    for nb in sorted((REPO / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        text += "\n".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get(
            "text/plain", "")) for c in cells for o in c.get("outputs", []))
        for w in words:
            assert w.lower() not in text.lower(), (nb.name, w)
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        own = set(re.findall(r"^([A-Z][A-Z0-9_, ]+?) *=", code, re.M))  # the lesson's own
        own = {name.strip() for names in own for name in names.split(",")}
        named = {c for c in constants - own if re.search(rf"\b{c}\b", text)}
        assert not named, (nb.name, sorted(named))


def test_ncu_teach_writes_every_kernel_it_profiled_the_librarys_last_included(tmp_path,
                                                                              monkeypatch):
    """The library's kernel, profiled last and without a SASS excerpt, still reaches the file."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ncu_teach, "ncu_binary", lambda: "ncu")
    monkeypatch.setattr(ncu_teach, "profile", lambda ncu, kernel, M, N, log: [
        {"metric": "gpu__time_duration.sum", "unit": "ns", "value": 1000.0}])
    monkeypatch.setattr(ncu_teach, "sass_record", lambda module, kernel, N, arch:
                        f"== teach.{kernel} ({arch}, N={N}) ==\nLDG.E.128\n")
    monkeypatch.setattr(ncu_teach, "load_kernels", lambda path: None)
    monkeypatch.setattr("rmsnorm_workbook.results.provenance.collect", lambda: {
        "gpu": "testgpu", "commit": "abc", "timestamp": "t"})
    monkeypatch.setattr(lesson, "target_arch", lambda: "sm_90a")
    assert ncu_teach.main(["--out", str(tmp_path), "--kernels", "fused,cute.auto"]) == 0
    written = pd.read_csv(tmp_path / "testgpu" / "ncu" / "ncu-teach.csv")
    assert sorted(written["kernel"]) == ["cute.auto", "teach.fused"]
    # a run of other kernels keeps these records; one of the same kernel replaces its own
    for kernels in ("warp_row", "fused"):
        assert ncu_teach.main(["--out", str(tmp_path), "--kernels", kernels]) == 0
    written = pd.read_csv(tmp_path / "testgpu" / "ncu" / "ncu-teach.csv")
    assert sorted(written["kernel"]) == ["cute.auto", "teach.fused", "teach.warp_row"]
    sass = (tmp_path / "testgpu" / "ncu" / "sass-teach.txt").read_text()
    assert sass.count("== teach.fused ") == 1 and sass.count("== teach.warp_row ") == 1
    assert "\n\n\n" not in sass


def test_show_code_shows_a_function_or_a_slice_of_a_source_file(capsys):
    from pathlib import Path

    import rmsnorm_lab
    from rmsnorm_workbook.bench import launch_paths
    lesson.show_code(launch_paths.marshal)
    out = capsys.readouterr().out
    assert out.startswith("`rmsnorm_workbook.bench.launch_paths.marshal`:")
    assert "from_dlpack(" in out
    assert "```python" in out and out.rstrip().endswith("```")
    node = Path(rmsnorm_lab.__file__).parent / "native" / "native_node.cpp"
    lesson.show_code(node, start="at::Tensor apply(", end="// ----")
    out = capsys.readouterr().out
    assert out.startswith("`rmsnorm_lab/native/native_node.cpp`:") and "```cpp" in out
    body = out.split("```cpp\n")[1]
    assert body.startswith("at::Tensor apply(") and "// ----" not in body


def test_a_stated_number_is_checked_against_the_data(monkeypatch):
    monkeypatch.setattr(lesson, "gpu_available", lambda: False)
    lesson.stated(96, 96.4, 0.5)
    with pytest.raises(AssertionError, match="the text says 96, the data give 97.2"):
        lesson.stated(96, 97.2, 0.5)


def test_a_live_run_reports_a_number_that_moved_instead_of_failing(monkeypatch, capsys):
    monkeypatch.setattr(lesson, "gpu_available", lambda: True)
    lesson.stated(96, 97.2, 0.5, "cta_row % of copy")
    assert "this run: cta_row % of copy: the text says 96" in capsys.readouterr().out


def test_revealed_evidence_prints_in_a_script(capsys):
    lesson.reveal(pd.DataFrame({"µs": [1.5]}, index=["cta_row"]), "Answer: the time")
    out = capsys.readouterr().out
    assert out.startswith("Answer: the time:\n") and "cta_row  1.5" in out
