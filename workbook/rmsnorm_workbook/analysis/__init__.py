"""Across GPUs: the spec table (with sources), figures reported elsewhere, a bandwidth + host
overhead model calibrated on this lab's measurements, and the compiled-code table.

Every number this package hands out says what it is: ``measured`` (this lab's benchmark on a real
GPU, ``results/<gpu>/``), ``modelled`` (computed here from a measurement and a datasheet) or
``reported`` (quoted from elsewhere, ``results/reported/``, with its source).
"""

MEASURED, MODELLED, REPORTED = "measured", "modelled", "reported"
