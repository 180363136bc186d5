"""The q/k norms + RoPE benchmark ops (``fwd-qk-rope``, ``bwd-qk-rope``) on the CPU, with the
CUDA timers replaced by stand-ins (the ``cpu_sweep`` fixture of test_bench_ops.py)."""

import functools

import pytest
import torch

from rmsnorm_lab import reference
from rmsnorm_workbook.bench import impls, qk_rope, runner
from test_bench_ops import cpu_sweep  # noqa: F401 (the fixture)

pytest.importorskip("transformers")


def test_the_ops_their_shapes_and_implementations():
    fwd, bwd = runner.OPS["fwd-qk-rope"], runner.OPS["bwd-qk-rope"]
    assert (fwd.name, bwd.name) == ("fwd", "bwd")
    assert (fwd.same_shape, bwd.same_shape) == (("copy",), ("copy2r1w",))
    assert (8 * 40, 128) in fwd.sweep and (16384 * 40, 128) in fwd.sweep  # decode, prefill
    assert fwd.sweep == bwd.sweep and bwd.prepare is not None
    assert set(impls.lab_impls("bwd-qk-rope")) == {"cute.qk+rope", "triton.qk+rope",
                                                   "cute.auto+rope.eager"}
    assert list(qk_rope.PEERS)[-1] == "liger.rope"  # it turns the gradients in place
    with pytest.raises(ValueError, match="tokens x 40"):
        qk_rope.inputs(41, 128, torch.bfloat16, "cpu")
    for op in (fwd, bwd):  # host time is taken on one decode token's heads
        assert op.host_shape == (40, 128)
        q, k = qk_rope.inputs(*op.host_shape, torch.bfloat16, "cpu")[:2]
        assert (q.shape, k.shape) == ((1, 1, 32, 128), (1, 1, 8, 128))


@pytest.mark.parametrize("opname", ["fwd-qk-rope", "bwd-qk-rope"])
def test_sweep_of_the_prologue(cpu_sweep, opname):
    """The unpatched model's chain and the lab's norms before transformers' RoPE agree with the
    reference (outputs, or gradients of q, k and both weights); a chain that forgets the rotation
    fails; the fused op on the Triton backend refuses CPU tensors (a skip); the bytes are the
    rows' and the tables'."""
    make, _, _ = cpu_sweep
    lab = impls.lab_impls(opname)

    def unrotated(q, k, wq, wk, c, s):
        return (reference.rms_norm(q, wq, qk_rope.EPS, 0.0, "llama"),
                reference.rms_norm(k, wk, qk_rope.EPS, 0.0, "llama"))

    chosen = {"cute.auto+rope.eager": lab["cute.auto+rope.eager"],
              "triton.qk+rope": lab["triton.qk+rope"],
              "torch.eager+rope.eager": qk_rope.torch_eager(qk_rope.EPS),
              "unrotated": unrotated}
    sweep = make(opname, chosen)
    device_inputs = qk_rope.grad_inputs if opname.startswith("bwd") else qk_rope.inputs
    sweep.op = runner.dataclasses.replace(
        sweep.op, make_inputs=functools.partial(device_inputs, device="cpu"))
    T, N = 2, 16
    sweep.shape(T * 40, N)
    rows = {(r["impl"], r["metric"]): r for r in sweep.out.rows if r["path"] == "graph"}
    assert ("cute.auto+rope.eager", "time") in rows and ("torch.eager+rope.eager", "time") in rows
    assert any("unrotated at 80x16 not timed" in f for f in sweep.out.failures)
    assert any(s.startswith("triton.qk+rope at 80x16") for s in sweep.out.skipped)
    rows_bytes = 40 * T * N * 2
    expect = (2 * rows_bytes + 2 * T * N * 2 + 2 * N * 2 if opname.startswith("fwd")
              else 3 * rows_bytes + 2 * T * N * 2 + 4 * 40 * T + 4 * N * 2)
    assert rows[("torch.eager+rope.eager", "bandwidth")]["p50"] == pytest.approx(
        expect / 5.0 / 1e3)
