"""The downstream fp8 GEMM chains' helpers on the CPU: the weight's per-channel quantization and
the error measure (the chains themselves need an fp8 GEMM: GPU tests)."""

import pytest
import torch

from rmsnorm_workbook.bench import fp8_gemm


def test_the_weight_is_quantized_per_output_channel():
    w = torch.randn(64, 256) * torch.linspace(0.1, 10, 64).unsqueeze(1)
    w_q, scales = fp8_gemm.weight_fp8(w.to(torch.bfloat16))
    assert w_q.dtype == torch.float8_e4m3fn and scales.shape == (64,)
    assert torch.equal(scales, w.to(torch.bfloat16).float().abs().amax(1) / 448)
    back = w_q.float() * scales.unsqueeze(1)
    assert float(((back - w).norm() / w.norm())) < 0.05  # e4m3: 3 mantissa bits


def test_relative_errors_overall_and_worst_row():
    expect = torch.ones(4, 8)
    out = expect.clone()
    out[2] *= 1.5
    err = fp8_gemm.relative_errors(out, expect)
    assert err["worst_row"] == pytest.approx(0.5)
    assert err["all"] == pytest.approx(0.5 / 2)  # one row of four: sqrt(8 * 0.25 / 32)


def test_without_a_gpu_it_says_what_it_needs(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert fp8_gemm.main([]) == 2
    assert "need a CUDA GPU" in capsys.readouterr().err
