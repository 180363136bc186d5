"""The q/k-norm + RoPE Triton kernels compiled for sm_90a without a GPU (``triton.compile`` with a
target): both compile for each dtype and head size, keep the row in registers (no local memory)
and the backward sums dW in registers (one partial row stored per program and weight); the
forward's rotation rounds each product (no fma). Not under the interpreter (its kernels are not
compiled)."""

import os
import re

import pytest

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from rmsnorm_lab.triton import qk_rope

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                                reason="compiles kernels: not under TRITON_INTERPRET=1")


def compile_kernel(kernel, sig, consts, **options):
    names = list(sig)
    constexprs = {(names.index(k),): v for k, v in consts.items()}
    sig = {k: ("constexpr" if k in consts else v) for k, v in sig.items()}
    aligned = {(i,): [["tt.divisibility", 16]] for i, (k, v) in enumerate(sig.items())
               if v.startswith("*")}
    src = ASTSource(fn=kernel, signature=sig, constexprs=constexprs, attrs=aligned)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 2, **options}).asm["ptx"]


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_forward_and_backward_compile(dtype, D):
    p = f"*{dtype}"
    half = triton.next_power_of_2(D // 2)
    fwd = compile_kernel(qk_rope._qk_norm_rope_fwd, {
        "Q": p, "K": p, "WQ": p, "WK": p, "COS": p, "SIN": p, "QO": p, "KO": p, "QR": "*fp32",
        "KR": "*fp32", "q_tok": "i32", "q_head": "i32", "k_tok": "i32", "k_head": "i32",
        "c_tok": "i32", "s_tok": "i32", "HQ": "i32", "HK": "i32", "eps": "fp32", "D": "",
        "HALF_BLOCK": "", "CASTING_MODE": "", "STORE_RSTD": ""},
        {"D": D, "HALF_BLOCK": half, "CASTING_MODE": "llama", "STORE_RSTD": True},
        **qk_rope.FORWARD_OPTIONS)
    assert "ld.local" not in fwd and "st.local" not in fwd
    assert len(re.findall(r"\brsqrt\.approx", fwd)) == 1  # one rstd a row
    # the rotation rounds each product, as eager torch: no fma of any width fuses one away
    assert not re.search(r"\bfma\.", fwd)
    assert len(re.findall(r"\bmul\.rn\.(f32|bf16|bf16x2)\b", fwd)) >= 4
    bwd = compile_kernel(qk_rope._qk_norm_rope_bwd, {
        "DQO": p, "DKO": p, "Q": p, "K": p, "WQ": p, "WK": p, "COS": p, "SIN": p,
        "QR": "*fp32", "KR": "*fp32", "DQ": p, "DK": p, "DWQ_P": "*fp32", "DWK_P": "*fp32",
        "q_tok": "i32", "q_head": "i32", "k_tok": "i32", "k_head": "i32", "c_tok": "i32",
        "s_tok": "i32", "T": "i32", "HQ": "i32", "HK": "i32", "tokens_per_program": "i32",
        "D": "", "HALF_BLOCK": "", "CASTING_MODE": ""},
        {"D": D, "HALF_BLOCK": half, "CASTING_MODE": "llama"})
    assert "ld.local" not in bwd and "st.local" not in bwd
    assert not re.search(r"\b(atom|red)\.global", bwd)  # dW without atomics
