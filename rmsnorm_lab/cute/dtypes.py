"""The element types the kernels take, torch's dtype to CuTe's: the one map the kernels and their
launchers share."""

import cutlass
import torch

TORCH_TO_CUTE = {
    torch.float32: cutlass.Float32,
    torch.bfloat16: cutlass.BFloat16,
    torch.float16: cutlass.Float16,
    torch.float8_e4m3fn: cutlass.Float8E4M3FN,  # the fp8 output's
}
