"""Device-side pieces the kernels share: the tile mapping and copies, row reductions, the
cluster exchanges through distributed shared memory, and programmatic dependent launch."""
