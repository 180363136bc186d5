"""Fused vs split backward, numerically: how far apart their dx and dw are, and how far each is
from a float64 oracle, per dtype and shape, on one GPU.

    python -m rmsnorm_workbook.bench.agreement [--out results/<gpu>/numerics/fused-vs-split.jsonl]

Both paths compute dx row by row with the same thread mapping and the same row-sum order, so dx
is expected to match bit for bit; dW sums the same products in a different grouping (strips of
contiguous rows vs row groups of the split dW kernel), so dW may differ in its last bits. y is not
compared: the forward is the same kernel either way.

The table is not a timing result, so it is not a results CSV: one JSON object per row (JSON lines,
below ``<gpu>/numerics/``), carrying the same provenance fields as every results row.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Dict, List

import torch

from rmsnorm_lab import reference
from .. import results as results_io
from ..results import provenance

SHAPES = [(131, 4096), (4096, 4096), (16384, 4096), (1000, 8192), (16384, 1024), (16384, 2048)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
COLUMNS = ["M", "N", "dtype", "casting_mode",
           "dx_bitwise_equal", "dx_max_abs_diff", "dw_bitwise_equal", "dw_max_abs_diff",
           "dw_rel_diff", "dx_rel_err_fused", "dx_rel_err_split", "dw_rel_err_fused",
           "dw_rel_err_split"]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def _equal_fraction(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a == b).double().mean().item()


def compare(M: int, N: int, dtype: torch.dtype, casting_mode: str = "llama",
            seed: int = 0) -> Dict[str, object]:
    """One row of the table: fused and split on the same fresh inputs and the same rstd."""
    from rmsnorm_lab.lab import cute_backward as backward
    from rmsnorm_lab.lab import sm_count

    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, N, device="cuda", generator=g).to(dtype)
    dy = torch.randn(M, N, device="cuda", generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(N, device="cuda", generator=g)).to(dtype)
    rstd = reference.rstd_of(x, 1e-6).reshape(M)
    sms = sm_count(x.get_device())
    f_dx, f_dw = backward(dy, x, w, rstd, 0.0, casting_mode, "fused", sms)
    s_dx, s_dw = backward(dy, x, w, rstd, 0.0, casting_mode, "split", sms)
    # the oracle: the same formula and rstd, every step in float64
    o_dx, o_dw = reference.rms_norm_backward(dy.double(), x.double(), w.double(),
                                             rstd.double(), 0.0, "gemma")
    return {
        "M": M, "N": N, "dtype": str(dtype).replace("torch.", ""), "casting_mode": casting_mode,
        "dx_bitwise_equal": _equal_fraction(f_dx, s_dx),
        "dx_max_abs_diff": (f_dx.double() - s_dx.double()).abs().max().item(),
        "dw_bitwise_equal": _equal_fraction(f_dw, s_dw),
        "dw_max_abs_diff": (f_dw.double() - s_dw.double()).abs().max().item(),
        "dw_rel_diff": _rel(f_dw, s_dw),
        "dx_rel_err_fused": _rel(f_dx, o_dx), "dx_rel_err_split": _rel(s_dx, o_dx),
        "dw_rel_err_fused": _rel(f_dw, o_dw), "dw_rel_err_split": _rel(s_dw, o_dw),
    }


def run(shapes=SHAPES, dtypes=DTYPES) -> List[Dict[str, object]]:
    prov = provenance.collect()
    rows = []
    for dtype in dtypes:
        for M, N in shapes:
            row = dict(prov)
            row.update(compare(M, N, dtype))
            rows.append(row)
            torch.cuda.empty_cache()
    return rows


def write(rows: List[Dict[str, object]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="output path (default results/<gpu>/numerics/fused-vs-split.jsonl)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU; the recorded table is results/<gpu>/numerics/fused-vs-split.jsonl")
        return 2
    rows = run()
    out = args.out or (results_io.results_dir() / str(rows[0]["gpu"]) / "numerics"
                       / "fused-vs-split.jsonl")
    print(f"wrote {len(rows)} rows to {write(rows, out)}")
    for r in rows:
        print(" ".join(f"{k}={r[k]:.3g}" if isinstance(r[k], float) else f"{k}={r[k]}"
                       for k in COLUMNS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
