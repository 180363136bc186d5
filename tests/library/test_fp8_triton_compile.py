"""The Triton fp8-output kernels compiled for sm_90a without a GPU (``triton.compile`` with a
target), and their PTX read: the saturating round-to-nearest-even convert to e4m3, IEEE divisions
where the convention divides, 16-byte stores of the fp8 row. Arguments are specialised as a launch
on 16-byte aligned rows would be. Not under the interpreter (its kernels are not compiled)."""

import os
import re

import pytest

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from rmsnorm_lab.triton import forward, quant

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                                reason="compiles kernels: not under TRITON_INTERPRET=1")

FLAGS = ("BLOCK", "CASTING_MODE", "HAS_WEIGHT", "HAS_RESIDUAL", "PER_TOKEN", "HAS_SCALE_UB")


def compile_fp8(kernel, dtype, block, per_token, residual, weight=True, bound=False,
                mode="llama"):
    sig = {"X": f"*{dtype}", "Q": "*fp8e4nv", "W": f"*{dtype}" if weight else "constexpr",
           "SCALE": "constexpr" if per_token else "*fp32",
           "SCALES": "*fp32" if per_token else "constexpr",
           "SCALE_UB": "*fp32" if bound else "constexpr",
           "R": f"*{dtype}" if residual else "constexpr",
           "H": f"*{dtype}" if residual else "constexpr",
           "x_row_stride": "i32", "r_row_stride": "i32", "N": "i32", "eps": "fp32",
           "offset": "fp32", **{k: "constexpr" for k in FLAGS}}
    values = dict(zip(FLAGS, (block, mode, weight, residual, per_token, bound)))
    names = list(sig)
    constexprs = {(names.index(k),): values.get(k) for k, v in sig.items() if v == "constexpr"}
    aligned = {(i,): [["tt.divisibility", 16]] for i, (k, v) in enumerate(sig.items())
               if v.startswith("*") or k in ("x_row_stride", "r_row_stride", "N")}
    src = ASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=aligned)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": forward.num_warps_for(block)})
    return compiled.asm["ptx"]


@pytest.mark.parametrize("dtype, block, per_token, residual, bound, looped", [
    ("bf16", 4096, True, True, True, False),
    ("bf16", 128, True, False, False, False),
    ("fp16", 8192, False, True, False, False),
    ("fp32", 1024, False, False, False, False),
    ("bf16", 8192, True, True, False, True),
    ("fp32", 8192, False, False, False, True),
], ids=["bf16-4096-token-add-ub", "bf16-128-token", "fp16-8192-static-add", "fp32-1024-static",
        "looped-bf16-token-add", "looped-fp32-static"])
def test_ptx(dtype, block, per_token, residual, bound, looped):
    kernel = quant._rms_norm_fp8_looped if looped else quant._rms_norm_fp8_fused
    ptx = compile_fp8(kernel, dtype, block, per_token, residual, bound=bound)
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx
    # the per-token y / s and the static 1 / scale are IEEE divisions; the approximate
    # division left is the statistics' sum / N, as in the forward
    assert "div.rn.f32" in ptx
    assert not re.search(r"div\.approx", ptx)
    if block >= 2048:  # 16 fp8 values a thread: one 16-byte store
        assert re.search(r"st\.global(\.\w+)*\.v4\.b32", ptx)
