// The native tape node: rms_norm's autograd node written in C++.
//
// Why it exists (results/NOTES.md, "The native tape node"): with the kernels launched through
// TVM-FFI, the host cost of a training call was dominated by the Python autograd.Function, whose
// backward runs Python on autograd's device thread. torch's own RMSNorm keeps its tape in C++,
// and so does this node: the forward launch, the saved tensors and the backward's kernel calls
// run in C++.
//
// The kernels are the CuTe DSL compilations the Python path launches: TVM-FFI functions, called
// through TVM-FFI's C ABI with DLTensor views of the torch tensors on torch's current stream.
// Python decides everything (rmsnorm_lab/native/launch.py): which kernels, grids, strip counts,
// the backward's steps and their argument lists, the NVTX names and colours. It hands the
// decision over as a `LaunchSpec` once per call key; this file only carries it out. A `CallMemo`
// finds the Launch of a repeated call without entering Python.

#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/dynamo/compiled_autograd.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "call_key.h"
#include "ffi.h"

namespace {
using namespace rmsnorm_lab;

// ------------------------------------------------------------------------------- the node

// Argument codes of a backward step (rmsnorm_lab/cute/backward_runner.py: DY .. OFFSET).
enum Arg : int64_t {
  kDy, kX, kW, kRstd, kDx, kPartials, kNoPartials, kDw, kDh, kCount, kOffset
};

template <typename T>
T attr(const py::handle& spec, const char* name) {
  return spec.attr(name).cast<T>();
}

// backward_runner.RowsRule: an integer that follows the row count, max(1, min(cap, ceil(M/per))).
struct RowsRule {
  RowsRule() = default;
  explicit RowsRule(const py::handle& rule)
      : per(attr<int64_t>(rule, "per")), cap(attr<int64_t>(rule, "cap")), set(true) {}
  int64_t of(int64_t m) const {
    const int64_t n = (m + per - 1) / per;
    return std::max<int64_t>(1, cap > 0 ? std::min(n, cap) : n);
  }
  int64_t per = 1, cap = 0;
  bool set = false;
};

// One kernel call of a backward, as Python planned it.
struct Step {
  FfiFunction kernel;
  std::vector<int64_t> args;  // Arg codes, in the kernel's argument order
  RowsRule count;             // the value passed for kCount
  std::string stage, name;    // NVTX
  uint32_t argb = 0;
  bool on_partials = false;   // NVTX shape: (partial rows, N) instead of (M, N)
};

// The steps of one backward and the rule of its rows of dW partials (unset: no dW).
struct Backward {
  explicit Backward(const py::handle& spec) {
    for (const py::handle step : spec.attr("steps")) {
      Step s;
      s.kernel = FfiFunction(attr<int64_t>(step, "kernel"));
      s.args = attr<std::vector<int64_t>>(step, "args");
      if (!step.attr("count").is_none()) s.count = RowsRule(step.attr("count"));
      s.stage = attr<std::string>(step, "stage");
      s.name = attr<std::string>(step, "name");
      s.argb = attr<uint32_t>(step, "argb");
      s.on_partials = attr<bool>(step, "on_partials");
      TORCH_CHECK(static_cast<bool>(s.kernel), "rmsnorm_lab native node: a step has no kernel");
      steps.push_back(std::move(s));
    }
    if (!spec.attr("partial_rows").is_none()) partial_rows = RowsRule(spec.attr("partial_rows"));
  }
  std::vector<Step> steps;
  RowsRule partial_rows;
};

// Everything one call key launches, built from a rmsnorm_lab.native.launch.LaunchSpec and
// shared by every node recorded for that key. Nothing in it depends on the row count. A
// training launch has three backwards (dx and dW, dx alone, dW alone) and its forward stores
// rstd; an inference launch has none and never goes on the tape.
struct Launch {
  enum Need { kBoth = 0, kDxOnly = 1, kDwOnly = 2 };

  explicit Launch(const py::handle& spec)
      : forward(attr<int64_t>(spec, "forward")),
        forward_name(attr<std::string>(spec, "forward_name")),
        forward_argb(attr<uint32_t>(spec, "forward_argb")),
        forward_grid(spec.attr("forward_grid")),
        row_stride(attr<int64_t>(spec, "row_stride")),
        weighted(attr<bool>(spec, "weighted")),
        eps(attr<double>(spec, "eps")),
        offset(attr<double>(spec, "offset")),
        nvtx(attr<bool>(spec, "nvtx")),
        no_weight(attr<at::Tensor>(spec, "no_weight")),
        no_rstd(attr<at::Tensor>(spec, "no_rstd")),
        no_partials(attr<at::Tensor>(spec, "no_partials")),
        aligned(attr<bool>(spec, "aligned")) {
    for (const py::handle b : spec.attr("backward")) backward.emplace_back(b);
    TORCH_CHECK(static_cast<bool>(forward), "rmsnorm_lab native node: no forward kernel");
    TORCH_CHECK(backward.empty() || backward.size() == 3,
                "rmsnorm_lab native node: a training launch has three backwards");
    TORCH_CHECK(!training() || backward[kBoth].partial_rows.set == weighted,
                "rmsnorm_lab native node: a weight needs dW partial rows, and only a weight");
  }

  bool training() const { return !backward.empty(); }

  FfiFunction forward;  // (x, w, y, rstd, grid, eps, offset)
  std::string forward_name;
  uint32_t forward_argb;
  RowsRule forward_grid;
  int64_t row_stride;  // x's row stride as rows, where the memo keys the layout exactly
  bool weighted;
  double eps, offset;
  bool nvtx;
  at::Tensor no_weight, no_rstd, no_partials;  // stand-ins for tensors a kernel does not use
  bool aligned;  // the backward kernels assume 16-byte aligned rows of dy
  std::vector<Backward> backward;
};

// x's row stride as (M, n) rows: n when contiguous, the leading stride of a 2-D x, and the
// planned one otherwise (such layouts are memoized by their exact sizes and strides).
int64_t row_stride_of(const at::Tensor& x, const Launch& k) {
  if (x.is_contiguous()) return x.size(-1);
  if (x.dim() == 2) return x.stride(0);
  return k.row_stride;
}

// The incoming gradient as rows the backward kernels can address. The common case, dy laid out
// as x's contiguous rows, is taken here; any other layout (y.sum()'s stride-0 gradient, an offset
// view) is Python's to decide, under the GIL.
at::Tensor grad_rows(const at::Tensor& dy, const at::Tensor& x, int64_t m, const Launch& k) {
  const int64_t n = x.size(-1);
  if (dy.is_contiguous() && dy.sizes() == x.sizes() &&
      (!k.aligned || (reinterpret_cast<uintptr_t>(dy.data_ptr()) & 15) == 0)) {
    return dy.view({m, n});
  }
  py::gil_scoped_acquire gil;
  return py::module_::import("rmsnorm_lab.common.rows")
      .attr("kernel_grad_rows")(dy, n, k.aligned)
      .cast<at::Tensor>();
}

// (dx, dw) of the forward over m rows: the steps of the backward the needed gradients select,
// each given the tensors its argument codes name (what is not needed stays undefined).
torch::autograd::variable_list run_backward(const Launch& k, int64_t m, const at::Tensor& x,
                                            const at::Tensor& weight, const at::Tensor& rstd,
                                            const at::Tensor& dy, bool need_dx, bool need_dw) {
  const int64_t n = x.size(-1);
  TORCH_CHECK(x.numel() == m * n && rstd.numel() == m && dy.numel() == m * n,
              "rmsnorm_lab native node: the saved x (", x.sizes(), ") or the gradient (",
              dy.sizes(), ") no longer has the forward's ", m, " rows of ", n,
              " (was a saved tensor's .data replaced?)");
  const bool with_dw = need_dw && weight.defined();
  const Backward& b = k.backward[with_dw ? (need_dx ? Launch::kBoth : Launch::kDwOnly)
                                         : Launch::kDxOnly];
  const at::Tensor dy2 = grad_rows(dy, x, m, k);
  at::Tensor dx, partials, dw;
  const int64_t partial_rows = b.partial_rows.set ? b.partial_rows.of(m) : 0;
  for (const Step& step : b.steps) {
    if (std::find(step.args.begin(), step.args.end(), kDx) != step.args.end()) {
      dx = at::empty_like(x, at::MemoryFormat::Contiguous);
    }
  }
  if (partial_rows > 0) {
    partials = at::empty({partial_rows, n}, x.options().dtype(at::kFloat));
    dw = at::empty_like(weight);
  }
  Rows r_x(x, m, n, row_stride_of(x, k)), r_dx(dx.defined() ? dx : x, m, n, n);
  DLTensor d_dy = dl_view(dy2), d_w = dl_view(weight.defined() ? weight : k.no_weight),
           d_rstd = dl_view(rstd), d_none = dl_view(k.no_partials);
  DLTensor d_part = partials.defined() ? dl_view(partials) : d_none;
  DLTensor d_dw = dw.defined() ? dl_view(dw) : d_none;
  // kDh: the fused add's gradient, which a native Launch never plans (it serves rms_norm alone)
  DLTensor* tensors[] = {&d_dy, &r_x.dl, &d_w, &d_rstd, &r_dx.dl, &d_part, &d_none, &d_dw,
                         &d_none};
  const EnvStream env(x);
  for (const Step& step : b.steps) {
    TVMFFIAny args[11];
    const int32_t count = static_cast<int32_t>(step.args.size());
    TORCH_CHECK(count <= 11, "rmsnorm_lab native node: a step has too many arguments");
    for (int32_t i = 0; i < count; ++i) {
      const int64_t code = step.args[i];
      args[i] = code == kCount    ? any_int(step.count.of(m))
                : code == kOffset ? any_float(k.offset)
                                  : any_tensor(tensors[code]);
    }
    Range range(k.nvtx, step.stage.c_str(), step.name, step.argb,
                step.on_partials ? partial_rows : m, n);
    invoke(step.kernel.get(), args, count);
  }
  return {need_dx ? dx : at::Tensor(), with_dw ? dw : at::Tensor()};
}

// The tape node, written like torch's generated ones rather than as a torch::autograd::Function,
// whose generic input/output bookkeeping and saved_data map are per-call work this node does not
// need (results/NOTES.md, "The native tape node").
// `Base` is always torch::autograd::Node: a template only so that both of torch's ownership
// models compile (std::shared_ptr<Node> up to 2.11, c10::intrusive_ptr<Node> after; record()).
template <typename Base>
struct RMSNormNativeBackward : public Base {
  RMSNormNativeBackward(std::shared_ptr<const Launch> launch, int64_t rows)
      : launch(std::move(launch)), rows(rows) {}

  std::string name() const override { return "RMSNormNativeBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "rms_norm has no double backward: its backward cannot run under "
                "backward(create_graph=True)");
    const bool need_dx = this->task_should_compute_output(0);
    const bool need_dw = this->num_outputs() > 1 && this->task_should_compute_output(1);
    if (!grads[0].defined() || !(need_dx || need_dw)) return {at::Tensor(), at::Tensor()};
    return run_backward(*launch, rows, x.unpack(), weight.unpack(), rstd.unpack(), grads[0],
                        need_dx, need_dw);
  }

  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& /*args*/) const override {
    TORCH_CHECK(false, "rms_norm's native autograd node does not support compiled autograd; "
                "run the model with RMSNORM_LAB_AUTOGRAD_NODE=python (the Python node, which "
                "compiled autograd traces), or compile the forward with torch.compile, whose "
                "graphs use the lab's custom ops");
  }

  void release_variables() override {
    x.reset_data();
    weight.reset_data();
    rstd.reset_data();
  }

  std::shared_ptr<const Launch> launch;
  int64_t rows;  // the forward's M: the saved tensors and the gradient are checked against it
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
            const at::Tensor& rstd, std::shared_ptr<const Launch> launch, int64_t rows) {
  using NodeT = RMSNormNativeBackward<Base>;
  if constexpr (std::is_base_of_v<c10::intrusive_ptr_target, Base>) {
    attach(c10::make_intrusive<NodeT>(std::move(launch), rows), y, x, weight, rstd);
  } else {
    attach(std::shared_ptr<NodeT>(new NodeT(std::move(launch), rows),
                                  [](NodeT* node) { deleteNode(node); }),
           y, x, weight, rstd);
  }
}

at::Tensor apply(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                 const std::shared_ptr<const Launch>& launch) {
  const Launch& k = *launch;
  const int64_t n = x.size(-1), m = x.numel() / n;
  TORCH_CHECK(weight.has_value() == k.weighted, "rmsnorm_lab native node: the launch was planned ",
              k.weighted ? "with" : "without", " a weight");
  const bool on_tape = at::GradMode::is_enabled() &&
                       (x.requires_grad() || (weight.has_value() && weight->requires_grad()));
  TORCH_CHECK(!on_tape || k.training(), "rmsnorm_lab native node: an inference launch cannot "
              "record a training call");
  at::Tensor y = at::empty_like(x, at::MemoryFormat::Contiguous);
  at::Tensor rstd = k.training() ? at::empty({m}, x.options().dtype(at::kFloat)) : k.no_rstd;
  Rows r_x(x, m, n, row_stride_of(x, k)), r_y(y, m, n, n);
  DLTensor d_w = dl_view(weight.has_value() ? *weight : k.no_weight), d_rstd = dl_view(rstd);
  TVMFFIAny args[] = {any_tensor(&r_x.dl), any_tensor(&d_w), any_tensor(&r_y.dl),
                      any_tensor(&d_rstd), any_int(k.forward_grid.of(m)), any_float(k.eps),
                      any_float(k.offset)};
  {
    const EnvStream env(x);
    Range range(k.nvtx, "launch", k.forward_name, k.forward_argb, m, n);
    invoke(k.forward.get(), args, 7);
  }
  if (on_tape) record(y, x, weight, rstd, launch, m);
  return y;
}

// ------------------------------------------------------------------------------- call memo
// Launches by call key, filled by Python (rmsnorm_lab/native/launch.py) as it plans each new
// call. `call` is a call's whole host path once its key is known (results/NOTES.md, "The call
// memo").
// A key is only ever inserted after Python validated and planned a call with that key, so a
// hit needs no further checks. Python threads reach it holding the GIL, one at a time.
class CallMemo {
 public:
  CallMemo(int64_t capacity, int64_t few_rows_max)
      : capacity_(capacity), few_rows_max_(few_rows_max) {}

  std::shared_ptr<const Launch> find(py::handle x, py::handle w, py::handle eps,
                                     py::handle offset, py::handle mode) const {
    CallKey key;
    key.settings = settings_;
    if (!call_key(x, w, eps, offset, mode, few_rows_max_, &key)) return nullptr;
    const auto it = launches_.find(key);
    return it == launches_.end() ? nullptr : it->second;
  }

  // True when inserted (false: a call the memo does not serve). `settings` is the code of the
  // settings the launch was planned under, which may differ from the code now in force.
  bool insert(py::handle x, py::handle w, py::handle eps, py::handle offset, py::handle mode,
              std::shared_ptr<const Launch> launch, int64_t settings) {
    CallKey key;
    if (!call_key(x, w, eps, offset, mode, few_rows_max_, &key)) return false;
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
  int64_t capacity_;
  int64_t few_rows_max_;  // M <= this is part of the key (cute/plan.py AUTO_PERSISTENT_MAX_ROWS)
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
      .def("forward_grid", [](const Launch& k, int64_t m) { return k.forward_grid.of(m); },
           "the forward's grid for m rows")
      .def("steps", [](const Launch& k, int64_t need) {
        return static_cast<int64_t>(k.backward.at(need).steps.size());
      }, "the kernel calls of backward `need` (0: dx and dW, 1: dx alone, 2: dW alone)");
  m.def("apply", &apply,
        "y = rms_norm(x, weight) as `launch` plans it; on the tape when x or weight requires "
        "grad (and grad mode is on; a training launch only)",
        py::arg("x"), py::arg("weight"), py::arg("launch"));
  py::class_<CallMemo>(m, "CallMemo")
      .def(py::init<int64_t, int64_t>(), py::arg("capacity"), py::arg("few_rows_max"))
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
