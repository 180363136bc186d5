// The native tape nodes: the autograd nodes of rms_norm and of the fused residual add, in C++.
//
// Why it exists: with the kernels launched through TVM-FFI, the host cost of a training call is
// dominated by a Python autograd.Function, whose backward runs Python on autograd's device
// thread. torch's own RMSNorm keeps its tape in C++, and so does this node: the forward launch,
// the saved tensors and the backward's kernel calls run in C++
// (docs/design-record.md, 'Host: the native tape node').
//
// The kernels are the CuTe DSL compilations the Python path launches: TVM-FFI functions, called
// through TVM-FFI's C ABI with DLTensor views of the torch tensors on torch's current stream.
// Python decides everything (rmsnorm_lab/native/launch.py): which kernels, grids, strip counts,
// the backward's steps and their argument lists, the NVTX names and colours. It hands the
// decision over as a `LaunchSpec` once per call key; launch.h holds it and runs the backward's
// kernel calls, this file the forwards, the nodes and the `CallMemo`, which finds the Launch of a
// repeated call without entering Python.

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
#include "launch.h"

namespace {
using namespace rmsnorm_lab;

// ------------------------------------------------------------------------------- the node

constexpr const char* kNoCompiledAutograd =
    "rms_norm's native autograd node does not support compiled autograd; run the model with "
    "RMSNORM_LAB_AUTOGRAD_NODE=python (the Python node, which compiled autograd traces), or "
    "compile the forward with torch.compile, whose graphs use the lab's custom ops";

// The tape nodes, written like torch's generated ones rather than as a torch::autograd::Function,
// whose generic input/output bookkeeping and saved_data map are per-call work these nodes do not
// need (docs/design-record.md, 'Host: the native tape node').
// `Base` is always torch::autograd::Node: a template only so that both of torch's ownership
// models compile (std::shared_ptr<Node> up to 2.11, c10::intrusive_ptr<Node> after; record()).
// What both share: the Launch they were recorded with, the forward's row count, the saved weight
// and rstd, and the refusals (double backward, compiled autograd).
template <typename Base>
struct NativeNode : public Base {
  NativeNode(std::shared_ptr<const Launch> launch, int64_t rows)
      : launch(std::move(launch)), rows(rows) {}

  static void refuse_double_backward() {
    TORCH_CHECK(!at::GradMode::is_enabled(),
                "rms_norm has no double backward: its backward cannot run under "
                "backward(create_graph=True)");
  }

  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& /*args*/) const override {
    TORCH_CHECK(false, kNoCompiledAutograd);
  }

  void release_variables() override {
    weight.reset_data();
    rstd.reset_data();
  }

  std::shared_ptr<const Launch> launch;
  int64_t rows;  // the forward's M: the saved tensors and the gradient are checked against it
  torch::autograd::SavedVariable weight, rstd;
};

template <typename Base>
struct RMSNormNativeBackward : public NativeNode<Base> {
  using NativeNode<Base>::NativeNode;

  std::string name() const override { return "RMSNormNativeBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    this->refuse_double_backward();
    const bool need_dx = this->task_should_compute_output(0);
    const bool need_dw = this->num_outputs() > 1 && this->task_should_compute_output(1);
    if (!grads[0].defined() || !(need_dx || need_dw)) return {at::Tensor(), at::Tensor()};
    return run_backward(*this->launch, this->rows, x.unpack(), this->weight.unpack(),
                        this->rstd.unpack(), grads[0], need_dx, need_dw);
  }

  void release_variables() override {
    NativeNode<Base>::release_variables();
    x.reset_data();
  }

  torch::autograd::SavedVariable x;
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
  TORCH_CHECK(!k.residual, "rmsnorm_lab native node: a fused-add launch takes the residual");
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

// ------------------------------------------------------------------------ the fused residual add

// The fused add's tape node: y = rms_norm(h) and h = x + r from (x, r, weight). x and r get one
// and the same gradient, h's incoming one plus the norm's dx, made by one backward pass (the dx
// kernels add dh); dW as for rms_norm. h, an output, is what the node saves.
template <typename Base>
struct RMSNormAddNativeBackward : public NativeNode<Base> {
  using NativeNode<Base>::NativeNode;

  std::string name() const override { return "RMSNormAddNativeBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    this->refuse_double_backward();
    const bool need_x = this->task_should_compute_output(0);
    const bool need_r = this->task_should_compute_output(1);
    const bool need_dw = this->num_outputs() > 2 && this->task_should_compute_output(2);
    const at::Tensor h_ = h.unpack(this->getptr()), weight_ = this->weight.unpack();
    const at::Tensor& dy = grads[0];
    at::Tensor dh = grads[1];
    at::Tensor d, dw;
    if (!dy.defined()) {  // y unused: h's gradient passes through, and dW is zero
      d = dh;
      if (need_dw) dw = at::zeros_like(weight_);
    } else if (need_x || need_r || need_dw) {
      if ((need_x || need_r) && !dh.defined()) dh = at::zeros_like(h_);  // h unused downstream
      auto out = run_backward(*this->launch, this->rows, h_, weight_, this->rstd.unpack(), dy,
                              need_x || need_r, need_dw, need_x || need_r ? dh : at::Tensor());
      d = out[0], dw = out[1];
    }
    return {need_x ? d : at::Tensor(), need_r ? d : at::Tensor(), need_dw ? dw : at::Tensor()};
  }

  void release_variables() override {
    NativeNode<Base>::release_variables();
    h.reset_data();
  }

  torch::autograd::SavedVariable h;
};

template <typename Base = torch::autograd::Node>
void record_add(at::Tensor& y, at::Tensor& h, const at::Tensor& x, const at::Tensor& r,
                const std::optional<at::Tensor>& weight, const at::Tensor& rstd,
                std::shared_ptr<const Launch> launch, int64_t rows) {
  using NodeT = RMSNormAddNativeBackward<Base>;
  auto attach_add = [&](const auto& node) {
    node->set_next_edges(torch::autograd::collect_next_edges(x, r, weight));
    if (weight.has_value()) node->weight = torch::autograd::SavedVariable(*weight, false);
    node->rstd = torch::autograd::SavedVariable(rstd, false);
    torch::autograd::set_history(y, node);
    torch::autograd::set_history(h, node);
    node->h = torch::autograd::SavedVariable(h, true);  // an output: saved after its history
  };
  if constexpr (std::is_base_of_v<c10::intrusive_ptr_target, Base>) {
    attach_add(c10::make_intrusive<NodeT>(std::move(launch), rows));
  } else {
    attach_add(std::shared_ptr<NodeT>(new NodeT(std::move(launch), rows),
                                      [](NodeT* node) { deleteNode(node); }));
  }
}

// (y, h) of the fused add as `launch` (a fused-add launch) plans it; r laid out as x.
std::tuple<at::Tensor, at::Tensor> apply_add(const at::Tensor& x, const at::Tensor& r,
                                             const std::optional<at::Tensor>& weight,
                                             const std::shared_ptr<const Launch>& launch) {
  const Launch& k = *launch;
  TORCH_CHECK(k.residual, "rmsnorm_lab native node: not a fused-add launch");
  TORCH_CHECK(r.sizes() == x.sizes() && r.strides() == x.strides() &&
              r.scalar_type() == x.scalar_type() && r.device() == x.device(),
              "rmsnorm_lab native node: the residual must be laid out as x");
  const int64_t n = x.size(-1), m = x.numel() / n;
  TORCH_CHECK(weight.has_value() == k.weighted, "rmsnorm_lab native node: the launch was planned ",
              k.weighted ? "with" : "without", " a weight");
  const bool on_tape = at::GradMode::is_enabled() &&
                       (x.requires_grad() || r.requires_grad() ||
                        (weight.has_value() && weight->requires_grad()));
  TORCH_CHECK(!on_tape || k.training(), "rmsnorm_lab native node: an inference launch cannot "
              "record a training call");
  at::Tensor y = at::empty_like(x, at::MemoryFormat::Contiguous);
  at::Tensor h = at::empty_like(x, at::MemoryFormat::Contiguous);
  at::Tensor rstd = k.training() ? at::empty({m}, x.options().dtype(at::kFloat)) : k.no_rstd;
  const int64_t stride = row_stride_of(x, k);
  Rows r_x(x, m, n, stride), r_r(r, m, n, stride), r_y(y, m, n, n), r_h(h, m, n, n);
  DLTensor d_w = dl_view(weight.has_value() ? *weight : k.no_weight), d_rstd = dl_view(rstd);
  TVMFFIAny args[] = {any_tensor(&r_x.dl), any_tensor(&r_r.dl), any_tensor(&d_w),
                      any_tensor(&r_y.dl), any_tensor(&r_h.dl), any_tensor(&d_rstd),
                      any_int(k.forward_grid.of(m)), any_float(k.eps), any_float(k.offset)};
  {
    const EnvStream env(x);
    Range range(k.nvtx, "launch", k.forward_name, k.forward_argb, m, n);
    invoke(k.forward.get(), args, 9);
  }
  if (on_tape) record_add(y, h, x, r, weight, rstd, launch, m);
  return {y, h};
}

// ------------------------------------------------------------------------------- call memo
// Launches by call key, filled by Python (rmsnorm_lab/native/launch.py) as it plans each new
// call. `call` is a call's whole host path once its key is known
// (docs/design-record.md, 'Host: the call memo').
// A key is only ever inserted after Python validated and planned a call with that key, so a
// hit needs no further checks. Python threads reach it holding the GIL, one at a time.
class CallMemo {
 public:
  CallMemo(int64_t capacity, int64_t few_rows_max, int64_t fewest_rows_max)
      : capacity_(capacity), few_rows_max_(few_rows_max), fewest_rows_max_(fewest_rows_max) {}

  // `r`: the fused add's residual (None for rms_norm), served only when laid out as x.
  std::shared_ptr<const Launch> find(py::handle x, py::handle w, py::handle eps,
                                     py::handle offset, py::handle mode,
                                     py::handle r = py::none()) const {
    CallKey key;
    key.settings = settings_;
    if (!key_of(x, r, w, eps, offset, mode, &key)) return nullptr;
    const auto it = launches_.find(key);
    return it == launches_.end() ? nullptr : it->second;
  }

  // y of a call (on the tape when it is a training call). A call not planned before goes to
  // `planner` (None: the call returns None and Python takes it), which returns (Launch, the code
  // of the settings it was planned under); the Launch is filed under this call's key, computed
  // once, with that code (not the code now in force, should the settings change meanwhile).
  py::object call(py::handle x, py::handle w, py::handle eps, py::handle offset,
                  py::handle mode, py::handle planner = py::none()) {
    const auto launch = launch_of(x, py::none(), w, eps, offset, mode, planner);
    if (!launch) return py::none();
    std::optional<at::Tensor> weight;
    if (!w.is_none()) weight = THPVariable_Unpack(w.ptr());
    return py::reinterpret_steal<py::object>(
        THPVariable_Wrap(apply(THPVariable_Unpack(x.ptr()), weight, launch)));
  }

  // (y, h) of a fused add, as `call`.
  py::object call_add(py::handle x, py::handle r, py::handle w, py::handle eps,
                      py::handle offset, py::handle mode, py::handle planner = py::none()) {
    const auto launch = launch_of(x, r, w, eps, offset, mode, planner);
    if (!launch) return py::none();
    std::optional<at::Tensor> weight;
    if (!w.is_none()) weight = THPVariable_Unpack(w.ptr());
    auto [y, h] = apply_add(THPVariable_Unpack(x.ptr()), THPVariable_Unpack(r.ptr()), weight,
                            launch);
    return py::make_tuple(py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(y))),
                          py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(h))));
  }

  void clear() { launches_.clear(); }
  int64_t size() const { return static_cast<int64_t>(launches_.size()); }
  int64_t settings_ = 0;  // the code of the settings now in force

 private:
  // The call key, with a fused add's residual: a plain tensor laid out as x (the same sizes,
  // strides, dtype and device, and as aligned), whose requiring grad makes the call training.
  bool key_of(py::handle x, py::handle r, py::handle w, py::handle eps, py::handle offset,
              py::handle mode, CallKey* key) const {
    if (!call_key(x, w, eps, offset, mode, few_rows_max_, fewest_rows_max_, key)) return false;
    if (r.is_none()) return true;
    if (!THPVariable_Check(r.ptr())) return false;
    const at::Tensor& xt = THPVariable_Unpack(x.ptr());
    const at::Tensor& rt = THPVariable_Unpack(r.ptr());
    if (!plain(rt) || rt.sizes() != xt.sizes() || rt.strides() != xt.strides() ||
        rt.scalar_type() != xt.scalar_type() || rt.device() != xt.device() ||
        (key->aligned && (reinterpret_cast<uintptr_t>(rt.data_ptr()) & 15) != 0)) {
      return false;
    }
    key->residual = true;
    key->training = key->training || (rt.requires_grad() && at::GradMode::is_enabled());
    return true;
  }

  // The Launch of this call: the memo's, or the planner's (filed, where the memo serves the
  // call), or null (no planner).
  std::shared_ptr<const Launch> launch_of(py::handle x, py::handle r, py::handle w,
                                          py::handle eps, py::handle offset, py::handle mode,
                                          py::handle planner) {
    CallKey key;
    key.settings = settings_;
    const bool keyed = key_of(x, r, w, eps, offset, mode, &key);
    if (keyed) {
      const auto it = launches_.find(key);
      if (it != launches_.end()) return it->second;
    }
    if (planner.is_none()) return nullptr;
    const py::tuple planned = planner();
    std::shared_ptr<const Launch> launch = planned[0].cast<std::shared_ptr<Launch>>();
    if (keyed) {
      key.settings = planned[1].cast<int64_t>();
      if (static_cast<int64_t>(launches_.size()) >= capacity_) launches_.clear();  // bounded
      launches_[std::move(key)] = launch;  // nodes hold their own reference
    }
    return launch;
  }

  int64_t capacity_;
  // M's row class is part of the key (cute/plan/auto.py AUTO_FEW_ROWS_MAX, AUTO_FEWEST_ROWS_MAX)
  int64_t few_rows_max_;
  int64_t fewest_rows_max_;
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
  m.def("apply_add", &apply_add,
        "(y, h) = the fused residual add of (x, residual, weight) as `launch` plans it; on the "
        "tape when any of them requires grad (and grad mode is on; a training launch only)",
        py::arg("x"), py::arg("residual"), py::arg("weight"), py::arg("launch"));
  m.def("apply", &apply,
        "y = rms_norm(x, weight) as `launch` plans it; on the tape when x or weight requires "
        "grad (and grad mode is on; a training launch only)",
        py::arg("x"), py::arg("weight"), py::arg("launch"));
  py::class_<CallMemo>(m, "CallMemo")
      .def(py::init<int64_t, int64_t, int64_t>(), py::arg("capacity"), py::arg("few_rows_max"),
           py::arg("fewest_rows_max"))
      .def("find", &CallMemo::find, "the Launch planned for this call, or None", py::arg("x"),
           py::arg("weight"), py::arg("eps"), py::arg("offset"), py::arg("casting_mode"),
           py::arg("residual") = py::none())
      .def("call_add", &CallMemo::call_add,
           "(y, h) of a fused add (on the tape for a training call); one not planned before "
           "goes to `planner` (() -> (Launch, settings code)), or returns None without one",
           py::arg("x"), py::arg("residual"), py::arg("weight"), py::arg("eps"),
           py::arg("offset"), py::arg("casting_mode"), py::arg("planner") = py::none())
      .def("call", &CallMemo::call,
           "y of a call (on the tape for a training call); one not planned before goes to "
           "`planner` (() -> (Launch, settings code)), or returns None without one",
           py::arg("x"), py::arg("weight"), py::arg("eps"), py::arg("offset"),
           py::arg("casting_mode"), py::arg("planner") = py::none())
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
