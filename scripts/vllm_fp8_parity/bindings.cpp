// The three fp8 norms of vLLM's csrc, registered as torch.ops.vllm_fp8_norms for parity.py.
// The kernels take torch's stable-ABI tensors (torch::stable::Tensor), so they are registered as
// vLLM registers them (STABLE_TORCH_LIBRARY, TORCH_BOX); the declarations must match the
// definitions in csrc/layernorm_quant_kernels.cu and
// csrc/quantization/fused_kernels/fused_layernorm_dynamic_per_token_quant.cu exactly, or loading
// fails with an undefined symbol. Compiled with the same -D flags as those files (parity.py).

#include <optional>

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>

// csrc/layernorm_quant_kernels.cu
void rms_norm_static_fp8_quant(torch::stable::Tensor& out,
                               torch::stable::Tensor& input,
                               torch::stable::Tensor& weight,
                               torch::stable::Tensor& scale, double epsilon);

void fused_add_rms_norm_static_fp8_quant(torch::stable::Tensor& out,
                                         torch::stable::Tensor& input,
                                         torch::stable::Tensor& residual,
                                         torch::stable::Tensor& weight,
                                         torch::stable::Tensor& scale,
                                         double epsilon);

// csrc/quantization/fused_kernels/fused_layernorm_dynamic_per_token_quant.cu
void rms_norm_dynamic_per_token_quant(
    torch::stable::Tensor& out, torch::stable::Tensor const& input,
    torch::stable::Tensor const& weight, torch::stable::Tensor& scales,
    double const var_epsilon, std::optional<torch::stable::Tensor> scale_ub,
    std::optional<torch::stable::Tensor> residual);

// The schemas of vLLM's csrc/torch_bindings.cpp ("Tensor!": written in place).
STABLE_TORCH_LIBRARY(vllm_fp8_norms, m) {
  m.def(
      "rms_norm_static_fp8_quant(Tensor! result, Tensor input, Tensor weight, "
      "Tensor scale, float epsilon) -> ()");
  m.def(
      "fused_add_rms_norm_static_fp8_quant(Tensor! result, Tensor input, "
      "Tensor! residual, Tensor weight, Tensor scale, float epsilon) -> ()");
  m.def(
      "rms_norm_dynamic_per_token_quant(Tensor! result, Tensor input, "
      "Tensor weight, Tensor! scale, float epsilon, "
      "Tensor? scale_ub, Tensor!? residual) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(vllm_fp8_norms, CUDA, m) {
  m.impl("rms_norm_static_fp8_quant", TORCH_BOX(&rms_norm_static_fp8_quant));
  m.impl("fused_add_rms_norm_static_fp8_quant",
         TORCH_BOX(&fused_add_rms_norm_static_fp8_quant));
  m.impl("rms_norm_dynamic_per_token_quant",
         TORCH_BOX(&rms_norm_dynamic_per_token_quant));
}
