//! \file reference/checks.hpp
//! Argument checks of the CPU reference ops (reference/attention.hpp, reference/oracle.hpp) and
//! the view helpers both use. `view_checks` runs the checks every op shares in order and keeps the
//! first failure, so each op's `can_implement` reads as the list of what it checks.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "../config.hpp"
#include "../geometry.hpp"
#include "../partition_types.hpp"
#include "../status.hpp"
#include "../view.hpp"

namespace greenmim {
namespace reference {

//! head_dim^-0.5, the default scale. Precondition: head_dim > 0. O(1).
template <class T>
T default_scale(index_t head_dim) {
  return T(1) / std::sqrt(T(head_dim));
}

namespace detail {

template <class V>
bool strides_non_negative(const V& v, int rank) {
  for (int i = 0; i < rank; ++i)
    if (v.stride[i] < 0 || v.extent[i] < 0) return false;
  return true;
}

//! True when no two index tuples of `v` address the same element (sufficient test: sorted by
//! stride, each stride is at least the span of the dimensions below it).
template <class T, int R>
bool is_injective(const tensor_view<T, R>& v) {
  if (v.numel() == 0) return true;
  int order[R];
  for (int i = 0; i < R; ++i) order[i] = i;
  std::sort(order, order + R, [&](int a, int b) { return v.stride[a] < v.stride[b]; });
  std::int64_t span_below = 1;  // elements spanned by the dimensions sorted so far
  for (int i = 0; i < R; ++i) {
    const int d = order[i];
    if (v.extent[d] == 1) continue;
    if (v.stride[d] < span_below) return false;
    span_below = v.stride[d] * (v.extent[d] - 1) + span_below;
  }
  return true;
}

template <class A, class B, int R>
bool same_extents(const tensor_view<A, R>& a, const tensor_view<B, R>& b) {
  for (int i = 0; i < R; ++i)
    if (a.extent[i] != b.extent[i]) return false;
  return true;
}

//! Extents [B, N, H] and [B, N, H, D] of the inputs; the usual checks of a 4-D view against q.
template <class T, class U>
status check_like_q(const tensor_view<T, 4>& q, const tensor_view<U, 4>& x, bool output) {
  if (!same_extents(q, x) || !strides_non_negative(x, 4)) return status::shape_mismatch;
  if (output && !is_injective(x)) return status::shape_mismatch;
  if (x.numel() > 0 && x.data == nullptr) return status::invalid_argument;
  return status::success;
}

template <class T, class U>
status check_rows(const tensor_view<T, 4>& q, const tensor_view<U, 3>& x, bool output) {
  for (int i = 0; i < 3; ++i)
    if (x.extent[i] != q.extent[i]) return status::shape_mismatch;
  if (!strides_non_negative(x, 3)) return status::shape_mismatch;
  if (output && !is_injective(x)) return status::shape_mismatch;
  if (x.numel() > 0 && x.data == nullptr) return status::invalid_argument;
  return status::success;
}

//! Shape of q itself: non-negative extents and strides, head_dim >= 1 when there is any row.
template <class T>
status check_q(const tensor_view<const T, 4>& q) {
  if (!strides_non_negative(q, 4)) return status::shape_mismatch;
  if (q.extent[0] * q.extent[1] * q.extent[2] > 0 && q.extent[3] <= 0) return status::invalid_argument;
  if (q.numel() > 0 && q.data == nullptr) return status::invalid_argument;
  return status::success;
}

//! Bias table (if given): p > 0, extents [(2p-1)^2, heads].
template <class T>
status check_bias(const tensor_view<const T, 2>& bias, index_t window, index_t heads) {
  if (bias.data == nullptr) return status::success;
  if (window <= 0 || window > 16384) return status::invalid_argument;
  const std::int64_t rows = (2 * static_cast<std::int64_t>(window) - 1) * (2 * static_cast<std::int64_t>(window) - 1);
  if (bias.extent[0] != rows || bias.extent[1] != heads || !strides_non_negative(bias, 2))
    return status::shape_mismatch;
  return status::success;
}

//! Output bias gradient: null, or the shape of the bias table (and a bias table must exist).
template <class T>
status check_dbias(const tensor_view<const T, 2>& bias, const tensor_view<T, 2>& dbias) {
  if (dbias.data == nullptr) return status::success;
  if (bias.data == nullptr) return status::shape_mismatch;
  if (!same_extents(bias, dbias) || !strides_non_negative(dbias, 2) || !is_injective(dbias))
    return status::shape_mismatch;
  return status::success;
}

//! True when two coordinates of one window are close enough for the bias table of window p.
inline bool within_window(index_t ca, index_t cb, index_t p) {
  const index_t dh = coord_h(ca) - coord_h(cb), dw = coord_w(ca) - coord_w(cb);
  return dh > -p && dh < p && dw > -p && dw < p;
}

//! The partition against a token axis of length n: ranges, exact cover, pad consistency and, with
//! a bias, the coordinates of every attending pair inside the table. O(n_g*G^2) with a bias,
//! O(n_g*G + N) without.
inline status check_partition(const partition_view& part, std::int64_t n, bool with_bias, index_t window) {
  if (part.num_tokens != n) return status::shape_mismatch;
  if (part.group_size < 0 || part.num_groups < 0) return status::invalid_argument;
  const std::int64_t slots = static_cast<std::int64_t>(part.group_size) * part.num_groups;
  if (slots > std::numeric_limits<index_t>::max()) return status::overflow;
  if (slots > 0 && (part.gather == nullptr || part.slot_window == nullptr ||
                    (with_bias && part.slot_coord == nullptr)))
    return status::invalid_argument;
  if (n > 0 && part.scatter == nullptr) return status::invalid_argument;
  std::int64_t real = 0;
  for (std::int64_t s = 0; s < slots; ++s) {
    const index_t t = part.gather[s];
    const index_t w = part.slot_window[s];
    if (t == pad_index) {
      if (w != pad_index) return status::out_of_range;
      continue;
    }
    if (t < 0 || t >= n || w < 0) return status::out_of_range;
    if (with_bias && part.slot_coord[s] < 0) return status::out_of_range;
    ++real;
  }
  for (std::int64_t t = 0; t < n; ++t)
    if (part.scatter[t] < 0 || part.scatter[t] >= slots) return status::out_of_range;
  if (real != n) return status::not_covered;
  for (std::int64_t s = 0; s < slots; ++s) {
    const index_t t = part.gather[s];
    if (t != pad_index && part.scatter[t] != s) return status::not_covered;
  }
  if (with_bias) {
    const index_t G = part.group_size;
    for (index_t g = 0; g < part.num_groups; ++g) {
      const std::int64_t base = static_cast<std::int64_t>(g) * G;
      for (index_t i = 0; i < G; ++i)
        for (index_t j = i + 1; j < G; ++j)
          if (attends(part.slot_window[base + i], part.slot_window[base + j]) &&
              !within_window(part.slot_coord[base + i], part.slot_coord[base + j], window))
            return status::out_of_range;
    }
  }
  return status::success;
}

//! The mask mode is one of mask_mode's (`invalid_argument`).
template <class M>
status check_mask(M mask) {
  return mask == M::exact || mask == M::additive ? status::success : status::invalid_argument;
}

template <class T>
T resolve_scale(T scale, std::int64_t head_dim) {
  return scale == T(0) ? default_scale<T>(static_cast<index_t>(head_dim)) : scale;
}


//! Pointer to row (b, t, h, :) of a 4-D view.
template <class T>
T* row_ptr(const tensor_view<T, 4>& x, std::int64_t b, std::int64_t t, std::int64_t h) {
  return x.data + b * x.stride[0] + t * x.stride[1] + h * x.stride[2];
}

//! The checks of a reference op against its q, in the order they are called; the first failure
//! sticks and later checks are skipped. `result()` is that failure, or success.
template <class T>
class view_checks {
 public:
  explicit view_checks(const tensor_view<const T, 4>& q) : q_(q), s_(check_q(q)) {}
  //! Inputs shaped like q ([B, N, H, D], non-negative strides, non-null data).
  template <class... V>
  view_checks& inputs(const V&... v) {
    (step([&] { return check_like_q(q_, v, false); }), ...);
    return *this;
  }
  //! Outputs shaped like q, without self-overlap.
  template <class... V>
  view_checks& outputs(const V&... v) {
    (step([&] { return check_like_q(q_, v, true); }), ...);
    return *this;
  }
  //! A [B, N, H] row view (lse); `optional`: skipped when its data is null.
  template <class U>
  view_checks& rows(const tensor_view<U, 3>& x, bool output, bool optional) {
    if (!(optional && x.data == nullptr)) step([&] { return check_rows(q_, x, output); });
    return *this;
  }
  //! The bias table of window p ([(2p-1)^2, H]), and its gradient if one is given.
  template <class B>
  view_checks& bias(const tensor_view<const T, 2>& b, index_t window, const B* dbias = nullptr) {
    step([&] { return check_bias(b, window, static_cast<index_t>(q_.extent[2])); });
    if (dbias != nullptr) step([&] { return check_dbias(b, *dbias); });
    return *this;
  }
  view_checks& bias(const tensor_view<const T, 2>& b, index_t window) {
    return bias(b, window, static_cast<const tensor_view<T, 2>*>(nullptr));
  }
  //! Any further check, `f()` -> status.
  template <class F>
  view_checks& then(F&& f) {
    step(f);
    return *this;
  }
  status result() const { return s_; }

 private:
  template <class F>
  void step(F&& f) {
    if (s_ == status::success) s_ = f();
  }
  const tensor_view<const T, 4>& q_;
  status s_;
};

}  // namespace detail
}  // namespace reference
}  // namespace greenmim
