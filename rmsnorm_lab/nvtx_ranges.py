"""NVTX ranges of the ``rmsnorm_lab`` domain, visible in ``nsys profile -t cuda,nvtx``.

Ranges: ``compile``, ``marshal``, ``launch`` and ``reduce`` (the dW partial reduction), each named
with the implementation and shape (``launch row 128x4096``) and coloured per implementation.
With ``settings.nvtx`` off, ``range`` returns one shared no-op context manager: the disabled cost
is an attribute load and a call, measured in notebooks/03_host_overhead.ipynb.
"""

from __future__ import annotations

import contextlib

from .settings import settings

DOMAIN = "rmsnorm_lab"
COLORS = {"row": "blue", "persistent": "purple", "warp": "green", "fallback": "red",
          "fused": "orange", "split": "yellow", "triton": "cyan"}
_OFF = contextlib.nullcontext()


def range(stage: str, impl: str, shape=None):  # noqa: A001 - reads as nvtx_ranges.range(...)
    if not settings.nvtx:
        return _OFF
    import nvtx
    text = f"{stage} {impl}" if shape is None else f"{stage} {impl} {'x'.join(map(str, shape))}"
    return nvtx.annotate(text, color=COLORS.get(impl, "white"), domain=DOMAIN)
