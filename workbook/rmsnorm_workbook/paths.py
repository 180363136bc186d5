"""Where the workbook's files live: it runs from a checkout of rmsnorm-lab (this package sits in
its ``workbook/`` folder), whose ``results/``, ``profiles/`` and ``notebooks/`` it reads and
writes. Commands that read or write results take another place with ``--results``/``--out``."""

from pathlib import Path

#: the checkout's root: notebooks/, results/, profiles/ (and git, for provenance)
REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results"
PROFILES = REPO / "profiles"
NOTEBOOKS = REPO / "notebooks"
