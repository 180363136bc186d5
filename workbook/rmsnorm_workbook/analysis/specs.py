"""Datasheet figures of the GPUs the lab compares, each with the vendor page it came from.

Adding a GPU is adding files: run the benchmarks on it (``python -m rmsnorm_lab bench --op fwd``,
``--op bwd``, ``--op full``, ``--op host``), which write ``results/<slug>/*.csv`` with the slug
``results.provenance.gpu_slug`` makes of the device name; then add its ``GPUSpec`` below under
that slug, with the datasheet's bandwidth and the page it came from (SMs, L2 and clock with
theirs, its colour in figures, and whether the cross-GPU model draws it). Every notebook and the
report pick both up; nothing else names a GPU.

``measured_copy_bandwidth`` reads the copy ceiling that the lab's own benchmark measured on a GPU
(``impl`` ``copy``: an SM kernel reading 1 GiB and writing 1 GiB, CUDA-graph replay): every run
measures its own, and the one that stands for the GPU is the forward run's that the forward's
"% of copy" table holds most rows against (``copy_run``), so a ratio to it quoted anywhere is the
table's. The ratio measured / datasheet is what the model in ``model.py`` carries from one GPU to
another.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional

import pandas as pd


@dataclasses.dataclass(frozen=True)
class GPUSpec:
    key: str                  # the results-directory slug (results/<key>/)
    name: str
    compute_capability: str
    arch: str                 # the CuTe DSL target (CUTE_DSL_ARCH)
    memory: str
    memory_bandwidth_tbps: float   # datasheet, TB/s (10^12 bytes/s)
    sms: int
    l2_mib: float
    boost_clock_mhz: int
    source: str               # the vendor datasheet/whitepaper for the bandwidth
    detail_source: str        # where SMs, L2 and clock come from
    note: str = ""
    #: peak FP32 throughput without tensor cores (TFLOP/s): the compute roof of an op like
    #: RMSNorm, which runs on the CUDA cores; from ``fp32_source``
    fp32_tflops: float = float("nan")
    fp32_source: str = ""
    #: its colour wherever a figure tells GPUs apart (Okabe-Ito)
    colour: str = "#999999"
    #: drawn by the cross-GPU model's figures and tables (``model.MODEL_GPUS``)
    modelled: bool = False

    @property
    def bandwidth_gbps(self) -> float:
        return self.memory_bandwidth_tbps * 1000.0

    @property
    def ridge_flop_per_byte(self) -> float:
        """The arithmetic intensity at which the FP32 roof meets the bandwidth roof: an op of
        lower intensity cannot be limited by arithmetic on this GPU."""
        return self.fp32_tflops * 1e12 / (self.memory_bandwidth_tbps * 1e12)


_H100_WP = "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper"
SPECS: Dict[str, GPUSpec] = {s.key: s for s in (
    GPUSpec("h100_sxm", "H100 SXM5 80GB", "9.0", "sm_90a", "80 GB HBM3", 3.35, 132, 50, 1980,
            "https://www.nvidia.com/en-us/data-center/h100/", _H100_WP,
            "SMs, L2 and boost clock from the Hopper whitepaper's H100 SXM5 column",
            67.0, "https://www.nvidia.com/en-us/data-center/h100/", "#E69F00", True),
    GPUSpec("h100_pcie", "H100 PCIe 80GB", "9.0", "sm_90a", "80 GB HBM2e", 2.0, 114, 50, 1755,
            "https://www.nvidia.com/en-us/data-center/h100/", _H100_WP,
            "SMs, L2 and boost clock from the Hopper whitepaper's H100 PCIe column",
            51.0, "https://www.nvidia.com/en-us/data-center/h100/", "#D55E00"),
    GPUSpec("h200", "H200 SXM 141GB", "9.0", "sm_90a", "141 GB HBM3e", 4.8, 132, 50, 1980,
            "https://www.nvidia.com/en-us/data-center/h200/", _H100_WP,
            "same GH100 die as H100 SXM5 (SMs, L2, clock from the Hopper whitepaper); "
            "the lab's results record 132 SMs",
            67.0, "https://www.nvidia.com/en-us/data-center/h200/", "#0072B2", True),
    GPUSpec("b200", "B200 (HGX B200)", "10.0", "sm_100a", "180 GB HBM3e", 8.0, 148, 126, 1965,
            "https://www.nvidia.com/en-us/data-center/hgx/",
            "https://resources.nvidia.com/en-us-blackwell-architecture",
            "bandwidth per GPU from the HGX B200 datasheet (64 TB/s for 8 GPUs); SMs, L2 and "
            "clock are NOT datasheet figures (the datasheet gives none): commonly reported "
            "device-query values, treat as approximate; FP32 from the HGX B200 column of "
            "NVIDIA's per-GPU Blackwell specifications",
            75.0, "https://www.nvidia.com/en-us/data-center/hgx/", "#009E73", True),
)}

#: other names a caller may use for a spec (results directories use the keys themselves)
ALIASES = {"h100": "h100_sxm"}


def spec(gpu: str) -> GPUSpec:
    """The spec of ``gpu`` (a results slug such as ``h200``, or an alias such as ``h100``)."""
    if not has_spec(gpu):
        raise KeyError(f"no spec for GPU {gpu!r}; known: {sorted(SPECS)}")
    return SPECS[_key(gpu)]


def has_spec(gpu: str) -> bool:
    """Is there a datasheet for ``gpu`` (a results slug or an alias)?"""
    return _key(gpu) in SPECS


def _key(gpu: str) -> str:
    return ALIASES.get(gpu.lower(), gpu.lower())


def spec_table() -> pd.DataFrame:
    """The spec table, one row per GPU, with its sources."""
    rows = [{"gpu": s.key, "name": s.name, "cc": s.compute_capability, "arch": s.arch,
             "memory": s.memory, "bandwidth TB/s": s.memory_bandwidth_tbps,
             "FP32 TFLOP/s": s.fp32_tflops, "ridge FLOP/B": s.ridge_flop_per_byte, "SMs": s.sms,
             "L2 MiB": s.l2_mib, "boost MHz": s.boost_clock_mhz, "source": s.source,
             "detail source": s.detail_source, "note": s.note} for s in SPECS.values()]
    return pd.DataFrame(rows).set_index("gpu")


#: the op whose runs hold their kernels against each ceiling (``tables.CEILING_OF_OP``)
OP_OF_CEILING = {"copy": "fwd", "copy2r1w": "bwd"}


def copy_run(df: pd.DataFrame, gpu: str, ceiling: str = "copy") -> Optional[pd.Series]:
    """The row of ``ceiling`` measured on ``gpu`` that stands for the GPU: the one measured in
    the run of the op it bounds (``OP_OF_CEILING``) that measured most of that op's rows
    (``tables.ceiling_run``), so the same ceiling most of the op's "% of copy" cells are held
    against; its ``timestamp`` and ``commit`` name the run. None where never measured."""
    from .tables import ceiling_run

    if df is None or df.empty or gpu not in set(df["gpu"]):
        return None
    return ceiling_run(df, OP_OF_CEILING.get(ceiling, "fwd"), gpu)


def measured_copy_bandwidth(df: pd.DataFrame, gpu: str, ceiling: str = "copy",
                            run: Optional[str] = None) -> Optional[float]:
    """Median GB/s of the ``ceiling`` (``copy``: 1 read + 1 write; ``copy2r1w``) that the lab's
    benchmark measured on ``gpu`` by CUDA-graph replay: with ``run`` (a ``timestamp``), the one
    measured in that run, to hold that run's rows against; without, ``copy_run``'s. None where
    not measured."""
    if df is None or df.empty:
        return None
    if run is None:
        row = copy_run(df, gpu, ceiling)
        return None if row is None else float(row["p50"])
    d = df[(df["gpu"] == gpu) & (df["impl"] == ceiling) & (df["metric"] == "bandwidth")
           & (df["path"] == "graph") & (df["timestamp"] == run)]
    return float(d["p50"].iloc[-1]) if len(d) else None


def bandwidth_table(df: pd.DataFrame) -> pd.DataFrame:
    """Datasheet vs measured copy bandwidth per GPU (measured only where the lab has run), with
    the run the copy comes from (``copy_run``: the op, commit and date)."""
    rows = []
    for s in SPECS.values():
        row = copy_run(df, s.key)
        copy = None if row is None else float(row["p50"])
        where = (f"{row['op']} run {str(row.get('commit', ''))[:7]} "
                 f"({str(row['timestamp'])[:10]})" if row is not None else None)
        rows.append({"gpu": s.key, "datasheet GB/s": s.bandwidth_gbps,
                     "measured copy GB/s": copy,
                     "copy % of datasheet": 100 * copy / s.bandwidth_gbps if copy else None,
                     "copy measured in": where,
                     "kind": "measured" if copy else "datasheet only"})
    return pd.DataFrame(rows).set_index("gpu")
