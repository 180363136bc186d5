r"""A small workload for ``compute-sanitizer``: every CuTe kernel at the shapes the GPU checklist
names, each launch checked against the reference.

    compute-sanitizer --tool memcheck --report-api-errors no \
        python -m rmsnorm_workbook.profiling.sanitize [fwd|bwd|fp8|qk]
    compute-sanitizer --tool racecheck python -m rmsnorm_workbook.profiling.sanitize [fwd|bwd|fp8|qk]

``--report-api-errors no``: the CUDA driver bindings look up entry points with cuGetProcAddress
while a kernel compiles, and memcheck counts each lookup the driver answers "invalid argument" as
an error, though no kernel is involved (dozens in one forward run).
Memory errors in the kernels are still reported.

Without a CUDA GPU it says so in one line and exits with status 2; 1 when a kernel's result
differs from the reference.
"""

import argparse
import sys

import torch

from rmsnorm_lab import qk_norm_rope, reference, rms_norm, rms_norm_fp8, settings
from rmsnorm_lab.lab import kernel_backward as backward
from rmsnorm_lab.lab import BACKWARD_MODES, FORWARD_VARIANTS

# (3, 1023) only admits the forward fallback; (3, 1024) runs every variant on the same tiny grid;
# (5, 32768): rows too wide for one CTA's registers (cluster, staged); (1001, 128): per-head
# rows, two tiles a CTA, the last CTA's second tile holding one row.
FWD_SHAPES = [(3, 1023), (3, 1024), (133, 8192), (5, 32768), (1001, 128)]
FWD_VARIANTS = list(FORWARD_VARIANTS)
# the fused add's forward: one tile a CTA, column chunks (its second pass re-reads h), and
# per-head rows (two tiles a CTA)
ADD_FWD_SHAPES = [(131, 4096), (5, 32768), (1001, 64)]
# (131, 4096) and (1001, 1024): the fused kernel's CTAs in pairs that sum dW in each other's
# shared memory, the odd row counts leaving CTAs without rows; (131, 16384): chunked fused with dW
# in shared memory, and a cluster of 4; (3, 32768): of 8
BWD_SHAPES = [(131, 4096), (1001, 1024), (1000, 8192), (131, 16384), (3, 32768)]
BWD_MODES = list(BACKWARD_MODES)
# the fused add's backward: fused and staged at one shape, split where the row is too wide
ADD_SHAPES = [(131, 4096), (5, 16384)]
# the fp8 output: the fallback's odd width, warp-per-row tiles of per-head rows with the last
# tile's second row missing, the row kernel at many rows, column chunks with the amax pass
FP8_SHAPES = [(3, 1023), (1001, 128), (4099, 4096), (5, 32768)]
# q/k norms + RoPE, (tokens, q heads, k heads, head dim): one token; an odd count whose last
# CTA's second tile is short; 96, whose rows leave lanes idle; fp32 rows of 256, both halves in
# one thread; and a token count the backward's programs split unevenly
QK_SHAPES = [(1, 32, 8, 128), (61, 5, 3, 128), (7, 4, 2, 96), (33, 8, 2, 256), (1001, 16, 4, 64)]


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a.float(), b.float(), atol=0.05, rtol=0.02)


def forward_cases() -> int:
    """Every forward variant at FWD_SHAPES, and the fused add's forward (h beside y) at
    ADD_FWD_SHAPES."""
    failures = 0
    cases = [(M, N, False) for M, N in FWD_SHAPES] + [(M, N, True) for M, N in ADD_FWD_SHAPES]
    for M, N, add in cases:
        x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        r = torch.randn(M, N, device="cuda", dtype=torch.bfloat16) if add else None
        h_ref = reference.add_residual(x, r) if add else x
        expect = reference.rms_norm(h_ref, w, 1e-6, 0.0, "llama")
        name = "fwd+add" if add else "fwd"
        for variant in FWD_VARIANTS:
            with settings.override(forward_variant=variant):
                try:
                    out = rms_norm(x, w, 1e-6, backend="cute", residual=r,
                                   casting_mode="llama")
                except ValueError as e:  # not eligible for this shape
                    print(f"{name} {variant:>10} {M}x{N}: skipped ({e})")
                    continue
            torch.cuda.synchronize()
            y, h = out if add else (out, None)
            ok = _close(y, expect) and (h is None or torch.equal(h, h_ref))
            failures += not ok
            print(f"{name} {variant:>10} {M}x{N}: {'ok' if ok else 'MISMATCH'}")
    return failures


def backward_cases() -> int:
    """Every backward mode at BWD_SHAPES, and the fused add's backward (dh joins dx) at
    ADD_SHAPES."""
    failures = 0
    cases = [(M, N, False) for M, N in BWD_SHAPES] + [(M, N, True) for M, N in ADD_SHAPES]
    for M, N, add in cases:
        x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        dh = torch.randn(M, N, device="cuda", dtype=torch.bfloat16) if add else None
        rstd = reference.rstd_of(x, 1e-6)
        dx_ref, dw_ref = reference.rms_norm_backward(dy, x, w, rstd, 0.0, "llama", dh=dh)
        name = "bwd+add" if add else "bwd"
        for mode in BWD_MODES:
            with settings.override(backward=mode):
                try:
                    dx, dw = backward(dy, x, w, rstd, 0.0, "llama", "cute", dh=dh)
                except ValueError as e:  # not eligible for this shape
                    print(f"{name} {mode:>10} {M}x{N}: skipped ({e})")
                    continue
            torch.cuda.synchronize()
            ok = _close(dx, dx_ref) and _close(dw, dw_ref)
            failures += not ok
            print(f"{name} {mode:>10} {M}x{N}: {'ok' if ok else 'MISMATCH'}")
    return failures


def _fp8_close(q: torch.Tensor, q_ref: torch.Tensor) -> bool:
    """fp8 codes at most one step apart (another fp32 sum order moves y by its last bit)."""
    return int((reference.fp8_order(q) - reference.fp8_order(q_ref)).abs().max()) <= 1


def fp8_cases() -> int:
    """``rms_norm_fp8`` on the CuTe path at FP8_SHAPES: per-token (bounded too) and static
    scales, with and without the residual, each against the reference within one fp8 step."""
    failures = 0
    for M, N in FP8_SHAPES:
        x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        r = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        bound = {"scale_ub": torch.tensor([3.0], device="cuda")}
        static = {"scale": torch.tensor([0.02], device="cuda")}
        for kind, kw in (("token", {}), ("bounded", bound), ("static", static)):
            for res in (None, r):
                out = rms_norm_fp8(x, w, 1e-6, residual=res, casting_mode="llama",
                                   backend="cute", **kw)
                torch.cuda.synchronize()
                ref = reference.rms_norm_fp8(x, w, 1e-6, 0.0, "llama", kw.get("scale"), res,
                                             kw.get("scale_ub"))
                ok = _fp8_close(out[0], ref[0]) and _close(out[1], ref[1])
                ok = ok and (res is None or torch.equal(out[2], ref[2]))
                failures += not ok
                name = "fp8+add" if res is not None else "fp8"
                print(f"{name} {kind:>8} {M}x{N}: {'ok' if ok else 'MISMATCH'}")
    return failures


def qk_cases() -> int:
    """``qk_norm_rope`` at QK_SHAPES, bf16 (fp32 at 256): the forward on the CuTe and Triton
    backends and the backward, each against the reference."""
    failures = 0
    for T, Hq, Hk, D in QK_SHAPES:
        dtype = torch.float32 if D == 256 else torch.bfloat16
        q = torch.randn(T, Hq, D, device="cuda", dtype=dtype, requires_grad=True)
        k = torch.randn(T, Hk, D, device="cuda", dtype=dtype, requires_grad=True)
        wq, wk = (torch.randn(D, device="cuda", dtype=dtype) for _ in range(2))
        cos, sin = (torch.rand(T, D, device="cuda", dtype=dtype) for _ in range(2))
        expect = reference.qk_norm_rope(q.detach(), k.detach(), wq, wk, cos, sin, 1e-6)
        for backend in ("cute", "triton"):
            out = qk_norm_rope(q, k, wq, wk, cos, sin, 1e-6, backend=backend)
            grads = torch.autograd.grad(out, (q, k), [torch.ones_like(t) for t in out])
            torch.cuda.synchronize()
            ok = all(_close(a, b) for a, b in zip(out, expect))
            ok = ok and all(bool(g.isfinite().all()) for g in grads)
            failures += not ok
            print(f"qk {backend:>6} {T}x{Hq}+{Hk}x{D}: {'ok' if ok else 'MISMATCH'}")
    return failures


COMMAND = "python -m rmsnorm_workbook.profiling.sanitize"
#: the workload's parts, by the name the command takes, in the order they run
CASES = {"fwd": forward_cases, "bwd": backward_cases, "fp8": fp8_cases, "qk": qk_cases}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog=COMMAND, description="A workload for compute-sanitizer: every CuTe kernel at the "
        "shapes the GPU checklist names, each launch checked against the reference.")
    ap.add_argument("ops", nargs="*", metavar="|".join(CASES),
                    help="the ops to run (default: all)")
    ops = ap.parse_args(argv).ops or list(CASES)
    unknown = sorted(set(ops) - set(CASES))
    if unknown:
        ap.error(f"unknown op {', '.join(unknown)} (choose from {', '.join(CASES)})")
    if not torch.cuda.is_available():
        print(f"error: {COMMAND} needs a CUDA GPU (torch.cuda.is_available() is False here), and "
              "is meant to run under compute-sanitizer: compute-sanitizer --tool memcheck "
              f"--report-api-errors no {COMMAND}", file=sys.stderr)
        return 2
    failures = sum(cases() for name, cases in CASES.items() if name in ops)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
