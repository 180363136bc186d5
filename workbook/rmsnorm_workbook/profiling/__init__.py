"""Profiling the lab: the workload Nsight Systems captures (``workload``), reading its reports
(``nsys``: summaries; ``trace``: per-event traces) and a workload for compute-sanitizer
(``sanitize``)."""
