// The call memo's key: what a native Launch was decided from, read off a call's arguments in C++
// (native_node.cpp's CallMemo maps keys to Launches). Included by native_node.cpp only.
#pragma once

#include <torch/csrc/autograd/python_variable.h>
#include <torch/extension.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>

#include <algorithm>
#include <cstdint>
#include <string>

namespace rmsnorm_lab {

// ------------------------------------------------------------------------------- call memo
// Everything a Launch was decided from, read off the call's arguments: the row width and how x
// is laid out as rows, dtypes and devices of x and the weight, the 16-byte alignment of their
// pointers and of x's row stride, the casting mode, eps and offset, the class of the row count
// (the two thresholds a plan reads: auto's few-rows tiles, cute/plan/auto.py row_class), and a code
// of the settings the plan read (native/launch.py, Snapshot), which Python updates on every
// settings change. The row count
// itself is not in the key: a Launch's grids follow it (RowsRule), so calls whose M changes
// every call (packed batches, serving) all find one Launch.
constexpr int kMaxDims = 8;

enum Layout : int32_t {
  kContiguous = 0,  // any number of dims, contiguous: rows of n
  kRows2d = 1,      // 2-D with a unit last stride: rows of n, row stride in the key
  kExact = 2,       // anything else the kernels address: sizes and strides in the key
};

struct CallKey {
  int32_t layout = kContiguous;
  int64_t n = 0, row_stride = 0;
  int64_t sizes[kMaxDims] = {};  // kExact only
  int64_t strides[kMaxDims] = {};
  int32_t dims = 0;
  int8_t row_class = 0;   // cute/plan/auto.py row_class: 0 many rows, 1 few, 2 fewest
  int32_t x_dtype = 0;
  int32_t x_device = 0;   // device type * 256 + index
  int32_t w_dtype = -1;   // -1: no weight
  int32_t w_device = 0;
  int64_t w_size = 0, w_stride = 0;
  bool aligned = false;
  bool training = false;  // grad mode on and x or the weight (or the residual) requiring grad
  bool residual = false;  // the fused residual add (its residual laid out as x)
  double eps = 0.0, offset = 0.0;
  int64_t settings = 0;
  std::string casting_mode;

  bool operator==(const CallKey& o) const {
    return settings == o.settings && layout == o.layout && n == o.n &&
           row_stride == o.row_stride && dims == o.dims && row_class == o.row_class &&
           x_dtype == o.x_dtype && x_device == o.x_device && w_dtype == o.w_dtype &&
           w_device == o.w_device && w_size == o.w_size && w_stride == o.w_stride &&
           aligned == o.aligned && training == o.training && residual == o.residual &&
           eps == o.eps &&
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
    mix(k.layout), mix(k.n), mix(k.row_stride), mix(k.row_class), mix(k.x_dtype);
    mix(k.x_device), mix(k.w_dtype), mix(k.aligned), mix(k.training), mix(k.residual);
    mix(static_cast<uint64_t>(k.settings));
    return h;
  }
};

inline int32_t device_code(const at::Tensor& t) {
  return static_cast<int32_t>(t.device().type()) * 256 + t.device().index() + 1;
}

// A dense tensor with nothing for torch's dispatcher to do: not a subclass (fake tensors), not
// meta, sparse or nested, not wrapped by a functorch transform or functionalization, no lazy
// conjugate or negation, no forward-mode tangent. Anything else goes through Python, where
// api.rms_norm hands it to the custom op and torch's machinery.
inline bool plain(const at::Tensor& t) {
  const c10::DispatchKeySet keys = t.key_set();
  return t.layout() == at::kStrided && !t.is_meta() && !t.is_nested() &&
         !keys.has(c10::DispatchKey::Python) && !keys.has(c10::DispatchKey::FuncTorchBatched) &&
         !keys.has(c10::DispatchKey::FuncTorchGradWrapper) &&
         !keys.has(c10::DispatchKey::Functionalize) && !t.is_conj() && !t.is_neg() &&
         !t._fw_grad(/*level=*/0).defined();
}

// The key of (x, weight, eps, offset, casting_mode), or false when the call is not one the memo
// serves: not plain tensors, an active dispatch mode or autocast, eps or offset not a Python
// number, mode not a str, an empty x, or rows past the kernels' 32-bit indices.
inline bool call_key(py::handle x_obj, py::handle w_obj, py::handle eps, py::handle offset,
              py::handle mode, int64_t few_rows_max, int64_t fewest_rows_max,
              CallKey* key) {
  if (!THPVariable_Check(x_obj.ptr())) return false;
  const at::Tensor& x = THPVariable_Unpack(x_obj.ptr());
  const int64_t dims = x.dim();
  if (dims < 1 || dims > kMaxDims || x.numel() == 0 || !plain(x)) return false;
  if (c10::impl::TorchDispatchModeTLS::any_modes_set() ||
      at::autocast::is_autocast_enabled(x.device().type())) {
    return false;
  }
  if (!PyUnicode_Check(mode.ptr())) return false;
  for (py::handle number : {eps, offset}) {
    if (!PyFloat_Check(number.ptr()) && !PyLong_Check(number.ptr())) return false;
  }
  const int64_t n = x.size(-1), m = x.numel() / n;
  key->n = n;
  // The row stride is the one the planner reads (common/rows.py as_rows): a 2-D tensor is its
  // own rows, so its stride(0) counts even where torch calls it contiguous (torch ignores a
  // size-1 dimension's stride: (1, 8193)[:, :4096] is "contiguous"); as_rows views any other
  // contiguous tensor as rows of n.
  if (x.is_contiguous() && (dims != 2 || x.stride(0) == n)) {
    key->layout = kContiguous;
    key->row_stride = n;
  } else if (dims == 2 && x.stride(1) == 1) {
    key->layout = kRows2d;
    key->row_stride = x.stride(0);
  } else {
    key->layout = kExact;
    key->dims = static_cast<int32_t>(dims);
    std::copy_n(x.sizes().data(), dims, key->sizes);
    std::copy_n(x.strides().data(), dims, key->strides);
  }
  if (m * std::max(key->row_stride, n) >= (int64_t{1} << 31)) return false;
  key->row_class = static_cast<int8_t>((m <= few_rows_max) + (m <= fewest_rows_max));
  key->x_dtype = static_cast<int32_t>(x.scalar_type());
  key->x_device = device_code(x);
  auto ptrs = reinterpret_cast<uintptr_t>(x.data_ptr());
  bool requires_grad = x.requires_grad();
  if (!w_obj.is_none()) {
    if (!THPVariable_Check(w_obj.ptr())) return false;
    const at::Tensor& w = THPVariable_Unpack(w_obj.ptr());
    if (w.dim() != 1 || !plain(w)) return false;
    key->w_dtype = static_cast<int32_t>(w.scalar_type());
    key->w_device = device_code(w);
    key->w_size = w.size(0), key->w_stride = w.stride(0);
    ptrs |= reinterpret_cast<uintptr_t>(w.data_ptr());
    requires_grad = requires_grad || w.requires_grad();
  }
  // as the planner decides it: the pointers and the row stride (kExact: sizes and strides are
  // in the key, so the view's row stride is too)
  const uintptr_t row_bytes = static_cast<uintptr_t>(key->row_stride) * x.element_size();
  key->aligned = ((ptrs | row_bytes) & 15) == 0;
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

}  // namespace rmsnorm_lab
