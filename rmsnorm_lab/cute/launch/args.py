"""What a backward step passes, argument by argument, as codes: the one definition of them.

A step (``launch.backward.Step``) lists its kernel's arguments as these codes; the Python launch
and the native node (native/native_node.cpp, built with the codes as ``RMSNORM_LAB_ARG_<NAME>``
macros by native/build.py) fill each from the same table. No CUTLASS import: the native build
reads this module.
"""

import enum


class Arg(enum.IntEnum):
    """A backward kernel's argument: a tensor of the call (up to ``DH``), or a scalar."""
    DY = 0
    X = 1
    W = 2
    RSTD = 3
    DX = 4
    PARTIALS = 5      # the fp32 rows of dW partials
    NO_PARTIALS = 6   # the stand-in for partials a kernel does not write
    DW = 7
    DH = 8            # the fused add's gradient at h
    COUNT = 9         # the step's integer (strips, or rows), a rule of M
    OFFSET = 10       # the weight's offset


#: the codes that name a tensor: ``Arg.DH`` is the last
TENSOR_ARGS = Arg.DH + 1


def build_macros():
    """``-DRMSNORM_LAB_ARG_<NAME>=<code>`` for every code: the native node's definitions."""
    return [f"-DRMSNORM_LAB_ARG_{a.name}={a.value}" for a in Arg]
