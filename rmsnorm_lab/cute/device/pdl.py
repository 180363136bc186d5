"""Programmatic dependent launch (PDL), the device side.

A kernel launched with ``use_pdl=True`` (programmatic stream serialization) may have CTAs
resident before the previous kernel on its stream has finished. Its first act must be
``griddepcontrol.wait``: it returns once the previous grid has completed and its writes are
visible, so nothing may touch global memory before it. ``griddepcontrol.launch_dependents`` then
lets the next PDL kernel's CTAs launch as soon as every CTA of this grid has issued it (or
exited), that is, while this grid's last CTAs drain. Which kernels launch this way is the plans'
decision (``plan.uses_pdl``).
"""

from __future__ import annotations

import cutlass.cute as cute


@cute.jit
def wait_for_previous_grid():
    """The prologue of a PDL kernel: wait for the previous grid, then release the next one."""
    cute.arch.griddepcontrol_wait()
    cute.arch.griddepcontrol_launch_dependents()
