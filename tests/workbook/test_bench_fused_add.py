"""The fused residual add's benchmark ops (``fwd-add``, ``bwd-add``) on the CPU, with the CUDA
timers replaced by stand-ins (the ``cpu_sweep`` fixture of test_bench_ops.py)."""

import pytest
import torch

from rmsnorm_lab import reference
from rmsnorm_workbook.bench import runner
from test_bench_ops import EPS, cpu_sweep  # noqa: F401 (the fixture)


def test_sweep_of_the_fused_add(cpu_sweep):
    """fwd-add and bwd-add: implementations take (x, r, w) and return (y, h); the backward
    checks the gradient of x, of the residual (the same) and of w; the same-shape ceiling moves
    the op's bytes (two in, two out; three in, one out)."""
    from rmsnorm_workbook.bench import fused_add
    make, calls, _ = cpu_sweep

    def lab_like(x, r, w):
        h = x + r
        return reference.rms_norm(h, w, EPS), h

    def stand_in_ceiling():  # the Triton copy needs a GPU: its bytes are what is checked
        return lambda a, b, c, d: (c.copy_(a), d.copy_(b))

    for opname, ceiling in (("fwd-add", "copy2r2w"), ("bwd-add", "copy3r1w")):
        sweep = make(opname, {"torch.native+add": lab_like, "wrong+add": lambda x, r, w: (x, r)})
        maker = fused_add.inputs if opname == "fwd-add" else fused_add.grad_inputs
        sweep.op = runner.dataclasses.replace(
            sweep.op, make_inputs=lambda M, N, dtype, maker=maker: tuple(
                t.cpu().to(torch.bfloat16) if t.dtype.is_floating_point else t
                for t in _cpu(maker, M, N)))
        reads, writes, _ = runner.SAME_SHAPE[ceiling]
        runner.SAME_SHAPE[ceiling] = (reads, writes, stand_in_ceiling if ceiling == "copy2r2w"
                                      else runner.SAME_SHAPE[ceiling][2])
        try:
            sweep.shape(32, 64)
        finally:
            runner.SAME_SHAPE[ceiling] = (reads, writes, fused_add.SAME_SHAPE[ceiling][2])
        rows = {(r["impl"], r["metric"]): r for r in sweep.out.rows if r["path"] == "graph"}
        assert ("torch.native+add", "time") in rows
        assert any("wrong+add at 32x64 not timed" in f for f in sweep.out.failures)
        assert rows[(f"{ceiling}.shape", "bandwidth")]["p50"] == pytest.approx(
            (reads + writes) * 32 * 64 * 2 / 5.0 / 1e3)
        expect = 4 * 32 * 64 * 2 + 64 * 2 + (32 * 4 + 64 * 2 if opname == "bwd-add" else 0)
        assert rows[("torch.native+add", "bandwidth")]["p50"] == pytest.approx(
            expect / 5.0 / 1e3)


def _cpu(maker, M, N):
    """The op's inputs built on the CPU (the makers allocate on CUDA)."""
    real = torch.randn
    try:
        torch.randn = lambda *a, device=None, **k: real(*a, **k)
        return maker(M, N, torch.float32)
    finally:
        torch.randn = real
