"""Device-side pieces the kernels share: the tile mapping and copies (tiles.py), row reductions
(reduce.py), a CTA's strip of rows (strip.py), the staged kernels' rings in shared memory
(ring.py), the cluster exchanges through distributed shared memory (cluster_sum.py,
dw_cluster.py), and programmatic dependent launch (pdl.py)."""
