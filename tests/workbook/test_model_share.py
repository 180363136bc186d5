"""``profiling.model_share``: the norm kernels' share of each model step, read from a
hand-made SQLite file with the tables and columns an nsys export has (``python -m
rmsnorm_workbook.bench.model --capture`` makes the real ones on a GPU)."""

import sqlite3

import pytest

from rmsnorm_workbook.profiling import model_share

LAB_FWD = ("kernel_cutlass_kernel_rmsnorm_labcuteforwardRMSNormForward_object_at__tensorptrbf16"
           "gmemalign16o4096div81_tensorptrbf16gmemalign16o1409601_0")
LAB_DW = "kernel_cutlass_kernel_rmsnorm_labcutedw_reduceDwReduce_object_at__tensorptrf32gmemo_0"
TORCH_FWD = ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16,"
             " float, true>(int, float, const T1 *, const T1 *, const T1 *, T2 *, T2 *, T1 *)")
TORCH_DW = ("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<c10::"
            "BFloat16, float, 32u, 1u, 32u, true, true, false>(long, long, ...)")
LIGER = "_rms_norm_forward_kernel"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1"
RSQRT = ("void at::native::vectorized_elementwise_kernel<4, at::native::rsqrt_kernel_cuda("
         "at::TensorIteratorBase &)::{lambda()#1}, std::array<char *, 2>>(int, T2, T3)")
INDUCTOR = "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0"
FLASH = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>(...)"


@pytest.mark.parametrize("name, norm", [
    (LAB_FWD, True), (LAB_DW, True), (TORCH_FWD, True), (TORCH_DW, True), (LIGER, True),
    ("_rms_norm_bwd", True), ("RowwiseMomentsCUDAKernel", True),
    (GEMM, False), (RSQRT, False), (INDUCTOR, False), (FLASH, False)])
def test_norm_kernels_by_name(name, norm):
    assert model_share.is_norm_kernel(name) is norm


def _export(path, *, with_text_ids=True):
    """A capture's SQLite export with the tables and columns nsys writes (those read, and a few
    beside them): two ``step`` ranges (one named through StringIds), a mark and an outer range,
    kernels before, inside and after the steps."""
    con = sqlite3.connect(path)
    con.executescript(f"""
        CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL,
            rangeId INTEGER, category INTEGER, color INTEGER, text TEXT, globalTid INTEGER,
            endGlobalTid INTEGER, {"textId INTEGER REFERENCES StringIds(id)," if with_text_ids
                                   else ""} domainId INTEGER, jsonText TEXT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
            deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
            correlationId INTEGER, globalPid INTEGER,
            demangledName INTEGER NOT NULL REFERENCES StringIds(id),
            shortName INTEGER NOT NULL REFERENCES StringIds(id),
            mangledName INTEGER REFERENCES StringIds(id), registersPerThread INTEGER NOT NULL,
            gridX INTEGER NOT NULL, gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL);
    """)
    names = ["step", "other", LAB_FWD, "kernel_cutlass_kernel_0", TORCH_FWD,
             "vectorized_layer_norm_kernel", GEMM, "gemm", RSQRT, "vectorized_elementwise_kernel",
             LIGER, INDUCTOR, LAB_DW, "dw"]
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", list(enumerate(names, 1)))
    sid = {n: i for i, n in enumerate(names, 1)}
    nvtx = [(0, 9000, 59, "other", None), (1000, 2000, 59, "step", None),
            (2500, None, 34, "step", None)]  # a mark of the same name: not a step
    nvtx.append((3000, 4000, 59, None, sid["step"]) if with_text_ids
                else (3000, 4000, 59, "step", None))
    for start, end, kind, text, text_id in nvtx:
        if with_text_ids:
            con.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, textId) "
                        "VALUES (?, ?, ?, ?, ?)", (start, end, kind, text, text_id))
        else:
            con.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text) "
                        "VALUES (?, ?, ?, ?)", (start, end, kind, text))
    kernels = [(500, 600, GEMM, "gemm"),                                # warm-up: no step
               (1100, 1400, GEMM, "gemm"), (1400, 1450, LAB_FWD, "kernel_cutlass_kernel_0"),
               (1450, 1470, TORCH_FWD, "vectorized_layer_norm_kernel"),
               (1500, 1600, RSQRT, "vectorized_elementwise_kernel"),
               (1990, 2100, GEMM, "gemm"),                               # starts inside step 0
               (3100, 3130, LIGER, LIGER), (3200, 3300, INDUCTOR, INDUCTOR),
               (3300, 3320, LAB_DW, "dw"), (4100, 4200, LAB_FWD, "kernel_cutlass_kernel_0")]
    con.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES "
                    "(?, ?, 0, 1, 7, 0, 0, ?, ?, NULL, 32, 1, 1, 1)",
                    [(s, e, sid[d], sid[short]) for s, e, d, short in kernels])
    con.commit()
    con.close()
    return path


@pytest.mark.parametrize("with_text_ids", [True, False])
def test_step_shares_from_an_export(tmp_path, with_text_ids):
    shares = model_share.step_shares(_export(tmp_path / "x.sqlite", with_text_ids=with_text_ids))
    assert [(s.step, s.start_ns, s.end_ns, s.kernels, s.kernel_ns, s.norm_kernels, s.norm_ns)
            for s in shares] == [(0, 1000, 2000, 5, 580, 2, 70), (1, 3000, 4000, 3, 150, 2, 50)]
    assert shares[0].share == pytest.approx(70 / 580) and shares[1].share == pytest.approx(1 / 3)
    assert shares[0].norm_names == (LAB_FWD, TORCH_FWD)  # demangled names, not short ones
    assert shares[1].norm_names == (LIGER, LAB_DW)
    assert shares[0].wall_ns == 1000
    text = model_share.format_shares(shares)
    assert "norms 0.1 of 0.7 kernel µs = 16.4%" in text and "_rms_norm_forward_kernel" in text


def test_step_shares_refuses_what_is_not_such_an_export(tmp_path):
    with pytest.raises(model_share.ExportError, match="no such file"):
        model_share.step_shares(tmp_path / "missing.sqlite")
    (tmp_path / "text.sqlite").write_text("not a database\n" * 100)
    with pytest.raises(model_share.ExportError, match="not an SQLite file"):
        model_share.step_shares(tmp_path / "text.sqlite")
    con = sqlite3.connect(tmp_path / "bare.sqlite")
    con.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
    con.close()
    with pytest.raises(model_share.ExportError, match="no table NVTX_EVENTS, CUPTI_ACTIVITY"):
        model_share.step_shares(tmp_path / "bare.sqlite")
    export = _export(tmp_path / "x.sqlite")
    with pytest.raises(model_share.ExportError, match="no NVTX range named 'iteration'"):
        model_share.step_shares(export, "iteration")
    assert model_share.main([str(tmp_path / "bare.sqlite")]) == 1


def test_step_kernels_agree_with_the_shares_and_reach_a_csv(tmp_path):
    export = _export(tmp_path / "x.sqlite")
    kernels = model_share.step_kernels(export)
    shares = model_share.step_shares(export)
    for s in shares:
        mine = [k for k in kernels if k[0] == s.step]
        assert len(mine) == s.kernels and sum(k[4] for k in mine) == s.norm_kernels
        assert sum(k[2] - k[1] for k in mine) == pytest.approx(s.kernel_ns / 1e3)
        assert all(0 <= k[1] < k[2] for k in mine)
    out = tmp_path / "k.csv"
    assert model_share.main([str(export), "--kernels-csv", str(out)]) == 0
    assert len(out.read_text().splitlines()) == len(kernels) + 1
