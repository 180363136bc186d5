"""The CuTe DSL kernels and everything that takes a call to them, by role:

``plan/``     what each kernel is compiled with, decided in plain Python from the row width, the
              dtypes and the alignment (no CUTLASS import): ``plan_forward``, ``plan_backward``
              and their siblings, ``auto``'s choices, and the rules by which grids and strip
              counts follow the row count.
``kernels/``  the kernel classes, one per family, read like the CUTLASS examples: ``__call__``
              is the host side (tensors with a static N, the launch), ``kernel`` the device body.
``device/``   the device-side pieces the kernels share: the tile mapping and its copies, row
              reductions, the exchanges across a thread-block cluster, programmatic dependent
              launch.
``launch/``   from 2-D torch rows to a launch: the compile cache, ``forward_launch`` and
              ``backward_launch`` (the planning entries the Python path and the native node
              both launch from), the backward's argument codes.
``dtypes.py`` torch's dtype to CuTe's; ``inspect_ptx.py`` reads the compiled code.

The words the kernels use:

copy / vec    one 16-byte load or store; ``vec`` elements of x's dtype (8 bf16, 4 fp32). The
              fallback moves one element a copy.
tile          the rows one CTA works on at once (``rows_per_cta``) by the columns its threads
              cover in one pass (``cols_per_tile``): thread c of a row owns, in column block k,
              the ``vec`` elements at ``(k * threads_per_row + c) * vec``.
chunk         a tile's columns when a row is wider than the registers: the row streams through
              them chunk by chunk, and the second pass re-reads all but the last (from L2).
pass          pass 1 sums the squares of a row; pass 2 normalizes, scales and stores it.
strip         a contiguous run of rows one CTA (or cluster) walks, balanced to within a row
              (``plan.backward.strip_bounds``, ``device.tiles.strip_rows``); the fused backward
              keeps its dW accumulator across its strip and writes one row of dW partials.
partial rows  fp32 rows of dW, one a strip (or row group of the split dW kernel), summed by
              the ``dw_reduce`` kernel: no atomics, so dW is bitwise reproducible.
row class     ``auto``'s only view of the row count: many rows, few, or fewest.
slot          one of the two shared-memory buffers a CTA's row sum alternates between, so a row's
              sum never waits for the previous row's readers.
stage / ring  the staged kernels copy the next rows of a strip into shared memory with
              ``cp.async``, ``stages`` rows at a time, in a ring of stages.
cluster       a thread-block cluster: its CTAs share a row too wide for one (the ``cluster``
              variant and mode), or sum their strips' dW rows (``dw_cluster``), through
              distributed shared memory.
PDL           programmatic dependent launch: a kernel's CTAs start while the previous kernel
              drains; ``griddepcontrol.wait`` comes before any global access.
plan / launch a plan is what a kernel is compiled with; a launch is a plan with its compiled
              kernel, its grid as a rule of M and the stand-ins for absent tensors.
variant/mode  a forward kernel (``row``, ``warp``, ...) / a backward's way (``fused``,
              ``split``, ...), each named once in ``rmsnorm_lab.registry``.
quant         a forward plan that writes y for the GEMM that reads it: fp8 with a static scale or a
              scale a row (``token``), or NVFP4 (e2m1 values, an e4m3 scale a ``block`` of 16).
"""
