// The native tape node: rms_norm's autograd node written in C++.
//
// Why it exists (results/NOTES.md §14, §17): with the kernels launched through TVM-FFI, the host
// cost of a training call was dominated by the Python autograd.Function, not by the launches:
// an *empty* Python Function costs ~81 us for forward + backward through autograd's engine, and
// its backward runs Python on the engine's device thread. torch's own RMSNorm keeps its tape in
// C++. This node does the same: the forward launch, the saved tensors and the whole backward
// (dx/dW kernel, optional dW kernel, partial-row reduction) run in C++, with no Python and no
// GIL on the backward.
//
// The kernels are the same CuTe DSL compilations the Python path launches: TVM-FFI functions,
// called here through TVM-FFI's C ABI with DLTensor views of the torch tensors (no allocation per
// argument) on torch's current stream, set as TVM-FFI's environment stream for the call.
// Which kernels, grids and strip counts to use is decided in Python (rmsnorm_lab/cute/
// native_launch.py) and handed over as a `Kernels` object (per configuration) and a few integers
// (per call).

#include <torch/extension.h>

#include <cstdint>
#include <string>

#include <tvm/ffi/c_api.h>
#include <tvm/ffi/extra/c_env_api.h>

#if defined(RMSNORM_LAB_NVTX)
#include <nvtx3/nvToolsExt.h>
#endif

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ------------------------------------------------------------------------------- NVTX ranges
// The same ranges as rmsnorm_lab/nvtx_ranges.py: domain rmsnorm_lab, "<stage> <impl> <M>x<N>",
// a colour per implementation. Built only while settings.nvtx is on (the flag rides with each
// call), so the disabled cost is one branch.
class Range {
 public:
  Range(bool on, const char* stage, const std::string& impl, int64_t m, int64_t n) {
#if defined(RMSNORM_LAB_NVTX)
    if (!on) return;
    static nvtxDomainHandle_t domain = nvtxDomainCreateA("rmsnorm_lab");
    domain_ = domain;
    std::string text = std::string(stage) + " " + impl + " " + std::to_string(m) + "x" +
                       std::to_string(n);
    nvtxEventAttributes_t a = {};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.colorType = NVTX_COLOR_ARGB;
    a.color = color(impl);
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = text.c_str();
    nvtxDomainRangePushEx(domain_, &a);
#else
    (void)on, (void)stage, (void)impl, (void)m, (void)n;
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
  static uint32_t color(const std::string& impl) {  // nvtx_ranges.COLORS, as ARGB
    if (impl == "row") return 0xFF0000FF;
    if (impl == "persistent") return 0xFF800080;
    if (impl == "warp") return 0xFF008000;
    if (impl == "fallback") return 0xFFFF0000;
    if (impl == "fused") return 0xFFFFA500;
    if (impl == "split") return 0xFFFFFF00;
    return 0xFFFFFFFF;
  }
  nvtxDomainHandle_t domain_ = nullptr;
#endif
};

// ------------------------------------------------------------------------------- TVM-FFI calls

DLDataType dl_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return {kDLFloat, 32, 1};
    case at::kHalf: return {kDLFloat, 16, 1};
    case at::kBFloat16: return {kDLBfloat, 16, 1};
    default: TORCH_CHECK(false, "rmsnorm_lab native node: unsupported dtype ", t);
  }
}

// A DLTensor describing `t` without copying: valid while `t` lives (shape and strides point
// into the tensor's own metadata).
DLTensor dl_view(const at::Tensor& t) {
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

TVMFFIAny any_tensor(DLTensor* t) {
  TVMFFIAny a;
  a.type_index = kTVMFFIDLTensorPtr;
  a.zero_padding = 0;
  a.v_ptr = t;
  return a;
}

TVMFFIAny any_int(int64_t v) {
  TVMFFIAny a;
  a.type_index = kTVMFFIInt;
  a.zero_padding = 0;
  a.v_int64 = v;
  return a;
}

TVMFFIAny any_float(double v) {
  TVMFFIAny a;
  a.type_index = kTVMFFIFloat;
  a.zero_padding = 0;
  a.v_float64 = v;
  return a;
}

[[noreturn]] void raise_ffi_error() {
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

// Calls a TVM-FFI function on torch's current stream of `on`'s device (CUDA tensors: the stream
// becomes TVM-FFI's environment stream for the call, as the Python binding does).
void invoke(void* fn, TVMFFIAny* args, int32_t n, const at::Tensor& on) {
  const bool cuda = on.is_cuda();
  const int32_t device = cuda ? on.get_device() : 0;
  TVMFFIStreamHandle previous = nullptr;
  if (cuda) {
    const c10::Stream stream = c10::impl::getDeviceGuardImpl(at::kCUDA)->getStream(on.device());
    TVMFFIEnvSetStream(kDLCUDA, device, stream.native_handle(), &previous);
  }
  TVMFFIAny result;
  result.type_index = kTVMFFINone;
  result.zero_padding = 0;
  result.v_int64 = 0;
  const int rc = TVMFFIFunctionCall(fn, args, n, &result);
  if (cuda) TVMFFIEnvSetStream(kDLCUDA, device, previous, nullptr);
  if (rc != 0) raise_ffi_error();
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
  void* get() const { return handle_; }
  explicit operator bool() const { return handle_ != nullptr; }

 private:
  void* handle_ = nullptr;
};

// ------------------------------------------------------------------------------- the node

// One configuration's kernels (dtypes, N, casting mode, alignment, backward mode). The Python
// side keeps every Kernels it creates alive for the life of the process, so a node on a tape
// can hold a plain pointer to it.
struct Kernels {
  Kernels(int64_t forward, int64_t backward, int64_t dw, int64_t reduce, at::Tensor no_weight,
          at::Tensor no_partials, std::string forward_name, std::string backward_name,
          bool aligned)
      : forward(forward), backward(backward), dw(dw), reduce(reduce),
        no_weight(std::move(no_weight)), no_partials(std::move(no_partials)),
        forward_name(std::move(forward_name)), backward_name(std::move(backward_name)),
        aligned(aligned) {}

  FfiFunction forward;   // (x, w, y, rstd, grid, eps, offset)
  FfiFunction backward;  // (dy, x, w, rstd, dx, partials, int, offset): fused or split dx
  FfiFunction dw;        // split only: (dy, x, rstd, partials)
  FfiFunction reduce;    // (partials, dw)
  at::Tensor no_weight;    // zero-length stand-in for an absent weight
  at::Tensor no_partials;  // stand-in for partials a kernel does not write
  std::string forward_name, backward_name;  // NVTX: "row", "fused", ...
  bool aligned;  // the backward kernels assume 16-byte aligned rows
};

// What one call adds to its configuration: M-dependent grids and the scalars.
struct Call {
  int64_t forward_grid;
  double eps;
  double offset;
  int64_t backward_int;  // fused: the strip count (= grid); split: M
  int64_t partial_rows;  // rows of fp32 dW partials (0: no weight)
  bool nvtx;
};

constexpr int64_t kInt32Limit = int64_t{1} << 31;

// The incoming gradient as rows the backward kernels can address: autograd hands over whatever
// layout the next op's backward made (y.sum() gives an expanded stride-0 tensor), so such a
// layout, a misaligned one (the kernels assume 16-byte rows) or one past the kernels' Int32
// indexing is copied into a fresh contiguous tensor.
at::Tensor grad_rows(const at::Tensor& dy, int64_t n, bool aligned) {
  at::Tensor dy2 = dy.reshape({-1, n});
  const int64_t m = dy2.size(0);
  bool copy = n > 1 && dy2.stride(1) != 1;
  if (!copy && aligned) {
    const auto bytes = reinterpret_cast<uintptr_t>(dy2.data_ptr()) |
                       static_cast<uintptr_t>(dy2.stride(0) * dy2.element_size());
    copy = (bytes & 15) != 0;
  }
  if (!copy && m > 0) copy = (m - 1) * dy2.stride(0) + n >= kInt32Limit;
  return copy ? dy2.clone(at::MemoryFormat::Contiguous) : dy2;
}

class RMSNormNode : public torch::autograd::Function<RMSNormNode> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const std::optional<at::Tensor>& weight, const Kernels* k,
                            const Call& call) {
    const int64_t n = x.size(-1);
    const at::Tensor x2 = x.dim() == 2 ? x : x.view({-1, n});
    const int64_t m = x2.size(0);
    at::Tensor y = at::empty_like(x2, at::MemoryFormat::Contiguous);
    at::Tensor rstd = at::empty({m}, x2.options().dtype(at::kFloat));
    const at::Tensor& w = weight.has_value() ? *weight : k->no_weight;
    DLTensor dx = dl_view(x2), dw = dl_view(w), dy = dl_view(y), dr = dl_view(rstd);
    TVMFFIAny args[] = {any_tensor(&dx), any_tensor(&dw), any_tensor(&dy), any_tensor(&dr),
                        any_int(call.forward_grid), any_float(call.eps), any_float(call.offset)};
    {
      Range range(call.nvtx, "launch", k->forward_name, m, n);
      invoke(k->forward.get(), args, 7, x2);
    }
    ctx->save_for_backward({x, weight.value_or(at::Tensor()), rstd});
    ctx->saved_data["kernels"] = reinterpret_cast<int64_t>(k);
    ctx->saved_data["backward_int"] = call.backward_int;
    ctx->saved_data["partial_rows"] = call.partial_rows;
    ctx->saved_data["offset"] = call.offset;
    ctx->saved_data["nvtx"] = call.nvtx;
    return x.dim() == 2 ? y : y.view(x.sizes());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "rms_norm has no double backward: its backward cannot run under "
                "backward(create_graph=True)");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& rstd = saved[2];
    const auto* k = reinterpret_cast<const Kernels*>(ctx->saved_data["kernels"].toInt());
    const int64_t backward_int = ctx->saved_data["backward_int"].toInt();
    const int64_t partial_rows = ctx->saved_data["partial_rows"].toInt();
    const double offset = ctx->saved_data["offset"].toDouble();
    const bool nvtx = ctx->saved_data["nvtx"].toBool();

    const int64_t n = x.size(-1);
    const at::Tensor x2 = x.dim() == 2 ? x : x.view({-1, n});
    const int64_t m = x2.size(0);
    const at::Tensor dy2 = grad_rows(grads[0], n, k->aligned);
    at::Tensor dx = at::empty_like(x2, at::MemoryFormat::Contiguous);
    const bool has_weight = weight.defined();
    at::Tensor partials = partial_rows > 0
                              ? at::empty({partial_rows, n}, x2.options().dtype(at::kFloat))
                              : k->no_partials;
    const bool split = static_cast<bool>(k->dw);
    DLTensor d_dy = dl_view(dy2), d_x = dl_view(x2), d_w = dl_view(has_weight ? weight : k->no_weight),
             d_rstd = dl_view(rstd), d_dx = dl_view(dx), d_part = dl_view(partials),
             d_none = dl_view(k->no_partials);
    {
      Range range(nvtx, "launch", k->backward_name, m, n);
      TVMFFIAny args[] = {any_tensor(&d_dy), any_tensor(&d_x), any_tensor(&d_w),
                          any_tensor(&d_rstd), any_tensor(&d_dx),
                          any_tensor(split ? &d_none : &d_part), any_int(backward_int),
                          any_float(offset)};
      invoke(k->backward.get(), args, 8, x2);
      if (split && partial_rows > 0) {
        TVMFFIAny dw_args[] = {any_tensor(&d_dy), any_tensor(&d_x), any_tensor(&d_rstd),
                               any_tensor(&d_part)};
        invoke(k->dw.get(), dw_args, 4, x2);
      }
    }
    at::Tensor dw;
    if (partial_rows > 0) {
      dw = at::empty_like(weight);
      DLTensor d_dw = dl_view(dw);
      TVMFFIAny args[] = {any_tensor(&d_part), any_tensor(&d_dw)};
      Range range(nvtx, "reduce", k->backward_name, partial_rows, n);
      invoke(k->reduce.get(), args, 2, x2);
    }
    return {x.dim() == 2 ? dx : dx.view(x.sizes()), dw, at::Tensor(), at::Tensor()};
  }
};

at::Tensor apply(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                 const Kernels& kernels, int64_t forward_grid, double eps, double offset,
                 int64_t backward_int, int64_t partial_rows, bool nvtx) {
  TORCH_CHECK(!weight.has_value() || partial_rows > 0 || x.numel() == 0,
              "rmsnorm_lab native node: a weight needs dW partial rows");
  return RMSNormNode::apply(x, weight, &kernels,
                            Call{forward_grid, eps, offset, backward_int, partial_rows, nvtx});
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "rms_norm's autograd node in C++ (see rmsnorm_lab/native_node.py)";
  pybind11::class_<Kernels>(m, "Kernels")
      .def(pybind11::init<int64_t, int64_t, int64_t, int64_t, at::Tensor, at::Tensor, std::string,
                          std::string, bool>(),
           pybind11::arg("forward"), pybind11::arg("backward"), pybind11::arg("dw"),
           pybind11::arg("reduce"), pybind11::arg("no_weight"), pybind11::arg("no_partials"),
           pybind11::arg("forward_name"), pybind11::arg("backward_name"),
           pybind11::arg("aligned"));
  m.def("apply", &apply, "y = rms_norm(x, weight) with its autograd node in C++",
        pybind11::arg("x"), pybind11::arg("weight"), pybind11::arg("kernels"),
        pybind11::arg("forward_grid"), pybind11::arg("eps"), pybind11::arg("offset"),
        pybind11::arg("backward_int"), pybind11::arg("partial_rows"), pybind11::arg("nvtx"));
  m.def("has_nvtx", []() {
#if defined(RMSNORM_LAB_NVTX)
    return true;
#else
    return false;
#endif
  });
}
