"""Benchmark harness: timers (``timing``), peers and ceilings (``peers``), the sweep (``runner``),
the host benchmark (``host``) and its instruments (``instruments``: the launch paths of
``launch_paths``, the tensor-cache cap, the settings parsed per call).

    from rmsnorm_workbook.bench import bench
    outcome = bench("fwd", quick=True)      # writes results/<gpu>/fwd-quick.csv
"""

from .runner import FWD_SWEEP, OPS, Op, Outcome, bench
from .timing import Quantiles, eager_time_us, graph_time_us, host_time_us, peak_mem_mib

__all__ = ["bench", "OPS", "Op", "Outcome", "FWD_SWEEP", "Quantiles", "eager_time_us",
           "graph_time_us", "host_time_us", "peak_mem_mib"]
