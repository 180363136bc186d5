"""A small workload for ``compute-sanitizer``: every forward variant at the shapes the GPU
checklist names, each launch checked against the reference.

    compute-sanitizer --tool memcheck python -m rmsnorm_lab.sanitize
    compute-sanitizer --tool racecheck python -m rmsnorm_lab.sanitize
"""

import sys

import torch

from . import reference, rms_norm, settings

# (3, 1023) only admits the fallback; (3, 1024) runs every variant on the same tiny grid.
SHAPES = [(3, 1023), (3, 1024), (133, 8192)]
VARIANTS = ["row", "persistent", "warp", "fallback"]


def main() -> int:
    failures = 0
    for M, N in SHAPES:
        x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(N, device="cuda", dtype=torch.bfloat16)
        expect = reference.rms_norm(x, w)
        for variant in VARIANTS:
            with settings.override(forward_variant=variant):
                try:
                    y = rms_norm(x, w, backend="cute")
                except ValueError as e:  # not eligible for this shape
                    print(f"{variant:>10} {M}x{N}: skipped ({e})")
                    continue
            torch.cuda.synchronize()
            ok = torch.allclose(y.float(), expect.float(), atol=0.05, rtol=0.02)
            failures += not ok
            print(f"{variant:>10} {M}x{N}: {'ok' if ok else 'MISMATCH'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
