"""NVTX ranges of the ``rmsnorm_lab`` domain, visible in ``nsys profile -t cuda,nvtx``.

Ranges: ``compile``, ``marshal``, ``launch`` and ``reduce`` (the dW partial reduction), each named
with the kernel variant and shape (``launch row 128x4096``) and coloured as the registry says.
With NVTX off (``on``: the call's snapshot of ``settings.nvtx``; None reads the setting), ``range``
returns one shared no-op context manager: the disabled cost is a call and a test
(notebooks/03_host_overhead.ipynb measures it).
"""

from __future__ import annotations

import contextlib

from ..registry import nvtx_argb
from ..settings import settings

DOMAIN = "rmsnorm_lab"
_OFF = contextlib.nullcontext()


def range(stage: str, impl: str, shape=None, on=None):  # noqa: A001 - reads as nvtx.range(...)
    if not (settings.nvtx if on is None else on):
        return _OFF
    import nvtx
    text = f"{stage} {impl}" if shape is None else f"{stage} {impl} {'x'.join(map(str, shape))}"
    return nvtx.annotate(text, color=nvtx_argb(impl), domain=DOMAIN)
