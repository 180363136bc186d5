// What a native Launch carries out: the decision Python made for one call key
// (rmsnorm_lab/native/launch.py, LaunchSpec) as plain values, and the backward's kernel calls
// run from it. Included by native_node.cpp only.
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "ffi.h"

namespace rmsnorm_lab {
namespace py = pybind11;

// Argument codes of a backward step, defined once in Python (rmsnorm_lab/cute/launch/args.py,
// Arg) and given to this build as RMSNORM_LAB_ARG_* macros (rmsnorm_lab/native/build.py). Codes
// below kTensorArgs name a tensor of the call, indexing `run_backward`'s table.
enum Arg : int64_t {
  kDy = RMSNORM_LAB_ARG_DY,
  kX = RMSNORM_LAB_ARG_X,
  kW = RMSNORM_LAB_ARG_W,
  kRstd = RMSNORM_LAB_ARG_RSTD,
  kDx = RMSNORM_LAB_ARG_DX,
  kPartials = RMSNORM_LAB_ARG_PARTIALS,
  kNoPartials = RMSNORM_LAB_ARG_NO_PARTIALS,
  kDw = RMSNORM_LAB_ARG_DW,
  kDh = RMSNORM_LAB_ARG_DH,
  kCount = RMSNORM_LAB_ARG_COUNT,
  kOffset = RMSNORM_LAB_ARG_OFFSET,
};
constexpr int64_t kTensorArgs = kDh + 1;

template <typename T>
inline T attr(const py::handle& spec, const char* name) {
  return spec.attr(name).cast<T>();
}

// cute/plan/forward.py RowsRule: an integer that follows the row count,
// max(1, min(cap, ceil(M / per))).
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
        aligned(attr<bool>(spec, "aligned")),
        residual(attr<bool>(spec, "residual")) {
    for (const py::handle b : spec.attr("backward")) backward.emplace_back(b);
    TORCH_CHECK(static_cast<bool>(forward), "rmsnorm_lab native node: no forward kernel");
    TORCH_CHECK(backward.empty() || backward.size() == 3,
                "rmsnorm_lab native node: a training launch has three backwards");
    TORCH_CHECK(!training() || backward[kBoth].partial_rows.set == weighted,
                "rmsnorm_lab native node: a weight needs dW partial rows, and only a weight");
  }

  bool training() const { return !backward.empty(); }

  // (x, w, y, rstd, grid, eps, offset); the fused add's: (x, r, w, y, h, rstd, grid, eps, offset)
  FfiFunction forward;
  std::string forward_name;
  uint32_t forward_argb;
  RowsRule forward_grid;
  int64_t row_stride;  // x's row stride as rows, where the memo keys the layout exactly
  bool weighted;
  double eps, offset;
  bool nvtx;
  at::Tensor no_weight, no_rstd, no_partials;  // stand-ins for tensors a kernel does not use
  bool aligned;  // the backward kernels assume 16-byte aligned rows of dy
  bool residual;  // the fused residual add: its forward writes h too, its backwards add dh
  std::vector<Backward> backward;
};

// x's row stride as (M, n) rows: n when contiguous, the leading stride of a 2-D x, and the
// planned one otherwise (such layouts are memoized by their exact sizes and strides).
inline int64_t row_stride_of(const at::Tensor& x, const Launch& k) {
  if (x.is_contiguous()) return x.size(-1);
  if (x.dim() == 2) return x.stride(0);
  return k.row_stride;
}

// The incoming gradient as rows the backward kernels can address. The common case, dy laid out
// as x's contiguous rows, is taken here; any other layout (y.sum()'s stride-0 gradient, an offset
// view) is Python's to decide, under the GIL.
inline at::Tensor grad_rows(const at::Tensor& dy, const at::Tensor& x, int64_t m, const Launch& k) {
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
// `dh`: the fused add's gradient at h (its launches only), added to dx by the dx kernels.
inline torch::autograd::variable_list run_backward(const Launch& k, int64_t m, const at::Tensor& x,
                                            const at::Tensor& weight, const at::Tensor& rstd,
                                            const at::Tensor& dy, bool need_dx, bool need_dw,
                                            const at::Tensor& dh = at::Tensor()) {
  const int64_t n = x.size(-1);
  TORCH_CHECK(x.numel() == m * n && rstd.numel() == m && dy.numel() == m * n,
              "rmsnorm_lab native node: the saved x (", x.sizes(), ") or the gradient (",
              dy.sizes(), ") no longer has the forward's ", m, " rows of ", n,
              " (was a saved tensor's .data replaced?)");
  const bool with_dw = need_dw && weight.defined();
  const Backward& b = k.backward[with_dw ? (need_dx ? Launch::kBoth : Launch::kDwOnly)
                                         : Launch::kDxOnly];
  const at::Tensor dy2 = grad_rows(dy, x, m, k);
  TORCH_CHECK(dh.defined() == (k.residual && need_dx), "rmsnorm_lab native node: h's gradient "
              "joins dx in the fused add's launches, and only there");
  const at::Tensor dh2 = dh.defined() ? grad_rows(dh, x, m, k) : at::Tensor();
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
  DLTensor d_dh = dh2.defined() ? dl_view(dh2) : d_none;
  DLTensor d_part = partials.defined() ? dl_view(partials) : d_none;
  DLTensor d_dw = dw.defined() ? dl_view(dw) : d_none;
  DLTensor* tensors[kTensorArgs] = {};
  tensors[kDy] = &d_dy, tensors[kX] = &r_x.dl, tensors[kW] = &d_w, tensors[kRstd] = &d_rstd;
  tensors[kDx] = &r_dx.dl, tensors[kPartials] = &d_part, tensors[kNoPartials] = &d_none;
  tensors[kDw] = &d_dw, tensors[kDh] = &d_dh;
  const EnvStream env(x);
  for (const Step& step : b.steps) {
    TVMFFIAny args[11];
    const int32_t count = static_cast<int32_t>(step.args.size());
    TORCH_CHECK(count <= 11, "rmsnorm_lab native node: a step has too many arguments");
    for (int32_t i = 0; i < count; ++i) {
      const int64_t code = step.args[i];
      TORCH_CHECK(code >= 0 && (code < kTensorArgs || code == kCount || code == kOffset),
                  "rmsnorm_lab native node: unknown argument code ", code);
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

}  // namespace rmsnorm_lab
