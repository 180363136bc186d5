"""The downstream fp8 GEMM chains on a GPU with fp8 (run with: pytest -m gpu)."""

import pytest
import torch

from rmsnorm_workbook.bench import fp8_gemm

pytestmark = pytest.mark.gpu


def test_the_fused_and_unfused_chains_agree_and_stay_near_bf16():
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("row-wise scaled fp8 GEMMs need Hopper or later")
    torch.manual_seed(0)
    norm_w = (1 + 0.1 * torch.randn(fp8_gemm.K, device="cuda")).to(torch.bfloat16)
    w = (torch.randn(512, fp8_gemm.K, device="cuda") / fp8_gemm.K ** 0.5).to(torch.bfloat16)
    fns = fp8_gemm.chains(norm_w, w)
    x = torch.randn(64, fp8_gemm.K, device="cuda", dtype=torch.bfloat16)
    fused, unfused = fns["cute.auto+fp8+scaled_mm"](x), fns["cute.auto+fp8.unfused+scaled_mm"](x)
    assert torch.equal(fused, unfused)  # the same fp8 operands: the fused kernel's are the chain's
    err = fp8_gemm.relative_errors(fused, fns["cute.auto+bf16+mm"](x))
    assert err["all"] < 0.08 and err["worst_row"] < 0.1, err  # two fp8 roundings of ~3% each
