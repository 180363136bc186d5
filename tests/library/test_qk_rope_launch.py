"""The CuTe q/k-rope launch path on the CPU, its kernels stubbed: one dict probe a call finds a
configuration's plan, grid and kernels, each compiled once; the kernels receive the rows, the
grids and both weights' partial rows as the launch lays them out."""

import torch

from rmsnorm_lab.cute.launch import qk_rope as lq


def test_a_configuration_compiles_its_kernels_once_and_launches_them_each_call(monkeypatch):
    compiled, calls = [], []

    def fake_compile(plan, arch, keep_ptx_dir=None, backward=False):
        compiled.append("backward" if backward else "forward")
        return lambda *args: calls.append(("backward" if backward else "forward", args))

    def fake_reduce(N, w_dtype, arch, keep_ptx_dir=None, pdl=False, pair=False):
        compiled.append(("reduce", N, w_dtype, pair))
        return lambda *args: calls.append(("reduce", args))

    monkeypatch.setattr(lq, "compile_qk_rope", fake_compile)
    monkeypatch.setattr(lq, "compile_dw_reduce", fake_reduce)
    monkeypatch.setattr(lq, "_LAUNCHES", {})
    T, D, bf16 = 6, 128, torch.bfloat16
    q, k = torch.randn(1, T, 4, D, dtype=bf16), torch.randn(1, T, 2, D, dtype=bf16)
    wq, wk = torch.ones(D, dtype=bf16), torch.ones(D, dtype=bf16)
    cos, sin = torch.randn(1, T, D, dtype=bf16), torch.randn(1, T, D, dtype=bf16)
    for _ in range(3):
        qo, ko, qr, kr = lq.qk_norm_rope_forward(q, k, wq, wk, cos, sin, 1e-6, "llama", False, 4)
        lq.qk_norm_rope_backward(torch.randn_like(qo), torch.randn_like(ko), q, k, wq, wk, cos,
                                 sin, qr, kr, "llama", False, 4)
    assert compiled == ["forward", ("reduce", D, bf16, True), "backward"]
    (launch,) = lq._LAUNCHES.values()
    assert [c[0] for c in calls] == ["forward", "backward", "reduce"] * 3
    fwd, bwd, red = (c[1] for c in calls[:3])
    q_ctas = launch.grid.of(T * 4)
    assert fwd[-3:] == (q_ctas, q_ctas + launch.grid.of(T * 2), 1e-6)
    partials, grid = bwd[12], bwd[-1]
    assert grid == min(T, 4 * lq.backward_ctas_per_sm(launch.plan))
    assert partials.shape == (grid, 2 * D) and red[0] is partials
    assert red[1].shape == red[2].shape == (D,) and red[1].dtype == bf16
