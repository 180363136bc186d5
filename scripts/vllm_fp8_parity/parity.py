"""``rms_norm_fp8`` against vLLM's fp8 norms, code for code, on a GPU.

vLLM pins its own torch, so its kernels are built here from its source instead of installed:
the two files of its csrc that define ``rms_norm_static_fp8_quant``,
``fused_add_rms_norm_static_fp8_quant`` and ``rms_norm_dynamic_per_token_quant`` (and the headers
they include), with bindings.cpp, as a torch extension. Then each op runs beside the lab's on the
same inputs (random rows, and rows of zeros, NaN, infinity and the largest finite values), and
the log counts the fp8 codes that differ and by how many steps.

    tar xzf vllm-0.34.0.tar.gz   # the release's source: pypi.org/project/vllm/0.34.0/#files
    .venv/bin/python scripts/vllm_fp8_parity/parity.py --vllm-src vllm-0.34.0 --out parity.txt

``--vllm-src``: an unpacked vLLM source tree (the release's sdist, or a checkout) holding
``csrc/``. Needs a GPU, the lab's environment with a CUDA build of torch 2.11 or newer (the
kernels are built for torch's stable ABI of 2.11, as vLLM 0.34 builds them), nvcc of torch's
CUDA version, and ninja; the build takes about half a minute, the comparisons a minute more.
The log names the lab's commit as the results files do (``LAB_COMMIT``, else git's). The H100's log:
``results/h100_sxm/logs/fp8-vllm-parity.txt``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

import torch

import rmsnorm_lab
from rmsnorm_lab.reference import fp8_order
from rmsnorm_workbook.results.provenance import commit

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = ("layernorm_quant_kernels.cu",
           "quantization/fused_kernels/fused_layernorm_dynamic_per_token_quant.cu")
# vLLM's build gives these files: the stable ABI of torch 2.11, the CUDA shims of its header,
# the fp8 conversions; and it drops the half-precision operator bans torch's extensions add.
DEFINES = ["-DTORCH_TARGET_VERSION=0x020B000000000000ULL", "-DUSE_CUDA", "-DENABLE_FP8"]
UNBAN_HALF = ["-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
              "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__"]
SHAPES = ((16384, 4096), (16384, 1024), (1000, 5120), (7, 8192), (65536, 128), (333, 2048))
EPS = 1e-6


def cublas_include() -> list:
    """vLLM's torch_utils.h includes cublas_v2.h (nothing calls it): torch's pip cuBLAS headers
    where the toolkit has none."""
    from torch.utils.cpp_extension import CUDA_HOME
    if CUDA_HOME and os.path.isfile(os.path.join(CUDA_HOME, "include", "cublas_v2.h")):
        return []
    for root in sys.path:
        for sub in ("nvidia/cu13/include", "nvidia/cublas/include"):
            if os.path.isfile(os.path.join(root, sub, "cublas_v2.h")):
                return [f"-isystem {os.path.join(root, sub)}"]
    return []


def build(vllm_src: str, build_dir: str):
    """vLLM's three ops as ``torch.ops.vllm_fp8_norms`` (compiled for this GPU's arch)."""
    from torch.utils.cpp_extension import load
    csrc = os.path.join(vllm_src, "csrc")
    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}{'a' if major >= 9 else ''}"
    flags = ["-O3", "-std=c++17"] + DEFINES + cublas_include()
    os.makedirs(build_dir, exist_ok=True)
    load(name="vllm_fp8_norms", is_python_module=False, build_directory=build_dir,
         sources=[os.path.join(HERE, "bindings.cpp")] + [os.path.join(csrc, s) for s in SOURCES],
         extra_include_paths=[csrc], extra_cflags=flags,
         extra_cuda_cflags=flags + UNBAN_HALF + ["--expt-relaxed-constexpr",
                                                 f"-gencode=arch=compute_{arch},code=sm_{arch}"])
    return torch.ops.vllm_fp8_norms


def vllm_version(vllm_src: str) -> str:
    """The version and commit its sdist's vllm/_version.py names, or the checkout's HEAD."""
    path = os.path.join(vllm_src, "vllm", "_version.py")
    if os.path.isfile(path):
        text = open(path).read()
        found = [re.search(rf"^{name} = .*'(.+)'$", text, re.M) for name in
                 ("__version__", "__commit_id__")]
        return " ".join(m.group(1) for m in found if m)
    git = subprocess.run(["git", "-C", vllm_src, "rev-parse", "HEAD"], capture_output=True,
                         text=True)
    return git.stdout.strip() or "unknown"


def inputs(M: int, N: int, dtype, special: bool):
    g = torch.Generator(device="cuda").manual_seed(M * 7 + N)
    x = torch.randn(M, N, device="cuda", dtype=dtype, generator=g) * 3
    r = torch.randn(M, N, device="cuda", dtype=dtype, generator=g)
    w = torch.rand(N, device="cuda", dtype=dtype, generator=g) + 0.5
    if special:  # a row of zeros, a NaN, an infinity, the largest finite values
        x[0] = 0
        x[1, 5] = float("nan")
        x[2, 7] = float("inf")
        x[3] = torch.finfo(dtype).max
        x[4, ::3] = -torch.finfo(dtype).max
    return x, r, w


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vllm-src", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--build-dir", default="/tmp/vllm_fp8_norms")
    args = ap.parse_args()
    ops = build(args.vllm_src, args.build_dir)
    log = open(args.out, "w")

    def say(line: str) -> None:
        print(line)
        print(line, file=log, flush=True)

    def compare(name: str, ours: torch.Tensor, theirs: torch.Tensor) -> None:
        steps = (fp8_order(ours) - fp8_order(theirs)).abs()
        say(f"  {name}: {int((steps > 0).sum())}/{steps.numel()} codes differ, "
            f"max {int(steps.max())} steps")

    say(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; lab {commit()}; "
        f"vLLM {vllm_version(args.vllm_src)}")
    for dtype in (torch.bfloat16, torch.float16):
        for M, N in SHAPES:
            say(f"{str(dtype).removeprefix('torch.')} {M}x{N}")
            for special in (False, True):
                x, r, w = inputs(M, N, dtype, special)
                rows = "special rows" if special else "random"
                s = torch.tensor([0.05], device="cuda")
                theirs = torch.empty(M, N, device="cuda", dtype=torch.float8_e4m3fn)
                ops.rms_norm_static_fp8_quant(theirs, x, w, s, EPS)
                for mode in ("llama", "gemma"):
                    for backend in ("cute", "triton"):
                        ours = rmsnorm_lab.rms_norm_fp8(x, w, EPS, scale=s, casting_mode=mode,
                                                        backend=backend)[0]
                        compare(f"{rows} static {mode} {backend}", ours, theirs)
                h_theirs = r.clone()
                ops.fused_add_rms_norm_static_fp8_quant(theirs, x, h_theirs, w, s, EPS)
                for mode in ("llama", "gemma"):
                    ours, _, h = rmsnorm_lab.rms_norm_fp8(x, w, EPS, scale=s, residual=r,
                                                          casting_mode=mode, backend="cute")
                    compare(f"{rows} static+add {mode} cute", ours, theirs)
                same = (h == h_theirs) | (h.isnan() & h_theirs.isnan())
                say(f"  {rows} static+add h equal (NaN to NaN): {bool(same.all())}")
                for bound in (None, torch.tensor([2.0], device="cuda")):
                    for residual in (None, r):
                        scales = torch.empty(M, 1, device="cuda")
                        ops.rms_norm_dynamic_per_token_quant(
                            theirs, x, w, scales, EPS, bound,
                            None if residual is None else residual.clone())
                        ours, our_scales = rmsnorm_lab.rms_norm_fp8(
                            x, w, EPS, scale_ub=bound, residual=residual, casting_mode="llama",
                            backend="cute")[:2]
                        compare(f"{rows} token{' ub' if bound is not None else ''}"
                                f"{' +add' if residual is not None else ''} llama cute", ours,
                                theirs)
                        off = our_scales.view(-1) != scales.view(-1)
                        say(f"    scales differ: {int(off.sum())}/{M}")


if __name__ == "__main__":
    main()
