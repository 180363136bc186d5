// The C-level pieces the native node calls kernels with: NVTX ranges, DLTensor views of torch
// tensors, TVM-FFI's C ABI (arguments, calls, errors, the environment stream) and a reference-
// holding function handle. Included by native_node.cpp only.
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <string>
#include <utility>

#include <tvm/ffi/c_api.h>
#include <tvm/ffi/extra/c_env_api.h>

#if defined(RMSNORM_LAB_NVTX)
#include <nvtx3/nvToolsExt.h>
#endif

namespace rmsnorm_lab {

// ------------------------------------------------------------------------------- NVTX ranges
// The ranges of rmsnorm_lab/common/nvtx.py: domain rmsnorm_lab, "<stage> <name> <M>x<N>", in the
// colour the registry gives. Built only while settings.nvtx is on (the flag rides with each
// launch), so the disabled cost is one branch.
class Range {
 public:
  Range(bool on, const char* stage, const std::string& name, uint32_t argb, int64_t m,
        int64_t n) {
#if defined(RMSNORM_LAB_NVTX)
    if (!on) return;
    static nvtxDomainHandle_t domain = nvtxDomainCreateA("rmsnorm_lab");
    domain_ = domain;
    std::string text = std::string(stage) + " " + name + " " + std::to_string(m) + "x" +
                       std::to_string(n);
    nvtxEventAttributes_t a = {};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.colorType = NVTX_COLOR_ARGB;
    a.color = argb;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = text.c_str();
    nvtxDomainRangePushEx(domain_, &a);
#else
    (void)on, (void)stage, (void)name, (void)argb, (void)m, (void)n;
#endif
  }
  ~Range() {
#if defined(RMSNORM_LAB_NVTX)
    if (domain_ != nullptr) nvtxDomainRangePop(domain_);
#endif
  }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
#if defined(RMSNORM_LAB_NVTX)
  nvtxDomainHandle_t domain_ = nullptr;
#endif
};

// ------------------------------------------------------------------------------- TVM-FFI calls

inline DLDataType dl_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return {kDLFloat, 32, 1};
    case at::kHalf: return {kDLFloat, 16, 1};
    case at::kBFloat16: return {kDLBfloat, 16, 1};
    default: TORCH_CHECK(false, "rmsnorm_lab native node: unsupported dtype ", t);
  }
}

// A DLTensor describing `t` without copying: valid while `t` lives (shape and strides point
// into the tensor's own metadata).
inline DLTensor dl_view(const at::Tensor& t) {
  DLTensor d;
  d.data = t.data_ptr();
  d.device = {t.is_cuda() ? kDLCUDA : kDLCPU, t.is_cuda() ? t.get_device() : 0};
  d.ndim = static_cast<int32_t>(t.dim());
  d.dtype = dl_dtype(t.scalar_type());
  d.shape = const_cast<int64_t*>(t.sizes().data());
  d.strides = const_cast<int64_t*>(t.strides().data());
  d.byte_offset = 0;
  return d;
}

inline TVMFFIAny any_of(int32_t type_index) {
  TVMFFIAny a;
  a.type_index = type_index;
  a.zero_padding = 0;
  a.v_int64 = 0;
  return a;
}

inline TVMFFIAny any_tensor(DLTensor* t) {
  TVMFFIAny a = any_of(kTVMFFIDLTensorPtr);
  a.v_ptr = t;
  return a;
}

inline TVMFFIAny any_int(int64_t v) {
  TVMFFIAny a = any_of(kTVMFFIInt);
  a.v_int64 = v;
  return a;
}

inline TVMFFIAny any_float(double v) {
  TVMFFIAny a = any_of(kTVMFFIFloat);
  a.v_float64 = v;
  return a;
}

[[noreturn]] inline void raise_ffi_error() {
  TVMFFIObjectHandle err = nullptr;
  TVMFFIErrorMoveFromRaised(&err);
  std::string msg = "rmsnorm_lab native node: kernel call failed";
  if (err != nullptr) {
    const TVMFFIErrorCell* cell = TVMFFIErrorGetCellPtr(err);
    msg += ": " + std::string(cell->kind.data, cell->kind.size) + ": " +
           std::string(cell->message.data, cell->message.size);
    TVMFFIObjectDecRef(err);
  }
  TORCH_CHECK(false, msg);
}

// For its lifetime, torch's current stream of `on`'s device is TVM-FFI's environment stream
// (where the kernels launch, as the Python binding arranges per call); the previous one is put
// back on exit. One per forward or backward: their two or three kernel calls share the lookup.
class EnvStream {
 public:
  explicit EnvStream(const at::Tensor& on) : cuda_(on.is_cuda()) {
    if (!cuda_) return;
    device_ = on.get_device();
    const c10::Stream stream = c10::impl::getDeviceGuardImpl(at::kCUDA)->getStream(on.device());
    TVMFFIEnvSetStream(kDLCUDA, device_, stream.native_handle(), &previous_);
  }
  ~EnvStream() {
    if (cuda_) TVMFFIEnvSetStream(kDLCUDA, device_, previous_, nullptr);
  }
  EnvStream(const EnvStream&) = delete;
  EnvStream& operator=(const EnvStream&) = delete;

 private:
  bool cuda_;
  int32_t device_ = 0;
  TVMFFIStreamHandle previous_ = nullptr;
};

// Calls a TVM-FFI function (on the environment stream an EnvStream in scope has set).
inline void invoke(void* fn, TVMFFIAny* args, int32_t n) {
  TVMFFIAny result = any_of(kTVMFFINone);
  if (TVMFFIFunctionCall(fn, args, n, &result) != 0) raise_ffi_error();
  if (result.type_index >= kTVMFFIStaticObjectBegin) TVMFFIObjectDecRef(result.v_obj);
}

// A TVM-FFI function handle held with a reference of its own.
class FfiFunction {
 public:
  FfiFunction() = default;
  explicit FfiFunction(int64_t handle) : handle_(reinterpret_cast<void*>(handle)) {
    if (handle_ != nullptr) TVMFFIObjectIncRef(handle_);
  }
  ~FfiFunction() {
    if (handle_ != nullptr) TVMFFIObjectDecRef(handle_);
  }
  FfiFunction(const FfiFunction&) = delete;
  FfiFunction& operator=(const FfiFunction&) = delete;
  FfiFunction(FfiFunction&& other) noexcept : handle_(other.handle_) { other.handle_ = nullptr; }
  FfiFunction& operator=(FfiFunction&& other) noexcept {
    std::swap(handle_, other.handle_);
    return *this;
  }
  void* get() const { return handle_; }
  explicit operator bool() const { return handle_ != nullptr; }

 private:
  void* handle_ = nullptr;
};


// A DLTensor of `t` seen as (rows, n) with the given row stride (no view tensor is made).
struct Rows {
  Rows(const at::Tensor& t, int64_t rows, int64_t n, int64_t row_stride)
      : shape{rows, n}, strides{row_stride, 1} {
    dl = dl_view(t);
    dl.ndim = 2;
    dl.shape = shape;
    dl.strides = strides;
  }
  Rows(const Rows&) = delete;
  int64_t shape[2];
  int64_t strides[2];
  DLTensor dl;
};

}  // namespace rmsnorm_lab
