"""From 2-D torch rows to a launch: the compile cache, the launch entries that hold a plan and
its compiled kernels, and the calls that run them on torch's current stream."""
