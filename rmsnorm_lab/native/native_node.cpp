// The native tape node: rms_norm's autograd node written in C++.
//
// Why it exists (results/NOTES.md, "the native node"): with the kernels launched through TVM-FFI,
// the host cost of a training call was dominated by the Python autograd.Function, whose backward
// runs Python on autograd's device thread. torch's own RMSNorm keeps its tape in C++, and so does
// this node: the forward launch, the saved tensors and the backward's kernel calls run in C++.
//
// The kernels are the CuTe DSL compilations the Python path launches: TVM-FFI functions, called
// through TVM-FFI's C ABI with DLTensor views of the torch tensors on torch's current stream.
// Python decides everything (rmsnorm_lab/native/launch.py): which kernels, grids, strip counts,
// the backward's steps and their argument lists, the NVTX names and colours. It hands the
// decision over as a `LaunchSpec` once per call key; this file only carries it out. A `CallMemo`
// finds the Launch of a repeated call without entering Python.

#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "ffi.h"

namespace {
using namespace rmsnorm_lab;

// ------------------------------------------------------------------------------- the node

// Argument codes of a backward step (rmsnorm_lab/cute/backward_runner.py: DY .. OFFSET).
enum Arg : int64_t { kDy, kX, kW, kRstd, kDx, kPartials, kNoPartials, kDw, kCount, kOffset };

// One kernel call of the backward, as Python planned it.
struct Step {
  FfiFunction kernel;
  std::vector<int64_t> args;  // Arg codes, in the kernel's argument order
  int64_t count = 0;          // the value passed for kCount
  std::string stage, name;    // NVTX
  uint32_t argb = 0;
  bool on_partials = false;   // NVTX shape: (partial rows, N) instead of (M, N)
};

template <typename T>
T attr(const py::handle& spec, const char* name) {
  return spec.attr(name).cast<T>();
}

// Everything one call key launches, built from a rmsnorm_lab.native.launch.LaunchSpec and
// shared by every node recorded for that key. A training launch has backward steps and its
// forward stores rstd; an inference launch has none and never goes on the tape.
struct Launch {
  explicit Launch(const py::handle& spec)
      : forward(attr<int64_t>(spec, "forward")),
        forward_name(attr<std::string>(spec, "forward_name")),
        forward_argb(attr<uint32_t>(spec, "forward_argb")),
        forward_grid(attr<int64_t>(spec, "forward_grid")),
        rows(attr<int64_t>(spec, "rows")),
        row_stride(attr<int64_t>(spec, "row_stride")),
        weighted(attr<bool>(spec, "weighted")),
        eps(attr<double>(spec, "eps")),
        offset(attr<double>(spec, "offset")),
        nvtx(attr<bool>(spec, "nvtx")),
        no_weight(attr<at::Tensor>(spec, "no_weight")),
        no_rstd(attr<at::Tensor>(spec, "no_rstd")),
        no_partials(attr<at::Tensor>(spec, "no_partials")),
        aligned(attr<bool>(spec, "aligned")),
        partial_rows(attr<int64_t>(spec, "partial_rows")) {
    for (const py::handle step : spec.attr("backward")) {
      Step s;
      s.kernel = FfiFunction(attr<int64_t>(step, "kernel"));
      s.args = attr<std::vector<int64_t>>(step, "args");
      s.count = attr<int64_t>(step, "count");
      s.stage = attr<std::string>(step, "stage");
      s.name = attr<std::string>(step, "name");
      s.argb = attr<uint32_t>(step, "argb");
      s.on_partials = attr<bool>(step, "on_partials");
      TORCH_CHECK(static_cast<bool>(s.kernel), "rmsnorm_lab native node: a step has no kernel");
      backward.push_back(std::move(s));
    }
    TORCH_CHECK(static_cast<bool>(forward), "rmsnorm_lab native node: no forward kernel");
    TORCH_CHECK(training() ? (partial_rows > 0) == weighted : partial_rows == 0,
                "rmsnorm_lab native node: a weight needs dW partial rows, and only a weight "
                "of a training launch");
  }

  bool training() const { return !backward.empty(); }

  FfiFunction forward;  // (x, w, y, rstd, grid, eps, offset)
  std::string forward_name;
  uint32_t forward_argb;
  int64_t forward_grid;
  int64_t rows;        // M: x seen as (M, N) rows
  int64_t row_stride;  // x's row stride as rows (leading dims collapsed)
  bool weighted;
  double eps, offset;
  bool nvtx;
  at::Tensor no_weight, no_rstd, no_partials;  // stand-ins for tensors a kernel does not use
  bool aligned;          // the backward kernels assume 16-byte aligned rows of dy
  int64_t partial_rows;  // rows of fp32 dW partials (0: no weight or no backward)
  std::vector<Step> backward;
};

// The incoming gradient as rows the backward kernels can address. The common case, dy laid out
// as x's contiguous rows, is taken here; any other layout (y.sum()'s stride-0 gradient, an offset
// view) is Python's to decide, under the GIL.
at::Tensor grad_rows(const at::Tensor& dy, const at::Tensor& x, const Launch& k) {
  const int64_t n = x.size(-1);
  if (dy.is_contiguous() && dy.sizes() == x.sizes() &&
      (!k.aligned || (reinterpret_cast<uintptr_t>(dy.data_ptr()) & 15) == 0)) {
    return dy.view({k.rows, n});
  }
  py::gil_scoped_acquire gil;
  return py::module_::import("rmsnorm_lab.common.rows")
      .attr("kernel_grad_rows")(dy, n, k.aligned)
      .cast<at::Tensor>();
}

// (dx, dw): the steps of the launch, each given the tensors its argument codes name.
torch::autograd::variable_list run_backward(const Launch& k, const at::Tensor& x,
                                            const at::Tensor& weight, const at::Tensor& rstd,
                                            const at::Tensor& dy) {
  const int64_t n = x.size(-1), m = k.rows;
  const at::Tensor dy2 = grad_rows(dy, x, k);
  at::Tensor dx = at::empty_like(x, at::MemoryFormat::Contiguous);
  at::Tensor partials, dw;
  if (k.partial_rows > 0) {
    partials = at::empty({k.partial_rows, n}, x.options().dtype(at::kFloat));
    dw = at::empty_like(weight);
  }
  Rows r_x(x, m, n, k.row_stride), r_dx(dx, m, n, n);
  DLTensor d_dy = dl_view(dy2), d_w = dl_view(weight.defined() ? weight : k.no_weight),
           d_rstd = dl_view(rstd), d_none = dl_view(k.no_partials);
  DLTensor d_part = partials.defined() ? dl_view(partials) : d_none;
  DLTensor d_dw = dw.defined() ? dl_view(dw) : d_none;
  DLTensor* tensors[] = {&d_dy, &r_x.dl, &d_w, &d_rstd, &r_dx.dl, &d_part, &d_none, &d_dw};
  const EnvStream env(x);
  for (const Step& step : k.backward) {
    TVMFFIAny args[10];
    const int32_t count = static_cast<int32_t>(step.args.size());
    TORCH_CHECK(count <= 10, "rmsnorm_lab native node: a step has too many arguments");
    for (int32_t i = 0; i < count; ++i) {
      const int64_t code = step.args[i];
      args[i] = code == kCount    ? any_int(step.count)
                : code == kOffset ? any_float(k.offset)
                                  : any_tensor(tensors[code]);
    }
    Range range(k.nvtx, step.stage.c_str(), step.name, step.argb,
                step.on_partials ? k.partial_rows : m, n);
    invoke(step.kernel.get(), args, count);
  }
  return {dx, dw};
}

// The tape node, written like torch's generated ones rather than as a torch::autograd::Function,
// whose generic input/output bookkeeping and saved_data map are per-call work this node does not
// need (on the H200's host the native call went from 0.86x to 0.75x the time of torch's whole
// F.rms_norm with autograd, each measured against torch in its own run; NOTES.md 17).
// `Base` is always torch::autograd::Node: a template only so that both of torch's ownership
// models compile (std::shared_ptr<Node> up to 2.11, c10::intrusive_ptr<Node> after; record()).
template <typename Base>
struct RMSNormNativeBackward : public Base {
  explicit RMSNormNativeBackward(std::shared_ptr<const Launch> launch)
      : launch(std::move(launch)) {}

  std::string name() const override { return "RMSNormNativeBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "rms_norm has no double backward: its backward cannot run under "
                "backward(create_graph=True)");
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    return run_backward(*launch, x.unpack(), weight.unpack(), rstd.unpack(), grads[0]);
  }

  void release_variables() override {
    x.reset_data();
    weight.reset_data();
    rstd.reset_data();
  }

  std::shared_ptr<const Launch> launch;
  torch::autograd::SavedVariable x, weight, rstd;
};

template <typename Ptr>
void attach(const Ptr& node, at::Tensor& y, const at::Tensor& x,
            const std::optional<at::Tensor>& weight, const at::Tensor& rstd) {
  node->set_next_edges(torch::autograd::collect_next_edges(x, weight));
  node->x = torch::autograd::SavedVariable(x, false);
  if (weight.has_value()) node->weight = torch::autograd::SavedVariable(*weight, false);
  node->rstd = torch::autograd::SavedVariable(rstd, false);
  torch::autograd::set_history(y, node);
}

// Puts y on the tape. The branch not taken is never instantiated.
template <typename Base = torch::autograd::Node>
void record(at::Tensor& y, const at::Tensor& x, const std::optional<at::Tensor>& weight,
            const at::Tensor& rstd, std::shared_ptr<const Launch> launch) {
  using NodeT = RMSNormNativeBackward<Base>;
  if constexpr (std::is_base_of_v<c10::intrusive_ptr_target, Base>) {
    attach(c10::make_intrusive<NodeT>(std::move(launch)), y, x, weight, rstd);
  } else {
    attach(std::shared_ptr<NodeT>(new NodeT(std::move(launch)),
                                  [](NodeT* node) { deleteNode(node); }),
           y, x, weight, rstd);
  }
}

at::Tensor apply(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                 const std::shared_ptr<const Launch>& launch) {
  const Launch& k = *launch;
  const int64_t n = x.size(-1), m = k.rows;
  TORCH_CHECK(x.numel() == m * n, "rmsnorm_lab native node: x has ", x.numel(),
              " elements, its launch was planned for ", m, " rows of ", n);
  TORCH_CHECK(weight.has_value() == k.weighted, "rmsnorm_lab native node: the launch was planned ",
              k.weighted ? "with" : "without", " a weight");
  const bool on_tape = at::GradMode::is_enabled() &&
                       (x.requires_grad() || (weight.has_value() && weight->requires_grad()));
  TORCH_CHECK(!on_tape || k.training(), "rmsnorm_lab native node: an inference launch cannot "
              "record a training call");
  at::Tensor y = at::empty_like(x, at::MemoryFormat::Contiguous);
  at::Tensor rstd = k.training() ? at::empty({m}, x.options().dtype(at::kFloat)) : k.no_rstd;
  Rows r_x(x, m, n, k.row_stride), r_y(y, m, n, n);
  DLTensor d_w = dl_view(weight.has_value() ? *weight : k.no_weight), d_rstd = dl_view(rstd);
  TVMFFIAny args[] = {any_tensor(&r_x.dl), any_tensor(&d_w), any_tensor(&r_y.dl),
                      any_tensor(&d_rstd), any_int(k.forward_grid), any_float(k.eps),
                      any_float(k.offset)};
  {
    const EnvStream env(x);
    Range range(k.nvtx, "launch", k.forward_name, k.forward_argb, m, n);
    invoke(k.forward.get(), args, 7);
  }
  if (on_tape) record(y, x, weight, rstd, launch);
  return y;
}

// ------------------------------------------------------------------------------- call memo
// Everything a Launch was decided from, read off the call's arguments: shapes, strides, dtypes
// and devices of x and the weight, the 16-byte alignment of their pointers, the casting mode,
// eps and offset, and a code of the settings the plan read (native/launch.py, Snapshot), which
// Python updates on every settings change.
// A call whose x has more than kMaxDims dimensions is not memoized (it goes through Python).
constexpr int kMaxDims = 8;

struct CallKey {
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
  int32_t dims = 0;
  int32_t x_dtype = 0;
  int32_t x_device = 0;   // device type * 256 + index
  int32_t w_dtype = -1;   // -1: no weight
  int32_t w_device = 0;
  int64_t w_size = 0, w_stride = 0, w_dims = 0;
  bool aligned = false;
  bool training = false;  // grad mode on and x or the weight requiring grad
  double eps = 0.0, offset = 0.0;
  int64_t settings = 0;
  std::string casting_mode;

  bool operator==(const CallKey& o) const {
    return settings == o.settings && dims == o.dims && x_dtype == o.x_dtype &&
           x_device == o.x_device && w_dtype == o.w_dtype && w_device == o.w_device &&
           w_size == o.w_size && w_stride == o.w_stride && w_dims == o.w_dims &&
           aligned == o.aligned && training == o.training && eps == o.eps &&
           offset == o.offset && casting_mode == o.casting_mode &&
           std::equal(sizes, sizes + dims, o.sizes) &&
           std::equal(strides, strides + dims, o.strides);
  }
};

struct CallKeyHash {
  size_t operator()(const CallKey& k) const {
    size_t h = std::hash<std::string>()(k.casting_mode);
    auto mix = [&h](uint64_t v) { h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2); };
    for (int32_t i = 0; i < k.dims; ++i) mix(k.sizes[i]), mix(k.strides[i]);
    mix(k.x_dtype), mix(k.x_device), mix(k.w_dtype), mix(k.w_size), mix(k.aligned);
    mix(k.training), mix(static_cast<uint64_t>(k.settings));
    return h;
  }
};

int32_t device_code(const at::Tensor& t) {
  return static_cast<int32_t>(t.device().type()) * 256 + t.device().index() + 1;
}

// The key of (x, weight, eps, offset, casting_mode), or false when the call is not one the memo
// serves (not tensors, eps or offset not a Python number, mode not a str, too many dims).
bool call_key(py::handle x_obj, py::handle w_obj, py::handle eps, py::handle offset,
              py::handle mode, CallKey* key) {
  if (!THPVariable_Check(x_obj.ptr())) return false;
  const at::Tensor& x = THPVariable_Unpack(x_obj.ptr());
  const int64_t dims = x.dim();
  if (dims < 1 || dims > kMaxDims) return false;
  if (!PyUnicode_Check(mode.ptr())) return false;
  for (py::handle number : {eps, offset}) {
    if (!PyFloat_Check(number.ptr()) && !PyLong_Check(number.ptr())) return false;
  }
  key->dims = static_cast<int32_t>(dims);
  std::copy_n(x.sizes().data(), dims, key->sizes);
  std::copy_n(x.strides().data(), dims, key->strides);
  key->x_dtype = static_cast<int32_t>(x.scalar_type());
  key->x_device = device_code(x);
  auto ptrs = reinterpret_cast<uintptr_t>(x.data_ptr());
  bool requires_grad = x.requires_grad();
  if (!w_obj.is_none()) {
    if (!THPVariable_Check(w_obj.ptr())) return false;
    const at::Tensor& w = THPVariable_Unpack(w_obj.ptr());
    key->w_dtype = static_cast<int32_t>(w.scalar_type());
    key->w_device = device_code(w);
    key->w_dims = w.dim();
    if (w.dim() == 1) key->w_size = w.size(0), key->w_stride = w.stride(0);
    ptrs |= reinterpret_cast<uintptr_t>(w.data_ptr());
    requires_grad = requires_grad || w.requires_grad();
  }
  key->aligned = (ptrs & 15) == 0;
  key->training = requires_grad && at::GradMode::is_enabled();
  key->eps = PyFloat_AsDouble(eps.ptr());
  key->offset = PyFloat_AsDouble(offset.ptr());
  if (PyErr_Occurred()) {  // an int too large for a double
    PyErr_Clear();
    return false;
  }
  Py_ssize_t length = 0;
  const char* text = PyUnicode_AsUTF8AndSize(mode.ptr(), &length);
  if (text == nullptr) {
    PyErr_Clear();
    return false;
  }
  key->casting_mode.assign(text, static_cast<size_t>(length));
  return true;
}

// Launches by call key, filled by Python (rmsnorm_lab/native/launch.py) as it plans each new
// call. `call` is a call's whole host path once its key is known (NOTES.md, "the call memo").
// A key is only ever inserted after Python validated and planned that exact call, so a hit
// needs no further checks.
class CallMemo {
 public:
  explicit CallMemo(int64_t capacity) : capacity_(capacity) {}

  std::shared_ptr<const Launch> find(py::handle x, py::handle w, py::handle eps,
                                     py::handle offset, py::handle mode) const {
    CallKey key;
    if (!key_of(x, w, eps, offset, mode, &key)) return nullptr;
    const auto it = launches_.find(key);
    return it == launches_.end() ? nullptr : it->second;
  }

  // True when inserted (false: a call the memo does not serve). `settings` is the code of the
  // settings the launch was planned under, which may differ from the code now in force.
  bool insert(py::handle x, py::handle w, py::handle eps, py::handle offset, py::handle mode,
              std::shared_ptr<const Launch> launch, int64_t settings) {
    CallKey key;
    if (!call_key(x, w, eps, offset, mode, &key)) return false;
    key.settings = settings;
    if (static_cast<int64_t>(launches_.size()) >= capacity_) launches_.clear();  // bounded
    launches_[std::move(key)] = std::move(launch);  // nodes hold their own reference
    return true;
  }

  // y of a call planned before (on the tape when it is a training call); None otherwise, and
  // Python takes the call.
  py::object call(py::handle x, py::handle w, py::handle eps, py::handle offset,
                  py::handle mode) const {
    const auto launch = find(x, w, eps, offset, mode);
    if (!launch) return py::none();
    std::optional<at::Tensor> weight;
    if (!w.is_none()) weight = THPVariable_Unpack(w.ptr());
    return py::reinterpret_steal<py::object>(
        THPVariable_Wrap(apply(THPVariable_Unpack(x.ptr()), weight, launch)));
  }

  void clear() { launches_.clear(); }
  int64_t size() const { return static_cast<int64_t>(launches_.size()); }
  int64_t settings_ = 0;  // the code of the settings now in force

 private:
  bool key_of(py::handle x, py::handle w, py::handle eps, py::handle offset, py::handle mode,
              CallKey* key) const {
    key->settings = settings_;
    return call_key(x, w, eps, offset, mode, key);
  }

  int64_t capacity_;
  std::unordered_map<CallKey, std::shared_ptr<const Launch>, CallKeyHash> launches_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  m.doc() = "rms_norm's autograd node in C++ (see rmsnorm_lab/native/build.py)";
  py::class_<Launch, std::shared_ptr<Launch>>(m, "Launch")
      .def(py::init<const py::handle&>(), py::arg("spec"),
           "a launch built from a rmsnorm_lab.native.launch.LaunchSpec")
      .def_property_readonly("training", &Launch::training)
      .def_readonly("forward_grid", &Launch::forward_grid)
      .def_readonly("partial_rows", &Launch::partial_rows)
      .def_property_readonly("steps", [](const Launch& k) {
        return static_cast<int64_t>(k.backward.size());
      });
  m.def("apply", &apply,
        "y = rms_norm(x, weight) as `launch` plans it; on the tape when x or weight requires "
        "grad (and grad mode is on; a training launch only)",
        py::arg("x"), py::arg("weight"), py::arg("launch"));
  py::class_<CallMemo>(m, "CallMemo")
      .def(py::init<int64_t>(), py::arg("capacity"))
      .def("find", &CallMemo::find, "the Launch planned for this call, or None", py::arg("x"),
           py::arg("weight"), py::arg("eps"), py::arg("offset"), py::arg("casting_mode"))
      .def("insert", &CallMemo::insert, py::arg("x"), py::arg("weight"), py::arg("eps"),
           py::arg("offset"), py::arg("casting_mode"), py::arg("launch"), py::arg("settings"))
      .def("call", &CallMemo::call,
           "y of a call planned before (on the tape for a training call), or None: Python "
           "takes it",
           py::arg("x"), py::arg("weight"), py::arg("eps"), py::arg("offset"),
           py::arg("casting_mode"))
      .def_readwrite("settings", &CallMemo::settings_,
                     "code of the settings in force (part of every key)")
      .def("clear", &CallMemo::clear)
      .def("__len__", &CallMemo::size);
  m.def("has_nvtx", []() {
#if defined(RMSNORM_LAB_NVTX)
    return true;
#else
    return false;
#endif
  });
}
