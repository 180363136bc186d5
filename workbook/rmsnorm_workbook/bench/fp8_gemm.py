"""What the fp8 output buys downstream: the norm feeding one Llama-sized projection through
``torch._scaled_mm`` with row-wise scales (Hopper's scaled fp8 GEMM), against the same GEMM fed by
the bf16 norm and a separate quantization, and the bf16 norm and bf16 GEMM; and the error of each
fp8 chain's output against the bf16 chain's.

    python -m rmsnorm_workbook.bench.fp8_gemm [--out DIR]

Chains (``impl``), at each token count M of ``TOKENS``, x (M, K) bf16 through a weight (N, K):
* ``cute.auto+fp8+scaled_mm``: ``rms_norm_fp8`` (per-token scales), then ``_scaled_mm``;
* ``cute.auto+fp8.unfused+scaled_mm``: ``rms_norm`` (bf16), ``reference.quantize_fp8`` in torch's
  eager ops, then ``_scaled_mm``;
* ``cute.auto+bf16+mm``: ``rms_norm`` (bf16), then a bf16 GEMM.
The weight is quantized once, outside the timed region, per output channel (``weight_fp8``).
Writes ``<out>/<gpu>/fwd-fp8-gemm.csv`` (op ``fwd``, graph-replay time of each chain, N the
norm's width K) and ``<out>/<gpu>/logs/fp8-gemm-error.json``: per fp8 chain and M, the output's
relative error against the bf16 chain, over the whole output and in its worst row.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch

from rmsnorm_lab import reference, rms_norm, rms_norm_fp8

from .. import results as results_io
from ..results import provenance

EPS = 1e-6
MODE = "llama"
#: Llama 3 8B's MLP up-projection: hidden 4096 to 14336
K, N = 4096, 14336
#: decode, a small batch, prefill chunks
TOKENS: Sequence[int] = (16, 128, 1024, 8192)
#: the chains' names (``impl``), in the order shown
FUSED = "cute.auto+fp8+scaled_mm"
UNFUSED = "cute.auto+fp8.unfused+scaled_mm"
BF16 = "cute.auto+bf16+mm"
CHAINS: Sequence[str] = (FUSED, UNFUSED, BF16)


def error_log(root: Path, gpu: str) -> Path:
    """Where a run under results root ``root`` on ``gpu`` writes its chains' output errors."""
    return root / gpu / "logs" / "fp8-gemm-error.json"


def weight_fp8(w: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(w_q, scales)`` of an (N, K) weight quantized per output channel (row): scales fp32
    ``(N,)`` = the row's amax over 448, ``w ~ w_q * scales[:, None]``."""
    return reference.quantize_fp8(w)


def scaled_mm(y_q: torch.Tensor, y_scales: torch.Tensor, w_q: torch.Tensor,
              w_scales: torch.Tensor) -> torch.Tensor:
    """``y @ w.T`` in bf16 from fp8 operands with row-wise scales (a's (M, 1), b's (1, N))."""
    return torch._scaled_mm(y_q, w_q.t(), scale_a=y_scales.reshape(-1, 1),
                            scale_b=w_scales.reshape(1, -1), out_dtype=torch.bfloat16)


def chains(norm_w: torch.Tensor, w: torch.Tensor) -> Dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """The chains by name, each ``fn(x) -> out`` (M, N) bf16, for the norm weight ``norm_w`` and
    the projection ``w`` (N, K)."""
    w_q, w_scales = weight_fp8(w)

    def fused(x):
        y_q, s = rms_norm_fp8(x, norm_w, EPS, casting_mode=MODE)
        return scaled_mm(y_q, s, w_q, w_scales)

    def unfused(x):
        y_q, s = reference.quantize_fp8(rms_norm(x, norm_w, EPS, casting_mode=MODE))
        return scaled_mm(y_q, s, w_q, w_scales)

    def bf16(x):
        return rms_norm(x, norm_w, EPS, casting_mode=MODE) @ w.t()

    return {FUSED: fused, UNFUSED: unfused, BF16: bf16}


def relative_errors(out: torch.Tensor, expect: torch.Tensor) -> Dict[str, float]:
    """The Frobenius norm of ``out - expect`` over ``expect``'s, for the whole output and for its
    worst row."""
    diff, e = (out.float() - expect.float()), expect.float()
    rows = diff.norm(dim=-1) / e.norm(dim=-1).clamp_min(1e-30)
    return {"all": float(diff.norm() / e.norm().clamp_min(1e-30)), "worst_row": float(rows.max())}


def run(out: Optional[Path] = None, tokens: Sequence[int] = TOKENS) -> Tuple[Path, Path]:
    from .timing import graph_time_us
    from .runner import make_row

    torch.manual_seed(0)
    prov = provenance.collect()
    norm_w = (1 + 0.1 * torch.randn(K, device="cuda")).to(torch.bfloat16)
    w = (torch.randn(N, K, device="cuda") / K ** 0.5).to(torch.bfloat16)
    fns = chains(norm_w, w)
    rows, errors = [], {}
    for M in tokens:
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        expect = fns[BF16](x)
        for name, fn in fns.items():
            if name != BF16:
                errors.setdefault(name, {})[M] = relative_errors(fn(x), expect)
            t = graph_time_us(lambda fn=fn: fn(x), replays=50)
            rows.append(make_row(prov, "fwd", name, "graph", M, K, torch.bfloat16, "time", t))
    root = Path(out) if out is not None else results_io.results_dir()
    csv = results_io.write(rows, root / prov["gpu"] / "fwd-fp8-gemm.csv")
    log = error_log(root, prov["gpu"])
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(json.dumps({"provenance": prov, "K": K, "N": N, "errors": errors}, indent=1))
    return csv, log


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rmsnorm_workbook.bench.fp8_gemm",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="results root (default: results/)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: the fp8 GEMM chains need a CUDA GPU with fp8 (Hopper or later)",
              file=sys.stderr)
        return 2
    for path in run(args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
