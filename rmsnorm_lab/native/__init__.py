"""The native autograd node: a C++ extension (``native_node.cpp``, ``ffi.h``) that launches the
CuTe kernels and keeps rms_norm's tape in C++, its build (``build``), and the Python side that
decides what it launches and memoizes that per call (``launch``)."""
