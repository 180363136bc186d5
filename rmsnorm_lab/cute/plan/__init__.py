"""Plans: what each kernel is compiled with (tile, chunks, strips, PDL), decided in plain Python
from the row width, dtypes and alignment. No CUTLASS import: plans are testable anywhere."""
