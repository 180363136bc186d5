"""workbook/rmsnorm_workbook/profiling/ncu_teach.py on the CPU: reading ncu's CSV (a fabricated sample in its
``--csv`` details format, built here and never written to results/) and composing the command."""

import sys

import pytest

from rmsnorm_workbook.profiling import ncu_teach as nt

HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
        '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
        '"Metric Value"')


def line(launch, kernel, section, name, unit, value):
    fields = (str(launch), "748", "python3", "127.0.0.1", kernel, "1", "7", "(256, 1, 1)",
              "(16384, 1, 1)", "0", "9.0", section, name, unit, value)
    return ",".join(f'"{f}"' for f in fields)


def sample():
    k = "kernel_cutlass_fused_kernel_tensorptrbf16gmemalign16o_0"
    return "\n".join([
        "==PROF== Connected to process 748 (/usr/bin/python3)",
        "something the application printed",
        HEAD,
        line(0, k, "Command line profiler metrics", "gpu__time_duration.sum", "ns", "99,999"),
        line(1, k, "Command line profiler metrics", "gpu__time_duration.sum", "ns", "127,392"),
        line(1, k, "Command line profiler metrics",
             "dram__throughput.avg.pct_of_peak_sustained_elapsed", "%", "83.56"),
        line(1, k, "Occupancy", "Achieved Occupancy", "%", "47.10"),
        line(1, k, "LaunchStats", "Function Cache Configuration", "", "CachePreferNone"),
        HEAD,  # a second header, as when several processes are profiled
        "==PROF== Disconnected from process 748",
    ])


def test_parse_reads_metric_rows_and_skips_the_rest():
    rows = nt.parse_ncu_csv(sample())
    assert len(rows) == 4  # the non-numeric cache configuration is left out
    assert {r["metric"] for r in rows} == {
        "gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "Occupancy/Achieved Occupancy"}
    last = nt.last_launch(rows)
    assert {r["launch"] for r in last} == {1}
    t = next(r for r in last if r["metric"] == "gpu__time_duration.sum")
    assert t["value"] == 127392.0 and t["unit"] == "ns"
    assert nt.parse_ncu_csv("==PROF== nothing profiled\n") == []
    assert nt.last_launch([]) == []


def test_parse_refuses_a_csv_that_is_not_ncus():
    with pytest.raises(ValueError, match="not ncu --csv output"):
        nt.parse_ncu_csv('"a","b"\n"1","2"\n')


def test_command_profiles_the_second_launch_of_one_kernel():
    cmd = nt.ncu_command("ncu", "split_dw", 16384, 4096, nt.CORE_METRICS)
    assert cmd[:4] == ["ncu", "--csv", "--clock-control", "none"]
    for s in nt.SECTIONS:
        assert s in cmd
    i = cmd.index("--kernel-name")
    assert cmd[i + 1] == "regex:cutlass_split_dw_kernel_"
    assert cmd[cmd.index("--launch-skip") + 1] == "1"
    assert cmd[cmd.index("--launch-count") + 1] == "1"
    assert cmd[cmd.index("--metrics") + 1] == ",".join(nt.CORE_METRICS)
    assert sys.executable in cmd and cmd[-6:] == ["--child", "split_dw", "--M", "16384", "--N",
                                                  "4096"]
    assert "--metrics" not in nt.ncu_command("ncu", "scalar", 1, 8, ())


def test_names():
    assert nt.impl_name("cta_row") == "teach.cta_row" and nt.impl_name("cute.auto") == "cute.auto"
    assert nt.op_of("fused") == "bwd" and nt.op_of("persistent") == "fwd"
    assert nt.kernel_regex("cute.auto") == "RMSNormForward"


def test_main_refuses_without_a_gpu(capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert nt.main(["--kernels", "scalar"]) == 2
    assert "CUDA GPU" in capsys.readouterr().err


def test_the_ncu_log_is_written_beside_the_record_not_in_the_temporary_folder(tmp_path,
                                                                            monkeypatch):
    """The log of ncu's output goes with the run's other files (under --out); the system's
    temporary folder, shared by every user and test run, gets nothing."""
    import tempfile

    import torch

    from rmsnorm_workbook.viz import lesson

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(nt, "ncu_binary", lambda: "ncu")

    def profile(ncu, kernel, M, N, log):
        log.write(f"$ ncu ... {kernel}\n")
        return [{"metric": "gpu__time_duration.sum", "unit": "ns", "value": 1000.0}]
    monkeypatch.setattr(nt, "profile", profile)
    monkeypatch.setattr("rmsnorm_workbook.results.provenance.collect", lambda: {
        "gpu": "testgpu", "commit": "abc", "timestamp": "t"})
    monkeypatch.setattr(lesson, "target_arch", lambda: "sm_90a")
    out = tmp_path / "profiles"
    assert nt.main(["--out", str(out), "--kernels", "cute.auto"]) == 0
    log = out / "testgpu" / "ncu" / "ncu-teach.log"
    assert log.read_text() == "$ ncu ... cute.auto\n"
    assert not any(temp.iterdir())
