"""Triton baselines: a row-per-program forward and a Liger-style backward (dW partials per program).

``forward.triton_rms_norm_forward`` and ``backward.triton_rms_norm_backward`` take 2-D ``(M, N)``
tensors and follow ``rmsnorm_lab.reference`` rounding point for rounding point.
"""
