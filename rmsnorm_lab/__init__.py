"""rmsnorm-lab: RMSNorm GPU kernels (CuTe DSL and Triton) that teach and measure the op.

    from rmsnorm_lab import rms_norm, RMSNorm, settings
    y = rms_norm(x, weight)                       # as F.rms_norm(x, (N,), weight), bit for bit
    y = rms_norm(x, (4096,), weight, 1e-6)        # torch's call shape works too
    y = rms_norm(x, weight, 1e-6, casting_mode="llama", backend="cute")  # HF Llama's rounding
    norm = RMSNorm(4096, device="cuda", dtype=torch.bfloat16)  # drop-in nn.RMSNorm
    y_q, scales = rms_norm_fp8(x, weight)          # float8_e4m3fn, per-token scales (inference)
    q, k = qk_norm_rope(q, k, q_weight, k_weight, cos, sin, 1e-6)  # Qwen3's q/k norms + RoPE
"""

__version__ = "0.1.0"

import sys as _sys

# The compile, plan and handle caches and the native call memo rely on the GIL to serialise
# their updates; a free-threaded interpreter would race them.
if not getattr(_sys, "_is_gil_enabled", lambda: True)():
    raise ImportError("rmsnorm_lab needs the GIL: its kernel caches and the native call memo are "
                      "not safe without it; run with PYTHON_GIL=1 (or -X gil=1) or a standard "
                      "(not free-threaded) build of CPython")

from .settings import settings  # noqa: E402
from .reference import CASTING_MODE_NAMES, CASTING_MODES  # noqa: E402
from .api import qk_norm_rope, rms_norm, rms_norm_fp8  # noqa: E402
from .module import FusedAddRMSNorm, RMSNorm  # noqa: E402
from .models import (carry_residual, fuse_qk_rope, patch, uncarry_residual,  # noqa: E402
                     unfuse_qk_rope, unpatch)

__all__ = ["rms_norm", "rms_norm_fp8", "qk_norm_rope", "RMSNorm", "FusedAddRMSNorm", "patch",
           "unpatch", "carry_residual", "uncarry_residual", "fuse_qk_rope", "unfuse_qk_rope",
           "settings", "CASTING_MODES", "CASTING_MODE_NAMES", "__version__"]
