"""The CuTe DSL kernels, one class per kernel family: ``__call__`` is the host side (tensors with
static N, the launch), ``kernel`` the device body. Each is built from a plan (``cute.plan``)."""
