"""rmsnorm-lab's workbook: the benchmarks, the lessons' helpers, profiling and the report that
measure and teach the ``rmsnorm_lab`` kernels. It reads the library through its public names
(``rmsnorm_lab``, ``rmsnorm_lab.reference``, ``rmsnorm_lab.settings`` and ``rmsnorm_lab.lab``);
the library never imports it.

    python -m rmsnorm_lab report      # (or python -m rmsnorm_workbook report)
"""

from rmsnorm_lab import __version__  # noqa: F401  (one version for both packages)
